"""HTTP errors, each API in its own shape.

Ollama answers ``{"error": "message"}``; OpenAI answers ``{"error": {"message",
"type", "param", "code"}}``. Which one a response takes follows the path: ``/v1/...``
is OpenAI's, everything else Ollama's. pyengine's typed errors map to 4xx statuses
(a user's mistake); only an unexpected failure is a 500.
"""

from __future__ import annotations

import json
from typing import Mapping

from starlette.responses import JSONResponse, Response

from pyengine.errors import (
    ContextLengthError,
    ModelNotFoundError,
    NativeError,
    PyEngineError,
    StoreError,
    UnsupportedError,
)

OPENAI_PREFIX = "/v1/"


class HTTPError(Exception):
    """An error answered with `status` and a message (and optional headers)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})


def from_engine_error(exc: PyEngineError) -> HTTPError:
    """The HTTP error for one of pyengine's typed errors."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, ModelNotFoundError):
        return HTTPError(404, message, param="model", code="model_not_found")
    if isinstance(exc, ContextLengthError):
        return HTTPError(400, message, param="messages", code="context_length_exceeded")
    if isinstance(exc, StoreError):
        return HTTPError(502, message, code="store_error")
    if isinstance(exc, NativeError):
        return HTTPError(500, message, code="native_error")
    if isinstance(exc, UnsupportedError):
        return HTTPError(400, message, code="unsupported")
    return HTTPError(400, message)


def is_openai_path(path: str) -> bool:
    return path.startswith(OPENAI_PREFIX) or path == OPENAI_PREFIX.rstrip("/")


def error_body(path: str, status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    if not is_openai_path(path):
        return {"error": message}
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 401:
        code = code or "invalid_api_key"
    elif status == 503:
        kind = "server_overloaded"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(path: str, error: HTTPError) -> Response:
    body = error_body(path, error.status, error.message, error.param, error.code)
    return JSONResponse(body, status_code=error.status, headers=error.headers)


async def send_error(scope, send, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
    """Answer a raw ASGI request with an error (used by the middlewares)."""
    body = json.dumps(error_body(scope.get("path", ""), status, message)).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


__all__ = ["HTTPError", "error_body", "error_response", "from_engine_error", "is_openai_path", "send_error"]
