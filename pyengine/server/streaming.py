"""Streaming replies that stop generating when the client goes away.

:class:`GenerationResponse` sends an async iterator of byte chunks while watching
the connection: when the client disconnects, the iterator is cancelled (its
``finally`` cancels the generation) and ``on_close`` runs; it runs after a normal
end too, so a request's model lease and queue ticket are always given back.
:func:`collect` does the same for a reply that is sent in one piece.
"""

from __future__ import annotations

import json
import logging
from typing import Any, AsyncIterator, Callable

import anyio
from starlette.responses import Response

from pyengine.errors import PyEngineError
from pyengine.server.errors import from_engine_error

log = logging.getLogger("pyengine.server")

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"


class GenerationResponse(Response):
    """A streamed response tied to a generation (see the module docs)."""

    def __init__(self, body: AsyncIterator[bytes], media_type: str, on_close: Callable[[], None],
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(content=None, status_code=200, headers=headers, media_type=media_type)
        # A length was computed for the empty content; a stream has none.
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self.body_iterator = body
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(_cancel_on_disconnect, receive, group.cancel_scope)
                await self._send_all(send)
                group.cancel_scope.cancel()
        except OSError:
            pass  # the client went away while we were writing
        finally:
            try:
                with anyio.CancelScope(shield=True):
                    await self.body_iterator.aclose()
            finally:
                self.on_close()

    async def _send_all(self, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for chunk in self.body_iterator:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _cancel_on_disconnect(receive, scope: anyio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def collect(run: Any, receive) -> Any | None:
    """Run a reply to its end and return its result, or None if the client disconnected
    first (the generation is then cancelled)."""
    result = None
    error: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(_cancel_on_disconnect, receive, group.cancel_scope)
        try:
            async for _event in run:
                pass
            result = run.result
        except Exception as exc:  # raised below, outside the group (which would wrap it)
            error = exc
        finally:
            if result is None:
                run.cancel()
        group.cancel_scope.cancel()
    if error is not None:
        raise error
    return result


def streamed_reply(body: AsyncIterator[bytes], media_type: str, started: Any, keep_alive: Any) -> GenerationResponse:
    """A started reply streamed as NDJSON or SSE; its end, however it comes, gives back
    what the reply holds (`started.close`)."""
    headers = {"Cache-Control": "no-cache"} if media_type == SSE else None
    return GenerationResponse(body, media_type, on_close=lambda: started.close(keep_alive), headers=headers)


async def collect_started(started: Any, receive, keep_alive: Any, gather=collect) -> Any | None:
    """The whole result of a started reply (None: the client left first, and the route
    answers 499), what the reply holds given back whatever happens. `gather(run, receive)`
    runs it: `collect` by default."""
    try:
        return await gather(started.run, receive)
    finally:
        started.close(keep_alive)


def ndjson(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


def sse(obj: dict | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


def stream_error_message(exc: BaseException) -> str:
    """What to tell a client whose stream failed after its headers were sent."""
    if isinstance(exc, PyEngineError):
        return from_engine_error(exc).message
    log.exception("generation failed", exc_info=exc)
    return f"internal error: {type(exc).__name__}: {exc}"


__all__ = ["GenerationResponse", "NDJSON", "SSE", "collect", "ndjson", "sse", "stream_error_message"]
