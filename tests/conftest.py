"""Shared fixtures: data paths, the instruction sets this CPU has, real models."""

from __future__ import annotations

import contextlib
import pathlib

import pytest

DATA = pathlib.Path(__file__).parent / "data"
SYNTH = DATA / "synth"
GOLDEN = DATA / "golden"


def available_isas() -> list[str]:
    from pyengine import _core

    return [isa for isa in ("scalar", "avx2", "avx512", "neon") if _core.isa_available(isa)]


@contextlib.contextmanager
def forced_isa(name: str):
    """Run a block with the kernels of one instruction set, then restore."""
    from pyengine import _core

    before = _core.isa()
    _core.set_isa(name)
    try:
        yield
    finally:
        _core.set_isa(before)


@pytest.fixture(scope="session")
def smollm2_path() -> pathlib.Path:
    from pyengine.store import resolve_model

    return resolve_model("smollm2-135m", progress=False)


@pytest.fixture(scope="session")
def gemma3_path() -> pathlib.Path:
    from pyengine.store import resolve_model

    return resolve_model("gemma3-270m", progress=False)
