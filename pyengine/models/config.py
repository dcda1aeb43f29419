"""Hyper-parameters every transformer shares, read from GGUF keys and
checked before any graph is built (absurd values fail here, not in C)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from pyengine.errors import GGUFError, ModelError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import ROPE_NEOX, ROPE_NORMAL, Context, Tensor

MAX_LAYERS = 1024
MAX_HEADS = 4096
MAX_HEAD_DIM = 1024


@dataclass(frozen=True)
class TransformerConfig:
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    eps: float
    rope_base: float
    rope_scale: float          # freq_scale = 1 / linear scaling factor
    rope_dims: int
    rope_mode: int
    n_ctx_train: int

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim

    @classmethod
    def common_from_gguf(cls, f: GGUFFile, *, rope_mode: int = ROPE_NEOX, eps_default: float = 1e-5) -> dict:
        """The shared fields as keyword arguments; an architecture adds its own."""
        key = f.arch_key
        try:
            n_embd = f.get_int(key("embedding_length"))
            n_head = f.get_int(key("attention.head_count"))
            n_head_kv = f.get_int(key("attention.head_count_kv"), n_head)
        except GGUFError as e:
            raise ModelError(f"{f.path}: {e}") from None
        _positive("embedding_length", n_embd, 1 << 20)
        _positive("attention.head_count", n_head, MAX_HEADS)
        head_dim = f.get_int(key("attention.key_length"), n_embd // n_head if n_embd % n_head == 0 else 0)
        embd = f.tensors.get("token_embd.weight")
        if embd is None:
            raise ModelError(f"missing tensor 'token_embd.weight' in {f.path}")
        rope_scale = 1.0
        if f.get_str(key("rope.scaling.type"), "none") == "linear":
            rope_scale = 1.0 / f.get_float(key("rope.scaling.factor"), 1.0)
        return dict(
            n_vocab=embd.shape[1],
            n_embd=n_embd,
            n_layer=f.get_int(key("block_count")),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_ff=f.get_int(key("feed_forward_length"), 0),
            eps=f.get_float(key("attention.layer_norm_rms_epsilon"), eps_default),
            rope_base=f.get_float(key("rope.freq_base"), 10000.0),
            rope_scale=rope_scale,
            rope_dims=f.get_int(key("rope.dimension_count"), head_dim),
            rope_mode=rope_mode,
            n_ctx_train=f.get_int(key("context_length"), 2048),
        )

    def __post_init__(self) -> None:
        _positive("block_count", self.n_layer, MAX_LAYERS)
        _positive("attention.head_count_kv", self.n_head_kv, MAX_HEADS)
        if self.n_head % self.n_head_kv:
            raise ModelError(f"head_count {self.n_head} is not a multiple of head_count_kv {self.n_head_kv}")
        _positive("attention.key_length (head size)", self.head_dim, MAX_HEAD_DIM)
        if self.rope_dims <= 0 or self.rope_dims > self.head_dim or self.rope_dims % 2:
            raise ModelError(f"rope.dimension_count {self.rope_dims} is invalid for head size {self.head_dim}")
        if not (self.eps > 0 and math.isfinite(self.eps)):
            raise ModelError(f"layer_norm_rms_epsilon must be positive, got {self.eps}")
        if not (self.rope_base > 0 and self.rope_scale > 0):
            raise ModelError("rope.freq_base and rope scaling must be positive")
        _positive("context_length", self.n_ctx_train, 1 << 24)

    def rope(self, ctx: Context, x: Tensor, positions: Tensor, *, base: float | None = None,
             freq_factors: Tensor | None = None) -> Tensor:
        """RoPE with this model's parameters (a layer may override the base)."""
        return ctx.rope(x, positions, n_dims=self.rope_dims, mode=self.rope_mode,
                        base=self.rope_base if base is None else base, scale=self.rope_scale,
                        freq_factors=freq_factors, n_ctx_orig=self.n_ctx_train)

    def describe(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _positive(name: str, value: int, limit: int) -> None:
    if not isinstance(value, int) or not 1 <= value <= limit:
        raise ModelError(f"hyper-parameter {name} = {value} is out of range (1..{limit})")


__all__ = ["TransformerConfig", "ROPE_NEOX", "ROPE_NORMAL"]
