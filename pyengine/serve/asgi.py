"""Running the server's ASGI app inside a replica without an HTTP server of its own:
its lifespan (:class:`Lifespan`) and one request from a parcel of plain data
(:func:`call_app`), whose response comes back as ASGI messages to relay."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import AsyncIterator

log = logging.getLogger("pyengine.server")
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_DRAIN_S = 5.0  # how long a request the client left may take to wind down before it is cancelled


class Lifespan:
    """Starts an ASGI app's lifespan and shuts it down."""

    def __init__(self, app) -> None:
        self.app = app
        self.state: dict = {}
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._outbox: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        scope = {"type": "lifespan", "asgi": _ASGI, "state": self.state}
        self._task = asyncio.create_task(self.app(scope, self._inbox.get, self._outbox.put))
        await self._exchange("lifespan.startup")

    async def stop(self) -> None:
        if self._task is None or self._task.done():
            return
        try:
            await self._exchange("lifespan.shutdown")
        finally:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task

    async def _exchange(self, event: str) -> None:
        await self._inbox.put({"type": event})
        reply = asyncio.ensure_future(self._outbox.get())
        await asyncio.wait([reply, self._task], return_when=asyncio.FIRST_COMPLETED)
        if not reply.done():
            reply.cancel()
            self._task.result()  # raises what the app raised
            raise RuntimeError(f"the app's lifespan ended without answering {event}")
        message = reply.result()
        if message["type"].endswith(".failed"):
            raise RuntimeError(f"{event} failed: {message.get('message', '')}")


def http_scope(parcel: dict, state: dict) -> dict:
    """The ASGI scope of a request sent as a parcel (see :func:`parcel_of`)."""
    return {
        "type": "http", "asgi": _ASGI, "http_version": "1.1", "method": parcel["method"],
        "scheme": parcel["scheme"], "path": parcel["path"], "raw_path": parcel["path"].encode(),
        "root_path": "", "query_string": parcel["query_string"],
        "headers": [(k, v) for k, v in parcel["headers"]], "client": parcel["client"],
        "server": parcel["server"], "state": dict(state),
    }


async def call_app(app, parcel: dict, state: dict, extra_headers: list[tuple[bytes, bytes]] = ()
                   ) -> AsyncIterator[dict]:
    """Run one request through `app`; yield its response's ASGI messages (the start with
    `extra_headers` added). Leaving early (the client went away) tells the app the client
    disconnected, as a server would."""
    outbox: asyncio.Queue = asyncio.Queue()
    finished = asyncio.Event()
    body_given = False

    async def receive() -> dict:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": parcel["body"], "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    async def run() -> None:
        try:
            await app(http_scope(parcel, state), receive, outbox.put)
        except Exception:  # the app has answered 500 already when it could
            log.exception("the app failed on %s %s", parcel["method"], parcel["path"])
        finally:
            await outbox.put(None)

    task = asyncio.create_task(run())
    started = False
    try:
        while True:
            message = await outbox.get()
            if message is None:
                if not started:
                    yield {"type": "http.response.start", "status": 500, "headers": list(extra_headers)}
                yield {"type": "http.response.body", "body": b"", "more_body": False}
                return
            if message["type"] == "http.response.start":
                started = True
                message = {**message, "headers": list(message.get("headers", ())) + list(extra_headers)}
            yield message
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                return
    finally:
        finished.set()
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), _DRAIN_S)
        if not task.done():
            task.cancel()


__all__ = ["Lifespan", "call_app", "http_scope"]
