"""Embeddings: Ollama's /api/embed and legacy /api/embeddings, OpenAI's /v1/embeddings.

Vectors are the mean of the model's final-norm hidden states over the input's tokens
(`LLM.embed`); /api/embed and /v1/embeddings L2-normalise them, the legacy endpoint
does not (as Ollama). Each input is run in the model's engine thread between two
generation steps, so embeddings and generations share one model safely.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from pyengine.errors import ContextLengthError, InvalidOptionError
from pyengine.server.common import read_fields, run_with_model, state_of
from pyengine.server.errors import HTTPError
from pyengine.server.fields import Fields
from pyengine.server.ollama import read_options
from pyengine.server.registry import KEEP, parse_keep_alive

router = APIRouter()

MAX_INPUTS = 2048                     # OpenAI's limit of inputs per request
OPENAI_FIELDS = frozenset({"model", "input", "encoding_format", "dimensions", "user"})
OLLAMA_FIELDS = frozenset({"model", "input", "truncate", "options", "keep_alive", "dimensions"})
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


def shorten(vectors: list[list[float]], dimensions: int | None) -> list[list[float]]:
    """The first `dimensions` values of each unit vector, scaled back to unit length
    (OpenAI's and Ollama's `dimensions`)."""
    if dimensions is None:
        return vectors
    out = []
    for vector in vectors:
        if dimensions > len(vector):
            raise HTTPError(400, f"'dimensions' must be at most the model's embedding size ({len(vector)})",
                            param="dimensions")
        head = np.asarray(vector[:dimensions], np.float64)
        norm = float(np.linalg.norm(head))
        out.append((head / norm if norm > 0 else head).astype(np.float32).tolist())
    return out


async def embed(request: Request, model: str, inputs: list, *, normalize: bool = True, truncate: bool = True,
                keep_alive: Any = KEEP) -> tuple[list[list[float]], int, float]:
    """Vectors, token count and load seconds; the engine's typed errors as 400s on `input`."""
    def work(adapter):
        return adapter.embed(inputs, normalize=normalize, truncate=truncate)

    try:
        (vectors, count), load_seconds = await run_with_model(state_of(request), model, work, keep_alive)
    except ContextLengthError as exc:
        raise HTTPError(400, str(exc), param="input", code="context_length_exceeded") from None
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
    read_options(fields)  # checked like /api/chat's; none of them changes an embedding
    keep_alive = read_keep_alive(fields)
    vectors, count, load_seconds = await embed(request, model, inputs, truncate=truncate, keep_alive=keep_alive)
    return JSONResponse({
        "model": model, "embeddings": shorten(vectors, dimensions),
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
    fields.string("user")
    vectors, count, _ = await embed(request, model, inputs)
    vectors = shorten(vectors, dimensions)
    data = [{"object": "embedding", "index": index, "embedding": _encoded(vector, encoding)}
            for index, vector in enumerate(vectors)]
    return JSONResponse({"object": "list", "data": data, "model": model,
                         "usage": {"prompt_tokens": count, "total_tokens": count}})


def _encoded(vector: list[float], encoding: str) -> list[float] | str:
    """A vector as floats, or as base64 of little-endian float32 (what the openai client asks for)."""
    if encoding == "float":
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


__all__ = ["router"]
