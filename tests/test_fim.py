"""Fill-in-the-middle: the prompt llama.cpp's /infill builds (format_prompt_infill, derived
by hand from its code), and /api/generate with a suffix and /infill on the synthetic FIM
model (scripts/make_synth_fim.py: Qwen2.5-Coder's FIM tokens at ids 512-517)."""

from __future__ import annotations

import json
import pathlib

import httpx
import pytest

from pyengine import LLM
from pyengine.chat import fim
from pyengine.errors import InvalidOptionError
from pyengine.server import ServerConfig
from server_support import running_server

SYNTH = pathlib.Path(__file__).parent / "data" / "synth"
FIM_MODEL = SYNTH.parent / "fim" / "llama-fim-q8_0.gguf"
PLAIN_MODEL = SYNTH / "llama-bpe-q5_1-tied.gguf"   # a <reponame> token, but no prefix/suffix/middle
PRE, SUF, MID, PAD, REP, SEP = 512, 513, 514, 515, 516, 517


class CharTokenizer:
    """One id per character (its code point + 1000), BOS 1 added when asked: the sequences
    below can be written down by hand."""

    def __init__(self, add_bos: bool = True, rep: bool = True, sep: bool = True) -> None:
        self.add_bos, self.bos_id = add_bos, 1
        special = {"fim_pre": PRE, "fim_suf": SUF, "fim_mid": MID, "fim_pad": PAD,
                   "fim_rep": REP if rep else None, "fim_sep": SEP if sep else None}
        self.vocab = type("Vocab", (), {"special": special})()
        self.calls: list[tuple[str, bool, bool]] = []

    def encode(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        self.calls.append((text, add_special, parse_special))
        return [1000 + ord(c) for c in text]


def chars(text: str) -> list[int]:
    return [1000 + ord(c) for c in text]


# --------------------------------------------------------------------------------------
# The prompt
# --------------------------------------------------------------------------------------


def test_infill_ids_in_llama_cpps_order():
    tokenizer = CharTokenizer()
    extra = [fim.ExtraChunk("x = 1\n", "a.py"), fim.ExtraChunk("y = 2\n")]
    ids = fim.infill_ids(tokenizer, "def f(", "):\n", extra=extra, prompt="x", n_ctx=4096)
    expected = ([REP, *chars("myproject\n"), SEP, *chars("a.py\n"), *chars("x = 1\n"),
                 SEP, *chars("tmp\n"), *chars("y = 2\n"), SEP, *chars("filename\n")]
                + [1, PRE, *chars("def f("), *chars("x"), SUF, *chars("):\n"), MID])
    assert ids == expected
    # the texts without special tokens read, the prompt with them; never BOS/EOS from encode
    assert ("def f(", False, False) in tokenizer.calls and ("x", False, True) in tokenizer.calls
    assert all(not add_special for _, add_special, _ in tokenizer.calls)


def test_infill_ids_spm_order_and_without_repo_tokens():
    tokenizer = CharTokenizer(add_bos=False, rep=False, sep=False)
    ids = fim.infill_ids(tokenizer, "ab", "cd", extra=[fim.ExtraChunk("zz")], n_ctx=4096, spm=True)
    assert ids == [*chars("\n\n--- snippet ---\n\n"), *chars("zz"), SUF, *chars("cd"), PRE, *chars("ab"), MID]
    assert fim.infill_ids(tokenizer, "ab", "cd", n_ctx=4096) == [PRE, *chars("ab"), SUF, *chars("cd"), MID]


def test_infill_budget_is_llama_cpps():
    tokenizer = CharTokenizer(add_bos=False)
    prefix, suffix = "0123456789abcdefghij", "ABCDEFGHIJ"
    extra = [fim.ExtraChunk("e" * 40, "f")]
    full_extra = [REP, *chars("myproject\n"), SEP, *chars("f\n"), *chars("e" * 40), SEP, *chars("filename\n")]
    assert len(full_extra) == 64
    # n_batch 16: the prefix keeps its last 3 * 4 = 12 tokens, the suffix its first 4 - (2 + 1) = 1;
    # the extra context its last 100 - 16 - 2 * 12 = 60 tokens
    ids = fim.infill_ids(tokenizer, prefix, suffix, extra=extra, prompt="p", n_ctx=100, n_batch=16, n_predict=12)
    assert ids == [*full_extra[-60:], PRE, *chars(prefix[-12:]), *chars("p"), SUF, *chars("A"), MID]
    # n_predict -1 (until the end): 100 - 16 + 2 = 86 tokens of extra context allowed, all 64 taken
    ids = fim.infill_ids(tokenizer, prefix, suffix, extra=extra, prompt="p", n_ctx=100, n_batch=16)
    assert ids == [*full_extra, PRE, *chars(prefix[-12:]), *chars("p"), SUF, *chars("A"), MID]
    # n_ctx 20: 20 - 16 + 2 = 6 extra tokens by llama.cpp's rule, but the prompt must leave one
    # token free (the guard): 3 + 1 + 6 + 12 + 1 = 23 tokens and one free are 24 > 20: 4 extra tokens go
    ids = fim.infill_ids(tokenizer, prefix, suffix, extra=extra, prompt="p", n_ctx=20, n_batch=16)
    assert ids == [*full_extra[-2:], PRE, *chars(prefix[-12:]), *chars("p"), SUF, *chars("A"), MID]
    assert len(ids) == 19
    # n_ctx 10: no extra context; 3 + 1 + 12 + 1 = 17 tokens and one free are 18 > 10: the prefix keeps 4
    ids = fim.infill_ids(tokenizer, prefix, suffix, extra=extra, prompt="p", n_ctx=10, n_batch=16)
    assert ids == [PRE, *chars(prefix[-4:]), *chars("p"), SUF, *chars("A"), MID] and len(ids) == 9


def test_read_extra_checks_like_llama_cpp():
    assert fim.read_extra([{"text": "t"}]) == [fim.ExtraChunk("t", "tmp")]
    for bad in ("nope", [{"filename": "x"}], [{"text": 3}], [{"text": "t", "filename": 4}], [3]):
        with pytest.raises(InvalidOptionError):
            fim.read_extra(bad)


def test_real_vocab_prompt_and_no_fim_tokens():
    llm = LLM(str(FIM_MODEL), n_ctx=512)
    tok = llm.tokenizer
    ids = fim.infill_ids(tok, "def f(x):\n", "\n    return y\n", n_ctx=4096)
    # add_bos is false in this vocabulary; the texts are not parsed for special tokens
    assert ids == [REP, *tok.encode("myproject\n"), SEP, *tok.encode("filename\n"), PRE,
                   *tok.encode("def f(x):\n"), SUF, *tok.encode("\n    return y\n"), MID]
    assert fim.infill_ids(tok, "<|fim_pad|>", "", n_ctx=4096)[-4:-2] != [PAD]
    assert {PAD, REP, SEP} <= tok.eog_ids  # the generation ends at them, as in llama.cpp
    plain = LLM(str(PLAIN_MODEL), n_ctx=256)
    with pytest.raises(InvalidOptionError):
        fim.infill_ids(plain.tokenizer, "a", "b", n_ctx=256)
    llm.close()
    plain.close()


# --------------------------------------------------------------------------------------
# The server: /api/generate with a suffix, /infill
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    config = ServerConfig(parallel=2, max_queue=8, n_ctx=4096)  # room for the extra context (llama.cpp: n_ctx - n_batch)
    with running_server(config, served={"coder": FIM_MODEL, "plain": PLAIN_MODEL}) as running:
        yield running


def expected_prompt(n_ctx: int = 4096) -> list[int]:
    llm = LLM(str(FIM_MODEL), n_ctx=n_ctx)
    try:
        return fim.infill_ids(llm.tokenizer, "def f(x):\n", "\n    return y\n", n_ctx=n_ctx,
                              n_batch=min(fim.DEFAULT_BATCH, n_ctx), n_predict=8)
    finally:
        llm.close()


def test_api_generate_with_suffix(server):
    body = {"model": "coder", "prompt": "def f(x):\n", "suffix": "\n    return y\n", "stream": False,
            "options": {"temperature": 0, "num_predict": 8}}
    reply = httpx.post(f"{server.url}/api/generate", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["done"] and data["done_reason"] in ("stop", "length")
    assert data["prompt_eval_count"] == len(expected_prompt())
    assert data["eval_count"] <= 8
    # raw and system do not change a FIM prompt
    again = httpx.post(f"{server.url}/api/generate", json={**body, "raw": True, "system": "ignored"}, timeout=60)
    assert again.json()["prompt_eval_count"] == data["prompt_eval_count"]
    assert again.json()["response"] == data["response"]


def test_openai_completions_with_suffix(server):
    body = {"model": "coder", "prompt": "def f(x):\n", "suffix": "\n    return y\n", "max_tokens": 8,
            "temperature": 0}
    reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] == len(expected_prompt())
    bad = httpx.post(f"{server.url}/v1/completions", json={**body, "prompt": [1, 2]}, timeout=60)
    assert bad.status_code == 400 and "suffix" in bad.json()["error"]["message"]


def test_infill_whole_and_stops(server):
    body = {"input_prefix": "def f(x):\n", "input_suffix": "\n    return y\n", "n_predict": 5,
            "temperature": 0, "input_extra": [{"filename": "a.py", "text": "x = 1\n"}],
            "cache_prompt": True, "samplers": ["top_k", "top_p", "infill"], "t_max_predict_ms": 500}
    reply = httpx.post(f"{server.url}/infill", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["stop"] is True and data["model"] == "coder"
    assert data["tokens_predicted"] == 5 and data["stop_type"] == "limit"
    assert data["prompt"].endswith("<|fim_prefix|>def f(x):\n<|fim_suffix|>\n    return y\n<|fim_middle|>")
    assert "<|file_sep|>a.py\nx = 1\n" in data["prompt"]
    assert data["tokens_evaluated"] > 0 and data["timings"]["predicted_n"] == 5
    # the FIM pad token ends the middle: an end of generation, as llama.cpp's eog set has it
    pad = httpx.post(f"{server.url}/infill", json={**body, "logit_bias": [[PAD, 100]]}, timeout=60).json()
    assert pad["stop_type"] == "eos" and pad["content"] == "" and pad["tokens_predicted"] == 0
    sep = httpx.post(f"{server.url}/infill", json={**body, "logit_bias": {str(SEP): 100}}, timeout=60).json()
    assert sep["stop_type"] == "eos"


def test_infill_streamed(server):
    body = {"model": "coder", "input_prefix": "a = ", "input_suffix": "\n", "n_predict": 4, "temperature": 0,
            "stream": True}
    with httpx.stream("POST", f"{server.url}/infill", json=body, timeout=60) as reply:
        assert reply.status_code == 200
        events = [json.loads(line[len("data: "):]) for line in reply.iter_lines() if line.startswith("data: ")]
    assert events and all(not e["stop"] for e in events[:-1]) and events[-1]["stop"] is True
    assert events[-1]["tokens_predicted"] == 4 and events[-1]["stop_type"] == "limit"
    whole = httpx.post(f"{server.url}/infill", json={**body, "stream": False}, timeout=60).json()
    assert "".join(e["content"] for e in events) == whole["content"]


@pytest.mark.parametrize("body, fragment", [
    ({"input_suffix": "b"}, '"input_prefix" is required'),
    ({"input_prefix": "a"}, '"input_suffix" is required'),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": "x"}, '"input_extra" must be an array'),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "f"}]}, '"text" field'),
    ({"input_prefix": "a", "input_suffix": "b", "wizard": 1}, "wizard"),
    ({"input_prefix": "a", "input_suffix": "b", "n_predict": -5}, "n_predict"),
    ({"input_prefix": "a", "input_suffix": "b", "temperature": "hot"}, "temperature"),
    ({"input_prefix": "a", "input_suffix": "b", "model": "plain"}, '"plain" does not support insert'),
])
def test_infill_bad_requests(server, body, fragment):
    reply = httpx.post(f"{server.url}/infill", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    assert fragment in reply.json()["error"]
