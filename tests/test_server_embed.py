"""Embeddings: the hidden-state hook of Forward, `LLM.embed`, and the server's
/api/embed, /api/embeddings and /v1/embeddings (with the real SmolLM2)."""

from __future__ import annotations

import base64
import threading

import httpx
import numpy as np
import pytest
from gguf.quants import dequantize

from conftest import SYNTH
from engine_support import hidden_rows, unit
from pyengine import LLM
from pyengine.errors import ContextLengthError, InvalidOptionError
from pyengine.server import ServerConfig
from server_support import FakeAdapter, fake_loader, running_server, wait_for

MODEL = "smollm2-135m"
N_EMBD = 576  # SmolLM2-135M's embedding_length
CAT = "The cat sat on the mat."
STOCKS = "Stock prices fell sharply on Monday."
# One synthetic model per architecture (gemma2 has a final soft-cap, llama-bpe ties its output to token_embd).
HOOK_MODELS = ("gemma2-q8_0", "llama-bpe-q5_1-tied", "llama-f32-gqa1", "phi3-q5_0", "qwen2-q8_0", "qwen3-q4_1",
               "qwen3moe-q8_0")


@pytest.fixture(scope="module")
def llm(smollm2_path):
    with LLM(str(smollm2_path), n_ctx=256, n_parallel=2) as model:
        yield model


# --------------------------------------------------------------------------------------
# The hook: hidden rows that the output projection turns into the logits
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", HOOK_MODELS)
def test_hidden_rows_projected_by_the_output_weight_are_the_logits(name):
    with LLM(str(SYNTH / f"{name}.gguf"), n_ctx=64, n_parallel=1) as model:
        ids = list(range(3, 12))
        logits = model.forward_logits(ids)
        hidden = hidden_rows(model, ids)
        assert hidden.shape == (len(ids), model.model.cfg.n_embd)
        head = model.gguf.tensors[model.model.output.weight.name]   # as the file has it (not interleaved)
        weight = dequantize(np.asarray(model.gguf.tensor_data(head.name)), head.type).reshape(-1, hidden.shape[1])
        projected = hidden.astype(np.float64) @ weight.T.astype(np.float64)
        cap = getattr(model.model.cfg, "final_softcap", 0.0)
        if cap:
            projected = cap * np.tanh(projected / cap)
        # the native matmul rounds the activations to 8 bits: about 1% of the logits' range
        assert np.abs(projected - logits).max() <= 0.02 * np.abs(logits).max()
        assert (projected.argmax(axis=1) == logits.argmax(axis=1)).all()


def test_hidden_graph_and_logits_graph_are_cached_apart(llm):
    ids = llm.tokenize(CAT)
    before = llm.forward_logits(ids)
    hidden_rows(llm, ids)
    after = llm.forward_logits(ids)
    np.testing.assert_array_equal(before, after)


# --------------------------------------------------------------------------------------
# LLM.embed
# --------------------------------------------------------------------------------------


def test_embed_is_the_unit_mean_of_the_hidden_rows(llm):
    ids = llm.tokenize(CAT)
    expected = unit(hidden_rows(llm, ids).astype(np.float64).mean(axis=0))
    [vector] = llm.embed(CAT)
    assert len(vector) == N_EMBD
    np.testing.assert_allclose(vector, expected, atol=1e-6)
    [raw] = llm.embed(CAT, normalize=False)
    assert abs(np.linalg.norm(raw) - 1.0) > 1e-3
    np.testing.assert_allclose(unit(raw), expected, atol=1e-6)


def test_embed_batch_same_and_different_texts(llm):
    vectors = llm.embed([CAT, STOCKS, CAT])
    assert len(vectors) == 3 and all(len(v) == N_EMBD for v in vectors)
    norms = np.linalg.norm(np.asarray(vectors), axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=1e-5)
    assert vectors[0] == vectors[2]
    assert np.abs(np.subtract(vectors[0], vectors[1])).max() > 1e-3
    assert llm.embed(CAT)[0] == vectors[0]   # alone or in a batch: the same


def test_embed_token_ids_and_counts(llm):
    ids = llm.tokenize(CAT)
    assert llm.embed(ids) == llm.embed(CAT)
    vectors, count = llm.embed([ids, ids[:3]], return_count=True)
    assert len(vectors) == 2 and count == len(ids) + 3
    response = llm.create_embedding([CAT, STOCKS])
    assert response["object"] == "list" and [d["index"] for d in response["data"]] == [0, 1]
    assert response["usage"]["prompt_tokens"] == len(ids) + len(llm.tokenize(STOCKS))
    assert llm.embed([]) == []


def test_embed_chunked_prompt_equals_one_batch(smollm2_path, llm):
    text = " ".join([CAT, STOCKS] * 4)
    with LLM(str(smollm2_path), n_ctx=256, n_parallel=1, n_batch=7) as small_batches:
        chunked = small_batches.embed(text)[0]
    np.testing.assert_allclose(chunked, llm.embed(text)[0], atol=1e-5)


def test_embed_truncates_to_the_context_or_refuses(smollm2_path):
    with LLM(str(smollm2_path), n_ctx=16, n_parallel=1) as small:
        long_ids = small.tokenize(" ".join([CAT] * 6))
        assert len(long_ids) > 16
        assert small.embed(long_ids) == small.embed(long_ids[:16])
        with pytest.raises(ContextLengthError):
            small.embed(long_ids, truncate=False)


def test_embed_leaves_no_cells_behind_and_keeps_generations_intact(llm):
    prompt = "Once upon a time"
    alone = llm.generate(prompt, max_tokens=24, temperature=0)
    reference = llm.embed(CAT)[0]
    used = llm.cache.n_used
    stream = llm.generate(prompt, max_tokens=24, temperature=0, stream=True)
    pieces = [next(stream)]
    vectors = []
    worker = threading.Thread(target=lambda: vectors.extend(llm.embed([CAT, STOCKS])))
    worker.start()
    pieces.extend(stream)
    worker.join(timeout=60)
    assert "".join(pieces) == alone
    assert vectors[0] == reference
    assert llm.cache.n_used == used


@pytest.mark.parametrize("bad", [3, None, b"bytes", [CAT, 3], [[1, 2.5]], [[1, -2]], [[10**9]], [True]])
def test_embed_bad_input_raises_a_typed_error(llm, bad):
    with pytest.raises(InvalidOptionError):
        llm.embed(bad)


# --------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(smollm2_path):
    with running_server(ServerConfig(parallel=2, max_queue=8, n_ctx=256)) as server:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            yield http


def test_api_embed(client, llm):
    reply = client.post("/api/embed", json={"model": MODEL, "input": [CAT, STOCKS, CAT]})
    assert reply.status_code == 200
    body = reply.json()
    assert body["model"] == MODEL and len(body["embeddings"]) == 3
    assert all(len(v) == N_EMBD for v in body["embeddings"])
    np.testing.assert_allclose(np.linalg.norm(body["embeddings"], axis=1), 1.0, atol=1e-5)
    assert body["embeddings"][0] == body["embeddings"][2] != body["embeddings"][1]
    np.testing.assert_allclose(body["embeddings"][0], llm.embed(CAT)[0], atol=1e-6)
    assert body["prompt_eval_count"] == 2 * len(llm.tokenize(CAT)) + len(llm.tokenize(STOCKS))
    assert body["total_duration"] >= body["load_duration"] >= 0 and body["total_duration"] > 0
    single = client.post("/api/embed", json={"model": MODEL, "input": CAT, "truncate": False,
                                             "options": {"num_ctx": 256}}).json()
    assert single["embeddings"] == body["embeddings"][:1]


def test_api_embed_without_input_only_loads(client):
    body = client.post("/api/embed", json={"model": MODEL}).json()
    assert body["embeddings"] == [] and body["prompt_eval_count"] == 0


def test_api_embed_dimensions_and_truncate(client):
    short = client.post("/api/embed", json={"model": MODEL, "input": CAT, "dimensions": 64}).json()
    assert len(short["embeddings"][0]) == 64
    assert abs(np.linalg.norm(short["embeddings"][0]) - 1.0) < 1e-5
    long_text = " ".join([CAT] * 60)
    reply = client.post("/api/embed", json={"model": MODEL, "input": long_text, "truncate": False})
    assert reply.status_code == 400 and "context" in reply.json()["error"]
    cut = client.post("/api/embed", json={"model": MODEL, "input": long_text})
    assert cut.status_code == 200 and cut.json()["prompt_eval_count"] == 256


def test_legacy_api_embeddings_is_not_normalised(client, llm):
    body = client.post("/api/embeddings", json={"model": MODEL, "prompt": CAT}).json()
    assert len(body["embedding"]) == N_EMBD
    assert abs(np.linalg.norm(body["embedding"]) - 1.0) > 1e-3
    np.testing.assert_allclose(unit(body["embedding"]), llm.embed(CAT)[0], atol=1e-5)
    assert client.post("/api/embeddings", json={"model": MODEL, "prompt": ""}).json() == {"embedding": []}


def test_v1_embeddings_float_and_base64(client, llm):
    floats = client.post("/v1/embeddings", json={"model": MODEL, "input": [CAT, STOCKS]}).json()
    assert floats["object"] == "list" and floats["model"] == MODEL
    assert [(d["object"], d["index"]) for d in floats["data"]] == [("embedding", 0), ("embedding", 1)]
    packed = client.post("/v1/embeddings", json={"model": MODEL, "input": [CAT, STOCKS],
                                                 "encoding_format": "base64"}).json()
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in packed["data"]]
    for vector, item in zip(decoded, floats["data"]):
        np.testing.assert_array_equal(vector, np.asarray(item["embedding"], np.float32))
    ids = llm.tokenize(CAT)
    by_ids = client.post("/v1/embeddings", json={"model": MODEL, "input": ids}).json()
    assert by_ids["data"][0]["embedding"] == floats["data"][0]["embedding"]
    assert by_ids["usage"] == {"prompt_tokens": len(ids), "total_tokens": len(ids)}
    lists = client.post("/v1/embeddings", json={"model": MODEL, "input": [ids, ids[:2]]}).json()
    assert len(lists["data"]) == 2 and lists["usage"]["prompt_tokens"] == len(ids) + 2


@pytest.mark.parametrize("path, body, param", [
    ("/api/embed", {"model": MODEL, "input": 3}, None),
    ("/api/embed", {"model": MODEL, "input": [CAT, 3]}, None),
    ("/api/embed", {"model": MODEL, "input": CAT, "truncate": "yes"}, None),
    ("/api/embed", {"model": MODEL, "input": CAT, "options": {"no_such_option": 1}}, None),
    ("/api/embed", {"model": MODEL, "input": CAT, "dimensions": 100000}, None),
    ("/api/embed", {"input": CAT}, None),
    ("/api/embeddings", {"model": MODEL, "prompt": ["a"]}, None),
    ("/v1/embeddings", {"model": MODEL, "input": ""}, "input"),
    ("/v1/embeddings", {"model": MODEL, "input": []}, "input"),
    ("/v1/embeddings", {"model": MODEL, "input": [[]]}, "input"),
    ("/v1/embeddings", {"model": MODEL, "input": [1, "a"]}, "input"),
    ("/v1/embeddings", {"model": MODEL, "input": [10**9]}, "input"),
    ("/v1/embeddings", {"model": MODEL, "input": CAT, "encoding_format": "hex"}, "encoding_format"),
    ("/v1/embeddings", {"model": MODEL, "input": CAT, "dimensions": 0}, "dimensions"),
    ("/v1/embeddings", {"model": MODEL, "input": CAT, "unknown": 1}, "unknown"),
])
def test_bad_embedding_requests_are_400(client, path, body, param):
    reply = client.post(path, json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    if path.startswith("/v1/"):
        assert error["type"] == "invalid_request_error" and error["param"] == param
    else:
        assert isinstance(error, str) and error


def test_unknown_model_is_404_in_each_shape(client):
    ollama_reply = client.post("/api/embed", json={"model": "no-such-model", "input": CAT})
    assert ollama_reply.status_code == 404 and "not found" in ollama_reply.json()["error"]
    openai_reply = client.post("/v1/embeddings", json={"model": "no-such-model", "input": CAT})
    assert openai_reply.status_code == 404 and openai_reply.json()["error"]["code"] == "model_not_found"


def test_embedding_requests_are_admitted_like_generations():
    adapter = FakeAdapter(pieces=40, delay_s=0.05)
    config = ServerConfig(parallel=1, max_queue=1, retry_after_s=2)
    with running_server(config, loader=fake_loader(adapter), served={"fake": SYNTH / "llama-f16.gguf"}) as server:
        chat = {"model": "fake", "messages": [{"role": "user", "content": "Hi"}]}
        with httpx.Client(base_url=server.url, timeout=30) as http:
            streams = [http.stream("POST", "/api/chat", json=chat) for _ in range(2)]
            responses = [stream.__enter__() for stream in streams]
            assert wait_for(lambda: server.state.admission.in_flight == 2)
            busy = http.post("/api/embed", json={"model": "fake", "input": "x"})
            assert busy.status_code == 503 and busy.headers["retry-after"] == "2"
            busy = http.post("/v1/embeddings", json={"model": "fake", "input": "x"})
            assert busy.status_code == 503 and busy.json()["error"]["type"] == "server_overloaded"
            for response, stream in zip(responses, streams):
                list(response.iter_lines())
                stream.__exit__(None, None, None)
            assert wait_for(lambda: server.state.admission.in_flight == 0)
            reply = http.post("/api/embed", json={"model": "fake", "input": ["x", "y"]})
            assert reply.json()["embeddings"] == [[1.0, 0.0, 0.0]] * 2 and reply.json()["prompt_eval_count"] == 2
            assert server.state.admission.in_flight == 0
            assert server.state.registry.get_loaded("fake").active == 0


# --------------------------------------------------------------------------------------
# Pooling per request, dimensions out of range
# --------------------------------------------------------------------------------------


def test_pooling_field(client, llm):
    body = client.post("/api/embed", json={"model": MODEL, "input": [CAT, STOCKS], "pooling": "last"}).json()
    assert body["embeddings"] == llm.embed([CAT, STOCKS], pooling="last")
    tokens = client.post("/api/embed", json={"model": MODEL, "input": CAT, "pooling": "none"}).json()
    assert tokens["embeddings"] == llm.embed(CAT, pooling="none")   # a vector per token
    assert len(tokens["embeddings"][0]) == tokens["prompt_eval_count"]
    by_number = client.post("/v1/embeddings", json={"model": MODEL, "input": CAT, "pooling": 2}).json()
    assert by_number["data"][0]["embedding"] == llm.embed(CAT, pooling="cls")[0]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/embeddings", {"model": MODEL, "input": CAT, "pooling": "none"}, "pooling"),
    ("/v1/embeddings", {"model": MODEL, "input": CAT, "pooling": "max"}, "pooling"),
    ("/v1/embeddings", {"model": MODEL, "input": CAT, "dimensions": N_EMBD + 1}, "dimensions"),
    ("/api/embed", {"model": MODEL, "input": CAT, "pooling": 7}, None),
    ("/v1/rerank", {"model": MODEL, "documents": ["a"]}, "query"),
    ("/v1/rerank", {"model": MODEL, "query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"model": MODEL, "query": "q", "documents": ["a", 3]}, "documents"),
    ("/v1/rerank", {"model": MODEL, "query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
    ("/v1/rerank", {"model": MODEL, "query": "q", "documents": ["a"], "extra": 1}, "extra"),
])
def test_bad_pooling_dimensions_and_rerank_requests_are_400(client, path, body, param):
    reply = client.post(path, json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    if path.startswith("/v1/"):
        assert error["param"] == param
    else:
        assert isinstance(error, str) and error


# --------------------------------------------------------------------------------------
# Reranking: llama-server's /v1/rerank and /rerank
# --------------------------------------------------------------------------------------

QUERY = "What do cats like to eat?"
DOCS = ["Cats are obligate carnivores and like fish and meat.", "The stock market fell on Monday.",
        "Kittens drink milk.", "Paris is the capital of France."]


def test_v1_rerank_in_llama_server_shape(client, llm):
    body = client.post("/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": DOCS}).json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert body["results"] == llm.rerank(QUERY, DOCS)
    scores = [r["relevance_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True) and sorted(r["index"] for r in body["results"]) == [0, 1, 2, 3]
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == llm.rerank(
        QUERY, DOCS, return_count=True)[1]
    top = client.post("/rerank", json={"model": MODEL, "query": QUERY, "documents": DOCS, "top_n": 2}).json()
    assert top["results"] == body["results"][:2]


def test_rerank_tei_shape(client, llm):
    body = client.post("/rerank", json={"model": MODEL, "query": QUERY, "texts": DOCS, "return_text": True}).json()
    expected = llm.rerank(QUERY, DOCS)
    assert body == [{"index": r["index"], "score": r["relevance_score"], "text": DOCS[r["index"]]} for r in expected]


# --------------------------------------------------------------------------------------
# An embedding model: listed as one, refuses text
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedder_server(tmp_path_factory):
    from gguf import GGUFValueType
    from model_parity import rewrite

    path = rewrite(tmp_path_factory.mktemp("embedder"), "qwen3-q4_1",
                   meta={"qwen3.pooling_type": (1, GGUFValueType.INT32)})
    with running_server(ServerConfig(parallel=1, max_queue=4, n_ctx=128), served={"embedder": path}) as server:
        yield server


def test_embedding_model_shows_embedding_and_refuses_text(embedder_server):
    with httpx.Client(base_url=embedder_server.url, timeout=120) as http:
        show = http.post("/api/show", json={"model": "embedder"}).json()
        assert show["capabilities"] == ["embedding"]
        reply = http.post("/api/embed", json={"model": "embedder", "input": [CAT, STOCKS]})
        assert reply.status_code == 200 and len(reply.json()["embeddings"]) == 2
        ask = [{"role": "user", "content": "Hi"}]
        for path, body in [("/api/generate", {"prompt": "Hi"}), ("/api/chat", {"messages": ask}),
                           ("/v1/chat/completions", {"messages": ask}), ("/v1/completions", {"prompt": "Hi"})]:
            reply = http.post(path, json={"model": "embedder", "stream": False, **body})
            assert reply.status_code == 400, (path, reply.text)
            error = reply.json()["error"]
            assert "does not support" in (error if isinstance(error, str) else error["message"])
