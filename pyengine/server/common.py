"""What both APIs share: the server's state, reading a body, and starting a reply
(admission, then the model's lease, then the generation) so that every exit path
gives back what it took."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from pyengine.errors import PyEngineError, UnsupportedCapabilityError
from pyengine.server.config import ServerConfig
from pyengine.server.errors import HTTPError, from_engine_error
from pyengine.server.fields import Fields, parse_json_object
from pyengine.server.metrics import Metrics
from pyengine.server.registry import KEEP, Admission, Lease, ModelRegistry, Ticket
from pyengine.server.security import check_json_content_type


@dataclass
class ServerState:
    config: ServerConfig
    registry: ModelRegistry
    admission: Admission
    metrics: Metrics = field(default_factory=Metrics)


def state_of(request: Request) -> ServerState:
    return request.app.state.pyengine


async def read_fields(request: Request) -> Fields:
    check_json_content_type(request.headers.get("content-type"), "origin" in request.headers)
    return Fields(parse_json_object(await request.body()))


@dataclass
class Started:
    """A reply in progress and what it holds; `close` gives both back (idempotent)."""

    ticket: Ticket
    lease: Lease
    run: Any
    metrics: Metrics | None = None

    def close(self, keep_alive: Any = KEEP) -> None:
        try:
            self.run.cancel()  # a no-op once it has finished
        finally:
            self.ticket.release()
            self.lease.release(keep_alive)
            if self.metrics is not None:
                runs = getattr(self.run, "runs", None) or [self.run]  # n > 1: each choice's run
                self.metrics.observe_replies([getattr(run, "result", None) for run in runs])
                self.metrics = None  # counted once


def admit(state: ServerState) -> Ticket:
    ticket = state.admission.try_enter()
    if ticket is None:
        retry = str(state.config.retry_after_s)
        raise HTTPError(503, f"the server is busy ({state.admission.capacity} requests in flight); retry later",
                        code="server_busy", headers={"Retry-After": retry})
    return ticket


async def admit_and_lease(state: ServerState, model: Any, num_ctx: Any = None,
                          exact: bool = True) -> tuple[Any, Any]:
    """Admit the request and lease its model (loading it if needed) with room for
    `num_ctx` tokens; the ticket is given back if the model cannot be had."""
    ticket = admit(state)
    try:
        return ticket, await state.registry.lease(model, num_ctx, exact=exact)
    except BaseException:
        ticket.release()
        raise


async def start_reply(state: ServerState, model: Any, start: Callable[[Any], Any],
                      options: dict | None = None) -> Started:
    """Admit the request, lease its model (loading it if needed) and start the reply.
    `options` (the dict `start` passes on) picks the instance by its num_ctx; when the
    instance is larger than the request asked for, its num_ctx is set to bound it."""
    num_ctx = options.get("num_ctx") if options else None
    ticket, lease = await admit_and_lease(state, model, num_ctx, exact=options is None)
    if options is not None and lease.n_ctx < lease.entry.n_ctx:
        options["num_ctx"] = lease.n_ctx
    try:
        run = await run_in_threadpool(start, lease.adapter)
    except UnsupportedCapabilityError as exc:  # named as the request named the model, as Ollama does
        ticket.release()
        lease.release()
        raise exc.for_model(model if isinstance(model, str) else exc.model) from None
    except BaseException:
        ticket.release()
        lease.release()
        raise
    return Started(ticket, lease, run, state.metrics)


async def run_with_model(state: ServerState, model: Any, work: Callable[[Any], Any],
                         keep_alive: Any = KEEP, num_ctx: Any = None) -> tuple[Any, float]:
    """Admit the request, lease an instance of its model of exactly `num_ctx` (None: the
    default size) and run `work(adapter)` in a worker thread; its result and the seconds
    the model took to load (0 when it was loaded already)."""
    ticket, lease = await admit_and_lease(state, model, num_ctx)
    try:
        return await run_in_threadpool(work, lease.adapter), lease.load_seconds
    finally:
        ticket.release()
        lease.release(keep_alive)


def as_http_error(exc: BaseException) -> HTTPError | None:
    if isinstance(exc, HTTPError):
        return exc
    if isinstance(exc, PyEngineError):
        return from_engine_error(exc)
    return None


__all__ = ["ServerState", "Started", "admit", "as_http_error", "read_fields", "run_with_model", "start_reply",
           "state_of"]
