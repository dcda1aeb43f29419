"""LG EXAONE 4.0: OLMo 2's block (no norm before attention or the MLP, an RMS
norm on each one's output before its residual add) with Qwen3's RMS norm over
each query and key head, NeoX-style RoPE, a SiLU-gated MLP, and the output
tied to the token embedding when the file has no `output.weight`.
GGUF `general.architecture = exaone4`.

Hybrid attention, as llama.cpp runs it: only a 64-layer model (the 32B) is
hybrid.  Its sliding layers attend to the last `attention.sliding_window`
tokens (4096 when the key is missing) and rope; its global layers attend to
everything without any position encoding.  Which layers slide comes from
`attention.sliding_window_pattern`: a per-layer array (the converter's form;
nonzero = sliding), else a period n (layer i slides when i % n < n - 1; every
layer when n = 0), else llama.cpp's period 4.  Any other depth (the 1.2B has
30 layers) ropes every layer over the whole context, whatever window keys the
file has.  RoPE uses `rope_freqs` (Llama-3 factors) where the file has it,
never a separate base for the sliding layers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pyengine.errors import ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Context, Tensor
from pyengine.models import common
from pyengine.models.binding import blocks, module
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register

# llama.cpp's values (GGUF does not say whether a model is hybrid)
HYBRID_LAYERS = 64       # the depth at which llama.cpp turns hybrid attention on (the 32B)
DEFAULT_WINDOW = 4096
DEFAULT_PATTERN = 4      # three sliding layers, then a global one


@dataclass(frozen=True)
class Exaone4Config(common.AttentionConfig):
    ROPE_WHOLE_HEADS = True   # (llama.cpp asserts it)

    sliding_window: int = 0                # tokens a sliding layer sees (its own included)
    sliding: tuple[bool, ...] = ()         # per layer of a hybrid model: slides (and ropes); () = not hybrid

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Exaone4Config":
        key = f.arch_key
        scaling = f.get_str(key("rope.scaling.type"), "none")
        if scaling not in ("none", "linear"):
            raise UnsupportedError(f"{f.path}: rope scaling {scaling!r} is not supported for EXAONE 4 yet; "
                                   "use a file converted without it (Llama-3 scaling comes as rope_freqs and runs)")
        if f.get_int(key("nextn_predict_layers"), 0):
            raise UnsupportedError(f"{f.path}: EXAONE 4 files with multi-token-prediction (NextN) layers "
                                   "are not supported yet")
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX, eps_default=None)   # HF's rotate-half layout
        if kw["n_layer"] == HYBRID_LAYERS:
            base_swa = f.get_float(key("rope.freq_base_swa"), kw["rope_base"])
            if base_swa != kw["rope_base"]:   # llama.cpp's graph ignores it, its context shift does not
                raise UnsupportedError(f"{f.path}: rope.freq_base_swa {base_swa} differs from rope.freq_base "
                                       f"{kw['rope_base']}; EXAONE 4 ropes its sliding layers with one base")
            kw.update(sliding_window=f.get_int(key("attention.sliding_window"), DEFAULT_WINDOW),
                      sliding=cls.sliding_layers(f, kw["n_layer"]))
        return cls(**kw)

    @staticmethod
    def sliding_layers(f: GGUFFile, n_layer: int) -> tuple[bool, ...]:
        """Which layers slide, read as llama.cpp's load_swa_pattern reads them."""
        name = f.arch_key("attention.sliding_window_pattern")
        value = f.metadata.get(name)
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "biu" or value.ndim != 1 or len(value) < n_layer:
                raise ModelError(f"{f.path}: {name} must be a bool or integer array with one entry per "
                                 f"layer ({n_layer}), got {len(value)} of {value.dtype}")
            return tuple(bool(v) for v in value[:n_layer])
        period = f.get_int(name, DEFAULT_PATTERN)
        common.check_range(name, period, 0, 1 << 16)
        return tuple(period == 0 or i % period < period - 1 for i in range(n_layer))

    def __post_init__(self) -> None:
        super().__post_init__()
        # llama.cpp shapes attn_output as n_embd x n_embd
        if self.q_dim != self.n_embd:
            raise ModelError(f"head_count {self.n_head} x head size {self.head_dim} = {self.q_dim} must equal "
                             f"embedding_length {self.n_embd} in an exaone4 model")
        if self.sliding:
            common.check_range("attention.sliding_window", self.sliding_window, 1, 1 << 24)
            if len(self.sliding) != self.n_layer:
                raise ModelError(f"sliding-window pattern has {len(self.sliding)} layers, the model {self.n_layer}")

    def uses_rope(self, layer: int) -> bool:
        return not self.sliding or self.sliding[layer]

    def layer_window(self, layer: int) -> int:
        return self.sliding_window if self.sliding and self.sliding[layer] else 0

    def layer_rope(self, ctx: Context, x: Tensor, positions: Tensor, layer: int,
                   freq_factors: Tensor | None = None) -> Tensor:
        """RoPE (with rope_freqs) on the sliding layers, or on every layer of a model that is not
        hybrid; a hybrid model's global layers return x as it is."""
        return self.rope(ctx, x, positions, freq_factors=freq_factors) if self.uses_rope(layer) else x


@dataclass(eq=False)
class Block(common.PostNormBlock):
    """x + norm(attention(x)), then + norm(mlp(.)); q and k normed per head before RoPE."""

    attn: common.HeadNormAttention = module()


@register("exaone4")
@dataclass(eq=False)
class Exaone4(common.Decoder):
    """The shared decoder (optional rope_freqs, output tied when missing) with EXAONE 4's
    blocks; the KV cache takes each layer's window from the config."""

    Config = Exaone4Config

    layers: list[Block] = blocks("blk")
