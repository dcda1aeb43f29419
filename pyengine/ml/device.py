"""Device discovery: what this build of the native core can compute on (as Ollama's ml/device.go).

The core computes a graph through a backend (csrc/core/backend.h); the build holds the CPU's always
and a GPU backend's where CMake's PYENGINE_BACKENDS named one.  `devices()` lists one Device per device
each backend finds: the CPU with its instruction sets and cores, a GPU backend's devices by number.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from functools import lru_cache

from pyengine import _core

# The CPU kernel tables' names (csrc/cpu/dispatch.c), in its order of preference.
CPU_ISAS = ("scalar", "avx2", "avxvnni", "avx512", "neon_nodot", "neon")


@dataclass(frozen=True)
class Device:
    backend: str                 # the backend that computes on it: "cpu", ...
    index: int                   # its number within the backend
    kind: str                    # "cpu" or "gpu"
    name: str                    # the CPU's model name, or "<backend>:<index>"
    isas: tuple[str, ...] = ()   # CPU: the kernel tables this CPU can run (the best last)
    isa: str = ""                # CPU: the table in use
    cores: int = 0               # CPU: physical cores (the default thread count)
    logical: int = 0             # CPU: logical processors

    def describe(self) -> str:
        if self.kind != "cpu":
            return f"{self.backend} {self.name}"
        return f"{self.name}: {self.isa} of {', '.join(self.isas)}; {self.cores} cores, {self.logical} threads"


def backends() -> tuple[str, ...]:
    """The backends compiled in, the CPU's first."""
    return tuple(name for name, _ in _core.backends())


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def cpu() -> Device:
    """The host CPU as the CPU backend sees it."""
    return Device(backend="cpu", index=0, kind="cpu", name=_cpu_model(),
                  isas=tuple(isa for isa in CPU_ISAS if _core.isa_available(isa)), isa=_core.isa(),
                  cores=_core.physical_cores(), logical=os.cpu_count() or 1)


@lru_cache(maxsize=1)
def _gpu_devices() -> tuple[Device, ...]:
    return tuple(Device(backend=name, index=i, kind="gpu", name=f"{name}:{i}")
                 for name, count in _core.backends() if name != "cpu" for i in range(count))


def devices() -> list[Device]:
    """Every device the build's backends find: the CPU first, then each GPU backend's."""
    return [cpu(), *_gpu_devices()]
