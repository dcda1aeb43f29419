"""pyengine on a Ray cluster with Ray Serve (``pip install "pyengine[ray]"``).

    from ray import serve
    from pyengine.serve.ray import deployment
    serve.run(deployment("smollm2-135m", replicas=2, threads=1), route_prefix="/")

The application has two deployments:

* ``PyengineReplica``: each replica owns one engine (its model loaded once, at start-up)
  and runs the single-process server's FastAPI app (:func:`pyengine.server.create_app`),
  so the Ollama and OpenAI routes, limits and errors are the same. Every response names
  the replica in ``X-Pyengine-Replica``.
* ``PyengineIngress``: Serve's HTTP entry. It reads the request, computes its prefix keys
  (:mod:`pyengine.serve.prefix`) and hands it to a replica chosen by
  :class:`PrefixAffinityRouter`: the one that served the longest prefix of the prompt, as
  long as it has a free slot, else the least loaded. It relays the response as it comes;
  a replica lost before the response's first bytes is replaced by another (the client sees
  nothing of it), one lost mid-stream ends the stream with an error event.

Back-pressure: a replica takes the single server's ``parallel`` requests at once; the
requests beyond wait at the ingress for the first replica with a free slot (so a replica
that dies takes none of them along), up to ``max_queue`` of them (at least ``parallel``,
which Serve's routing of a burst needs); more get a 503 with Retry-After. With ``autoscale=(lo, hi)``
Serve keeps about ``parallel`` requests in flight per replica between lo and hi replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections import OrderedDict
from dataclasses import asdict
from typing import Any, AsyncIterator

import ray
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError
from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica
from starlette.requests import Request
from starlette.responses import Response

import pyengine
from pyengine.errors import InvalidOptionError
from pyengine.serve.asgi import Lifespan, call_app
from pyengine.serve.prefix import prefix_keys
from pyengine.server.config import ServerConfig
from pyengine.server.errors import HTTPError, error_body, error_response
from pyengine.server.streaming import NDJSON, SSE, ndjson, sse

log = logging.getLogger("pyengine.server")

REPLICA_HEADER = "X-Pyengine-Replica"
FAILOVER_S = 8.0            # how long a request not yet answered keeps looking for a live replica
MAX_PREFIX_OWNERS = 1 << 16  # prefix keys the router remembers (least recently used dropped first)


# --------------------------------------------------------------------------------------
# routing
# --------------------------------------------------------------------------------------


class PrefixAffinityRouter(FIFOMixin, RequestRouter):
    """Sends a request to the replica that served the longest prefix of its prompt while
    that replica has a free generation slot (or is no busier than the others), else to the
    least loaded replica (ties taken in turn, so that sequential requests spread too)."""

    def initialize_state(self, slots: int = 4, max_owners: int = MAX_PREFIX_OWNERS) -> None:
        self._slots = slots
        self._max_owners = max_owners
        self._owners: OrderedDict[int, ReplicaID] = OrderedDict()
        self._turn = 0

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        load = {r.replica_id: self.replica_queue_len_cache.get(r.replica_id) or 0 for r in candidate_replicas}
        count = len(candidate_replicas)
        self._turn += 1
        ranked = sorted(range(count), key=lambda i: (load[candidate_replicas[i].replica_id], (i - self._turn) % count))
        ranked = [candidate_replicas[i] for i in ranked]
        owner = self._owner(_keys_of(pending_request), {r.replica_id: r for r in candidate_replicas})
        if owner is not None and (load[owner.replica_id] < self._slots
                                  or load[owner.replica_id] <= load[ranked[0].replica_id]):
            ranked = [owner] + [r for r in ranked if r is not owner]
        return [[r] for r in ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        for key in _keys_of(pending_request):
            self._owners[key] = replica_id
            self._owners.move_to_end(key)
        while len(self._owners) > self._max_owners:
            self._owners.popitem(last=False)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        for key in [key for key, owner in self._owners.items() if owner == replica_id]:
            del self._owners[key]

    def _owner(self, keys: list[int], replicas: dict) -> RunningReplica | None:
        for key in reversed(keys):  # the longest shared prefix first
            owner = self._owners.get(key)
            if owner in replicas:
                return replicas[owner]
        return None


class RoundRobinRouter(FIFOMixin, RequestRouter):
    """Each request to the next replica in turn, whatever its prompt (a baseline to compare
    :class:`PrefixAffinityRouter` with: ``deployment(..., router=RoundRobinRouter)``)."""

    def initialize_state(self, **kwargs) -> None:
        self._turn = 0

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        ordered = sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id)
        self._turn += 1
        start = self._turn % max(len(ordered), 1)
        return [[r] for r in ordered[start:] + ordered[:start]]


def _keys_of(pending_request: PendingRequest | None) -> list[int]:
    if pending_request is None:
        return []
    keys = pending_request.kwargs.get("prefix")
    return keys if isinstance(keys, list) else []


# --------------------------------------------------------------------------------------
# the replicas
# --------------------------------------------------------------------------------------


class PyengineReplica:
    """One engine and the server's app around it."""

    async def __init__(self, config: dict) -> None:
        from pyengine.server.app import create_app, resolve_served

        server_config = ServerConfig(**config)
        served = resolve_served(server_config.models, pull=True)
        self.app = create_app(server_config, served=served, preload=False)
        self.lifespan = Lifespan(self.app)
        await self.lifespan.start()
        registry = self.app.state.pyengine.registry
        await registry.preload()  # the model is loaded before the replica takes requests
        if registry.default_model in registry.load_errors:
            raise RuntimeError(f"loading {registry.default_model} failed: {registry.load_errors[registry.default_model]}")
        self.name = serve.get_replica_context().replica_id.unique_id
        self._header = [(REPLICA_HEADER.lower().encode(), self.name.encode())]

    async def handle(self, parcel: dict, prefix: list[int] | None = None) -> AsyncIterator[dict]:
        """The response to one request as ASGI messages (`prefix` is for the router)."""
        async for message in call_app(self.app, parcel, self.lifespan.state, self._header):
            yield message

    async def __del__(self) -> None:
        await self.lifespan.stop()


# --------------------------------------------------------------------------------------
# the ingress
# --------------------------------------------------------------------------------------


class PyengineIngress:
    """Serve's HTTP entry: picks a replica for each request and relays its response."""

    def __init__(self, engine, max_body_bytes: int) -> None:
        self._engine = engine.options(method_name="handle", stream=True)
        self._max_body_bytes = max_body_bytes

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        try:
            body = await _read_body(request, self._max_body_bytes)
        except HTTPError as exc:
            return error_response(path, exc)
        parcel = {
            "method": request.method, "scheme": request.url.scheme, "path": path,
            "query_string": request.url.query.encode(), "headers": list(request.headers.raw),
            "client": tuple(request.client) if request.client else None,
            "server": (request.url.hostname or "", request.url.port or 80), "body": body,
        }
        keys = prefix_keys(body) if request.method == "POST" else []
        deadline = time.monotonic() + FAILOVER_S
        while True:
            responses = self._engine.remote(parcel, prefix=keys)
            try:
                head = await _first_messages(responses)
                return _Relayed(head, responses, path)
            except BackPressureError:
                return error_response(path, HTTPError(503, "all replicas are busy; retry later",
                                                      headers={"Retry-After": "1"}))
            except (RayActorError, ActorUnavailableError) as exc:  # nothing was sent: try another
                responses.cancel()
                if time.monotonic() > deadline:
                    return error_response(path, HTTPError(503, f"no replica could take the request: {exc}",
                                                          headers={"Retry-After": "1"}))
                log.warning("replica lost before answering %s %s; trying another", request.method, path)
                await asyncio.sleep(0.2)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise HTTPError(413, f"request body larger than {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPError(413, f"request body larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _first_messages(responses) -> list[dict]:
    """The response's start and first body message: until then a lost replica costs the
    client nothing, since none of the response has gone out."""
    head = []
    async for message in responses:
        head.append(message)
        if message["type"] == "http.response.body":
            return head
    raise ActorUnavailableError("the replica ended the response before it began", None)


class _Relayed(Response):
    """A replica's response relayed as it comes; a replica lost midway ends it with an
    error in the stream's own format (an SSE event, an NDJSON line)."""

    def __init__(self, head: list[dict], responses, path: str) -> None:
        self.head = head
        self.responses = responses
        self.path = path
        self.status_code = head[0]["status"]
        self.raw_headers = [(bytes(k), bytes(v)) for k, v in head[0].get("headers", ())]
        self.background = None

    async def __call__(self, scope, receive, send) -> None:
        try:
            for message in self.head:
                await send(message)
            if not self._more(self.head[-1]):
                return
            async for message in self.responses:
                await send(message)
                if not self._more(message):
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (RayActorError, ActorUnavailableError) as exc:
            log.warning("replica lost during %s: %s", self.path, exc)
            await send({"type": "http.response.body", "body": self._error_tail(exc), "more_body": False})
        finally:
            self.responses.cancel()

    @staticmethod
    def _more(message: dict) -> bool:
        return message["type"] != "http.response.body" or bool(message.get("more_body", False))

    def _error_tail(self, exc: Exception) -> bytes:
        message = f"the replica serving this request was lost: {type(exc).__name__}"
        content_type = dict(self.raw_headers).get(b"content-type", b"").decode("latin-1")
        if content_type.startswith(SSE):
            if self.path.startswith("/v1/responses"):
                event = {"type": "error", "code": "server_error", "message": message, "param": None}
                return f"event: error\ndata: {_json(event)}\n\n".encode()
            return sse(error_body(self.path, 500, message)) + sse("[DONE]")
        if content_type.startswith(NDJSON):
            return ndjson({"error": message})
        return b""


def _json(obj: Any) -> str:
    import json

    return json.dumps(obj, ensure_ascii=False)


# --------------------------------------------------------------------------------------
# the application
# --------------------------------------------------------------------------------------


def deployment(model: str | list[str], *, replicas: int = 1, autoscale: tuple[int, int] | None = None,
               threads: int | None = None, parallel: int = 4, max_queue: int = 64, ctx: int | None = None,
               config: ServerConfig | None = None, ingress_replicas: int = 1, router: type | None = None):
    """The Ray Serve application serving `model` (a store name, pulled on each node that needs
    it, or a .gguf path present on every node; several for more models) from `replicas`
    replicas of `threads` threads each, or between ``autoscale = (lo, hi)`` replicas.
    `config` gives the rest of the single server's settings (API key, CORS, limits); `router`
    replaces :class:`PrefixAffinityRouter` (a Ray Serve RequestRouter; for comparisons)."""
    models = (model,) if isinstance(model, str) else tuple(model)
    if not models:
        raise InvalidOptionError("name at least one model to serve")
    base = config or ServerConfig()
    server_config = ServerConfig(**{**asdict(base), "models": models, "parallel": parallel, "max_queue": max_queue,
                                    "n_threads": threads if threads is not None else base.n_threads,
                                    "n_ctx": ctx if ctx is not None else base.n_ctx,
                                    "keep_alive_s": None})  # a replica's model stays loaded
    scaling = _scaling(replicas, autoscale, parallel)
    engine = serve.deployment(PyengineReplica, name="PyengineReplica").options(
        **scaling,
        # A replica takes only what it can start; the line waits at the ingress, in order, for
        # whichever replica frees a slot first, and is never lost with a replica.
        max_ongoing_requests=parallel,
        max_queued_requests=max(max_queue, parallel),  # at least a burst's routing; beyond it, 503
        ray_actor_options={"num_cpus": server_config.n_threads or 1},
        request_router_config={"request_router_class": router or PrefixAffinityRouter,
                               "request_router_kwargs": {"slots": parallel}},
        max_constructor_retry_count=3,
        health_check_period_s=2.0,
        graceful_shutdown_timeout_s=5.0,
    )
    front = serve.deployment(PyengineIngress, name="PyengineIngress").options(
        num_replicas=ingress_replicas, ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=10_000,
    )
    return front.bind(engine.bind(asdict(server_config)), server_config.max_body_bytes)


def _scaling(replicas: int, autoscale: tuple[int, int] | None, parallel: int) -> dict:
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise InvalidOptionError(f"replicas must be a positive integer, got {replicas!r}")
    if autoscale is None:
        return {"num_replicas": replicas}
    low, high = autoscale
    if not 0 <= low <= high or high < 1:
        raise InvalidOptionError(f"autoscale needs 0 <= MIN <= MAX and MAX >= 1, got {low}:{high}")
    return {"autoscaling_config": {"min_replicas": low, "max_replicas": high,
                                   "initial_replicas": min(max(replicas, low, 1), high),
                                   "target_ongoing_requests": parallel}}


def parse_autoscale(text: str) -> tuple[int, int]:
    """``MIN:MAX`` as given to ``--autoscale``."""
    low, sep, high = text.partition(":")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise InvalidOptionError(f"--autoscale takes MIN:MAX replicas (e.g. 1:4), got {text!r}")
    bounds = int(low), int(high)
    _scaling(1, bounds, 1)
    return bounds


def connect(address: str | None = None, **options: Any) -> None:
    """``ray.init(address, **options)`` from the folder pyengine is imported from. Ray puts
    the driver's working directory first on its workers' import path: started from a source
    checkout, the replicas would import its ``pyengine/`` (with no built core) in place of the
    installed package."""
    here = os.getcwd()
    os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(pyengine.__file__))))
    try:
        ray.init(address=address, **options)
    finally:
        os.chdir(here)


def serve_cluster(config: ServerConfig, *, address: str | None = None, replicas: int = 1,
                  autoscale: tuple[int, int] | None = None) -> None:
    """What ``pyengine serve --ray`` runs: join the cluster at `address` (default: start a
    local one), serve HTTP on ``config.host:config.port`` and block until interrupted."""
    if not config.models:
        raise InvalidOptionError("--ray needs the models to serve: pass --model NAME|PATH")
    app = deployment(list(config.models), replicas=replicas, autoscale=autoscale, threads=config.n_threads,
                     parallel=config.parallel, max_queue=config.max_queue, ctx=config.n_ctx, config=config)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a stop request tidies up as Ctrl-C does
    try:
        connect(address, include_dashboard=False, log_to_driver=False)
        serve.start(http_options={"host": config.host, "port": config.port})
        serve.run(app, name="pyengine", route_prefix="/")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        with contextlib.suppress(Exception):
            serve.delete("pyengine")
        ray.shutdown()


__all__ = ["PrefixAffinityRouter", "REPLICA_HEADER", "RoundRobinRouter", "connect", "deployment", "parse_autoscale", "serve_cluster"]
