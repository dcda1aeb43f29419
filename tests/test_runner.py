"""Forward passes over the multi-sequence cache: invariance to batch company and
chunking, sliding-window groups against full-size ones, input checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyengine import store
from pyengine.errors import InvalidOptionError
from pyengine.gguf import GGUFFile
from pyengine.kvcache import KVCache
from pyengine.ml.context import Backend
from pyengine.ml.nn import CacheSpec
from pyengine.models import load_model
from pyengine.runner.engine import Engine
from pyengine.runner.forward import Forward
from pyengine.sample import SamplingOptions
from pyengine.tokenizer import Tokenizer

SYNTH = Path(__file__).parent / "data" / "synth"
GREEDY = SamplingOptions(temperature=0.0, repeat_penalty=1.0)


def synth(name: str = "llama-f16"):
    gguf = GGUFFile(SYNTH / f"{name}.gguf")
    return load_model(gguf), Tokenizer.from_gguf(gguf)


def windowed(model, window: int):
    """The model with a sliding window on its odd layers (a Mistral-style llama)."""
    c = model.cfg
    model.cache_layout = lambda: [CacheSpec(c.kv_dim, c.kv_dim, window if i % 2 else 0) for i in range(c.n_layer)]
    return model


def test_rows_do_not_depend_on_their_batch_company():
    model, _ = synth()
    backend = Backend(1)
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, 512, 12)

    def logits_of_seq0(with_others: bool) -> np.ndarray:
        fw = Forward(model, backend, KVCache(model.cache_layout(), 64))
        tokens, pos, seqs = [prompt], [np.arange(12)], [np.zeros(12)]
        if with_others:
            tokens += [rng.integers(0, 512, 9), rng.integers(0, 512, 5)]
            pos += [np.arange(9), np.arange(5)]
            seqs += [np.full(9, 3), np.full(5, 7)]
        t, p, s = (np.concatenate(x) for x in (tokens, pos, seqs))
        return fw(t, p, s, np.arange(12))

    assert np.array_equal(logits_of_seq0(False), logits_of_seq0(True))


def test_smollm2_logits_do_not_depend_on_chunking():
    path = store.resolve_model("smollm2-135m", progress=False)
    gguf = GGUFFile(path)
    model, tok = load_model(gguf), Tokenizer.from_gguf(gguf)
    backend = Backend(1)
    ids = tok.encode("The quick brown fox jumps over the lazy dog while the cat sleeps. " * 5)
    assert len(ids) > 64
    results = {}
    for n_batch in (7, 64, 512):
        engine = Engine(model, tok, backend, n_ctx=256, n_batch=n_batch, n_parallel=1)
        results[n_batch] = engine.submit(ids, max_tokens=0, all_logits=True).result().logits
        engine.close()
    assert np.array_equal(results[7], results[64]) and np.array_equal(results[7], results[512])
    assert (results[7].argmax(1) == results[512].argmax(1)).all()


def test_sliding_window_group_matches_a_full_size_one():
    """A sliding layer's small ring of cells gives exactly what a full-size group with the
    same window gives, over a prompt several windows long and concurrent decoding."""
    window = 16
    model, tok = synth()
    windowed(model, window)
    backend = Backend(1)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 512, n).tolist() for n in (100, 37, 61)]
    outputs = {}
    for full in (True, False):
        engine = Engine(model, tok, backend, n_ctx=256, n_batch=8, n_parallel=2, swa_margin=4, swa_full=full)
        local = engine.cache.groups[1]
        assert local.window == window
        assert (local.n_cells == 512) if full else (local.n_cells == 2 * (window + 4) + 8 < len(prompts[0]))
        logits = engine.submit(prompts[0], max_tokens=0, all_logits=True).result().logits
        handles = [engine.submit(p, GREEDY, max_tokens=60) for p in prompts]
        outputs[full] = (logits, [h.result().tokens for h in handles])
        engine.close()
    assert np.array_equal(outputs[True][0], outputs[False][0])
    assert outputs[True][1] == outputs[False][1]
    assert all(len(t) == 60 for t in outputs[True][1])


def test_window_changes_what_a_token_sees():
    model, tok = synth()
    backend = Backend(1)
    ids = list(range(3, 43))

    def logits(window: int) -> np.ndarray:
        if window:
            windowed(model, window)
        engine = Engine(model, tok, backend, n_ctx=64, n_parallel=1)
        out = engine.submit(ids, max_tokens=0, all_logits=True).result().logits
        engine.close()
        return out

    plain = logits(0)
    wide = logits(64)     # a window wider than the prompt changes nothing
    narrow = logits(8)
    assert np.array_equal(plain, wide)
    assert np.array_equal(plain[:8], narrow[:8])          # within the first window: the same
    assert not np.allclose(plain[8:], narrow[8:], atol=1e-4)


def test_forward_rejects_bad_batches():
    model, _ = synth()
    fw = Forward(model, Backend(1), KVCache(model.cache_layout(), 16))
    with pytest.raises(InvalidOptionError, match="token ids"):
        fw(np.array([600]), np.array([0]), np.array([0]), np.array([0]))
    with pytest.raises(InvalidOptionError, match="output rows"):
        fw(np.array([1, 2]), np.array([0, 1]), np.array([0, 0]), np.array([2]))
    with pytest.raises(InvalidOptionError):
        fw(np.array([1, 2]), np.array([0]), np.array([0, 0]), np.array([0]))
    with pytest.raises(InvalidOptionError, match="0..63"):
        fw(np.array([1]), np.array([0]), np.array([64]), np.array([0]))
    assert fw.cache.n_used == 0
