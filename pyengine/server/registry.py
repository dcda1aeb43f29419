"""Loaded models and admission: which models are in memory, for how long, and how
many requests the server takes at once.

* :class:`ModelRegistry` maps a request's model name to a loaded adapter: it
  validates the name (store names only, plus the paths given at start-up), loads on
  first use (one load per model at a time), counts the requests using each model,
  and unloads a model once it has been idle for its ``keep_alive``.
* :class:`Admission` bounds the requests in flight (generating + queued); one more
  is refused (503) instead of waiting without bound.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from starlette.concurrency import run_in_threadpool

from pyengine import store
from pyengine.errors import ModelNotFoundError
from pyengine.server.config import ServerConfig
from pyengine.server.errors import HTTPError

Loader = Callable[[str, Path, ServerConfig], Any]
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
KEEP = object()


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

    def __init__(self, registry: "ModelRegistry", entry: Entry, load_seconds: float) -> None:
        self.registry = registry
        self.entry = entry
        self.adapter = entry.adapter
        self.load_seconds = load_seconds
        self._held = True

    def release(self, keep_alive: Any = KEEP) -> None:
        if self._held:
            self._held = False
            self.registry._release(self.entry, keep_alive)


class ModelRegistry:
    """The models a server has loaded (see the module docs)."""

    def __init__(self, config: ServerConfig, loader: Loader | None = None,
                 served: dict[str, Path] | None = None) -> None:
        from pyengine.server.models import ModelAdapter

        self.config = config
        self.loader: Loader = loader or ModelAdapter.load
        self.served: dict[str, Path] = dict(served or {})  # names given at start-up -> files
        self._loaded: dict[str, Entry] = {}
        self._locks: dict[str, asyncio.Lock] = {}

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

    async def lease(self, name: Any) -> Lease:
        canonical, path = self.resolve(name)
        lock = self._locks.setdefault(canonical, asyncio.Lock())
        async with lock:
            entry = self._loaded.get(canonical)
            load_seconds = 0.0
            if entry is None:
                await self._make_room()
                started = time.perf_counter()
                adapter = await run_in_threadpool(self.loader, canonical, path, self.config)
                load_seconds = time.perf_counter() - started
                entry = Entry(canonical, path, adapter, time.time(), load_seconds, self.config.keep_alive_s)
                self._loaded[canonical] = entry
            entry.active += 1
            entry.expires_at = None
            entry.last_used = time.monotonic()
        return Lease(self, entry, load_seconds)

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
        entry = self._loaded.get(name)
        if entry is not None:
            entry.keep_alive = keep_alive
            if entry.active == 0:
                entry.expires_at = None if keep_alive is None else time.monotonic() + keep_alive

    def loaded(self) -> list[Entry]:
        return sorted(self._loaded.values(), key=lambda entry: entry.name)

    def get_loaded(self, name: str) -> Entry | None:
        return self._loaded.get(name)

    # ---- unloading ---------------------------------------------------------------

    async def sweep(self) -> None:
        """Unload every idle model whose keep_alive has run out."""
        now = time.monotonic()
        for entry in list(self._loaded.values()):
            if entry.active == 0 and entry.expires_at is not None and entry.expires_at <= now:
                await self.unload(entry.name)

    async def unload(self, name: str) -> bool:
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            entry = self._loaded.get(name)
            if entry is None or entry.active:
                return False
            del self._loaded[name]
        await run_in_threadpool(entry.adapter.close)
        return True

    async def close(self) -> None:
        for entry in list(self._loaded.values()):
            self._loaded.pop(entry.name, None)
            await run_in_threadpool(entry.adapter.close)

    async def _make_room(self) -> None:
        """Unload the least recently used idle models while the registry is full."""
        while len(self._loaded) >= self.config.max_loaded_models:
            idle = [entry for entry in self._loaded.values() if entry.active == 0]
            if not idle:
                return  # all busy: load one more rather than refuse
            oldest = min(idle, key=lambda entry: entry.last_used)
            entry = self._loaded.pop(oldest.name)
            await run_in_threadpool(entry.adapter.close)


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
