"""Declarative tensor binding: fields name their GGUF tensors, one binder
walks them (Python's counterpart of Ollama's `gguf:"..."` struct tags).

    class Block(Module):
        attn_norm: RMSNorm = tensor("attn_norm", shape=("n_embd",))
        attn_q: Linear = tensor("attn_q", shape=("n_embd", "q_dim"))

    class Model(Module):
        output: Linear = tensor("output", alt="token_embd")
        layers: list[Block] = blocks("blk")          # binds blk.0., blk.1., ...

A missing tensor is reported by its full GGUF name; a tensor whose shape
contradicts the config is reported with both shapes; a tensor whose block
type has no kernels is reported with its type.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from pyengine import _core
from pyengine.errors import ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml.nn import Weight

ShapeSpec = tuple[int | str | None, ...]


@dataclass(frozen=True)
class TensorField:
    name: str
    alt: str | None = None
    optional: bool = False
    shape: ShapeSpec | None = None


@dataclass(frozen=True)
class ModuleField:
    prefix: str = ""
    present_if: str | None = None   # bound only where this tensor's weight is in the file, else None


@dataclass(frozen=True)
class BlocksField:
    prefix: str = "blk"
    count: str = "n_layer"
    kind: Callable[[Any, int], type] | None = None   # (config, index) -> the block's class


def tensor(name: str, *, alt: str | None = None, optional: bool = False, shape: ShapeSpec | None = None):
    """A leaf (Linear, RMSNorm, ...) bound to GGUF tensors `{prefix}{name}.weight` (and `.bias`)."""
    return field(default=None, metadata={"pe": TensorField(name, alt, optional, shape)})


def module(prefix: str = "", *, present_if: str | None = None):
    """A sub-module whose tensors share the parent's prefix (plus `prefix`).  present_if:
    the module is optional, there (bound) exactly where the file has `{prefix}{present_if}.weight`
    (a hybrid's block that is attention in some layers and recurrent in others)."""
    return field(default=None, metadata={"pe": ModuleField(prefix, present_if)})


def blocks(prefix: str = "blk", count: str = "n_layer", kind: Callable[[Any, int], type] | None = None):
    """A list of sub-modules bound to `{prefix}.{i}.` for i < config.<count>, each of
    the list's element class, or of kind(config, i) where the layers differ (a dense
    MLP in some, experts in others)."""
    return field(default_factory=list, metadata={"pe": BlocksField(prefix, count, kind)})


class Module:
    """Base of bound modules; `cfg` is the model's config, set by the binder."""

    cfg: Any = None


def bind(cls: type, gguf: GGUFFile, cfg: Any, prefix: str = "") -> Any:
    """Instantiate dataclass `cls`, binding every declared field from `gguf`."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("pe")
        if spec is None:
            continue
        kind = hints[f.name]
        if isinstance(spec, TensorField):
            values[f.name] = _bind_leaf(_strip_optional(kind), gguf, cfg, prefix, spec)
        elif isinstance(spec, ModuleField):
            sub = prefix + spec.prefix
            absent = spec.present_if is not None and f"{sub}{spec.present_if}.weight" not in gguf.tensors
            values[f.name] = None if absent else bind(_strip_optional(kind), gguf, cfg, sub)
        elif isinstance(spec, BlocksField):
            (elem,) = typing.get_args(kind)
            n = getattr(cfg, spec.count)
            values[f.name] = [bind(spec.kind(cfg, i) if spec.kind else elem, gguf, cfg, f"{prefix}{spec.prefix}.{i}.")
                              for i in range(n)]
    # A lookup table that is also multiplied (an output tied to the token embedding)
    # reads the copy the multiplication made, interleaved or not, not the file's
    # mapping as well (GGUFFile.tensor_data): its data is asked for again once the
    # level is bound.
    for value in values.values():
        if getattr(value, "LOOKUP", False):
            value.weight = _weight(gguf, value.weight.name, lookup=True)
    obj = cls(**values)
    obj.cfg = cfg
    return obj


def _strip_optional(kind: Any) -> type:
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if args else kind


def _bind_leaf(leaf: type, gguf: GGUFFile, cfg: Any, prefix: str, spec: TensorField) -> Any:
    names = [prefix + spec.name] + ([prefix + spec.alt] if spec.alt else [])
    lead = next(iter(leaf.PARTS))   # "weight", or the one part a leaf has ("bias": DeepSeek's exp_probs_b)
    base = next((n for n in names if _part_name(leaf, n, lead) in gguf.tensors), None)
    if base is None:
        if spec.optional:
            return None
        tried = " or ".join(f"'{_part_name(leaf, n, lead)}'" for n in names)
        raise ModelError(f"missing tensor {tried} in {gguf.path}")
    parts: dict[str, Weight | None] = {}
    for part, required in leaf.PARTS.items():
        name = _part_name(leaf, base, part)
        if name not in gguf.tensors:
            if required:
                raise ModelError(f"missing tensor '{name}' in {gguf.path}")
            parts[part] = None
            continue
        w = _weight(gguf, name, lookup=getattr(leaf, "LOOKUP", False),
                    interleave=part == "weight" and getattr(leaf, "INTERLEAVE", False))
        if part == lead and spec.shape is not None:
            _check_shape(w, spec.shape, cfg)
        parts[part] = w.to_f32() if part in leaf.F32_PARTS else w
    return leaf(**parts)


def _part_name(leaf: type, base: str, part: str) -> str:
    """The GGUF name of a leaf's part: `base.part`, or `base` itself for a leaf that says
    BARE (a tensor the converter names without a suffix, as Qwen3.5's `ssm_a`)."""
    return base if getattr(leaf, "BARE", False) else f"{base}.{part}"


def _interleaving() -> bool:
    """PYENGINE_INTERLEAVE=0 keeps every weight as the file has it (the same numbers,
    slower decoding: for comparisons)."""
    return os.environ.get("PYENGINE_INTERLEAVE", "1") != "0"


def _weight(gguf: GGUFFile, name: str, lookup: bool = False, interleave: bool = False) -> Weight:
    """`interleave`: the weight is only multiplied, so it may take the layout the
    current ISA multiplies faster (rows interleaved by 8, pe_type_rows8 in pe.h)."""
    info = gguf.tensors[name]
    if not _core.type_supported(info.type):
        raise UnsupportedError(f"tensor '{name}' has block type {info.type_name}, which pyengine cannot run yet")
    rows8 = -1   # the interleaved type this ISA would multiply the tensor as, if any
    # a 3-D stack (experts) interleaves each matrix's rows in 8s: no group straddles two
    if _interleaving() and len(info.shape) in (2, 3) and info.shape[1] % 8 == 0:
        rows8 = _core.rows8_type(info.type)
    interleaved = gguf.transformed(name) if rows8 >= 0 else None
    if lookup and interleaved is not None:   # a tied table: lookups read the products' copy
        return Weight(name, rows8, tuple(info.shape), interleaved)
    if not interleave or rows8 < 0:
        return Weight(name, info.type, tuple(info.shape), gguf.tensor_data(name, lookup=lookup))
    k, n = info.shape[0], int(np.prod(info.shape[1:]))
    group = 8 * info.nbytes // n   # bytes of 8 rows: the repacking's unit

    def repack(src: np.ndarray, dst: np.ndarray) -> None:
        _core.repack_rows8(rows8, src, dst, k, src.size // group * 8)

    return Weight(name, rows8, tuple(info.shape), gguf.tensor_data(name, transform=repack, unit=group))


def _check_shape(w: Weight, spec: ShapeSpec, cfg: Any) -> None:
    expected = tuple(getattr(cfg, d) if isinstance(d, str) else d for d in spec)
    actual = tuple(w.shape) + (1,) * (len(expected) - len(w.shape))
    if len(actual) != len(expected) or any(e is not None and e != a for e, a in zip(expected, actual)):
        shown = tuple("*" if e is None else e for e in expected)
        raise ModelError(f"tensor '{w.name}' has shape {tuple(w.shape)}, but the model's "
                         f"hyper-parameters say {shown} (GGML order)")
