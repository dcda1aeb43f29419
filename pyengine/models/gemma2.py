"""Gemma 2: embeddings scaled by sqrt(n_embd), a GELU(tanh)-gated MLP, RMS
norms after attention and after the MLP as well as before, soft-capped
attention scores and final logits, and sliding-window attention on every
other layer (the even ones).  GGUF `gemma2`.

Gemma's GGUF norm weights already include Gemma's "+1", so they are plain
RMSNorm weights here."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyengine.errors import ModelError
from pyengine.gguf import GGUFFile
from pyengine.ml import nn
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import Embedding, Linear, RMSNorm
from pyengine.models import llama, qwen2
from pyengine.models.binding import Module, blocks, module, tensor
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register

# llama.cpp's values when a Gemma 2 file lacks the keys
GEMMA2_DEFAULT_WINDOW = 4096
GEMMA2_DEFAULT_ATTN_SOFTCAP = 50.0
GEMMA2_DEFAULT_FINAL_SOFTCAP = 30.0


@dataclass(frozen=True)
class Gemma2Config(qwen2.AttentionConfig):
    LAYERS_27B = 46                # how llama.cpp recognises the 27B model (see query_pre_attn_scalar)

    sliding_window: int = 0        # tokens a sliding layer sees (its own included)
    swa_pattern: int = 2           # in each group of this many layers, all but the last slide
    rope_base_local: float = 0.0   # RoPE of the sliding layers
    rope_scale_local: float = 1.0
    final_softcap: float = 0.0     # cap * tanh(logit / cap) on the output; 0 = none

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Gemma2Config":
        kw = cls.gemma_from_gguf(f)
        key = f.arch_key
        kw.update(
            sliding_window=f.get_int(key("attention.sliding_window"), GEMMA2_DEFAULT_WINDOW),
            swa_pattern=2,
            rope_base_local=kw["rope_base"],
            rope_scale_local=kw["rope_scale"],
            attn_softcap=f.get_float(key("attn_logit_softcapping"), GEMMA2_DEFAULT_ATTN_SOFTCAP),
            final_softcap=f.get_float(key("final_logit_softcapping"), GEMMA2_DEFAULT_FINAL_SOFTCAP),
        )
        return cls(**kw)

    @classmethod
    def gemma_from_gguf(cls, f: GGUFFile) -> dict:
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX, eps_default=1e-6)
        kw["attn_scale"] = 1.0 / math.sqrt(cls.query_pre_attn_scalar(kw))
        kw["scale_query"] = True
        return kw

    @classmethod
    def query_pre_attn_scalar(cls, kw: dict) -> int:
        # Gemma scales queries by 1/sqrt(query_pre_attn_scalar), which GGUF does not
        # store; it is the head size except in the 27B models (recognised, as llama.cpp
        # does, by their layer count), where it is n_embd / n_head.
        if kw["n_layer"] == cls.LAYERS_27B and kw["n_embd"] % kw["n_head"] == 0:
            return kw["n_embd"] // kw["n_head"]
        return max(kw["head_dim"], 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        qwen2.check_range("attention.sliding_window", self.sliding_window, 1, 1 << 24)
        qwen2.check_range("sliding-window layer pattern", self.swa_pattern, 1, 1 << 16)
        if not (self.final_softcap >= 0 and math.isfinite(self.final_softcap)):
            raise ModelError(f"final_logit_softcapping must be >= 0, got {self.final_softcap}")

    def is_sliding(self, layer: int) -> bool:
        return layer % self.swa_pattern < self.swa_pattern - 1

    def layer_window(self, layer: int) -> int:
        return self.sliding_window if self.is_sliding(layer) else 0

    def layer_rope(self, ctx: Context, x: Tensor, positions: Tensor, layer: int,
                   freq_factors: Tensor | None = None) -> Tensor:
        local = self.is_sliding(layer)
        return self.rope(ctx, x, positions, base=self.rope_base_local if local else self.rope_base,
                         scale=self.rope_scale_local if local else self.rope_scale, freq_factors=freq_factors)


@dataclass(eq=False)
class MLP(llama.MLP):
    """down(gelu_tanh(gate x) * up x)."""

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        return self.ffn_down(ctx, ctx.geglu(*nn.linears(ctx, (self.ffn_gate, self.ffn_up), x)))


@dataclass(eq=False)
class Block(Module):
    attn_norm: RMSNorm = tensor("attn_norm", shape=("n_embd",))
    attn: qwen2.Attention = module()
    post_attention_norm: RMSNorm = tensor("post_attention_norm", shape=("n_embd",))
    ffn_norm: RMSNorm = tensor("ffn_norm", shape=("n_embd",))
    mlp: MLP = module()
    post_ffw_norm: RMSNorm = tensor("post_ffw_norm", shape=("n_embd",))

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int) -> Tensor:
        eps = self.cfg.eps
        h = self.attn(ctx, self.attn_norm(ctx, x, eps), batch, layer)
        x = ctx.add(x, self.post_attention_norm(ctx, h, eps))
        h = self.mlp(ctx, self.ffn_norm(ctx, x, eps))
        return ctx.add(x, self.post_ffw_norm(ctx, h, eps))


@register("gemma2")
@dataclass(eq=False)
class Gemma2(Module):
    Config = Gemma2Config

    token_embd: Embedding = tensor("token_embd", shape=("n_embd", "n_vocab"))
    layers: list[Block] = blocks("blk")
    output_norm: RMSNorm = tensor("output_norm", shape=("n_embd",))
    output: Linear = tensor("output", alt="token_embd", shape=("n_embd", "n_vocab"))

    def forward(self, ctx: Context, batch) -> Tensor:
        c = self.cfg
        x = ctx.scale(self.token_embd(ctx, batch.tokens), math.sqrt(c.n_embd))      # [n_embd, T]
        for i, block in enumerate(self.layers):
            x = block(ctx, x, batch, i)
        x = ctx.get_rows(x, batch.out_ids)                                         # [n_embd, n_out]
        logits = self.output(ctx, self.output_norm(ctx, x, c.eps))                 # [n_vocab, n_out]
        return ctx.softcap(logits, c.final_softcap) if c.final_softcap > 0 else logits

    def cache_layout(self) -> list[nn.CacheSpec]:
        return self.cfg.cache_layout()
