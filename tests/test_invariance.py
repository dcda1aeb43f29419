"""One arithmetic per row, whatever the batch: a token's logits are the same bits
fed alone (as a decode step feeds it) or as a row of a prompt batch beside other
sequences, on 1, 2 or 3 threads, and whatever chunks a prompt is cut into.

(llama.cpp's arithmetic depends on the batch: a lone token's attention sums in
four accumulators where a batch's take one, 4-row tiles of repacked Q4_K and
batches of 8+ rows of the other k-quants multiply differently.  Ours does not,
so these hold for every model; SmolLM2 and a Q4_K / Q6_K synthetic model, whose
products go through the decoding kernels, the 4-row tiles and the 16-row packed
prompt tiles, stand for them; the synthetic gpt-oss adds attention sinks, a
sliding window the prompts pass and routed experts; the synthetic DeepSeek-2 its
latent attention (V a prefix of the cached K rows) and grouped, biased routing;
the synthetic LFM2 its short convolutions, whose window rows the batch's
sequences read and write in the recurrent state; the synthetic Mamba-2 its
selective scan; the synthetic Granite 4 hybrid both beside attention.)

A model with recurrent layers (the synthetic Qwen3.5: the gated delta rule) keeps
the same bits whatever the thread count and the other sequences of the batch, but
its prompts run the delta rule's chunked form, which agrees with the token form to
rounding only: a prompt equals itself bit for bit when fed in the same pieces, or
in pieces that start at multiples of the op's chunk (32), and equals its tokens fed
one by one to within rounding (pe.h, pe_op_delta_net)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from model_parity import cache_for

from pyengine import store
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Backend
from pyengine.models import load_model
from pyengine.runner.engine import Engine
from pyengine.runner.forward import Forward
from pyengine.tokenizer import Tokenizer

SYNTH = Path(__file__).parent / "data" / "synth"
MODELS = ("smollm2", "llama-wide-q4_k_s", "gpt-oss-q8_0", "deepseek2-q8_0", "lfm2-q8_0", "mamba2-q8_0",
          "granitehybrid-q8_0", "nemotron_h-q8_0", "nemotron_h_moe-q8_0",
          "falcon-h1-q8_0", "lfm2moe-q8_0", "granitehybrid-moe-q8_0")


def model_and_tokenizer(name: str):
    path = store.resolve_model("smollm2-135m", progress=False) if name == "smollm2" else SYNTH / f"{name}.gguf"
    gguf = GGUFFile(path)
    return load_model(gguf), Tokenizer.from_gguf(gguf)


def prompt(model, length: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, model.cfg.n_vocab, length).astype(np.int32)


def fed_in_chunks(model, backend: Backend, ids: np.ndarray, sizes) -> np.ndarray:
    """The logits of every position of one sequence, its tokens fed through Forward in
    chunks of the given sizes (the last repeated until the prompt is done)."""
    fw = Forward(model, backend, cache_for(model.cache_layout(), 128))
    rows, start, k = [], 0, 0
    while start < len(ids):
        n = min(sizes[min(k, len(sizes) - 1)], len(ids) - start)
        rows.append(fw(ids[start:start + n], np.arange(start, start + n), np.zeros(n, np.int32), np.arange(n)).copy())
        start, k = start + n, k + 1
    return np.concatenate(rows)


def bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.fixture(scope="module", params=MODELS)
def loaded(request):
    return model_and_tokenizer(request.param)


def test_a_prompt_beside_three_others_equals_its_tokens_alone(loaded):
    """The engine runs a 37-token prompt in one batch with 3 other sequences' prompts
    (9, 23 and 50 tokens, 4 sequences sharing each forward pass); every position's
    logits equal the same tokens fed one at a time, each a batch of its own."""
    model, tok = loaded
    ids = prompt(model, 37, seed=1)
    others = [prompt(model, n, seed=10 + n) for n in (9, 23, 50)]
    alone = fed_in_chunks(model, Backend(2), ids, [1])
    engine = Engine(model, tok, Backend(2), n_ctx=128, n_batch=128, n_parallel=4, background=False)
    handles = [engine.submit(p.tolist(), max_tokens=0, all_logits=True) for p in [ids, *others]]
    while engine.step():
        pass
    together = handles[0].result().logits
    assert engine.steps == 1   # all four prompts in one forward pass
    engine.close()
    assert np.array_equal(bits(together), bits(alone))


def test_the_same_prompt_on_1_2_and_3_threads(loaded):
    """A prompt's logits are the same bits on 1, 2 and 3 threads (the decoding kernels
    split rows over threads, the prompt tiles deal tiles, attention splits tokens and
    heads), fed alike on each, and fed whole on one thread count against token by token
    (each a decode step's batch) on another."""
    model, _ = loaded
    ids = prompt(model, 41, seed=2)
    alike = [fed_in_chunks(model, Backend(n), ids, [40, 1]) for n in (1, 2, 3)]
    assert np.array_equal(bits(alike[0]), bits(alike[1])) and np.array_equal(bits(alike[0]), bits(alike[2]))
    crossed = [fed_in_chunks(model, Backend(n), ids, sizes) for n, sizes in ((1, [1]), (2, [41]), (3, [6, 1]))]
    for got in crossed:
        assert np.array_equal(bits(got), bits(alike[0]))


def test_a_prompt_in_chunks_equals_it_whole(loaded):
    """A 60-token prompt fed whole, in chunks of 1, 2, 3, 5, 8 and 13 (rows in tiles of
    every width, batches on either side of the 8-row packed tiles), and token by token:
    the same logits at every position, bit for bit."""
    model, _ = loaded
    ids = prompt(model, 60, seed=3)
    backend = Backend(2)
    whole = fed_in_chunks(model, backend, ids, [60])
    for sizes in ([1, 2, 3, 5, 8, 13], [7], [1]):
        got = fed_in_chunks(model, backend, ids, sizes)
        bad = np.flatnonzero((bits(got) != bits(whole)).any(axis=1))
        assert bad.size == 0, (sizes, bad[:8].tolist())


# ---- a model with recurrent layers ---------------------------------------------------

RECURRENT = ("qwen35-q8_0", "qwen35moe-q8_0", "qwen3next-q8_0")
DELTA_CHUNK = 32   # the delta rule's piece boundaries (Context.delta_net's default)


@pytest.fixture(scope="module", params=RECURRENT)
def recurrent(request):
    return model_and_tokenizer(request.param)


def test_a_recurrent_prompt_beside_three_others_equals_it_alone(recurrent):
    """Four prompts (37, 9, 23 and 50 tokens) in one forward pass: the 37-token one's
    logits are the bits it gets fed alone in one batch, and its tokens fed one by one
    (the delta rule's token form) agree to rounding."""
    model, tok = recurrent
    ids = prompt(model, 37, seed=1)
    others = [prompt(model, n, seed=10 + n) for n in (9, 23, 50)]
    alone = fed_in_chunks(model, Backend(2), ids, [37])
    engine = Engine(model, tok, Backend(2), n_ctx=128, n_batch=128, n_parallel=4, background=False)
    handles = [engine.submit(p.tolist(), max_tokens=0, all_logits=True) for p in [ids, *others]]
    while engine.step():
        pass
    together = handles[0].result().logits
    assert engine.steps == 1
    engine.close()
    assert np.array_equal(bits(together), bits(alone))
    one_by_one = fed_in_chunks(model, Backend(2), ids, [1])
    np.testing.assert_allclose(one_by_one, alone, atol=1e-3)
    assert np.array_equal(one_by_one.argmax(axis=1), alone.argmax(axis=1))


def test_a_recurrent_prompt_on_1_2_and_3_threads(recurrent):
    model, _ = recurrent
    ids = prompt(model, 41, seed=2)
    alike = [fed_in_chunks(model, Backend(n), ids, [41]) for n in (1, 2, 3)]
    assert np.array_equal(bits(alike[0]), bits(alike[1])) and np.array_equal(bits(alike[0]), bits(alike[2]))
    steps = [fed_in_chunks(model, Backend(n), ids, [1]) for n in (1, 3)]
    assert np.array_equal(bits(steps[0]), bits(steps[1]))


def test_a_recurrent_prompt_in_pieces_at_chunk_boundaries_equals_it_whole(recurrent):
    """Pieces that start at multiples of 32 give the whole prompt's bits; other cuts
    (the token form at one-token pieces, other in-piece products) agree to rounding."""
    model, _ = recurrent
    ids = prompt(model, 100, seed=3)
    backend = Backend(2)
    whole = fed_in_chunks(model, backend, ids, [100])
    for sizes in ([DELTA_CHUNK], [2 * DELTA_CHUNK, DELTA_CHUNK, 1]):
        got = fed_in_chunks(model, backend, ids, sizes)
        bad = np.flatnonzero((bits(got) != bits(whole)).any(axis=1))
        assert bad.size == 0, (sizes, bad[:8].tolist())
    for sizes in ([1, 2, 3, 5, 8, 13], [7], [1]):
        got = fed_in_chunks(model, backend, ids, sizes)
        np.testing.assert_allclose(got, whole, atol=1e-3, err_msg=str(sizes))
