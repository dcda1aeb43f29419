"""ASGI middlewares that keep a local server local and its inputs bounded.

* :class:`HostCheck`: on a loopback bind, requests must name a loopback host (a web
  page cannot reach the server through DNS rebinding).
* :class:`BodyLimit`: bodies over the limit get 413 before the app sees them.
* :class:`ApiKeyAuth`: with an API key set, every request but ``GET /`` (and the chat page's files),
  ``GET /health`` and CORS preflights must carry ``Authorization: Bearer <key>``.
* :class:`OriginCheck`: a request that a browser sent from a page of another origin
  gets 403 on every route and method, preflighted or not: a page cannot make the
  server generate or pull through a "simple" (text/plain, form) POST either.
* :func:`add_cors`: browsers may call from loopback origins (and the ones allowed
  explicitly), nothing else.
* :func:`check_json_content_type`: JSON bodies must say so.
"""

from __future__ import annotations

import hmac
import re

from starlette.middleware.cors import CORSMiddleware

from pyengine.server.errors import HTTPError, send_error

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})
LOOPBACK_ORIGIN_RE = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d{1,5})?"
# Content types a browser sends cross-site without asking first (no CORS preflight).
_SIMPLE_TYPES = ("text/plain", "multipart/form-data", "application/x-www-form-urlencoded")
PUBLIC_PATHS = frozenset({"/", "/health"})  # /health: probes carry no key (as llama-server's)
# The chat page and its files carry no secrets; the API calls the page makes need the key.
PUBLIC_PATHS |= {"/static/chat.js", "/static/chat.css"}
DRAIN_LIMIT_BYTES = 128 * 1024 * 1024  # read (and drop) at most this much of a refused body
# Bodies streamed to disk by their route, which bounds them itself (config.max_blob_bytes).
STREAMED_PREFIXES = ("/api/blobs/",)


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
        if scope["type"] != "http" or scope["path"].startswith(STREAMED_PREFIXES):
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


class OriginCheck:
    """403 for a request whose Origin header names a page the server does not trust.

    Browsers put Origin on every cross-origin request and on every POST; a request
    without one comes from a program (curl, a client library), which the host check
    and the API key govern. Trusted: loopback origins, `allowed` ("*": any), and the
    server's own origin (the Host the request was sent to: the chat page). "null"
    (sandboxed frames, file: pages, some redirects) is never trusted."""

    def __init__(self, app, allowed: tuple[str, ...]) -> None:
        self.app = app
        self.allowed = frozenset(origin.rstrip("/").lower() for origin in allowed)
        self.loopback = re.compile(LOOPBACK_ORIGIN_RE, re.IGNORECASE)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            origin = _header(scope, b"origin")
            if origin is not None and not self.trusted(origin.strip(), _header(scope, b"host")):
                await send_error(scope, send, 403,
                                 f"requests from the web page at origin {origin!r} are not allowed; "
                                 f"start the server with --allow-origin {origin} to allow them")
                return
        await self.app(scope, receive, send)

    def trusted(self, origin: str, host: str | None) -> bool:
        normalized = origin.rstrip("/").lower()
        if normalized == "null":
            return False
        if "*" in self.allowed or normalized in self.allowed or self.loopback.fullmatch(origin):
            return True
        return host is not None and normalized.split("://", 1)[-1] == host.strip().lower()


def check_json_content_type(content_type: str | None, has_origin: bool) -> None:
    """Raise HTTPError 415 unless a JSON body is labelled as one.

    application/json (or any +json type) is what clients send; a missing type is taken
    as JSON. Form-encoded bodies are accepted from programs only, since `curl -d`
    labels everything that way; from a browser (an Origin header) they are refused, as
    text/plain and multipart always are: those are the types a page may send to any
    server without a preflight."""
    if content_type is None or not content_type.strip():
        return
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        return
    if media == "application/x-www-form-urlencoded" and not has_origin:
        return
    advice = "send the body with 'Content-Type: application/json' (curl: --json, or -H 'Content-Type: application/json')"
    if media in _SIMPLE_TYPES:
        raise HTTPError(415, f"the request body is JSON but is labelled {media!r}; {advice}")
    raise HTTPError(415, f"unsupported content type {media!r}; {advice}")


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


__all__ = ["ApiKeyAuth", "BodyLimit", "HostCheck", "LOOPBACK_NAMES", "OriginCheck", "add_cors",
           "check_json_content_type"]
