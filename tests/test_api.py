"""The Python API on small synthetic models: shapes, streaming, graph reuse,
instruction sets, and every kind of bad input as a typed error."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import CHILD_CWD, GOLDEN, SYNTH, available_isas, child_env
from model_parity import run_case

from pyengine import LLM
from pyengine.errors import (
    ContextLengthError,
    GGUFError,
    InvalidOptionError,
    ModelError,
    ModelNotFoundError,
    UnknownArchitectureError,
)

LLAMA = SYNTH / "llama-bpe-q5_1-tied.gguf"


@pytest.fixture(scope="module")
def llm():
    return LLM(LLAMA, n_ctx=256, n_threads=2)


def test_forward_logits_shape_and_type(llm):
    ids = [1, 2, 3, 4, 5]
    logits = llm.forward_logits(ids)
    assert logits.shape == (5, llm.n_vocab) and logits.dtype == np.float32
    assert np.all(np.isfinite(logits))


def test_forward_logits_is_independent_of_previous_calls(llm):
    a = llm.forward_logits([7, 8, 9])
    llm.forward_logits([100, 200, 300, 400])
    assert np.array_equal(a, llm.forward_logits([7, 8, 9]))


def test_prompt_chunking_does_not_change_logits(tmp_path):
    ids = list(range(1, 41))
    whole = LLM(LLAMA, n_ctx=128, n_threads=1).forward_logits(ids)
    chunked = LLM(LLAMA, n_ctx=128, n_threads=1, n_batch=7).forward_logits(ids)
    assert np.array_equal(whole.argmax(-1), chunked.argmax(-1))
    np.testing.assert_allclose(whole, chunked, atol=1e-4)


def test_generate_stream_and_text_agree(llm):
    text = llm.generate([1, 2, 3], max_tokens=12, temperature=0)
    pieces = list(llm.generate([1, 2, 3], max_tokens=12, temperature=0, stream=True))
    assert "".join(pieces) == text


def test_forward_into_a_buffer_equals_a_fresh_result(llm):
    """forward(..., out) computes the logits straight into `out` (the engine's buffer): the
    same values as a fresh array, into other buffers in turn, the old one no longer
    written; without `out`, a fresh array as before."""
    fw = llm.forward

    def step(out=None):
        llm.cache.clear()
        return fw(np.array([5, 9, 11]), np.arange(3), np.zeros(3), np.array([1, 2]), out)

    want = step()
    first, second = np.full((2, llm.n_vocab), 7.0, np.float32), np.empty((2, llm.n_vocab), np.float32)
    assert step(first) is first and np.array_equal(first, want)
    assert step(second) is second and np.array_equal(second, want)
    first[:] = 7.0
    second[:] = 7.0
    step(second)   # the buffer bound already: written again, not bound again
    assert np.array_equal(second, want) and np.all(first == 7.0)   # the old buffer is no longer written
    second[:] = 7.0
    assert np.array_equal(step(), want) and np.all(second == 7.0)   # nor is it without a buffer
    llm.cache.clear()   # leave the engine an empty cache


def test_decode_steps_reuse_one_graph(llm):
    """Graph reuse: generating more tokens builds no new graphs, so Python
    work per token does not grow with the model's depth."""
    llm.generate([1, 2, 3], max_tokens=4)
    graphs = dict(llm.forward._graphs)
    llm.generate([1, 2, 3], max_tokens=20)
    assert dict(llm.forward._graphs).keys() == graphs.keys()
    assert all(llm.forward._graphs[k] is graphs[k] for k in graphs)


def test_greedy_synthetic_continuation_matches_llamacpp():
    case = json.loads((GOLDEN / "synth" / "llama-f32-gqa1.json").read_text())["cases"][1]
    llm = LLM(SYNTH / "llama-f32-gqa1.gguf", n_ctx=256, n_threads=2)
    run = run_case(llm.model, llm.backend, case["ids"], len(case["greedy"]))
    assert run.greedy == case["greedy"]


@pytest.mark.parametrize("isa", available_isas())
def test_forced_isa_through_environment(isa):
    code = ("import numpy as np; from pyengine import LLM, _core; "
            f"llm = LLM({str(LLAMA)!r}, n_threads=1); print(_core.isa()); "
            "print(int(llm.forward_logits([1, 2, 3])[-1].argmax()))")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(PYENGINE_ISA=isa), cwd=CHILD_CWD,
                         capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == isa


def cpu_flags() -> set[str]:
    """The kernel's CPU flags (Linux), empty elsewhere."""
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return set()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def test_every_table_the_cpu_supports_is_built():
    """A CPU feature the kernel reports has its table: the build did not drop
    one (AVX-VNNI's is compiled only where the compiler knows vpdpbusd)."""
    from pyengine import _core

    tables = {"avx2": {"avx2", "fma", "f16c", "bmi2"}, "avxvnni": {"avx2", "fma", "f16c", "bmi2", "avx_vnni"},
              "avx512": {"avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"},
              "neon_nodot": {"asimd"}, "neon": {"asimd", "asimddp", "asimdhp"}}
    flags = cpu_flags()
    expected = {name for name, needs in tables.items() if needs <= flags}
    assert expected <= set(available_isas()), (expected, available_isas())
    assert _core.best_isa() == available_isas()[-1]


def test_unavailable_isa_is_a_clear_error():
    code = f"from pyengine import LLM; LLM({str(LLAMA)!r})"
    out = subprocess.run([sys.executable, "-c", code], env=child_env(PYENGINE_ISA="not-an-isa"), cwd=CHILD_CWD,
                         capture_output=True, text=True)
    assert out.returncode != 0 and "PYENGINE_ISA" in out.stderr


# ---- bad input -----------------------------------------------------------------

def test_missing_file():
    with pytest.raises(ModelNotFoundError):
        LLM("/nonexistent/model.gguf")


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("just some text, not a model")
    with pytest.raises(GGUFError):
        LLM(bad)


def test_truncated_model(tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(LLAMA.read_bytes()[: LLAMA.stat().st_size // 2])
    with pytest.raises(GGUFError, match="truncated|past the end|outside"):
        LLM(cut)


def test_unknown_architecture(tmp_path):
    import gguf

    path = tmp_path / "martian.gguf"
    w = gguf.GGUFWriter(str(path), "martian")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnknownArchitectureError, match="martian"):
        LLM(path)


def test_missing_tensor_is_named(tmp_path):
    import gguf
    from gguf import GGUFReader

    src = GGUFReader(str(LLAMA))
    path = tmp_path / "holey.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for field in src.fields.values():
        if field.name.startswith(("GGUF.", "general.architecture")):
            continue
        value = field.contents()
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, value, vtype, sub_type=sub)
    for t in src.tensors:
        if t.name != "blk.1.ffn_up.weight":
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match="blk.1.ffn_up.weight"):
        LLM(path)


@pytest.mark.parametrize("kwargs", [dict(n_ctx=0), dict(n_ctx=-5), dict(n_threads=0), dict(n_batch=0),
                                    dict(n_ctx="big")])
def test_invalid_options(kwargs):
    with pytest.raises(InvalidOptionError):
        LLM(LLAMA, **kwargs)


def test_prompt_longer_than_context():
    small = LLM(LLAMA, n_ctx=16, n_threads=1)
    with pytest.raises(ContextLengthError, match="20.*16|16.*20"):
        small.forward_logits(list(range(1, 21)))
    with pytest.raises(ContextLengthError):
        small.generate(list(range(1, 21)), max_tokens=2)


def test_out_of_range_token_ids(llm):
    with pytest.raises(InvalidOptionError):
        llm.forward_logits([1, llm.n_vocab])
    with pytest.raises(InvalidOptionError):
        llm.forward_logits([-1])


def test_bench_at_depth_measures_after_the_context_and_leaves_it_empty(monkeypatch):
    """run_bench with n_depth (llama-bench's -d) fills that many tokens first, in pieces
    (600 > one piece), measures both speeds after them, and ends with an empty cache."""
    from pyengine import bench
    from pyengine.api import LLM as RealLLM
    from pyengine.runner.forward import Forward

    made, batches = [], []

    def recording_llm(*args, **kwargs):
        made.append(RealLLM(*args, **kwargs))
        return made[-1]

    def recording_call(self, tokens, positions, *args, **kwargs):
        batches.append((int(np.min(positions)), int(np.max(positions))))
        return real_call(self, tokens, positions, *args, **kwargs)

    real_call = Forward.__call__
    monkeypatch.setattr("pyengine.api.LLM", recording_llm)
    monkeypatch.setattr(Forward, "__call__", recording_call)
    result = bench.run_bench(str(LLAMA), n_threads=1, n_prompt=16, n_gen=4, repeat=1, n_depth=600)
    assert result["n_depth"] == 600 and result["pp_tps"] > 0 and result["tg_tps"] > 0
    [llm] = made
    assert llm.n_ctx >= 600 + 16 and llm.cache.n_used == 0
    fill = batches.index((0, 511))
    measured = batches[fill + 2:]   # after the context's two pieces
    assert batches[fill + 1] == (512, 599)
    assert measured[:5] == [(600, 615), (600, 600), (601, 601), (602, 602), (603, 603)] and len(measured) == 10


def test_cli_bench_reports_python_time():
    exe = shutil.which("pyengine")
    cmd = [exe] if exe else [sys.executable, "-m", "pyengine"]
    out = subprocess.run(cmd + ["bench", str(LLAMA), "--prompt-tokens", "32", "--gen-tokens", "8",
                                "--repeat", "1", "--threads", "1"], env=child_env(), cwd=CHILD_CWD,
                         capture_output=True, text=True, check=True)
    assert "python per token" in out.stdout and "tokens/s" in out.stdout
