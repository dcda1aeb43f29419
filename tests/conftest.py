"""Shared fixtures: data paths, the instruction sets this CPU has, real models."""

from __future__ import annotations

import contextlib
import pathlib

import pytest

DATA = pathlib.Path(__file__).parent / "data"
SYNTH = DATA / "synth"
GOLDEN = DATA / "golden"


# every kernel table the native core may build, and the x86 ones with SIMD
ISA_NAMES = ("scalar", "avx2", "avxvnni", "avx512", "neon_nodot", "neon")
X86_SIMD_ISAS = ("avx2", "avxvnni", "avx512")


# What each built wheel runs (`pytest -m wheel`, pyproject's [tool.cibuildwheel]): the kernels
# on every table the CPU has, every synthetic model, llama.cpp's tokenizer conformance files.
# None of them downloads a model or needs a cross compiler.
WHEEL_SUBSET = frozenset({"test_kernels_legacy.py", "test_kernels_kquants.py", "test_kernels_iquants.py",
                          "test_gemm.py", "test_rows8.py", "test_models_synth.py",
                          "test_tokenizer_conformance.py"})


def pytest_ignore_collect(collection_path, config):
    """With -m wheel, the other files are not even imported: a wheel's test environment
    has pytest and pyengine's dependencies, not the whole test extra."""
    if config.getoption("markexpr") == "wheel" and collection_path.suffix == ".py":
        return collection_path.name.startswith("test_") and collection_path.name not in WHEEL_SUBSET
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in WHEEL_SUBSET:
            item.add_marker(pytest.mark.wheel)


def available_isas() -> list[str]:
    from pyengine import _core

    return [isa for isa in ISA_NAMES if _core.isa_available(isa)]


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


def child_env(**extra: str) -> dict:
    """Environment for a child Python that must import the same pyengine as
    this process (the installed one, or the in-place build under PYTHONPATH)."""
    import os

    import pyengine

    root = str(pathlib.Path(pyengine.__file__).resolve().parents[1])
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


# A working directory for children outside the source tree, whose pyengine/
# folder (without the compiled core) would shadow the installed package.
CHILD_CWD = str(pathlib.Path(__file__).resolve().parent)
