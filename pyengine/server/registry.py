"""Loaded models and admission: which models are in memory, for how long, and how
many requests the server takes at once.

* :class:`ModelRegistry` maps a request's model name (and context size) to a loaded
  adapter: it validates the name (store names only, plus the paths given at start-up),
  loads on first use (one load per model at a time), counts the requests using each
  instance, and unloads an instance once it has been idle for its ``keep_alive``.
  A request's ``num_ctx`` picks an instance of at least that size (loading one of that
  size if none is loaded), as Ollama reloads its runner for a new ``num_ctx``; the
  instances' estimated KV caches together stay within ``config.kv_memory_bytes``.
* :class:`Admission` bounds the requests in flight (generating + queued); one more
  is refused (503) instead of waiting without bound.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from starlette.concurrency import run_in_threadpool

from pyengine import store
from pyengine.errors import ModelNotFoundError
from pyengine.server.config import ServerConfig
from pyengine.server.errors import HTTPError
from pyengine.server.models import ContextLimits, ModelAdapter, context_limits

Loader = Callable[[str, Path, ServerConfig], Any]  # the config's n_ctx is the instance's size
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
KEEP = object()
log = logging.getLogger("pyengine.server")


def parse_keep_alive(value: Any) -> float | None:
    """Ollama's keep_alive: seconds as a number, or a duration such as "5m", "1h30m",
    "0" (unload at once); negative means forever (None)."""
    if isinstance(value, bool):
        raise HTTPError(400, f"'keep_alive' must be a duration such as \"5m\" or a number of seconds, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _parse_duration(value.strip())
    else:
        raise HTTPError(400, f"'keep_alive' must be a duration such as \"5m\" or a number of seconds, got {value!r}")
    if math.isnan(seconds):
        raise HTTPError(400, "'keep_alive' must not be NaN")
    if seconds < 0 or math.isinf(seconds):
        return None
    return seconds


def _parse_duration(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    parts = _DURATION_PART.findall(body)
    if not body or "".join(number + unit for number, unit in parts) != body:
        raise HTTPError(400, f"'keep_alive' {text!r} is not a duration (examples: \"30s\", \"5m\", \"1h\", \"-1\")")
    return sign * sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


class Admission:
    """At most `capacity` requests in flight; `try_enter` never waits."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_flight = 0

    def try_enter(self) -> "Ticket | None":
        if self.in_flight >= self.capacity:
            return None
        self.in_flight += 1
        return Ticket(self)


class Ticket:
    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._admission.in_flight -= 1


@dataclass
class Entry:
    """A loaded model."""

    name: str
    path: Path
    adapter: Any
    loaded_at: float
    load_seconds: float
    keep_alive: float | None
    n_ctx: int = 0                       # the context size it was loaded with
    kv_bytes: int = 0                    # its KV cache, as estimated before loading
    active: int = 0
    expires_at: float | None = None      # monotonic deadline while idle; None: not expiring
    last_used: float = field(default_factory=time.monotonic)

    def expires_wall(self) -> float | None:
        """The expiry as a wall-clock time (for /api/ps), None when it never expires."""
        if self.active or self.keep_alive is None:
            return None
        deadline = self.expires_at if self.expires_at is not None else time.monotonic()
        return time.time() + max(deadline - time.monotonic(), 0.0)


class Lease:
    """One request's use of a loaded model; `release` exactly once (idempotent)."""

    def __init__(self, registry: "ModelRegistry", entry: Entry, load_seconds: float, n_ctx: int = 0) -> None:
        self.registry = registry
        self.entry = entry
        self.adapter = entry.adapter
        self.load_seconds = load_seconds
        self.n_ctx = n_ctx or entry.n_ctx   # the context the request asked for (<= the instance's)
        self._held = True

    def release(self, keep_alive: Any = KEEP) -> None:
        if self._held:
            self._held = False
            self.registry._release(self.entry, keep_alive)


class ModelRegistry:
    """The models a server has loaded (see the module docs)."""

    def __init__(self, config: ServerConfig, loader: Loader | None = None,
                 served: dict[str, Path] | None = None) -> None:
        self.config = config
        self.loader: Loader = loader or ModelAdapter.load
        self.served: dict[str, Path] = dict(served or {})  # names given at start-up -> files
        self.default_model: str | None = next(iter(self.served), None)  # the first start-up model
        self.kv_budget = config.kv_memory_bytes or _physical_memory() // 2
        self._loaded: dict[tuple[str, int], Entry] = {}     # (name, n_ctx) -> instance
        self._locks: dict[str, asyncio.Lock] = {}
        self.loading: set[str] = set()                      # names being loaded now
        self.ever_loaded: set[str] = set()                  # names loaded at least once
        self.load_errors: dict[str, str] = {}               # name -> why its last load failed

    # ---- names -----------------------------------------------------------------

    def resolve(self, name: Any) -> tuple[str, Path]:
        """The canonical name and file of a requested model; 400 for a bad name, 404 for a missing one."""
        if not isinstance(name, str) or not name:
            raise HTTPError(400, "'model' is required and must be a model name", param="model")
        try:
            canonical = store.canonical_name(name)
        except ModelNotFoundError as exc:
            raise HTTPError(400, str(exc), param="model", code="invalid_model_name") from None
        path = self.served.get(canonical) or self.served.get(name)
        if path is not None:
            return canonical, path
        path = store.find_local(canonical)
        if path is None:
            hint = f"pull it first (POST /api/pull or `pyengine pull {canonical}`)" if store.pullable(canonical) \
                else "list the models with GET /api/tags or /v1/models"
            raise HTTPError(404, f"model {name!r} not found; {hint}", param="model", code="model_not_found")
        return canonical, path

    def available(self) -> dict[str, Path]:
        """Every model a request may name: the store's and the served ones."""
        models = {model.name: model.path for model in store.list_models()}
        models.update(self.served)
        return models

    # ---- leases ----------------------------------------------------------------

    def limits(self, path: Path) -> ContextLimits:
        return context_limits(path, self.config)

    def wanted_context(self, name: str, limits: ContextLimits, num_ctx: Any) -> int:
        """The context a request gets: its num_ctx (400 beyond the model's trained context),
        else the default size."""
        if num_ctx is None:
            return limits.default
        if isinstance(num_ctx, bool) or not isinstance(num_ctx, int) or num_ctx < 1:
            raise HTTPError(400, f"option 'num_ctx' must be a positive integer, got {num_ctx!r}",
                            param="options.num_ctx")
        largest = limits.largest
        if largest is not None and num_ctx > largest:
            raise HTTPError(400, f"num_ctx {num_ctx} is larger than the context model {name!r} was trained "
                                 f"with ({largest}); ask for at most {largest}",
                            param="options.num_ctx", code="context_length_exceeded")
        return num_ctx

    async def lease(self, name: Any, num_ctx: Any = None, exact: bool = False) -> Lease:
        """A lease on an instance of the model with room for `num_ctx` tokens (None: the
        default size), loading one if needed. A loaded instance that is larger is reused
        for a smaller num_ctx (the request is then bounded to its num_ctx by the engine):
        Ollama reloads on any change, but a larger cache serves the request the same and
        costs no load; `exact` asks for the size itself (for callers that cannot pass the
        bound on)."""
        canonical, path = self.resolve(name)
        limits = self.limits(path)
        wanted = self.wanted_context(canonical, limits, num_ctx)
        lock = self._locks.setdefault(canonical, asyncio.Lock())
        async with lock:
            entry = self._instance(canonical, wanted, exact)
            load_seconds = 0.0
            if entry is None:
                kv_bytes = limits.kv_bytes(wanted, self.config.parallel)
                await self._make_room(kv_bytes, refuse=num_ctx is not None, name=canonical, n_ctx=wanted)
                entry, load_seconds = await self._load(canonical, path, wanted, kv_bytes)
            entry.active += 1
            entry.expires_at = None
            entry.last_used = time.monotonic()
        return Lease(self, entry, load_seconds, wanted)

    def _instance(self, name: str, n_ctx: int, exact: bool) -> Entry | None:
        """The loaded instance to serve `n_ctx` tokens: that size, else the smallest larger one."""
        if exact:
            return self._loaded.get((name, n_ctx))
        sizes = [size for (loaded, size) in self._loaded if loaded == name and size >= n_ctx]
        return self._loaded[(name, min(sizes))] if sizes else None

    async def _load(self, name: str, path: Path, n_ctx: int, kv_bytes: int) -> tuple[Entry, float]:
        self.loading.add(name)
        try:
            started = time.perf_counter()
            adapter = await run_in_threadpool(self.loader, name, path, replace(self.config, n_ctx=n_ctx))
        except Exception as exc:
            self.load_errors[name] = str(exc) or type(exc).__name__
            raise
        finally:
            self.loading.discard(name)
        load_seconds = time.perf_counter() - started
        self.load_errors.pop(name, None)
        self.ever_loaded.add(name)
        entry = Entry(name, path, adapter, time.time(), load_seconds, self.config.keep_alive_s, n_ctx, kv_bytes)
        self._loaded[(name, n_ctx)] = entry
        return entry, load_seconds

    async def preload(self) -> None:
        """Load the default model (at start-up, for /health); a failure is kept for /health."""
        if self.default_model is None:
            return
        self.loading.add(self.default_model)
        try:
            lease = await self.lease(self.default_model)
        except Exception as exc:  # kept for /health; the server still serves the other models
            self.load_errors.setdefault(self.default_model, str(exc) or type(exc).__name__)
            log.exception("loading the default model %s failed", self.default_model)
            return
        finally:
            self.loading.discard(self.default_model)
        lease.release()

    def _release(self, entry: Entry, keep_alive: Any) -> None:
        entry.active -= 1
        entry.last_used = time.monotonic()
        if keep_alive is not KEEP:
            entry.keep_alive = keep_alive
        if entry.active == 0 and entry.keep_alive is not None:
            entry.expires_at = time.monotonic() + entry.keep_alive
            if entry.keep_alive == 0:
                _spawn(self.sweep())

    def set_keep_alive(self, name: str, keep_alive: float | None) -> None:
        for entry in self._instances_of(name):
            entry.keep_alive = keep_alive
            if entry.active == 0:
                entry.expires_at = None if keep_alive is None else time.monotonic() + keep_alive

    def loaded(self) -> list[Entry]:
        return sorted(self._loaded.values(), key=lambda entry: (entry.name, entry.n_ctx))

    def get_loaded(self, name: str, n_ctx: int | None = None) -> Entry | None:
        """The instance of `name` of that size; without one, its most recently used instance."""
        if n_ctx is not None:
            return self._loaded.get((name, n_ctx))
        instances = self._instances_of(name)
        return max(instances, key=lambda entry: entry.last_used) if instances else None

    def _instances_of(self, name: str) -> list[Entry]:
        return [entry for entry in self._loaded.values() if entry.name == name]

    def kv_bytes_loaded(self) -> int:
        return sum(entry.kv_bytes for entry in self._loaded.values())

    # ---- unloading ---------------------------------------------------------------

    async def sweep(self) -> None:
        """Unload every idle instance whose keep_alive has run out."""
        now = time.monotonic()
        for entry in list(self._loaded.values()):
            if entry.active == 0 and entry.expires_at is not None and entry.expires_at <= now:
                await self._unload_entry(entry)

    async def unload(self, name: str) -> bool:
        """Unload every instance of `name`; False if one of them is in use (that one stays)."""
        all_gone = True
        for entry in self._instances_of(name):
            all_gone = await self._unload_entry(entry) and all_gone
        return all_gone

    async def _unload_entry(self, entry: Entry) -> bool:
        lock = self._locks.setdefault(entry.name, asyncio.Lock())
        async with lock:
            key = (entry.name, entry.n_ctx)
            if self._loaded.get(key) is not entry:
                return True  # unloaded meanwhile
            if entry.active:
                return False
            del self._loaded[key]
        await run_in_threadpool(entry.adapter.close)
        return True

    async def close(self) -> None:
        for key, entry in list(self._loaded.items()):
            self._loaded.pop(key, None)
            await run_in_threadpool(entry.adapter.close)

    async def _make_room(self, kv_bytes: int, *, refuse: bool, name: str, n_ctx: int) -> None:
        """Unload the least recently used idle instances while the registry is full (by count
        or by KV memory). With `refuse` (a request's own num_ctx), a cache that cannot fit is
        refused: 400 when it is larger than the whole budget, 503 while busy instances hold the room."""
        if refuse and kv_bytes > self.kv_budget:
            raise HTTPError(400, f"num_ctx {n_ctx} for model {name!r} needs about {_gib(kv_bytes)} of KV cache "
                                 f"({self.config.parallel} sequences of {n_ctx} tokens); this server allows "
                                 f"{_gib(self.kv_budget)}: ask for a smaller num_ctx",
                            param="options.num_ctx", code="context_too_large")
        while True:
            over_count = len(self._loaded) >= self.config.max_loaded_models
            over_memory = self.kv_bytes_loaded() + kv_bytes > self.kv_budget
            if not over_count and not over_memory:
                return
            idle = [entry for entry in self._loaded.values() if entry.active == 0]
            if not idle:
                if over_memory and refuse:
                    raise HTTPError(503, f"num_ctx {n_ctx} for model {name!r} needs about {_gib(kv_bytes)} of KV "
                                         f"cache and the models in use hold {_gib(self.kv_bytes_loaded())} of "
                                         f"{_gib(self.kv_budget)}; retry later",
                                    code="server_busy", headers={"Retry-After": str(self.config.retry_after_s)})
                return  # all busy: load one more rather than refuse
            oldest = min(idle, key=lambda entry: entry.last_used)
            del self._loaded[(oldest.name, oldest.n_ctx)]
            await run_in_threadpool(oldest.adapter.close)


def _gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.2f} GiB"


def _physical_memory() -> int:
    """This machine's RAM in bytes (64 GiB when the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 64 << 30


def _spawn(coro) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        coro.close()
        return
    task = loop.create_task(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


_BACKGROUND: set = set()

__all__ = ["KEEP", "Admission", "Entry", "Lease", "ModelRegistry", "Ticket", "parse_keep_alive"]
