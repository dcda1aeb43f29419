"""pyengine/embedding.py: pooling, normalisation, Matryoshka dimensions, inputs batched
into shared forward passes (the same bits as one at a time), reranking (a decoder's
yes/no score, a cross-encoder's classification head), and what marks an embedding model."""

from __future__ import annotations

import numpy as np
import pytest
from engine_support import hidden_rows, unit
from gguf import GGUFValueType
from model_parity import rewrite

from pyengine import LLM, embedding
from pyengine.embedding import DimensionsError, is_embedding_model, model_pooling, pooling_name
from pyengine.errors import InvalidOptionError, UnsupportedCapabilityError

CAT = "The cat sat on the mat."
TEXTS = [f"Note {i}: a few words about {topic}." for i, topic in
         enumerate(["the weather", "stock prices", "a football match", "the garden", "a train delay", "tax forms"])]
LONG = "word " * 90      # longer than the small n_batch below: split across passes


@pytest.fixture(scope="module")
def llm(smollm2_path):
    # n_batch 32: several inputs share a pass and LONG spans three of them
    with LLM(str(smollm2_path), n_ctx=256, n_batch=32, n_parallel=2) as model:
        yield model


# --------------------------------------------------------------------------------------
# What the file says
# --------------------------------------------------------------------------------------


def test_pooling_names_and_numbers():
    assert [pooling_name(i) for i in range(5)] == ["none", "mean", "cls", "last", "rank"]
    assert pooling_name("cls") == "cls"
    for bad in (5, -1, "max", True, 1.0, None):
        with pytest.raises(InvalidOptionError):
            pooling_name(bad)


def test_model_pooling_from_the_file():
    assert model_pooling({"general.architecture": "qwen3"}) == "mean"   # a decoder without the key
    assert model_pooling({"general.architecture": "qwen3", "qwen3.pooling_type": -1}) == "mean"
    assert model_pooling({"general.architecture": "qwen3", "qwen3.pooling_type": 3}) == "last"
    assert model_pooling({"general.architecture": "bert", "bert.pooling_type": 2}) == "cls"


def test_embedding_model_predicate(monkeypatch):
    from pyengine.models import registry

    assert not is_embedding_model({"general.architecture": "llama"})
    assert not is_embedding_model({"general.architecture": "martian"})
    assert is_embedding_model({"general.architecture": "qwen3", "qwen3.pooling_type": 1})

    class Encoder:
        EMBEDDING_ONLY = True   # an architecture with no LM head

    monkeypatch.setitem(registry._MODELS, "fake-encoder", Encoder)
    assert is_embedding_model({"general.architecture": "fake-encoder"})
    for arch in ("bert", "nomic-bert", "jina-bert-v2", "modern-bert"):   # without a pooling key too
        assert is_embedding_model({"general.architecture": arch})


# --------------------------------------------------------------------------------------
# Pooling and vectors
# --------------------------------------------------------------------------------------


def test_pool_each_type():
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(embedding.pool(rows, "mean"), [4, 5, 6, 7])
    np.testing.assert_array_equal(embedding.pool(rows, "cls"), rows[0])
    np.testing.assert_array_equal(embedding.pool(rows, "last"), rows[2])
    np.testing.assert_array_equal(embedding.pool(rows, "none"), rows)


def test_dimensions_keep_the_head_and_renormalise():
    v = embedding.normalized(np.array([3.0, 4.0, 12.0], np.float32))
    np.testing.assert_allclose(embedding.shortened(v, 2), [0.6, 0.8], rtol=1e-6)
    assert embedding.shortened(v, None) is v
    for bad in (0, 4, -1, True, 2.0):
        with pytest.raises(DimensionsError):
            embedding.shortened(v, bad)
    np.testing.assert_array_equal(embedding.normalized(np.zeros(3)), [0, 0, 0])


def test_embed_pools_as_asked(llm):
    ids = llm.tokenize(CAT, add_special=True)
    rows = hidden_rows(llm, ids)
    [mean] = llm.embed(CAT, normalize=False)
    np.testing.assert_allclose(mean, rows.astype(np.float64).mean(axis=0), rtol=1e-5, atol=1e-6)
    [last] = llm.embed(CAT, pooling="last", normalize=False)
    np.testing.assert_array_equal(last, rows[-1])
    [first] = llm.embed(CAT, pooling=2)
    np.testing.assert_allclose(first, unit(rows[0]), atol=1e-6)
    [tokens] = llm.embed(CAT, pooling="none")
    assert len(tokens) == len(ids)
    np.testing.assert_allclose(tokens, unit(rows), atol=1e-6)
    with pytest.raises(InvalidOptionError):
        llm.embed(CAT, pooling="max")


def test_embed_follows_the_pooling_the_file_declares(tmp_path):
    path = rewrite(tmp_path, "qwen3-q4_1", meta={"qwen3.pooling_type": (3, GGUFValueType.INT32)})
    with LLM(str(path), n_ctx=64) as model:
        assert model.pooling == "last" and model.is_embedding_model
        assert model.embed(CAT) == model.embed(CAT, pooling="last") != model.embed(CAT, pooling="mean")


@pytest.mark.parametrize("pooling", ["mean", "cls", "last", "none"])
def test_batched_inputs_give_the_bits_of_one_at_a_time(llm, pooling):
    inputs = TEXTS + [LONG, CAT]
    together = llm.embed(inputs, pooling=pooling, normalize=False)
    alone = [llm.embed(text, pooling=pooling, normalize=False)[0] for text in inputs]
    assert together == alone


def test_batch_size_does_not_change_the_bits(llm, smollm2_path):
    inputs = TEXTS + [LONG]
    with LLM(str(smollm2_path), n_ctx=256, n_batch=512, n_parallel=1) as big:
        assert big.embed(inputs) == llm.embed(inputs)


def test_embed_dimensions(llm):
    [full] = llm.embed(CAT)
    [short] = llm.embed(CAT, dimensions=32)
    assert len(short) == 32
    np.testing.assert_allclose(short, unit(full[:32]), atol=1e-6)
    with pytest.raises(DimensionsError):
        llm.embed(CAT, dimensions=len(full) + 1)


def test_embedding_leaves_no_slot_or_cell_behind(llm):
    llm.embed(TEXTS + [LONG])
    stats = llm.stats()
    assert stats["cells_used"] == 0 and stats["live"] == 0
    assert not any(slot.live for slot in llm.engine.slots.slots)


def test_more_inputs_than_sequence_slots(smollm2_path):
    texts = [f"text number {i}" for i in range(150)]   # the cache has 64 sequence ids
    with LLM(str(smollm2_path), n_ctx=128, n_batch=512, n_parallel=1) as model:
        together = model.embed(texts)
        assert together[::37] == [model.embed(t)[0] for t in texts[::37]]


# --------------------------------------------------------------------------------------
# Reranking
# --------------------------------------------------------------------------------------

QUERY = "What do cats like to eat?"
DOCS = ["Cats are obligate carnivores and like fish and meat.", "The stock market fell on Monday.",
        "Kittens drink milk.", "Paris is the capital of France."]


def test_decoder_rerank_is_p_yes_after_the_prompt(llm):
    ranked = llm.rerank(QUERY, DOCS)
    assert sorted(r["index"] for r in ranked) == list(range(len(DOCS)))
    scores = [r["relevance_score"] for r in ranked]
    assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
    yes, no = llm.tokenize("yes")[0], llm.tokenize("no")[0]
    for r in ranked:
        prompt = embedding.QWEN3_RERANK_TEMPLATE.format(query=QUERY, document=DOCS[r["index"]])
        logits = llm.forward_logits(llm.tokenize(prompt, parse_special=True))[-1]
        p_yes = np.exp(logits[yes]) / (np.exp(logits[yes]) + np.exp(logits[no]))
        assert r["relevance_score"] == pytest.approx(float(p_yes), abs=1e-6)
    assert llm.rerank(QUERY, DOCS, top_n=2) == ranked[:2]
    assert llm.rerank(QUERY, []) == []
    ranked_count = llm.rerank(QUERY, DOCS, return_count=True)
    assert ranked_count[0] == ranked and ranked_count[1] > 0


def test_cross_encoder_rerank_uses_the_classification_head(llm, monkeypatch):
    """A stand-in cross-encoder: SmolLM2 with a `classify` head (softmax over the pooled
    state, score = its first component) and no rerank template."""
    monkeypatch.setattr(llm.model, "classify", lambda ctx, x: ctx.softmax(x), raising=False)
    prompts = embedding.rerank_prompts(llm.tokenizer, llm.gguf.metadata, llm.model, QUERY, DOCS)
    q = llm.tokenize(QUERY)
    assert prompts == [q + llm.tokenize(d) for d in DOCS]   # SmolLM2 adds no BOS, EOS or SEP
    ranked = llm.rerank(QUERY, DOCS)
    expected = []
    for ids in prompts:   # a causal model's head reads the last token's state, as llama.cpp's
        last = hidden_rows(llm, ids)[-1].astype(np.float64)
        expected.append(float(np.exp(last[0] - last.max()) / np.exp(last - last.max()).sum()))
    assert [r["index"] for r in ranked] == sorted(range(len(DOCS)), key=lambda i: -expected[i])
    for r in ranked:
        assert r["relevance_score"] == pytest.approx(expected[r["index"]], rel=1e-5)


def test_rerank_prompt_of_a_file_template(llm):
    metadata = {embedding.RERANK_TEMPLATE_KEY: "<|im_start|>Q: {query} D: {document}"}
    [ids] = embedding.rerank_prompts(llm.tokenizer, metadata, llm.model, "a", ["b"])
    assert ids == llm.tokenize("<|im_start|>Q: a D: b", parse_special=True)


def test_rerank_bad_arguments(llm):
    for args in [("q", "not a list"), ("q", [1, 2]), (None, ["d"])]:
        with pytest.raises(InvalidOptionError):
            llm.rerank(*args)
    with pytest.raises(InvalidOptionError):
        llm.rerank("q", ["d"], top_n=-1)


def test_rank_order():
    assert embedding.rank_order([0.1, 0.9, 0.5, 0.9]) == [
        {"index": 1, "relevance_score": 0.9}, {"index": 3, "relevance_score": 0.9},
        {"index": 2, "relevance_score": 0.5}, {"index": 0, "relevance_score": 0.1}]
    assert embedding.rank_order([0.1, 0.9], top_n=1) == [{"index": 1, "relevance_score": 0.9}]


# --------------------------------------------------------------------------------------
# An embedding model cannot generate
# --------------------------------------------------------------------------------------


def test_embedding_model_refuses_generation(tmp_path):
    path = rewrite(tmp_path, "qwen3-q4_1", meta={"qwen3.pooling_type": (1, GGUFValueType.INT32)})
    with LLM(str(path), n_ctx=64) as model:
        assert len(model.embed(CAT)[0]) == model.model.cfg.n_embd
        with pytest.raises(UnsupportedCapabilityError, match="does not support generate"):
            model.generate("Hello", max_tokens=4)
        with pytest.raises(UnsupportedCapabilityError, match="does not support generate"):
            model.create_completion("Hello", max_tokens=4)
        with pytest.raises(UnsupportedCapabilityError, match="does not support chat"):
            model.chat([{"role": "user", "content": "Hello"}])


def test_show_reports_capabilities(tmp_path):
    from conftest import SYNTH
    from pyengine.summary import model_summary

    path = rewrite(tmp_path, "qwen3-q4_1", meta={"qwen3.pooling_type": (1, GGUFValueType.INT32)})
    assert dict(model_summary(path))["capabilities"] == "embedding"
    assert dict(model_summary(SYNTH / "qwen3-q4_1.gguf"))["capabilities"].startswith("completion")
