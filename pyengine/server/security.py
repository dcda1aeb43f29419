"""ASGI middlewares that keep a local server local and its inputs bounded.

* :class:`HostCheck`: on a loopback bind, requests must name a loopback host (a web
  page cannot reach the server through DNS rebinding).
* :class:`BodyLimit`: bodies over the limit get 413 before the app sees them.
* :class:`ApiKeyAuth`: with an API key set, every request but ``GET /`` and CORS
  preflights must carry ``Authorization: Bearer <key>``.
* :func:`add_cors`: browsers may call from loopback origins (and the ones allowed
  explicitly), nothing else.
"""

from __future__ import annotations

import hmac
import re

from starlette.middleware.cors import CORSMiddleware

from pyengine.server.errors import send_error

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})
LOOPBACK_ORIGIN_RE = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d{1,5})?"
PUBLIC_PATHS = frozenset({"/"})
DRAIN_LIMIT_BYTES = 128 * 1024 * 1024  # read (and drop) at most this much of a refused body


class HostCheck:
    """403 for a Host header outside `allowed` (None: any host)."""

    def __init__(self, app, allowed: frozenset[str] | None) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and self.allowed is not None:
            host = _header(scope, b"host")
            if host is not None and _host_name(host) not in self.allowed:
                await send_error(scope, send, 403, f"host {host!r} is not allowed; use 127.0.0.1 or localhost")
                return
        await self.app(scope, receive, send)


def _host_name(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return re.sub(r":\d*$", "", host)


class BodyLimit:
    """Reads the whole request body first (at most `max_bytes`) and replays it to the app."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send, more=message.get("more_body", False))
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _refuse(self, scope, receive, send, more: bool = True) -> None:
        # Read the rest (up to a cap) so the client gets to see the answer instead of a reset.
        drained = 0
        while more and drained < DRAIN_LIMIT_BYTES:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            drained += len(message.get("body", b""))
            more = message.get("more_body", False)
        await send_error(scope, send, 413, f"the request body is larger than {self.max_bytes} bytes")


def _replay(body: bytes, receive):
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # afterwards: the real channel, which reports the disconnect

    return replay


class ApiKeyAuth:
    """401 unless the request carries the key as a Bearer token."""

    def __init__(self, app, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and not self._exempt(scope):
            given = _header(scope, b"authorization")
            if given is None or not hmac.compare_digest(given.strip().encode("latin-1"), self.expected):
                message = "missing API key" if given is None else "invalid API key"
                await send_error(scope, send, 401, f"{message}; send 'Authorization: Bearer <key>'",
                                 headers={"WWW-Authenticate": "Bearer"})
                return
        await self.app(scope, receive, send)

    @staticmethod
    def _exempt(scope) -> bool:
        return scope["method"] == "OPTIONS" or (scope["path"] in PUBLIC_PATHS and scope["method"] in ("GET", "HEAD"))


def add_cors(app, extra_origins: tuple[str, ...]) -> None:
    """Allow loopback origins and `extra_origins` ("*" allows any)."""
    origins = [origin.rstrip("/") for origin in extra_origins]
    app.add_middleware(
        CORSMiddleware,
        allow_origins=["*"] if "*" in origins else origins,
        allow_origin_regex=LOOPBACK_ORIGIN_RE,
        allow_methods=["GET", "HEAD", "POST", "DELETE", "OPTIONS"],
        allow_headers=["*"],
        max_age=600,
    )


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


__all__ = ["ApiKeyAuth", "BodyLimit", "HostCheck", "LOOPBACK_NAMES", "add_cors"]
