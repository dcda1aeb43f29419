"""The shape of pyengine/models/: architecture files stand alone (each imports
the shared modules, never another architecture), every registered architecture
implements the model protocol the runner and the context shift call, and a
forward pass leaves the model as it found it (a model is shared by every graph
and cache built over it, so state set in one graph would leak into the next)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest
from model_parity import DATA, cache_for, load

import pyengine.models
from pyengine.gguf import GGUFFile
from pyengine.kvcache import KVCache
from pyengine.ml.context import Backend
from pyengine.models import architectures, model_for_arch
from pyengine.models.binding import Module
from pyengine.runner.forward import Forward

MODELS_DIR = Path(pyengine.models.__file__).parent
PACKAGE = "pyengine.models"

# the protocol: method -> its parameters after self (models/common.py, CausalLM)
PROTOCOL = {
    "hidden": ["ctx", "batch"],
    "head": ["ctx", "x"],
    "forward": ["ctx", "batch"],
    "shift_keys": ["ctx", "k", "positions", "layer", "n_ctx_seq"],
    "cache_layout": [],
}


def _registers(tree: ast.Module) -> bool:
    """Whether the file registers an architecture (a class decorated with register(...))."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for deco in node.decorator_list:
                func = deco.func if isinstance(deco, ast.Call) else deco
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if name == "register":
                    return True
    return False


def _imported_models(tree: ast.Module) -> set[str]:
    """Names of the pyengine.models modules a file imports, however it spells it."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE + "."):
                    found.add(alias.name[len(PACKAGE) + 1:].split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:   # relative: from . import x / from .x import y
                module = PACKAGE + ("." + module if module else "")
            if module == PACKAGE:
                found.update(alias.name for alias in node.names)
            elif module.startswith(PACKAGE + "."):
                found.add(module[len(PACKAGE) + 1:].split(".")[0])
    return found


def _architecture_files() -> dict[str, ast.Module]:
    trees = {p.stem: ast.parse(p.read_text()) for p in sorted(MODELS_DIR.glob("*.py"))}
    return {name: tree for name, tree in trees.items() if _registers(tree)}


def test_no_architecture_file_imports_another():
    archs = _architecture_files()
    assert len(archs) >= 15   # (the parse found them: llama, qwen2, ..., smollm3)
    crossings = {name: sorted(_imported_models(tree) & set(archs) - {name}) for name, tree in archs.items()}
    assert {name: found for name, found in crossings.items() if found} == {}


def test_the_import_check_sees_every_spelling():
    """The check above would catch each way of importing an architecture."""
    for source in ("from pyengine.models import qwen2", "from pyengine.models.qwen2 import Qwen2",
                   "import pyengine.models.qwen2", "from . import qwen2", "from .qwen2 import Qwen2"):
        assert _imported_models(ast.parse(source)) == {"qwen2"}, source


@pytest.mark.parametrize("arch", architectures())
def test_every_architecture_implements_the_protocol(arch):
    cls = model_for_arch(arch)
    for method, params in PROTOCOL.items():
        member = getattr(cls, method, None)
        assert callable(member), f"{cls.__name__} has no {method}"
        assert list(inspect.signature(member).parameters)[1:] == params, f"{cls.__name__}.{method}"
    assert callable(getattr(cls.Config, "from_gguf", None))


def test_the_protocol_is_the_one_listed_here():
    from pyengine.models.common import CausalLM

    members = {name for name, value in vars(CausalLM).items() if inspect.isfunction(value) and not name.startswith("_")}
    assert members == set(PROTOCOL)
    for method, params in PROTOCOL.items():
        assert list(inspect.signature(getattr(CausalLM, method)).parameters)[1:] == params


def _synth_by_arch() -> dict[str, Path]:
    """One synthetic model per architecture (the smallest file of each)."""
    from pyengine.gguf import GGUFFile

    found: dict[str, Path] = {}
    for path in sorted((DATA / "synth").glob("*.gguf"), key=lambda p: p.stat().st_size):
        found.setdefault(GGUFFile(path).architecture, path)
    return found


SYNTH = _synth_by_arch()
# the encoders' (embedding models: no language-model head), tests/data/synth/encoders
ENCODERS = {path.stem: path for path in sorted((DATA / "synth" / "encoders").glob("*.gguf"))}   # (a reranker too)


def file_arch(path) -> str:
    return GGUFFile(path).architecture


@pytest.mark.parametrize("arch", sorted(SYNTH))
def test_bound_models_are_causal_lms(arch):
    from pyengine.models.common import CausalLM

    model = load(SYNTH[arch])
    assert isinstance(model, CausalLM)
    assert not getattr(model, "EMBEDDING_ONLY", False)


@pytest.mark.parametrize("stem", sorted(ENCODERS))
def test_bound_encoders_are_embedding_models(stem):
    from pyengine.models.common import EmbeddingModel

    model = load(ENCODERS[stem])
    assert type(model) is model_for_arch(file_arch(ENCODERS[stem])) and isinstance(model, EmbeddingModel)
    assert model.EMBEDDING_ONLY and not model.cfg.causal


def test_every_encoder_architecture_has_a_synthetic_model():
    encoders = {arch for arch in architectures() if getattr(model_for_arch(arch), "EMBEDDING_ONLY", False)}
    assert encoders == {file_arch(p) for p in ENCODERS.values()} == {"bert", "nomic-bert", "jina-bert-v2", "modern-bert",
                                                                     "nomic-bert-moe", "gemma-embedding"}


def _state(obj, path: str = "model") -> dict[str, object]:
    """Every attribute of every module in the tree: plain values as they are, other
    objects by identity (a weight swapped or a list replaced shows up)."""
    state: dict[str, object] = {}
    for name, value in vars(obj).items():
        key = f"{path}.{name}"
        children = value if isinstance(value, list) else [value]
        state[key] = value if isinstance(value, (int, float, str, bool, type(None))) else id(value)
        for i, child in enumerate(children):
            if isinstance(child, Module):
                state.update(_state(child, f"{key}[{i}]"))
    return state


@pytest.mark.parametrize("arch", sorted(SYNTH))
def test_a_forward_leaves_the_model_unchanged(arch):
    """Graphs over caches of two sizes (Phi-3 used to keep the last one's width, which
    then decided the factors of every context shift, whichever cache it was for)."""
    model = load(SYNTH[arch])
    before = _state(model)
    backend = Backend(1)
    tokens = np.array([5, 17, 42, 99], np.int32)
    for n_cells in (16, 256):
        fw = Forward(model, backend, cache_for(model.cache_layout(), n_cells))
        fw(tokens, np.arange(4), np.zeros(4), np.array([3]))
        fw.hidden(tokens[:1], np.array([4]), np.zeros(1), np.array([0]))
    assert _state(model) == before


@pytest.mark.parametrize("arch", sorted(ENCODERS))
def test_an_embedding_pass_leaves_the_encoder_unchanged(arch):
    model = load(ENCODERS[arch])
    before = _state(model)
    tokens = np.array([2, 17, 42, 99, 3], np.int32)
    for n_cells in (16, 256):
        fw = Forward(model, Backend(1), KVCache(model.cache_layout(), n_cells))
        fw.hidden(tokens, np.arange(5), np.zeros(5), np.arange(5))
        fw.cache.remove(0)
        fw.hidden(tokens[:2], np.arange(2), np.zeros(2), np.array([0]))
    assert _state(model) == before
