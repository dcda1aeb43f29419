"""Embeddings: Ollama's /api/embed and legacy /api/embeddings, OpenAI's /v1/embeddings;
reranking: llama-server's /v1/rerank and /rerank.

Vectors are pooled as the model's file says, or as the request's `pooling` asks
(`LLM.embed`, pyengine/embedding.py); /api/embed and /v1/embeddings L2-normalise them,
the legacy endpoint does not (as Ollama). A request's inputs run together, in the
model's engine thread between two generation steps, so embeddings and generations
share one model safely.

/v1/rerank answers in llama-server's (Jina's) shape, ``{"model", "object": "list",
"usage", "results": [{"index", "relevance_score"}]}`` best first, cut to `top_n`; a
request that gives its documents as `texts` gets the TEI shape, a bare list of
``{"index", "score"}`` (with ``"text"`` when `return_text`), as llama-server does.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from pyengine.embedding import DimensionsError, pooling_name
from pyengine.errors import ContextLengthError, InvalidOptionError
from pyengine.server.common import read_fields, run_with_model, state_of
from pyengine.server.errors import HTTPError
from pyengine.server.fields import Fields
from pyengine.server.ollama import read_options
from pyengine.server.registry import KEEP, parse_keep_alive

router = APIRouter()

MAX_INPUTS = 2048                     # OpenAI's limit of inputs per request
OPENAI_FIELDS = frozenset({"model", "input", "encoding_format", "dimensions", "user", "pooling"})
OLLAMA_FIELDS = frozenset({"model", "input", "truncate", "options", "keep_alive", "dimensions", "pooling"})
RERANK_FIELDS = frozenset({"model", "query", "documents", "texts", "top_n", "return_text", "return_documents",
                           "keep_alive"})
LEGACY_FIELDS = frozenset({"model", "prompt", "options", "keep_alive"})


# --------------------------------------------------------------------------------------
# Reading inputs
# --------------------------------------------------------------------------------------


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_ollama_input(fields: Fields) -> list[str]:
    """Ollama's `input`: a text or a list of texts; absent or empty means none."""
    value = fields.data.get("input")
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or any(not isinstance(item, str) for item in value):
        raise HTTPError(400, "'input' must be a string or an array of strings", param="input")
    return fields.array("input", max_items=MAX_INPUTS)


def read_openai_input(fields: Fields) -> list[str] | list[list[int]]:
    """OpenAI's `input`: a text, a list of texts, a list of token ids or a list of such lists."""
    value = fields.data.get("input")
    if isinstance(value, str):
        if not value:
            raise HTTPError(400, "'input' must not be an empty string", param="input")
        return [value]
    if not isinstance(value, list) or not value:
        raise HTTPError(400, "'input' must be a non-empty string, array of strings, array of token ids or "
                        "array of token-id arrays", param="input")
    if all(_is_token(item) for item in value):
        return [value]
    items = fields.array("input", max_items=MAX_INPUTS)
    if all(isinstance(item, str) and item for item in items):
        return items
    if all(isinstance(item, list) and item and all(_is_token(t) for t in item) for item in items):
        return items
    raise HTTPError(400, "'input' must be a non-empty string, array of non-empty strings, array of token ids "
                    "or array of non-empty token-id arrays", param="input")


def read_dimensions(fields: Fields) -> int | None:
    return fields.integer("dimensions", low=1, high=1 << 20)


def read_keep_alive(fields: Fields) -> Any:
    value = fields.data.get("keep_alive")
    return KEEP if value is None else parse_keep_alive(value)


def read_pooling(fields: Fields, *, openai: bool = False) -> str | None:
    """The request's `pooling` (a name or llama.cpp's number); None: the model's own."""
    value = fields.data.get("pooling")
    if value is None:
        return None
    try:
        pooling = pooling_name(value)
    except InvalidOptionError as exc:
        raise HTTPError(400, str(exc), param="pooling") from None
    if openai and pooling == "none":
        raise HTTPError(400, "pooling 'none' gives a vector per token, which OpenAI's embeddings cannot "
                        "carry; use /api/embed or another pooling", param="pooling")
    return pooling


async def embed(request: Request, model: str, inputs: list, *, normalize: bool = True, truncate: bool = True,
                keep_alive: Any = KEEP, pooling: str | None = None,
                dimensions: int | None = None) -> tuple[list, int, float]:
    """Vectors, token count and load seconds; the engine's typed errors as 400s on `input`
    (on `dimensions` for a size out of the model's range)."""
    def work(adapter):
        return adapter.embed(inputs, normalize=normalize, truncate=truncate, pooling=pooling, dimensions=dimensions)

    try:
        (vectors, count), load_seconds = await run_with_model(state_of(request), model, work, keep_alive)
    except ContextLengthError as exc:
        raise HTTPError(400, str(exc), param="input", code="context_length_exceeded") from None
    except DimensionsError as exc:
        raise HTTPError(400, str(exc), param="dimensions") from None
    except InvalidOptionError as exc:
        raise HTTPError(400, str(exc), param="input") from None
    return vectors, count, load_seconds


# --------------------------------------------------------------------------------------
# Ollama
# --------------------------------------------------------------------------------------


@router.post("/api/embed")
async def api_embed(request: Request) -> Response:
    started = time.perf_counter()
    fields = await read_fields(request)
    fields.reject_unknown(OLLAMA_FIELDS)
    model = fields.string("model", required=True)
    inputs = read_ollama_input(fields)
    truncate = fields.boolean("truncate", True)
    dimensions = read_dimensions(fields)
    pooling = read_pooling(fields)
    read_options(fields)  # checked like /api/chat's; none of them changes an embedding
    keep_alive = read_keep_alive(fields)
    vectors, count, load_seconds = await embed(request, model, inputs, truncate=truncate, keep_alive=keep_alive,
                                               pooling=pooling, dimensions=dimensions)
    return JSONResponse({
        "model": model, "embeddings": vectors,
        "total_duration": _ns(time.perf_counter() - started), "load_duration": _ns(load_seconds),
        "prompt_eval_count": count,
    })


@router.post("/api/embeddings")
async def api_embeddings(request: Request) -> Response:
    fields = await read_fields(request)
    fields.reject_unknown(LEGACY_FIELDS)
    model = fields.string("model", required=True)
    prompt = fields.string("prompt", "")
    read_options(fields)
    keep_alive = read_keep_alive(fields)
    vectors, _, _ = await embed(request, model, [prompt] if prompt else [], normalize=False, keep_alive=keep_alive)
    return JSONResponse({"embedding": vectors[0] if vectors else []})


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


# --------------------------------------------------------------------------------------
# OpenAI
# --------------------------------------------------------------------------------------


@router.post("/v1/embeddings")
async def v1_embeddings(request: Request) -> Response:
    fields = await read_fields(request)
    fields.reject_unknown(OPENAI_FIELDS)
    model = fields.string("model", required=True)
    inputs = read_openai_input(fields)
    encoding = fields.string("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise HTTPError(400, "'encoding_format' must be \"float\" or \"base64\"", param="encoding_format")
    dimensions = read_dimensions(fields)
    pooling = read_pooling(fields, openai=True)
    fields.string("user")
    vectors, count, _ = await embed(request, model, inputs, pooling=pooling, dimensions=dimensions)
    data = [{"object": "embedding", "index": index, "embedding": _encoded(vector, encoding)}
            for index, vector in enumerate(vectors)]
    return JSONResponse({"object": "list", "data": data, "model": model,
                         "usage": {"prompt_tokens": count, "total_tokens": count}})


def _encoded(vector: list[float], encoding: str) -> list[float] | str:
    """A vector as floats, or as base64 of little-endian float32 (what the openai client asks for)."""
    if encoding == "float":
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


# --------------------------------------------------------------------------------------
# Reranking (llama-server)
# --------------------------------------------------------------------------------------


@router.post("/v1/rerank")
@router.post("/rerank")
@router.post("/v1/reranking")
@router.post("/reranking")
async def rerank(request: Request) -> Response:
    fields = await read_fields(request)
    fields.reject_unknown(RERANK_FIELDS)
    model = fields.string("model", required=True)
    query = fields.string("query")
    if query is None:
        raise HTTPError(400, "\"query\" must be provided", param="query")
    tei = "texts" in fields.data
    name = "texts" if tei else "documents"
    documents = fields.array(name, max_items=MAX_INPUTS)
    if not documents or any(not isinstance(d, str) for d in documents):
        raise HTTPError(400, f"\"{name}\" must be a non-empty string array", param=name)
    top_n = fields.integer("top_n", len(documents), low=0)
    return_text = bool(fields.boolean("return_text", False))
    fields.boolean("return_documents")
    keep_alive = read_keep_alive(fields)

    def work(adapter):
        return adapter.rerank(query, documents, top_n=top_n)

    try:
        (ranked, count), _ = await run_with_model(state_of(request), model, work, keep_alive)
    except ContextLengthError as exc:
        raise HTTPError(400, str(exc), param=name, code="context_length_exceeded") from None
    except InvalidOptionError as exc:
        raise HTTPError(400, str(exc), param=name) from None
    if tei:
        return JSONResponse([{"index": r["index"], "score": r["relevance_score"],
                              **({"text": documents[r["index"]]} if return_text else {})} for r in ranked])
    return JSONResponse({"model": model, "object": "list",
                         "usage": {"prompt_tokens": count, "total_tokens": count}, "results": ranked})


__all__ = ["router"]
