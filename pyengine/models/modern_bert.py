"""ModernBERT: pre-norm encoder blocks (LayerNorms without biases; none before the
first layer's attention, whose input is the normed embeddings already), a fused q/k/v
projection, NeoX RoPE, a GEGLU MLP (gelu(first half of up x) * second half, then
down), no biases anywhere, and a final LayerNorm.  Attention is bidirectional and
alternates: in every group of `attention.sliding_window_pattern` layers (3) the first
is global, roped with `rope.freq_base`, the others see only the tokens at most
sliding_window / 2 positions away on either side, roped with `rope.freq_base_swa`
(llama.cpp's symmetric window).  A cross-encoder (gte-reranker-modernbert) adds the
head: over the mean of the sequence's rows (`classifier.pooling_type`: mean unless the
file says cls), cls.output(norm(gelu(cls x))).  GGUF `general.architecture = modern-bert`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.errors import ModelError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import LayerNorm
from pyengine.models import common
from pyengine.models.binding import Module, blocks, module, tensor
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register

SWA_PERIOD = 3   # llama.cpp's default: one global layer, then two local ones
RANK_POOLINGS = {1: "mean", 2: "cls"}   # classifier.pooling_type, in GGUF's numbering


@dataclass(frozen=True)
class ModernBertConfig(common.EncoderConfig):
    sliding_window: int = 0        # 0: every layer global
    swa_period: int = SWA_PERIOD
    rope_base_local: float = 10000.0
    rank_pooling: str = "mean"     # the rows the classification head reads

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "ModernBertConfig":
        key = f.arch_key
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX)
        kw["rank_pooling"] = rank_pooling(f)
        window = f.get_int(key("attention.sliding_window"), 0)
        if window > 0:
            kw.update(sliding_window=window, swa_period=f.get_int(key("attention.sliding_window_pattern"), SWA_PERIOD),
                      rope_base_local=f.get_float(key("rope.freq_base_swa"), kw["rope_base"]))
        return cls(**kw)

    def __post_init__(self) -> None:
        super().__post_init__()
        common.check_range("attention.sliding_window", self.sliding_window, 0, 1 << 24)
        common.check_range("attention.sliding_window_pattern", self.swa_period, 1, 1 << 16)

    def is_local(self, layer: int) -> bool:
        return self.sliding_window > 0 and layer % self.swa_period != 0

    def layer_window(self, layer: int) -> int:
        return self.sliding_window if self.is_local(layer) else 0

    def layer_rope(self, ctx: Context, x: Tensor, positions: Tensor, layer: int,
                   freq_factors: Tensor | None = None) -> Tensor:
        base = self.rope_base_local if self.is_local(layer) else self.rope_base
        return self.rope(ctx, x, positions, base=base, freq_factors=freq_factors)


def rank_pooling(f: GGUFFile) -> str:
    """What the head pools: the file's classifier.pooling_type, mean where it has none
    (as llama.cpp reads gte-reranker-modernbert, whose file has none)."""
    value = f.get_int(f.arch_key("classifier.pooling_type"), 1)
    if value == -1:   # llama.cpp's "unspecified"
        value = 1
    if value not in RANK_POOLINGS:
        raise ModelError(f"{f.path}: classifier.pooling_type {value} is not one a ModernBERT head reads "
                         "(1 mean, 2 cls)")
    return RANK_POOLINGS[value]


@dataclass(eq=False)
class ClassifierHead(common.ClassifierHead):
    """cls.output(norm(gelu(cls x))): a ModernBERT cross-encoder's head (GELU, not BERT's
    tanh, then a bias-free LayerNorm); each part may be absent, as llama.cpp allows."""

    cls_norm: LayerNorm | None = tensor("cls.norm", optional=True, shape=("n_embd",))

    def __call__(self, ctx: Context, pooled: Tensor) -> Tensor:
        x = pooled                                                                 # [n_embd, n_seq]
        if self.cls is not None:
            x = ctx.gelu(self.cls(ctx, x))
            if self.cls_norm is not None:   # (llama.cpp norms only after cls)
                x = self.cls_norm(ctx, x, self.cfg.eps)
        if self.cls_output is not None:
            x = self.cls_output(ctx, x)                                            # [n_cls_out, n_seq]
        return x


@dataclass(eq=False)
class GegluMLP(common.FusedMLP):
    def gate(self, ctx: Context, gate: Tensor, up: Tensor) -> Tensor:
        return ctx.geglu(gate, up)


@dataclass(eq=False)
class Block(Module):
    """x + attn(norm(x)), then + mlp(norm(.))."""

    attn_norm: LayerNorm | None = tensor("attn_norm", optional=True, shape=("n_embd",))
    attn: common.FusedAttention = module()
    ffn_norm: LayerNorm = tensor("ffn_norm", shape=("n_embd",))
    mlp: GegluMLP = module()

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: common.LayerInputs) -> Tensor:
        eps = self.cfg.eps
        h = x if self.attn_norm is None else self.attn_norm(ctx, x, eps)
        x = ctx.add(x, self.attn(ctx, h, batch, layer, inputs))
        return ctx.add(x, self.mlp(ctx, self.ffn_norm(ctx, x, eps)))


@register("modern-bert")
@dataclass(eq=False)
class ModernBert(common.Encoder):
    Config = ModernBertConfig

    token_types: None = None
    head_cls: ClassifierHead = module()
    layers: list[Block] = blocks("blk")
    output_norm: LayerNorm = tensor("output_norm", shape=("n_embd",))

    def final(self, ctx: Context, x: Tensor) -> Tensor:
        return self.output_norm(ctx, x, self.cfg.eps)

    def rank_pooling(self) -> str:
        return self.cfg.rank_pooling
