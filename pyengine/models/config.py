"""Hyper-parameters every transformer shares, read from GGUF keys and
checked before any graph is built (absurd values fail here, not in C).

RoPE scaling is read as llama.cpp reads it (llama-model.cpp's load_hparams,
the context's cparams in llama-context.cpp): `rope.scaling.type` (linear when
the key is absent), freq_scale = 1 / `rope.scaling.factor` (else the older
`rope.scale_linear`) unless the type is none, `rope.scaling.attn_factor` on
every rope, and for yarn ggml's YaRN (ext_factor 1, beta_fast 32, beta_slow 1,
the ramp placed by `rope.scaling.original_context_length`) with llama.cpp's
attention factor.  A type pyengine cannot run is refused, never ignored."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields

import numpy as np

from pyengine.errors import GGUFError, ModelError, UnsupportedError
from pyengine.gguf import MISSING, GGUFFile
from pyengine.ml.context import ROPE_NEOX, ROPE_NORMAL, Context, Tensor

MAX_LAYERS = 1024
MAX_HEADS = 4096
MAX_HEAD_DIM = 1024

# llama.cpp's YaRN ramp ends (hparams' defaults; no GGUF key sets them for these architectures)
YARN_BETA_FAST = 32.0
YARN_BETA_SLOW = 1.0
F32 = np.float32   # llama.cpp derives the attention factor in float; so do we, step for step


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
    rope_scale: float          # freq_scale = 1 / rope.scaling.factor (1 when none)
    rope_dims: int
    rope_mode: int
    n_ctx_train: int
    rope_ext_factor: float = 0.0    # YaRN: 1 mixes extrapolated angles into the interpolated ones; 0 = off
    rope_attn_factor: float = 1.0   # attn_factor of every rope (llama.cpp's cparams.yarn_attn_factor)
    n_ctx_orig: int = 0             # rope.scaling.original_context_length, else context_length
    rope_beta_fast: float = YARN_BETA_FAST   # YaRN's ramp ends (an architecture may read them from its file)
    rope_beta_slow: float = YARN_BETA_SLOW
    rope_rotation_only: bool = False   # see rotation_only()

    # rope.scaling.type values this architecture runs (Phi-3 adds its LongRoPE)
    ROPE_SCALINGS = ("none", "linear", "yarn")
    # llama.cpp asserts rope.dimension_count == the head size for the architecture
    ROPE_WHOLE_HEADS = False
    # head_count_kv per layer may say 0 for a layer without attention (a recurrent
    # one: LFM2's, the hybrids'); the count is then that of the attention layers
    ZERO_KV_LAYERS = False
    # feed_forward_length per layer may say 0 for a layer without an MLP (Nemotron-H's);
    # n_ff is then that of the MLP layers
    ZERO_FF_LAYERS = False

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim

    @classmethod
    def common_from_gguf(cls, f: GGUFFile, *, rope_mode: int = ROPE_NEOX, eps_default: float | None = 1e-5) -> dict:
        """The shared fields as keyword arguments; an architecture adds its own.
        eps_default None: the file must set its RMS norm epsilon (llama.cpp requires
        it for the architecture, so no default is guessed)."""
        key = f.arch_key
        eps_key = key("attention.layer_norm_rms_epsilon")
        if eps_default is None and eps_key not in f.metadata:
            raise ModelError(f"{f.path}: missing metadata key {eps_key!r} ({f.architecture} models must set "
                             "their RMS norm epsilon)")
        try:
            n_embd = f.get_int(key("embedding_length"))
            n_head = _uniform_int(f, key("attention.head_count"))
            n_head_kv = _uniform_int(f, key("attention.head_count_kv"), n_head, skip_zero=cls.ZERO_KV_LAYERS)
            n_ff = _uniform_int(f, key("feed_forward_length"), 0, skip_zero=cls.ZERO_FF_LAYERS)
        except GGUFError as e:
            raise ModelError(f"{f.path}: {e}") from None
        _positive("embedding_length", n_embd, 1 << 20)
        _positive("attention.head_count", n_head, MAX_HEADS)
        head_dim = f.get_int(key("attention.key_length"), n_embd // n_head if n_embd % n_head == 0 else 0)
        embd = f.tensors.get("token_embd.weight")
        if embd is None:
            raise ModelError(f"missing tensor 'token_embd.weight' in {f.path}")
        n_ctx_train = f.get_int(key("context_length"), 2048)
        return dict(
            n_vocab=embd.shape[1],
            n_embd=n_embd,
            n_layer=f.get_int(key("block_count")),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_ff=n_ff,
            eps=f.get_float(eps_key, eps_default),
            rope_base=f.get_float(key("rope.freq_base"), 10000.0),
            rope_dims=f.get_int(key("rope.dimension_count"), head_dim),
            rope_mode=rope_mode,
            n_ctx_train=n_ctx_train,
            **cls.rope_scaling_from_gguf(f, n_ctx_train),
        )

    @classmethod
    def rope_scaling_from_gguf(cls, f: GGUFFile, n_ctx_train: int) -> dict:
        """rope_scale, rope_ext_factor, rope_attn_factor and n_ctx_orig as llama.cpp
        derives them from the file (with llama.cpp's default context parameters)."""
        key = f.arch_key
        kind = f.get_str(key("rope.scaling.type"), "linear")   # llama.cpp's default when absent
        if kind not in cls.ROPE_SCALINGS:
            raise UnsupportedError(f"{f.path}: rope scaling {kind!r} ({key('rope.scaling.type')}) is not "
                                   f"supported for {f.architecture}; pyengine runs {', '.join(cls.ROPE_SCALINGS)}")
        factor_key = key("rope.scaling.factor")   # the older key only when the newer is absent
        factor = f.get_float(factor_key if factor_key in f.metadata else key("rope.scale_linear"), 0.0)
        scale = 1.0 if kind == "none" or factor == 0 else 1.0 / factor
        ext_factor = 1.0 if kind == "yarn" else 0.0
        return dict(rope_scale=scale, rope_ext_factor=ext_factor,
                    rope_attn_factor=yarn_attn_factor(scale, ext_factor,
                                                      f.get_float(key("rope.scaling.attn_factor"), 1.0)),
                    n_ctx_orig=f.get_int(key("rope.scaling.original_context_length"), 0) or n_ctx_train)

    def __post_init__(self) -> None:
        _positive("block_count", self.n_layer, MAX_LAYERS)
        _positive("attention.head_count_kv", self.n_head_kv, MAX_HEADS)
        if self.n_head % self.n_head_kv:
            raise ModelError(f"head_count {self.n_head} is not a multiple of head_count_kv {self.n_head_kv}")
        _positive("attention.key_length (head size)", self.head_dim, MAX_HEAD_DIM)
        if self.ROPE_WHOLE_HEADS and self.rope_dims != self.head_dim:
            raise ModelError(f"rope.dimension_count {self.rope_dims} must equal the head size {self.head_dim} "
                             "(llama.cpp ropes whole heads for this architecture)")
        if self.rope_dims <= 0 or self.rope_dims > self.head_dim or self.rope_dims % 2:
            raise ModelError(f"rope.dimension_count {self.rope_dims} is invalid for head size {self.head_dim}")
        if not (self.eps > 0 and math.isfinite(self.eps)):
            raise ModelError(f"layer_norm_rms_epsilon must be positive, got {self.eps}")
        if not (self.rope_base > 0 and self.rope_scale > 0):
            raise ModelError("rope.freq_base and rope scaling must be positive")
        if not (self.rope_attn_factor > 0 and math.isfinite(self.rope_attn_factor)):
            raise ModelError(f"rope.scaling.attn_factor must be positive, got {self.rope_attn_factor}")
        _positive("context_length", self.n_ctx_train, 1 << 24)
        _positive("rope.scaling.original_context_length", self.n_ctx_orig, 1 << 24)
        for name in ("rope_beta_fast", "rope_beta_slow"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ModelError(f"YaRN's {name} must be positive and finite, got {value}")

    def rope(self, ctx: Context, x: Tensor, positions: Tensor, *, base: float | None = None,
             scale: float | None = None, freq_factors: Tensor | None = None) -> Tensor:
        """RoPE with this model's parameters (a layer may override the base and scale;
        YaRN and the attention factor are the same on every layer, as in llama.cpp)."""
        scale = self.rope_scale if scale is None else scale
        return ctx.rope(x, positions, n_dims=self.rope_dims, mode=self.rope_mode,
                        base=self.rope_base if base is None else base, scale=scale,
                        freq_factors=freq_factors, ext_factor=self.rope_ext_factor,
                        attn_factor=self.rope_attn(scale), beta_fast=self.rope_beta_fast,
                        beta_slow=self.rope_beta_slow, n_ctx_orig=self.n_ctx_orig)

    def rope_attn(self, scale: float) -> float:
        """The attn_factor of a rope with freq_scale `scale`: the model's, or in a
        rotation-only config the one that leaves ggml's rope a pure rotation."""
        if not self.rope_rotation_only:
            return self.rope_attn_factor
        return float(F32(1) / yarn_ggml_mscale(scale)) if self.rope_ext_factor != 0 else 1.0

    def rotation_only(self) -> "TransformerConfig":
        """This config with its RoPE reduced to the rotation, for re-roping cached keys
        (a context shift): they already carry the attention factor and YaRN's
        magnitude, which a second rope must not apply again.  (llama.cpp's K-shift
        passes the forward attn_factor, so its shifted keys grow by ggml's YaRN
        mscale at every shift; a fresh run's keys are what these re-ropes give.)"""
        return dataclasses.replace(self, rope_rotation_only=True)

    def describe(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _logf(x) -> np.float32:
    # C's logf: the float64 logarithm rounded to float (glibc's logf is correctly rounded
    # but for rare hard cases); NaN where it is undefined, for __post_init__ to refuse
    x = float(x)
    return F32(math.log(x)) if x > 0 else F32(math.nan)


def yarn_ggml_mscale(freq_scale: float) -> np.float32:
    """The factor ggml's rope multiplies cos/sin by on its own when ext_factor != 0
    (rope_yarn in ggml-cpu/ops.cpp: 1 + 0.1 ln(1 / freq_scale)), in float."""
    return F32(1) + F32(0.1) * _logf(F32(1) / F32(freq_scale))


def yarn_attn_factor(freq_scale: float, ext_factor: float, file_attn_factor: float, log_mul: float = 0.0) -> float:
    """llama.cpp's cparams.yarn_attn_factor (llama-context.cpp, since PR 17945), in its
    float steps: with YaRN, get_mscale(factor, 1) / get_mscale(factor, m) for a
    rope.scaling.yarn_log_multiplier m != 0 (only some architectures read it), else
    get_mscale(factor, 1), get_mscale(f, m) = 1 + 0.1 m ln(f) (1 for f <= 1), divided
    by what ggml's rope multiplies in itself; then times rope.scaling.attn_factor,
    with or without YaRN."""
    attn = F32(1)
    if ext_factor != 0:
        factor = F32(1) / F32(freq_scale)

        def mscale(m: float) -> np.float32:
            return F32(1) if factor <= 1 else F32(0.1) * F32(m) * _logf(factor) + F32(1)

        attn = mscale(1.0) / mscale(log_mul) if log_mul else mscale(1.0)
        attn = attn * (F32(1) / yarn_ggml_mscale(freq_scale))
    return float(attn * F32(file_attn_factor))


def _uniform_int(f: GGUFFile, key: str, default: object = MISSING, *, skip_zero: bool = False) -> int:
    """An int that some converters write once per layer (Granite 4's head counts):
    the value, when every layer has the same one (pyengine's layers share their
    shapes; llama.cpp reads a count per layer).  skip_zero: layers saying 0 (no
    attention) do not count."""
    value = f.metadata.get(key)
    if isinstance(value, (list, np.ndarray)) and len(value) > 0:
        counts = {int(v) for v in value if not (skip_zero and int(v) == 0)} or {0}
        if len(counts) > 1:
            raise UnsupportedError(f"{f.path}: {key} differs between layers ({sorted(counts)}); "
                                   "pyengine runs models whose layers have the same head counts and MLP sizes")
        return counts.pop()
    return f.get_int(key, default)


def _positive(name: str, value: int, limit: int) -> None:
    if not isinstance(value, int) or not 1 <= value <= limit:
        raise ModelError(f"hyper-parameter {name} = {value} is out of range (1..{limit})")


__all__ = ["TransformerConfig", "ROPE_NEOX", "ROPE_NORMAL", "YARN_BETA_FAST", "YARN_BETA_SLOW"]
