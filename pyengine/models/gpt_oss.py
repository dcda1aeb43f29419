"""gpt-oss (OpenAI's open-weight MoE models): attention with q/k/v/o biases and
a learned sink logit per head that joins each softmax without a value,
sliding-window attention on the even layers (the odd ones see everything),
NeoX RoPE with the file's YaRN scaling, and after a post-attention RMS norm a
mixture of experts: a router with a bias, the top `expert_used_count` experts
weighted by a softmax over their own logits, each expert's gate and up
products with a bias per expert, its clamped SwiGLU (swiglu_oai), its down
product with a bias.  GGUF `gpt-oss` (llama.cpp's LLM_ARCH_OPENAI_MOE)."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.gguf import GGUFFile
from pyengine.ml import nn
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import F32Param, Linear, RMSNorm
from pyengine.models import common
from pyengine.models.binding import Module, blocks, module, tensor
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register

MAX_EXPERTS = 1024
# llama.cpp's build_moe_ffn fixes gpt-oss's unit (LLM_FFN_SWIGLU_OAI_MOE); the file has no keys for them
SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0
SWA_PATTERN = 2   # llama.cpp's set_swa_pattern(2): layers 0, 2, 4, ... slide, 1, 3, 5, ... see all


@dataclass(frozen=True)
class GptOssConfig(common.SlidingWindowConfig):
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0              # hidden size of one expert's MLP

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "GptOssConfig":
        key = f.arch_key
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX, eps_default=None)
        kw.update(
            n_expert=f.get_int(key("expert_count"), 0),
            n_expert_used=f.get_int(key("expert_used_count"), 0),
            n_ff_exp=f.get_int(key("expert_feed_forward_length"), 0),
            sliding_window=f.get_int(key("attention.sliding_window"), 0),
            swa_pattern=SWA_PATTERN,
            # the sliding layers rope as the others unless the file says otherwise (llama.cpp's _swa defaults)
            rope_base_local=f.get_float(key("rope.freq_base_swa"), kw["rope_base"]),
            rope_scale_local=kw["rope_scale"],
        )
        return cls(**kw)

    def __post_init__(self) -> None:
        super().__post_init__()
        common.check_range("expert_count", self.n_expert, 1, MAX_EXPERTS)
        common.check_range("expert_used_count", self.n_expert_used, 1, self.n_expert)
        common.check_range("expert_feed_forward_length", self.n_ff_exp, 1, 1 << 20)


@dataclass(eq=False)
class SinkAttention(common.Attention):
    """Separate biased projections, RoPE as the layer takes it, attention whose
    softmax also counts one learned sink logit per head."""

    attn_sinks: F32Param = tensor("attn_sinks", shape=("n_head",))

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: common.LayerInputs) -> Tensor:
        c = self.cfg
        q, k, v = self.project(ctx, x)                                              # [hd, H|Hkv, T], [hd*Hkv, T]
        q, k = self.position(ctx, q, k, batch.positions, layer, inputs.freq_factors)
        o = nn.attention(ctx, batch, layer, q, ctx.reshape(k, (c.kv_dim, -1)), v, n_head_kv=c.n_head_kv,
                         scale=c.attn_scale, sinks=ctx.weight(self.attn_sinks.weight))  # [hd*H, T]
        return self.attn_output(ctx, o)


@dataclass(eq=False)
class MoE(Module):
    ffn_gate_inp: Linear = tensor("ffn_gate_inp", shape=("n_embd", "n_expert"))             # the router (+ bias)
    ffn_gate_exps: nn.Experts = tensor("ffn_gate_exps", shape=("n_embd", "n_ff_exp", "n_expert"))
    ffn_up_exps: nn.Experts = tensor("ffn_up_exps", shape=("n_embd", "n_ff_exp", "n_expert"))
    ffn_down_exps: nn.Experts = tensor("ffn_down_exps", shape=("n_ff_exp", "n_embd", "n_expert"))

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        c, n_tokens = self.cfg, x.shape[1]
        scores = self.ffn_gate_inp(ctx, x)                                          # [E, T]
        chosen = ctx.topk(scores, c.n_expert_used)                                  # i32 [U, T]
        weights = ctx.moe_softmax_chosen(scores, chosen)                            # [U, T]
        x = ctx.reshape(x, (c.n_embd, 1, n_tokens))                                 # one input for all U
        gate = self.ffn_gate_exps(ctx, x, chosen)                                   # [F, U, T]
        up = self.ffn_up_exps(ctx, x, chosen)                                       # [F, U, T]
        act = ctx.swiglu_oai(gate, up, alpha=SWIGLU_ALPHA, limit=SWIGLU_LIMIT)      # [F, U, T]
        return ctx.weighted_sum(self.ffn_down_exps(ctx, act, chosen), weights)      # [n_embd, T]


@dataclass(eq=False)
class Block(Module):
    """x + attn(norm(x)), then + moe(post_attention_norm(.))."""

    attn_norm: RMSNorm = tensor("attn_norm", shape=("n_embd",))
    attn: SinkAttention = module()
    post_attention_norm: RMSNorm = tensor("post_attention_norm", shape=("n_embd",))
    mlp: MoE = module()

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: common.LayerInputs) -> Tensor:
        eps = self.cfg.eps
        x = ctx.add(x, self.attn(ctx, self.attn_norm(ctx, x, eps), batch, layer, inputs))
        return ctx.add(x, self.mlp(ctx, self.post_attention_norm(ctx, x, eps)))


@register("gpt-oss")
@dataclass(eq=False)
class GptOss(common.Decoder):
    Config = GptOssConfig

    rope_freqs: F32Param | None = None
    layers: list[Block] = blocks("blk")
