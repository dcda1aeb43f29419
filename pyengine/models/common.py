"""What the architectures share: the attention config, the attention, MLP and
block variants, the decoder every architecture is, and the model protocol the
runner and the context shift call.

An architecture file (models/<arch>.py) imports this module and the shared
config, binding and registry modules, never another architecture's file: it
declares its config, picks the pieces here (or adds one of its own) and says
what differs.

The shapes follow GGML: x [n_embd, T] for T tokens; q [head_dim, n_head, T];
k [head_dim, n_head_kv, T]; v [head_dim * n_head_kv, T]."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pyengine.errors import ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml import nn
from pyengine.ml.context import ROPE_MROPE, Context, Tensor
from pyengine.ml.nn import BareF32Param, Embedding, F32Bias, F32Param, LayerNorm, Linear, Param, RMSNorm, Weight
from pyengine.models.binding import Module, blocks, module, tensor
from pyengine.models.config import ROPE_NEOX, TransformerConfig

F32_BYTES = 4
MAX_EXPERTS = 1024


# ---- the protocol ---------------------------------------------------------------------


@runtime_checkable
class CausalLM(Protocol):
    """What the runner (runner/forward.py, runner/engine.py) and the context shift
    (kvcache/rotate.py) ask of a model; every registered architecture implements it."""

    cfg: TransformerConfig

    def hidden(self, ctx: Context, batch) -> Tensor:
        """[n_embd, n_out] the final-norm hidden rows of the batch's output rows."""

    def head(self, ctx: Context, x: Tensor) -> Tensor:
        """[n_vocab, n_out] the logits of hidden rows x (whatever the model adds after
        the output projection, a soft-cap or a scale, included)."""

    def forward(self, ctx: Context, batch) -> Tensor:
        """head(hidden(batch))."""

    def shift_keys(self, ctx: Context, k: Tensor, positions: Tensor, layer: int,
                   n_ctx_seq: int | None = None) -> Tensor:
        """Cached keys k [head_dim, n_head_kv, n] of `layer` moved `positions` further (a
        context shift).  n_ctx_seq: the context one sequence may fill, for a model whose
        RoPE depends on it (Phi-3's LongRoPE); None where the caller does not know."""

    def cache_layout(self) -> list[nn.LayerCache]:
        """What each layer keeps: attention K/V (nn.CacheSpec, with its window), a
        recurrent state (nn.RecurrentSpec) or an encoder memory (nn.EncoderSpec); the
        runner's Cache (kvcache/cache.py) gives each kind its layers."""


def check_range(name: str, value: int, low: int, high: int) -> None:
    """A hyper-parameter outside [low, high] is a broken model, not a crash later."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ModelError(f"hyper-parameter {name} = {value} is out of range ({low}..{high})")


def zero_kv_layers(f: GGUFFile, n_layer: int, n_head_kv: int) -> tuple[bool, ...]:
    """Per layer, whether the file's `attention.head_count_kv` is 0 there: the recurrent
    layers of a hybrid that marks them so (LFM2, Granite 4); one count: every layer attends."""
    counts = f.metadata.get(f.arch_key("attention.head_count_kv"))
    if not hasattr(counts, "__len__"):   # one count (or none): every layer attends
        counts = [n_head_kv] * n_layer
    if len(counts) != n_layer:
        raise ModelError(f"{f.path}: {len(counts)} head_count_kv entries for {n_layer} layers")
    return tuple(int(n) == 0 for n in counts)


def gemma_query_scale(kw: dict, layers_27b: int) -> float:
    """Gemma's query factor 1/sqrt(query_pre_attn_scalar), which GGUF does not store:
    the scalar is the head size except in the 27B models (recognised, as llama.cpp
    does, by their layer count `layers_27b`), where it is n_embd / n_head."""
    if kw["n_layer"] == layers_27b and kw["n_embd"] % kw["n_head"] == 0:
        return 1.0 / math.sqrt(kw["n_embd"] // kw["n_head"])
    return 1.0 / math.sqrt(max(kw["head_dim"], 1))


# ---- config ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionConfig(TransformerConfig):
    """Shared hyper-parameters plus the per-layer attention knobs: what differs per
    layer (rope base, window) is asked of the config, so no layer class branches on
    the architecture."""

    attn_scale: float = 0.0     # multiplies q.k before the softmax
    attn_softcap: float = 0.0   # cap * tanh(score / cap) on the scores; 0 = none
    scale_query: bool = False   # apply attn_scale to the query instead (Gemma, as llama.cpp does)
    alibi_max_bias: float = 0.0   # ALiBi's max bias (Jina's 8); 0 = none

    @classmethod
    def common_from_gguf(cls, f: GGUFFile, *, rope_mode: int = ROPE_NEOX, eps_default: float | None = 1e-5,
                         equal_heads: bool = True) -> dict:
        """equal_heads: refuse a file whose value heads differ from its key heads (an
        architecture that checks them itself, or lets the tensor shapes do it, says False)."""
        kw = super().common_from_gguf(f, rope_mode=rope_mode, eps_default=eps_default)
        head_dim = kw["head_dim"]
        value_dim = f.get_int(f.arch_key("attention.value_length"), head_dim)
        if equal_heads and head_dim > 0 and value_dim != head_dim:   # (an invalid head_dim fails in __post_init__)
            raise UnsupportedError(f"{f.path}: value head size {value_dim} differs from key head size "
                                   f"{head_dim}; pyengine needs them equal")
        kw["attn_scale"] = 1.0 / math.sqrt(head_dim) if head_dim > 0 else 0.0
        return kw

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.attn_scale > 0 and math.isfinite(self.attn_scale)):
            raise ModelError(f"attention scale must be positive, got {self.attn_scale}")
        if not (self.attn_softcap >= 0 and math.isfinite(self.attn_softcap)):
            raise ModelError(f"attention soft-capping must be >= 0, got {self.attn_softcap}")

    @property
    def qkv_dim(self) -> int:
        """Rows of a fused q/k/v projection."""
        return self.q_dim + 2 * self.kv_dim

    @property
    def n_ff_pair(self) -> int:
        """Rows of a fused gate/up projection."""
        return 2 * self.n_ff

    def layer_rope(self, ctx: Context, x: Tensor, positions: Tensor, layer: int,
                   freq_factors: Tensor | None = None) -> Tensor:
        """RoPE as layer `layer` applies it (the same for every layer here)."""
        return self.rope(ctx, x, positions, freq_factors=freq_factors)

    def layer_window(self, layer: int) -> int:
        """Sliding-window size of layer `layer` in tokens; 0 = it sees everything."""
        return 0

    def cache_layout(self) -> list[nn.CacheSpec]:
        return [nn.CacheSpec(k_dim=self.kv_dim, v_dim=self.kv_dim, window=self.layer_window(i))
                for i in range(self.n_layer)]


@dataclass(frozen=True)
class SlidingWindowConfig(AttentionConfig):
    """Layers in groups of `swa_pattern`: all but the last of each group see only
    the last `sliding_window` tokens and rope with their own base and scale."""

    sliding_window: int = 0        # tokens a sliding layer sees (its own included)
    swa_pattern: int = 2           # in each group of this many layers, all but the last slide
    rope_base_local: float = 0.0   # RoPE of the sliding layers
    rope_scale_local: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("attention.sliding_window", self.sliding_window, 1, 1 << 24)
        check_range("sliding-window layer pattern", self.swa_pattern, 1, 1 << 16)

    def is_sliding(self, layer: int) -> bool:
        return layer % self.swa_pattern < self.swa_pattern - 1

    def layer_window(self, layer: int) -> int:
        return self.sliding_window if self.is_sliding(layer) else 0

    def layer_rope(self, ctx: Context, x: Tensor, positions: Tensor, layer: int,
                   freq_factors: Tensor | None = None) -> Tensor:
        local = self.is_sliding(layer)
        return self.rope(ctx, x, positions, base=self.rope_base_local if local else self.rope_base,
                         scale=self.rope_scale_local if local else self.rope_scale, freq_factors=freq_factors)


@dataclass(frozen=True)
class ExpertsConfig(AttentionConfig):
    """AttentionConfig plus routed experts: a router scores `n_expert` experts per
    token, the `n_expert_used` best run.  n_expert 0: no experts (a dense model,
    for an architecture whose files may have them or not)."""

    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0                  # hidden size of one expert's MLP
    norm_expert_weights: bool = True   # renormalise the chosen experts' weights to sum to 1
    expert_weights_scale: float = 1.0
    n_ff_shexp: int = 0                # hidden size of the shared expert, where the layers have one

    @staticmethod
    def experts_from_gguf(f: GGUFFile, *, n_ff_exp: int, norm_default: bool = True) -> dict:
        """The expert keys of `f`; n_ff_exp: the hidden size the architecture's experts have
        when the file does not say (`expert_feed_forward_length`)."""
        key = f.arch_key
        scale = f.get_float(key("expert_weights_scale"), 0.0)
        return dict(n_expert=f.get_int(key("expert_count"), 0),
                    n_expert_used=f.get_int(key("expert_used_count"), 0),
                    n_ff_exp=n_ff_exp,
                    norm_expert_weights=f.get_bool(key("expert_weights_norm"), norm_default),
                    expert_weights_scale=scale if scale > 0 else 1.0)   # llama.cpp: 0 (absent) = no scaling

    @staticmethod
    def expert_width(f: GGUFFile, n_ff: int) -> int:
        """expert_feed_forward_length, else llama.cpp's fallback for the Qwen MoEs:
        feed_forward_length over expert_used_count."""
        n_used = f.get_int(f.arch_key("expert_used_count"), 0)
        return f.get_int(f.arch_key("expert_feed_forward_length"), n_ff // n_used if n_used > 0 else 0)

    def check_experts(self) -> None:
        check_range("expert_count", self.n_expert, 1, MAX_EXPERTS)
        check_range("expert_used_count", self.n_expert_used, 1, self.n_expert)
        check_range("expert_feed_forward_length", self.n_ff_exp, 1, 1 << 20)
        if not math.isfinite(self.expert_weights_scale):
            raise ModelError(f"expert_weights_scale must be finite, got {self.expert_weights_scale}")


# ---- attention ------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerInputs:
    """What every layer reads besides x that the model makes once per batch."""

    freq_factors: Tensor | None = None   # RoPE frequency factors [rope_dims / 2]
    q_factor: Tensor | None = None       # [1, 1, T] a factor per token on the roped queries


def split_heads(ctx: Context, x: Tensor, head_dim: int) -> Tensor:
    """[head_dim * heads, T] -> [head_dim, heads, T]."""
    return ctx.reshape(x, (head_dim, -1, x.shape[1]))


def project_separate(ctx: Context, cfg: AttentionConfig, attn_q: Linear, attn_k: Linear, attn_v: Linear,
                     x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v from three projections (each with an optional bias)."""
    q, k, v = nn.linears(ctx, (attn_q, attn_k, attn_v), x)
    return split_heads(ctx, q, cfg.head_dim), split_heads(ctx, k, cfg.head_dim), v   # [hd, H|Hkv, T], [hd*Hkv, T]


def project_fused(ctx: Context, cfg: AttentionConfig, attn_qkv: Linear, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v as strided views into one fused projection: each token's row holds
    its q heads, then its k heads, then v."""
    c, n_tokens = cfg, x.shape[1]
    qkv = attn_qkv(ctx, x)                                                          # [q_dim + 2*kv_dim, T]
    row, head = c.qkv_dim * F32_BYTES, c.head_dim * F32_BYTES
    q = ctx.view(qkv, (c.head_dim, c.n_head, n_tokens), (F32_BYTES, head, row))                    # [hd, H, T]
    k = ctx.view(qkv, (c.head_dim, c.n_head_kv, n_tokens), (F32_BYTES, head, row), c.q_dim * F32_BYTES)  # [hd, Hkv, T]
    v = ctx.rows_slice(qkv, c.q_dim + c.kv_dim, c.kv_dim)                                          # [hd*Hkv, T]
    return q, k, v


@dataclass(eq=False)
class SelfAttention(Module):
    """Project, rope q and k (as the config's layer ropes), optionally scale the roped
    queries per token, attend over this layer's cache, project out.  A subclass says
    how q, k and v are projected (`project`) and may norm around the rope (`position`)."""

    attn_output: Linear = tensor("attn_output", shape=("q_dim", "n_embd"))

    def project(self, ctx: Context, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q [hd, H, T], k [hd, Hkv, T], v [hd*Hkv, T] of the normed input x [n_embd, T]."""
        raise NotImplementedError

    def position(self, ctx: Context, q: Tensor, k: Tensor, positions: Tensor, layer: int,
                 freq_factors: Tensor | None) -> tuple[Tensor, Tensor]:
        c = self.cfg
        return (c.layer_rope(ctx, q, positions, layer, freq_factors),              # [hd, H, T]
                c.layer_rope(ctx, k, positions, layer, freq_factors))              # [hd, Hkv, T]

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: LayerInputs) -> Tensor:
        c = self.cfg
        q, k, v = self.project(ctx, x)
        q, k = self.position(ctx, q, k, batch.positions, layer, inputs.freq_factors)
        if inputs.q_factor is not None:
            q = ctx.mul(q, inputs.q_factor)                                        # [hd, H, T] x [1, 1, T]
        scale = c.attn_scale
        if c.scale_query:
            q, scale = ctx.scale(q, scale), 1.0
        o = nn.attention(ctx, batch, layer, q, ctx.reshape(k, (c.kv_dim, -1)), v, n_head_kv=c.n_head_kv,
                         scale=scale, softcap=c.attn_softcap, alibi_max_bias=c.alibi_max_bias)  # [hd*H, T]
        return self.attn_output(ctx, o)


@dataclass(eq=False)
class Attention(SelfAttention):
    """Separate q/k/v projections, each with an optional bias."""

    attn_q: Linear = tensor("attn_q", shape=("n_embd", "q_dim"))
    attn_k: Linear = tensor("attn_k", shape=("n_embd", "kv_dim"))
    attn_v: Linear = tensor("attn_v", shape=("n_embd", "kv_dim"))

    def project(self, ctx: Context, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return project_separate(ctx, self.cfg, self.attn_q, self.attn_k, self.attn_v, x)


@dataclass(eq=False)
class FusedAttention(SelfAttention):
    """One fused q/k/v projection."""

    attn_qkv: Linear = tensor("attn_qkv", shape=("n_embd", "qkv_dim"))

    def project(self, ctx: Context, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return project_fused(ctx, self.cfg, self.attn_qkv, x)


@dataclass(eq=False)
class HeadNormAttention(Attention):
    """Separate projections, then each q and k head RMS-normed over its head_dim
    values before RoPE (Qwen3's; normed after RoPE: models/hunyuan_dense.py)."""

    attn_q_norm: RMSNorm = tensor("attn_q_norm", shape=("head_dim",))
    attn_k_norm: RMSNorm = tensor("attn_k_norm", shape=("head_dim",))

    def project(self, ctx: Context, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        eps = self.cfg.eps
        q, k, v = super().project(ctx, x)                                           # [hd, H|Hkv, T]
        return self.attn_q_norm(ctx, q, eps), self.attn_k_norm(ctx, k, eps), v


# ---- MLP ------------------------------------------------------------------------------


@dataclass(eq=False)
class MLP(Module):
    """down(silu(gate x) * up x)."""

    ffn_gate: Linear = tensor("ffn_gate", shape=("n_embd", "n_ff"))
    ffn_up: Linear = tensor("ffn_up", shape=("n_embd", "n_ff"))
    ffn_down: Linear = tensor("ffn_down", shape=("n_ff", "n_embd"))

    def gate(self, ctx: Context, gate: Tensor, up: Tensor) -> Tensor:
        return ctx.swiglu(gate, up)

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        return self.ffn_down(ctx, self.gate(ctx, *nn.linears(ctx, (self.ffn_gate, self.ffn_up), x)))


@dataclass(eq=False)
class GeluMLP(MLP):
    """down(gelu_tanh(gate x) * up x)."""

    def gate(self, ctx: Context, gate: Tensor, up: Tensor) -> Tensor:
        return ctx.geglu(gate, up)


@dataclass(eq=False)
class FusedMLP(Module):
    """down(silu(gate) * up), gate and up stacked in one `ffn_up` (gate first)."""

    ffn_up: Linear = tensor("ffn_up", shape=("n_embd", "n_ff_pair"))
    ffn_down: Linear = tensor("ffn_down", shape=("n_ff", "n_embd"))

    def gate(self, ctx: Context, gate: Tensor, up: Tensor) -> Tensor:
        return ctx.swiglu(gate, up)

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        n_ff = self.cfg.n_ff
        gate_up = self.ffn_up(ctx, x)                                               # [2*n_ff, T]
        gate, up = ctx.rows_slice(gate_up, 0, n_ff), ctx.rows_slice(gate_up, n_ff, n_ff)
        return self.ffn_down(ctx, self.gate(ctx, gate, up))


@dataclass(eq=False)
class SoftmaxExperts(Module):
    """Routed SiLU-gated experts: the router's softmax over all experts, the
    `n_expert_used` most probable run, their outputs summed weighted by those
    probabilities (renormalised over the chosen when the config says, then scaled).
    Qwen3-MoE's and Mixtral's."""

    ffn_gate_inp: Linear = tensor("ffn_gate_inp", shape=("n_embd", "n_expert"))          # the router
    ffn_gate_exps: nn.Experts = tensor("ffn_gate_exps", shape=("n_embd", "n_ff_exp", "n_expert"))
    ffn_up_exps: nn.Experts = tensor("ffn_up_exps", shape=("n_embd", "n_ff_exp", "n_expert"))
    ffn_down_exps: nn.Experts = tensor("ffn_down_exps", shape=("n_ff_exp", "n_embd", "n_expert"))

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        c = self.cfg
        scores = self.ffn_gate_inp(ctx, x)                                          # [E, T]
        chosen = ctx.topk(scores, c.n_expert_used)                                  # i32 [U, T]
        weights = scaled(ctx, ctx.moe_weights(scores, chosen, c.norm_expert_weights), c.expert_weights_scale)  # [U, T]
        return ctx.weighted_sum(self.experts(ctx, x, chosen), weights)             # [n_embd, T]

    def experts(self, ctx: Context, x: Tensor, chosen: Tensor) -> Tensor:
        """[n_embd, U, T] the chosen experts' outputs for x [n_embd, T] (or [n_embd, 1, T])."""
        x = ctx.reshape(x, (self.cfg.n_embd, 1, x.shape[-1]))                      # one input for all U
        gate = self.ffn_gate_exps(ctx, x, chosen)                                   # [F, U, T]
        up = self.ffn_up_exps(ctx, x, chosen)                                       # [F, U, T]
        return self.ffn_down_exps(ctx, ctx.swiglu(gate, up), chosen)


@dataclass(eq=False)
class SigmoidExperts(SoftmaxExperts):
    """Routed SiLU-gated experts scored by sigmoid(router): the `n_expert_used`
    best by score plus a per-expert selection bias (exp_probs_b, which only
    chooses), weighted by their unbiased scores, renormalised over the chosen
    when the config says, then scaled (GLM-4.5's routing)."""

    exp_probs_b: F32Bias = tensor("exp_probs_b", shape=("n_expert",))

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        c = self.cfg
        logits = self.ffn_gate_inp(ctx, x)                                          # [E, T]
        chosen = ctx.moe_route(logits, c.n_expert_used, sigmoid=True, bias=ctx.weight(self.exp_probs_b.bias))  # i32 [U, T]
        weights = scaled(ctx, ctx.moe_sigmoid_weights(logits, chosen, c.norm_expert_weights), c.expert_weights_scale)
        return ctx.weighted_sum(self.experts(ctx, x, chosen), weights)             # [n_embd, T]


@dataclass(eq=False)
class SharedExpert(Module):
    """The expert every token runs besides the routed ones: down(silu(gate x) * up x)."""

    ffn_gate_shexp: Linear = tensor("ffn_gate_shexp", shape=("n_embd", "n_ff_shexp"))
    ffn_up_shexp: Linear = tensor("ffn_up_shexp", shape=("n_embd", "n_ff_shexp"))
    ffn_down_shexp: Linear = tensor("ffn_down_shexp", shape=("n_ff_shexp", "n_embd"))

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        gate, up = nn.linears(ctx, (self.ffn_gate_shexp, self.ffn_up_shexp), x)
        return self.ffn_down_shexp(ctx, ctx.swiglu(gate, up))


# ---- blocks ---------------------------------------------------------------------------


@dataclass(eq=False)
class PreNormBlock(Module):
    """x + attn(norm(x)), then + mlp(norm(.)) (Llama's)."""

    attn_norm: RMSNorm = tensor("attn_norm", shape=("n_embd",))
    attn: Attention = module()
    ffn_norm: RMSNorm = tensor("ffn_norm", shape=("n_embd",))
    mlp: MLP = module()

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: LayerInputs) -> Tensor:
        eps = self.cfg.eps
        x = ctx.add(x, self.attn(ctx, self.attn_norm(ctx, x, eps), batch, layer, inputs))
        return ctx.add(x, self.mlp(ctx, self.ffn_norm(ctx, x, eps)))


@dataclass(eq=False)
class SandwichBlock(Module):
    """x + post_norm(attn(pre_norm(x))), then the same around the MLP (Gemma 2's)."""

    attn_norm: RMSNorm = tensor("attn_norm", shape=("n_embd",))
    attn: Attention = module()
    post_attention_norm: RMSNorm = tensor("post_attention_norm", shape=("n_embd",))
    ffn_norm: RMSNorm = tensor("ffn_norm", shape=("n_embd",))
    mlp: MLP = module()
    post_ffw_norm: RMSNorm = tensor("post_ffw_norm", shape=("n_embd",))

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: LayerInputs) -> Tensor:
        eps = self.cfg.eps
        h = self.attn(ctx, self.attn_norm(ctx, x, eps), batch, layer, inputs)
        x = ctx.add(x, self.post_attention_norm(ctx, h, eps))
        h = self.mlp(ctx, self.ffn_norm(ctx, x, eps))
        return ctx.add(x, self.post_ffw_norm(ctx, h, eps))


@dataclass(eq=False)
class GemmaBlock(SandwichBlock):
    """Gemma 3's block: the sandwich with RMS-normed q and k heads and the GELU MLP
    (models/gemma3.py; models/gemma_embedding.py reads it bidirectionally)."""

    attn: HeadNormAttention = module()
    mlp: GeluMLP = module()


@dataclass(eq=False)
class PostNormBlock(Module):
    """x + norm(attn(x)), then + norm(mlp(.)): no norm on the way in (OLMo 2's)."""

    attn: Attention = module()
    post_attention_norm: RMSNorm = tensor("post_attention_norm", shape=("n_embd",))
    mlp: MLP = module()
    post_ffw_norm: RMSNorm = tensor("post_ffw_norm", shape=("n_embd",))

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: LayerInputs) -> Tensor:
        eps = self.cfg.eps
        x = ctx.add(x, self.post_attention_norm(ctx, self.attn(ctx, x, batch, layer, inputs), eps))
        return ctx.add(x, self.post_ffw_norm(ctx, self.mlp(ctx, x), eps))


# ---- the decoder ----------------------------------------------------------------------


@dataclass(eq=False)
class Decoder(Module):
    """Token embeddings, the blocks, a final RMS norm and the output projection (tied
    to the token embedding when the file has no `output.weight`), with Llama-3 style
    `rope_freqs` where the file has them.  An architecture overrides a step: `embed`,
    `embed_batch`, `layer_inputs`, `layer_output`, `head`, `shift_keys`; it unbinds
    `rope_freqs` by declaring the field `= None`.  Implements CausalLM."""

    token_embd: Embedding = tensor("token_embd", shape=("n_embd", "n_vocab"))
    rope_freqs: F32Param | None = tensor("rope_freqs", optional=True)
    layers: list[PreNormBlock] = blocks("blk")
    output_norm: RMSNorm = tensor("output_norm", shape=("n_embd",))
    output: Linear = tensor("output", alt="token_embd", shape=("n_embd", "n_vocab"))

    def freq_factors(self, ctx: Context) -> Tensor | None:
        return ctx.weight(self.rope_freqs.weight) if self.rope_freqs is not None else None

    def layer_inputs(self, ctx: Context, batch) -> LayerInputs:
        return LayerInputs(freq_factors=self.freq_factors(ctx))

    def embed(self, ctx: Context, tokens: Tensor) -> Tensor:
        return self.token_embd(ctx, tokens)                                        # [n_embd, T]

    def embed_batch(self, ctx: Context, batch) -> Tensor:
        """The batch's input rows: its tokens' embeddings, or the rows it brings (an image's
        embeddings), taken as they are - no scaling of the model's own (llama.cpp's rule
        for embeddings given in place of tokens)."""
        given = getattr(batch, "embeddings", None)
        return self.embed(ctx, batch.tokens) if given is None else given           # [n_embd, T]

    def hidden(self, ctx: Context, batch) -> Tensor:
        inputs = self.layer_inputs(ctx, batch)
        x = self.embed_batch(ctx, batch)                                           # [n_embd, T]
        for i, block in enumerate(self.layers):
            x = self.layer_output(ctx, block(ctx, x, batch, i, inputs), batch, i)
        x = ctx.get_rows(x, batch.out_ids)                                         # [n_embd, n_out]
        return self.output_norm(ctx, x, self.cfg.eps)

    def layer_output(self, ctx: Context, x: Tensor, batch, layer: int) -> Tensor:
        """What layer `layer` hands the next one: its block's output x."""
        return x

    def head(self, ctx: Context, x: Tensor) -> Tensor:
        return self.output(ctx, x)                                                 # [n_vocab, n_out]

    def forward(self, ctx: Context, batch) -> Tensor:
        return self.head(ctx, self.hidden(ctx, batch))

    def shift_keys(self, ctx: Context, k: Tensor, positions: Tensor, layer: int,
                   n_ctx_seq: int | None = None) -> Tensor:
        """The layer's rope with the forward pass's factors, as a pure rotation: the keys
        already carry the rope's magnitude (attention factor, YaRN's mscale)."""
        ff = self.freq_factors(ctx)
        return self.cfg.rotation_only().layer_rope(ctx, k, positions, layer, ff)

    def cache_layout(self) -> list[nn.CacheSpec]:
        return self.cfg.cache_layout()


# ---- Gated DeltaNet hybrids (Qwen3.5, Qwen3-Next) ------------------------------------


@dataclass(frozen=True)
class DeltaNetConfig(AttentionConfig):
    """Hybrids of attention and Gated DeltaNet layers (Qwen3.5, Qwen3-Next): every
    full_attention_interval-th layer attends, the others run the delta rule."""

    full_attention_interval: int = 4
    conv_kernel: int = 4      # ssm.conv_kernel
    head_k_dim: int = 128     # ssm.state_size: q/k (and value) head size of the linear layers
    n_k_heads: int = 16       # ssm.group_count
    n_v_heads: int = 32       # ssm.time_step_rank
    d_inner: int = 4096       # ssm.inner_size: value heads * value head size

    @classmethod
    def delta_from_gguf(cls, f: GGUFFile) -> dict:
        """The shared keys plus the delta-rule layers' (ssm.*) and the layer pattern."""
        key = f.arch_key
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX, eps_default=None)
        return dict(kw, full_attention_interval=f.get_int(key("full_attention_interval"), 4),
                    conv_kernel=f.get_int(key("ssm.conv_kernel")), head_k_dim=f.get_int(key("ssm.state_size")),
                    n_k_heads=f.get_int(key("ssm.group_count")), n_v_heads=f.get_int(key("ssm.time_step_rank")),
                    d_inner=f.get_int(key("ssm.inner_size")))

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("full_attention_interval", self.full_attention_interval, 1, 1 << 16)
        check_range("ssm.conv_kernel", self.conv_kernel, 2, 64)
        check_range("ssm.state_size", self.head_k_dim, 1, 1024)
        check_range("ssm.group_count", self.n_k_heads, 1, 1024)
        check_range("ssm.time_step_rank", self.n_v_heads, 1, 1024)
        if self.n_v_heads % self.n_k_heads:
            raise ModelError(f"ssm.time_step_rank {self.n_v_heads} is not a multiple of ssm.group_count "
                             f"{self.n_k_heads}")
        if self.d_inner != self.n_v_heads * self.head_v_dim or self.head_v_dim != self.head_k_dim:
            raise ModelError(f"ssm.inner_size {self.d_inner} is not ssm.time_step_rank {self.n_v_heads} value "
                             f"heads of ssm.state_size {self.head_k_dim}")

    def is_recurrent(self, layer: int) -> bool:
        return (layer + 1) % self.full_attention_interval != 0

    @property
    def head_v_dim(self) -> int:
        return self.d_inner // self.n_v_heads

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.head_k_dim

    @property
    def conv_channels(self) -> int:
        """Channels of the q/k/v projection the convolution runs over."""
        return 2 * self.key_dim + self.d_inner

    @property
    def q_gate_dim(self) -> int:
        """Rows of an attention layer's query projection: each head's query, then its gate."""
        return 2 * self.q_dim

    def cache_layout(self) -> list:
        state = nn.RecurrentSpec(conv_dim=(self.conv_kernel - 1) * self.conv_channels,
                                 state_dim=self.n_v_heads * self.head_k_dim * self.head_v_dim)
        attn = nn.CacheSpec(k_dim=self.kv_dim, v_dim=self.kv_dim)
        return [state if self.is_recurrent(i) else attn for i in range(self.n_layer)]


def unbound_tensors(module: Module) -> list[str]:
    """The module's tensor fields the file left unbound (optional ones absent); fields
    without a tensor (a subclass setting one to None) do not count."""
    return [f.name for f in dataclasses.fields(module) if "pe" in f.metadata and getattr(module, f.name) is None]


def head_views(ctx: Context, x: Tensor, head_dim: int, n_heads: int, stride: int, offset: int) -> Tensor:
    """[head_dim, n_heads, T] contiguous: heads `stride` floats apart from `offset` in each row of x."""
    row = x.shape[0] * F32_BYTES
    return ctx.cont(ctx.view(x, (head_dim, n_heads, x.shape[1]), (F32_BYTES, stride * F32_BYTES, row),
                             offset * F32_BYTES))


@dataclass(eq=False)
class GatedAttention(Module):
    """Each attn_q head is a query then a gate; q and k RMS-normed per head, roped,
    attended; the output times sigmoid(gate)."""

    attn_q: Linear | None = tensor("attn_q", optional=True, shape=("n_embd", "q_gate_dim"))
    attn_k: Linear | None = tensor("attn_k", optional=True, shape=("n_embd", "kv_dim"))
    attn_v: Linear | None = tensor("attn_v", optional=True, shape=("n_embd", "kv_dim"))
    attn_q_norm: RMSNorm | None = tensor("attn_q_norm", optional=True, shape=("head_dim",))
    attn_k_norm: RMSNorm | None = tensor("attn_k_norm", optional=True, shape=("head_dim",))
    attn_output: Linear | None = tensor("attn_output", optional=True, shape=("q_dim", "n_embd"))

    def unbound(self) -> list[str]:
        return unbound_tensors(self)

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int) -> Tensor:
        c = self.cfg
        hd = c.head_dim
        q_gate = self.attn_q(ctx, x)                                               # [2*hd*H, T]
        q = head_views(ctx, q_gate, hd, c.n_head, 2 * hd, 0)                       # [hd, H, T]
        gate = ctx.reshape(head_views(ctx, q_gate, hd, c.n_head, 2 * hd, hd), (c.q_dim, -1))
        k = split_heads(ctx, self.attn_k(ctx, x), hd)                       # [hd, Hkv, T]
        q = c.rope(ctx, self.attn_q_norm(ctx, q, c.eps), batch.positions)
        k = c.rope(ctx, self.attn_k_norm(ctx, k, c.eps), batch.positions)
        o = nn.attention(ctx, batch, layer, q, ctx.reshape(k, (c.kv_dim, -1)), self.attn_v(ctx, x),
                         n_head_kv=c.n_head_kv, scale=c.attn_scale)                # [hd*H, T]
        return self.attn_output(ctx, ctx.mul(o, ctx.sigmoid(gate)))


@dataclass(eq=False)
class DeltaNet(Module):
    """qkv through the causal conv and SiLU, L2-normed q/k, the gated delta rule
    (value head h reads q/k head h % Hk), the per-head norm times silu(z), ssm_out."""

    attn_qkv: Linear | None = tensor("attn_qkv", optional=True, shape=("n_embd", "conv_channels"))
    attn_gate: Linear | None = tensor("attn_gate", optional=True, shape=("n_embd", "d_inner"))
    ssm_conv1d: F32Param | None = tensor("ssm_conv1d", optional=True, shape=("conv_kernel", "conv_channels"))
    ssm_dt: F32Bias | None = tensor("ssm_dt", optional=True)
    ssm_a: BareF32Param | None = tensor("ssm_a", optional=True)
    ssm_beta: Linear | None = tensor("ssm_beta", optional=True, shape=("n_embd", "n_v_heads"))
    ssm_alpha: Linear | None = tensor("ssm_alpha", optional=True, shape=("n_embd", "n_v_heads"))
    ssm_norm: RMSNorm | None = tensor("ssm_norm", optional=True, shape=("head_v_dim",))
    ssm_out: Linear | None = tensor("ssm_out", optional=True, shape=("d_inner", "n_embd"))

    def log_decay(self, ctx: Context, alpha: Tensor) -> Tensor:
        """g [Hv, T] = softplus(alpha + dt_bias) * ssm_a (ssm_a = -exp(A_log) <= 0), alpha = ssm_alpha x."""
        alpha = ctx.add(alpha, ctx.weight(self.ssm_dt.bias))
        return ctx.mul(ctx.softplus(alpha), ctx.weight(self.ssm_a.weight))

    def gates(self, ctx: Context, x: Tensor) -> tuple[Tensor, Tensor]:
        """beta and the log decay g, both [Hv, T]."""
        return ctx.sigmoid(self.ssm_beta(ctx, x)), self.log_decay(ctx, self.ssm_alpha(ctx, x))

    def key_heads(self, ctx: Context, q: Tensor) -> Tensor:
        """q or k [Dk, Hk, T] as the delta rule reads them: GGUF's tiled order, value head h
        on q/k head h % Hk, is the op's own broadcast."""
        return q

    def projections(self, ctx: Context, x: Tensor) -> tuple[Tensor, Tensor]:
        """The q, k, v channels the convolution runs over [conv_channels, T] and the output
        gate z [d_inner, T]."""
        return self.attn_qkv(ctx, x), self.attn_gate(ctx, x)

    def unbound(self) -> list[str]:
        return unbound_tensors(self)

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int) -> Tensor:
        c = self.cfg
        rec = batch.recurrent_inputs(layer)
        beta, g = self.gates(ctx, x)                                               # [Hv, T] each
        qkv, z = self.projections(ctx, x)
        mixed = ctx.ssm_conv(qkv, ctx.weight(self.ssm_conv1d.weight), rec.conv, rec.seqs)
        mixed = ctx.silu(mixed)                                                    # [conv_channels, T]
        dk, dv = c.head_k_dim, c.head_v_dim
        q = ctx.l2_norm(head_views(ctx, mixed, dk, c.n_k_heads, dk, 0), c.eps)     # [Dk, Hk, T]
        k = ctx.l2_norm(head_views(ctx, mixed, dk, c.n_k_heads, dk, c.key_dim), c.eps)
        v = head_views(ctx, mixed, dv, c.n_v_heads, dv, 2 * c.key_dim)             # [Dv, Hv, T]
        q, k = self.key_heads(ctx, q), self.key_heads(ctx, k)
        o = ctx.delta_net(q, k, v, g, beta, rec.state, rec.seqs, scale=1.0 / math.sqrt(dk))   # [Dv, Hv, T]
        z = split_heads(ctx, z, dv)                                                # [Dv, Hv, T]
        o = ctx.mul(self.ssm_norm(ctx, o, c.eps), ctx.silu(z))
        return self.ssm_out(ctx, ctx.reshape(o, (c.d_inner, -1)))


@dataclass(eq=False)
class DeltaNetHybridBlock(Module):
    """x + mixer(norm(x)), then + ffn(post_attention_norm(.)); the mixer is the
    layer's kind (gated attention or the delta rule); a subclass binds `mlp`."""

    attn_norm: RMSNorm = tensor("attn_norm", shape=("n_embd",))
    attn: GatedAttention = module()
    linear: DeltaNet = module()
    post_attention_norm: RMSNorm = tensor("post_attention_norm", shape=("n_embd",))

    def mixer(self, layer: int):
        mixer = self.linear if self.cfg.is_recurrent(layer) else self.attn
        missing = mixer.unbound()
        if missing:
            raise ModelError(f"layer {layer} ({type(mixer).__name__}) is missing tensors: {', '.join(missing)}")
        return mixer

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: LayerInputs) -> Tensor:
        eps = self.cfg.eps
        x = ctx.add(x, self.mixer(layer)(ctx, self.attn_norm(ctx, x, eps), batch, layer))
        return ctx.add(x, self.mlp(ctx, self.post_attention_norm(ctx, x, eps)))

@dataclass(frozen=True)
class DeltaNetMoeConfig(DeltaNetConfig):
    """DeltaNetConfig plus the experts of Qwen3.5-MoE and Qwen3-Next: `n_expert` routed
    experts of `n_ff_exp`, `n_expert_used` run per token, and a shared expert of `n_ff_shexp`."""

    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0       # hidden size of one routed expert
    n_ff_shexp: int = 0     # hidden size of the shared expert

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "DeltaNetMoeConfig":
        key = f.arch_key
        kw = cls.delta_from_gguf(f)
        return cls(**kw, n_expert=f.get_int(key("expert_count"), 0),
                   n_expert_used=f.get_int(key("expert_used_count"), 0),
                   n_ff_exp=ExpertsConfig.expert_width(f, kw["n_ff"]),
                   n_ff_shexp=f.get_int(key("expert_shared_feed_forward_length"), kw["n_ff"]))

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("expert_count", self.n_expert, 1, MAX_EXPERTS)
        check_range("expert_used_count", self.n_expert_used, 1, self.n_expert)
        check_range("expert_feed_forward_length", self.n_ff_exp, 1, 1 << 20)
        check_range("expert_shared_feed_forward_length", self.n_ff_shexp, 1, 1 << 20)


@dataclass(eq=False)
class GatedSharedExpertMoE(Module):
    """A router's softmax over the experts, the `n_expert_used` best run their SiLU-gated
    MLPs, weighted by their probabilities renormalised over the chosen; beside them a
    shared expert, its output times sigmoid(ffn_gate_inp_shexp . x) (Qwen3.5-MoE's, Qwen3-Next's)."""

    ffn_gate_inp: Linear = tensor("ffn_gate_inp", shape=("n_embd", "n_expert"))          # the router
    ffn_gate_exps: Param = tensor("ffn_gate_exps", shape=("n_embd", "n_ff_exp", "n_expert"))
    ffn_up_exps: Param = tensor("ffn_up_exps", shape=("n_embd", "n_ff_exp", "n_expert"))
    ffn_down_exps: Param = tensor("ffn_down_exps", shape=("n_ff_exp", "n_embd", "n_expert"))
    ffn_gate_inp_shexp: Linear = tensor("ffn_gate_inp_shexp", shape=("n_embd",))          # the shared gate
    ffn_gate_shexp: Linear = tensor("ffn_gate_shexp", shape=("n_embd", "n_ff_shexp"))
    ffn_up_shexp: Linear = tensor("ffn_up_shexp", shape=("n_embd", "n_ff_shexp"))
    ffn_down_shexp: Linear = tensor("ffn_down_shexp", shape=("n_ff_shexp", "n_embd"))

    def routed(self, ctx: Context, x: Tensor) -> Tensor:
        c, n_tokens = self.cfg, x.shape[1]
        scores = self.ffn_gate_inp(ctx, x)                                          # [E, T]
        chosen = ctx.topk(scores, c.n_expert_used)                                  # i32 [U, T]
        weights = ctx.moe_weights(scores, chosen, True)                             # [U, T]
        x = ctx.reshape(x, (c.n_embd, 1, n_tokens))
        gate = ctx.mul_mat_id(ctx.weight(self.ffn_gate_exps.weight), x, chosen)     # [F, U, T]
        up = ctx.mul_mat_id(ctx.weight(self.ffn_up_exps.weight), x, chosen)
        down = ctx.mul_mat_id(ctx.weight(self.ffn_down_exps.weight), ctx.swiglu(gate, up), chosen)
        return ctx.weighted_sum(down, weights)                                      # [n_embd, T]

    def shared(self, ctx: Context, x: Tensor) -> Tensor:
        h = ctx.swiglu(self.ffn_gate_shexp(ctx, x), self.ffn_up_shexp(ctx, x))
        gate = ctx.sigmoid(self.ffn_gate_inp_shexp(ctx, x))                         # [1, T]
        return ctx.mul(self.ffn_down_shexp(ctx, h), gate)

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        return ctx.add(self.routed(ctx, x), self.shared(ctx, x))


# ---- Mamba-2 ----------------------------------------------------------------------------


class Mamba2Dims:
    """What a config with Mamba-2 layers adds (a mixin: the config declares the fields
    d_inner, d_state, n_ssm_head, n_group and conv_kernel)."""

    @staticmethod
    def ssm_from_gguf(f: GGUFFile) -> dict:
        key = f.arch_key
        return dict(d_inner=f.get_int(key("ssm.inner_size")), d_state=f.get_int(key("ssm.state_size")),
                    n_ssm_head=f.get_int(key("ssm.time_step_rank")), n_group=f.get_int(key("ssm.group_count"), 1),
                    conv_kernel=f.get_int(key("ssm.conv_kernel")))

    def check_ssm(self) -> None:
        check_range("ssm.inner_size", self.d_inner, 1, 1 << 20)
        check_range("ssm.state_size", self.d_state, 1, 1 << 12)
        check_range("ssm.time_step_rank", self.n_ssm_head, 1, self.d_inner)
        check_range("ssm.group_count", self.n_group, 1, self.n_ssm_head)
        check_range("ssm.conv_kernel", self.conv_kernel, 2, 64)
        if self.d_inner % self.n_ssm_head or self.n_ssm_head % self.n_group:
            raise ModelError(f"ssm.inner_size {self.d_inner}, time_step_rank {self.n_ssm_head} and group_count "
                             f"{self.n_group} must divide one another")

    @property
    def ssm_head_dim(self) -> int:
        return self.d_inner // self.n_ssm_head

    @property
    def n_conv(self) -> int:
        """Channels of the convolution: x, B and C."""
        return self.d_inner + 2 * self.n_group * self.d_state

    @property
    def n_in_proj(self) -> int:
        return self.d_inner + self.n_conv + self.n_ssm_head

    @property
    def group_dim(self) -> int:
        return self.d_inner // self.n_group

    def mamba2_cache(self) -> nn.RecurrentSpec:
        """A Mamba-2 layer's state: the convolution window and the scan's H x N x P values."""
        return nn.RecurrentSpec(conv_dim=(self.conv_kernel - 1) * self.n_conv,
                                state_dim=self.n_ssm_head * self.d_state * self.ssm_head_dim)


@dataclass(frozen=True)
class Mamba2AttentionConfig(Mamba2Dims, AttentionConfig):
    """Attention's hyper-parameters and Mamba-2's, for the hybrids that have both kinds of
    layer (Granite 4, Nemotron-H, Falcon-H1); from_gguf adds ssm_from_gguf's."""

    d_inner: int = 0
    d_state: int = 0
    n_ssm_head: int = 0
    n_group: int = 0
    conv_kernel: int = 0


@dataclass(eq=False)
class ConvKernel:
    """The convolution's taps [K, channels] and its bias [channels], both float32."""

    weight: Weight
    bias: Weight

    PARTS = {"weight": True, "bias": True}
    F32_PARTS = ("weight", "bias")


@dataclass(eq=False)
class Mamba2Mixer(Module):
    """Mamba-2's mixer: z, xBC and dt from ssm_in; xBC through the causal convolution
    (its window in the layer's recurrent rows), its bias and SiLU, split into x [P, H],
    B and C [N, G]; the selective scan (dt bias, softplus, decay, skip D); silu(z) * y,
    RMS-normed per group; ssm_out.  The config is a Mamba2Dims."""

    ssm_in: Linear = tensor("ssm_in", shape=("n_embd", "n_in_proj"))
    ssm_conv1d: ConvKernel = tensor("ssm_conv1d", shape=("conv_kernel", "n_conv"))
    ssm_dt: F32Bias = tensor("ssm_dt")   # the time step's bias, stored as `ssm_dt.bias` alone
    ssm_a: BareF32Param = tensor("ssm_a", shape=(1, "n_ssm_head"))
    ssm_d: BareF32Param = tensor("ssm_d", shape=(1, "n_ssm_head"))
    ssm_norm: RMSNorm = tensor("ssm_norm", shape=("group_dim", "n_group"))
    ssm_out: Linear = tensor("ssm_out", shape=("d_inner", "n_embd"))

    def __call__(self, ctx: Context, h: Tensor, batch, layer: int) -> Tensor:
        c = self.cfg
        n_tokens = h.shape[1]
        rec = batch.recurrent_inputs(layer)
        zxbcdt = self.ssm_in(ctx, h)                                               # [n_in_proj, T]
        z = ctx.rows_slice(zxbcdt, 0, c.d_inner)
        xbc = ctx.rows_slice(zxbcdt, c.d_inner, c.n_conv)
        dt = ctx.rows_slice(zxbcdt, c.d_inner + c.n_conv, c.n_ssm_head)            # [H, T]
        xbc = ctx.ssm_conv(xbc, ctx.weight(self.ssm_conv1d.weight), rec.conv, rec.seqs)   # [n_conv, T]
        xbc = ctx.silu(ctx.add(xbc, ctx.weight(self.ssm_conv1d.bias)))
        row = c.n_conv * F32_BYTES
        x = ctx.view(xbc, (c.ssm_head_dim, c.n_ssm_head, n_tokens), (F32_BYTES, c.ssm_head_dim * F32_BYTES, row))
        b = ctx.view(xbc, (c.d_state, c.n_group, n_tokens), (F32_BYTES, c.d_state * F32_BYTES, row),
                     c.d_inner * F32_BYTES)
        cc = ctx.view(xbc, (c.d_state, c.n_group, n_tokens), (F32_BYTES, c.d_state * F32_BYTES, row),
                      (c.d_inner + c.n_group * c.d_state) * F32_BYTES)
        a = ctx.reshape(ctx.weight(self.ssm_a.weight), (c.n_ssm_head,))
        d = ctx.reshape(ctx.weight(self.ssm_d.weight), (c.n_ssm_head,))
        y = ctx.ssm_scan(x, dt, a, b, cc, rec.state, rec.seqs, D=d, dt_bias=ctx.weight(self.ssm_dt.bias))
        y = ctx.swiglu(z, ctx.reshape(y, (c.d_inner, n_tokens)))                   # silu(z) * y
        return self.ssm_out(ctx, self.group_norm(ctx, y))

    def group_norm(self, ctx: Context, y: Tensor) -> Tensor:
        """The gated y [d_inner, T] RMS-normed per group, times ssm_norm."""
        c, n_tokens = self.cfg, y.shape[1]
        y = ctx.rms_norm(ctx.reshape(y, (c.group_dim, c.n_group, n_tokens)), None, c.eps)   # per group
        y = ctx.mul(y, ctx.weight(self.ssm_norm.weight))                           # [gd, G, T] x [gd, G]
        return ctx.reshape(y, (c.d_inner, n_tokens))


# ---- encoders ---------------------------------------------------------------------------


@runtime_checkable
class EmbeddingModel(Protocol):
    """An encoder (models/bert.py and its kin): what the embedding path asks of it.
    It has no language-model head: forward() and head() raise ModelError."""

    cfg: TransformerConfig
    EMBEDDING_ONLY: bool   # True: runner/forward.py builds hidden() for an embedding graph

    def hidden(self, ctx: Context, batch) -> Tensor:
        """[n_embd, n_out] the final hidden states of the batch's output rows (every
        token's when the caller asks for all rows: the pooling reads them)."""

    def classify(self, ctx: Context, pooled: Tensor) -> Tensor:
        """[n_cls_out, n_seq] the classification head's scores of pooled rows
        [n_embd, n_seq] (a reranker's relevance: rank pooling); ModelError on a
        model without a head (has_classifier() says which)."""

    def has_classifier(self) -> bool:
        """Whether the file has a classification head (`cls` / `cls.output`)."""

    def max_positions(self) -> int | None:
        """The positions an input may reach, where the model has a limit (BERT's table)."""


@dataclass(frozen=True)
class EncoderConfig(AttentionConfig):
    """An encoder's hyper-parameters: LayerNorm epsilon (`attention.layer_norm_epsilon`,
    which llama.cpp requires), and whether attention is causal (`attention.causal`;
    an encoder's tokens see their whole sequence unless the file says otherwise)."""

    causal: bool = False

    @classmethod
    def common_from_gguf(cls, f: GGUFFile, *, rope_mode: int = ROPE_NEOX, equal_heads: bool = True) -> dict:
        kw = super().common_from_gguf(f, rope_mode=rope_mode, equal_heads=equal_heads)   # (its RMS eps unused)
        eps_key = f.arch_key("attention.layer_norm_epsilon")
        if eps_key not in f.metadata:
            raise ModelError(f"{f.path}: missing metadata key {eps_key!r} ({f.architecture} models must set "
                             "their LayerNorm epsilon)")
        kw["eps"] = f.get_float(eps_key)
        kw["causal"] = f.get_bool(f.arch_key("attention.causal"), False)
        return kw


@dataclass(eq=False)
class NoRopeAttention(Attention):
    """Separate q/k/v projections with biases, no rotary positions (BERT's: its
    positions are learned embeddings added to the input)."""

    def position(self, ctx: Context, q: Tensor, k: Tensor, positions: Tensor, layer: int,
                 freq_factors: Tensor | None) -> tuple[Tensor, Tensor]:
        return q, k


@dataclass(eq=False)
class GeluSeqMLP(Module):
    """down(gelu_tanh(up x + b)) + b: BERT's ungated MLP."""

    ffn_up: Linear = tensor("ffn_up", shape=("n_embd", "n_ff"))
    ffn_down: Linear = tensor("ffn_down", shape=("n_ff", "n_embd"))

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        return self.ffn_down(ctx, ctx.gelu(self.ffn_up(ctx, x)))


@dataclass(eq=False)
class EncoderBlock(Module):
    """BERT's post-norm block: norm(x + attn(x)), then norm(h + mlp(h)), LayerNorms."""

    attn: Attention = module()
    attn_output_norm: LayerNorm = tensor("attn_output_norm", shape=("n_embd",))
    mlp: GeluSeqMLP = module()
    layer_output_norm: LayerNorm = tensor("layer_output_norm", shape=("n_embd",))

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: LayerInputs) -> Tensor:
        eps = self.cfg.eps
        h = self.attn_output_norm(ctx, ctx.add(x, self.attn(ctx, x, batch, layer, inputs)), eps)
        return self.layer_output_norm(ctx, ctx.add(h, self.mlp(ctx, h)), eps)


@dataclass(eq=False)
class ClassifierHead(Module):
    """A cross-encoder's scores from a pooled row: cls.output(tanh(cls x + b)) + b
    (llama.cpp's rank pooling); either projection may be absent."""

    cls: Linear | None = tensor("cls", optional=True, shape=("n_embd", None))   # (Jina's: one row)
    cls_output: Linear | None = tensor("cls.output", optional=True, shape=("n_embd", None))

    def present(self) -> bool:
        return self.cls is not None or self.cls_output is not None

    def __call__(self, ctx: Context, pooled: Tensor) -> Tensor:
        x = pooled                                                                 # [n_embd, n_seq]
        if self.cls is not None:
            x = ctx.softcap(self.cls(ctx, x), 1.0)                                 # tanh
        if self.cls_output is not None:
            x = self.cls_output(ctx, x)                                            # [n_cls_out, n_seq]
        return x


def not_a_language_model(model) -> ModelError:
    return ModelError(f"{type(model).__name__} is an embedding model: it has no language-model head, so it "
                      "cannot generate or chat; use it to embed (or rerank, with a classification head)")


@dataclass(eq=False)
class Encoder(Module):
    """Token embeddings plus the type-0 row of the token-type embeddings (llama.cpp
    runs every token as sentence A), a LayerNorm, the blocks; no final norm, no
    head.  An architecture overrides `embed` (BERT adds learned positions) or its
    blocks.  Implements EmbeddingModel."""

    EMBEDDING_ONLY = True

    token_embd: Embedding = tensor("token_embd", shape=("n_embd", "n_vocab"))
    token_types: F32Param | None = tensor("token_types", optional=True, shape=("n_embd", None))
    token_embd_norm: LayerNorm = tensor("token_embd_norm", shape=("n_embd",))
    layers: list[EncoderBlock] = blocks("blk")
    head_cls: ClassifierHead = module()   # an architecture without one declares it `None = None`

    def embed(self, ctx: Context, batch) -> Tensor:
        x = self.token_embd(ctx, batch.tokens)                                     # [n_embd, T]
        if self.token_types is not None:
            n_embd = self.cfg.n_embd
            types = ctx.weight(self.token_types.weight)                            # [n_embd, n_types]
            type0 = ctx.view(types, (n_embd, 1), (F32_BYTES, n_embd * F32_BYTES))  # [n_embd, 1]
            x = ctx.add(x, type0)
        return x

    def hidden(self, ctx: Context, batch) -> Tensor:
        x = self.embed(ctx, batch)                                                 # [n_embd, T]
        if self.token_embd_norm is not None:   # (EmbeddingGemma has none)
            x = self.token_embd_norm(ctx, x, self.cfg.eps)
        inputs = LayerInputs()
        for i, block in enumerate(self.layers):
            x = block(ctx, x, batch, i, inputs)
        return self.final(ctx, ctx.get_rows(x, batch.out_ids))                     # [n_embd, n_out]

    def final(self, ctx: Context, x: Tensor) -> Tensor:
        """What follows the blocks (ModernBERT's final norm); nothing in BERT."""
        return x

    def has_classifier(self) -> bool:
        return self.head_cls is not None and self.head_cls.present()

    def max_positions(self) -> int | None:
        """Positions a sequence may reach (learned position embeddings' rows), or None:
        rotary or ALiBi positions have no table to run past (the cache bounds them)."""
        return None

    def rank_pooling(self) -> str:
        """The rows the classification head reads: the first ([CLS]) token's (BERT's)."""
        return "cls"

    def classify(self, ctx: Context, pooled: Tensor) -> Tensor:
        if not self.has_classifier():
            raise ModelError(f"{type(self).__name__} has no classification head (cls / cls.output): "
                             "it embeds, it cannot score (rank) pairs")
        return self.head_cls(ctx, pooled)

    def head(self, ctx: Context, x: Tensor) -> Tensor:
        raise not_a_language_model(self)

    def forward(self, ctx: Context, batch) -> Tensor:
        raise not_a_language_model(self)

    def shift_keys(self, ctx: Context, k: Tensor, positions: Tensor, layer: int,
                   n_ctx_seq: int | None = None) -> Tensor:
        raise ModelError(f"{type(self).__name__} is an encoder: its input is read whole, never shifted")

    def cache_layout(self) -> list[nn.CacheSpec]:
        return self.cfg.cache_layout()


def context_per_sequence(batch) -> int:
    """The context one sequence of the batch may fill (llama.cpp's n_ctx_seq), as the
    runner says (runner/forward.py: the engine's n_ctx, else the whole cache)."""
    return batch.n_ctx_seq


def scaled(ctx: Context, x: Tensor, s: float) -> Tensor:
    """x * s, or x itself for s = 1."""
    return x if s == 1.0 else ctx.scale(x, s)


__all__ = ["CausalLM", "AttentionConfig", "SlidingWindowConfig", "LayerInputs", "SelfAttention", "Attention", "FusedAttention",
           "HeadNormAttention", "MLP", "GeluMLP", "FusedMLP", "ExpertsConfig", "SoftmaxExperts", "SigmoidExperts",
           "SharedExpert", "PreNormBlock", "SandwichBlock", "GemmaBlock", "PostNormBlock",
           "Decoder", "EmbeddingModel", "EncoderConfig", "NoRopeAttention", "GeluSeqMLP", "EncoderBlock",
           "ClassifierHead", "Encoder", "Mamba2Dims", "Mamba2AttentionConfig", "Mamba2Mixer", "not_a_language_model", "check_range", "gemma_query_scale", "context_per_sequence", "split_heads", "project_separate", "project_fused", "scaled"]


# ---------------------------------------------------------------- LFM2's short convolutions
# The pieces the architectures on LFM2's hybrid share (lfm2, lfm2moe): the config (which
# layers are convolutions, by the file's per-layer `attention.head_count_kv`), the short
# convolution and the block around it, whose MLP a subclass binds.  A short convolution:
# in_proj gives B, C and x (in that order, n_embd rows each), B*x runs through a causal
# depthwise convolution over the last `shortconv.l_cache` tokens (its window is the
# layer's recurrent state), C gates the result, out_proj projects it.

@dataclass(frozen=True)
class ShortConvConfig(AttentionConfig):
    ZERO_KV_LAYERS = True

    conv_kernel: int = 3                     # shortconv.l_cache: taps of the convolution
    recurrent: tuple[bool, ...] = ()         # per layer: a short convolution (no attention)

    @classmethod
    def shortconv_from_gguf(cls, f: GGUFFile) -> dict:
        """The shared keys plus the layer kinds and the convolution's window."""
        key = f.arch_key
        if f.get_int(key("attention.sliding_window"), 0) > 0:
            raise UnsupportedError(f"{f.path}: LFM2 with sliding-window attention is not supported yet")
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX, eps_default=None)
        kw["recurrent"] = zero_kv_layers(f, kw["n_layer"], kw["n_head_kv"])
        kw["conv_kernel"] = f.get_int(key("shortconv.l_cache"))
        return kw

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("shortconv.l_cache", self.conv_kernel, 2, 64)
        if len(self.recurrent) != self.n_layer:
            raise ModelError(f"{len(self.recurrent)} layer kinds for {self.n_layer} layers")

    @property
    def n_bcx(self) -> int:
        """Rows of the short convolution's input projection: B, C and x."""
        return 3 * self.n_embd

    @property
    def conv_state_dim(self) -> int:
        """A sequence's convolution window: the last kernel-1 tokens' n_embd channels."""
        return (self.conv_kernel - 1) * self.n_embd

    def cache_layout(self) -> list[nn.LayerCache]:
        return [nn.RecurrentSpec(conv_dim=self.conv_state_dim, state_dim=0) if rec
                else nn.CacheSpec(k_dim=self.kv_dim, v_dim=self.kv_dim) for rec in self.recurrent]


@dataclass(eq=False)
class ShortConv(Module):
    """out_proj(C * conv(B * x)), B, C, x from in_proj; the convolution reads and
    writes the layer's window rows in the recurrent cache."""

    in_proj: Linear = tensor("shortconv.in_proj", shape=("n_embd", "n_bcx"))
    conv: F32Param = tensor("shortconv.conv", shape=("conv_kernel", "n_embd"))
    out_proj: Linear = tensor("shortconv.out_proj", shape=("n_embd", "n_embd"))

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int) -> Tensor:
        n = self.cfg.n_embd
        rec = batch.recurrent_inputs(layer)
        bcx = self.in_proj(ctx, x)                                                 # [3*n_embd, T]
        b, c, v = (ctx.rows_slice(bcx, i * n, n) for i in range(3))
        y = ctx.ssm_conv(ctx.mul(b, v), ctx.weight(self.conv.weight), rec.conv, rec.seqs)   # [n_embd, T]
        return self.out_proj(ctx, ctx.mul(c, y))


@dataclass(eq=False)
class ShortConvBlock(Module):
    """x + (attention or short convolution)(norm(x)), then + mlp(norm(.)); a subclass binds `mlp`."""

    attn_norm: RMSNorm = tensor("attn_norm", shape=("n_embd",))
    attn: HeadNormAttention | None = module(present_if="attn_q")
    shortconv: ShortConv | None = module(present_if="shortconv.in_proj")
    ffn_norm: RMSNorm = tensor("ffn_norm", shape=("n_embd",))

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: LayerInputs) -> Tensor:
        eps = self.cfg.eps
        h = self.attn_norm(ctx, x, eps)
        if self.shortconv is not None:
            h = self.shortconv(ctx, h, batch, layer)
        else:
            h = self.attn(ctx, h, batch, layer, inputs)
        x = ctx.add(x, h)
        return ctx.add(x, self.mlp(ctx, self.ffn_norm(ctx, x, eps)))


def check_shortconv_layers(arch: str, layers, recurrent: tuple[bool, ...]) -> None:
    """Each block has the mixer head_count_kv gives its layer, and only that one."""
    for i, (block, rec) in enumerate(zip(layers, recurrent)):
        if (block.shortconv is not None, block.attn is not None) != (rec, not rec):
            raise ModelError(f"layer {i} of an {arch} model must have "
                             f"{'a short convolution' if rec else 'attention'} only, as head_count_kv says")


# ---- M-RoPE and deepstack (the Qwen-VL text models) ------------------------------
# M-RoPE splits the rotated pairs into sections (`rope.dimension_sections`, e.g.
# 16/24/24/0 pairs of a 128-wide head) turned by a token's time, row and column
# positions (Qwen2-VL, Qwen2.5-VL: a run of pairs per stream; Qwen3-VL: the streams
# take turns pair by pair, `ROPE_IMROPE`; pairs none of the first three takes go
# to the fourth).  A text token carries its position in the first three streams and
# 0 in the fourth (as llama.cpp fills a text batch's); an image's rows carry (t,
# t + row, t + column, 0), t the image's first position, and the text after the
# image goes on from t + max(rows, columns), as llama.cpp's mtmd places them.  The graph reads the
# positions as I32 [4, n] (`ROPE_STREAMS`: the runner fills them); the cache and its
# masks keep the tokens' order, which is the same.
#
# Deepstack (Qwen3-VL): the tower hands each image row over as n_embd * (1 + n)
# values - the row the text model takes in, then one more n_embd piece for each of
# the first n layers, added to that layer's output (`n_deepstack_layers`).  Text
# tokens bring no such pieces (llama.cpp pads them with zeros).


@dataclass(frozen=True)
class MRopeConfig(AttentionConfig):
    rope_sections: tuple[int, int, int, int] = (0, 0, 0, 0)   # rotated pairs per position stream
    n_deepstack: int = 0   # layers that add a piece of each image row to their output

    ROPE_STREAMS = 4         # positions per token the graph takes (t, row, column, fourth)
    MROPE_MODE = ROPE_MROPE  # how the streams share the pairs

    @staticmethod
    def mrope_from_gguf(f: GGUFFile) -> dict:
        """rope_sections and n_deepstack of `f`, as keyword arguments."""
        key = f.arch_key("rope.dimension_sections")
        if key not in f.metadata:
            raise ModelError(f"{f.path}: an M-RoPE model needs {key}")
        sections = [int(v) for v in f.get_array(key)]
        if len(sections) < 3 or len(sections) > 4:
            raise ModelError(f"{f.path}: {key} must hold 3 or 4 values, got {sections}")
        return dict(rope_sections=tuple((sections + [0])[:4]),
                    n_deepstack=f.get_int(f.arch_key("n_deepstack_layers"), 0))

    def __post_init__(self) -> None:
        super().__post_init__()
        if any(s < 0 for s in self.rope_sections) or not 0 < sum(self.rope_sections) <= self.rope_dims // 2:
            raise ModelError(f"rope.dimension_sections {list(self.rope_sections)} must be >= 0 and hold "
                             f"1..{self.rope_dims // 2} rotated pairs")
        if self.rope_ext_factor != 0:
            raise UnsupportedError("YaRN scaling with M-RoPE is not supported")
        check_range("n_deepstack_layers", self.n_deepstack, 0, self.n_layer)

    @property
    def n_embd_input(self) -> int:
        """Width of the rows an image brings: the input row and its deepstack pieces."""
        return self.n_embd * (1 + self.n_deepstack)

    def layer_rope(self, ctx: Context, x: Tensor, positions: Tensor, layer: int,
                   freq_factors: Tensor | None = None) -> Tensor:
        """M-RoPE over positions I32 [4, n]."""
        if freq_factors is not None:
            raise UnsupportedError("rope frequency factors with M-RoPE are not supported")
        return ctx.rope_multi(x, positions, n_dims=self.rope_dims, sections=self.rope_sections,
                              mode=self.MROPE_MODE, base=self.rope_base, scale=self.rope_scale)


@dataclass(eq=False)
class MRopeDecoder(Decoder):
    """The decoder over M-RoPE positions; rows an image brings may carry deepstack
    pieces.  A context shift moves the first three streams (kvcache/rotate.py), as
    every token holds 0 in the fourth."""

    def embed_batch(self, ctx: Context, batch) -> Tensor:
        if getattr(batch, "embeddings", None) is None or self.cfg.n_deepstack == 0:
            return super().embed_batch(ctx, batch)
        return deepstack_piece(ctx, self.cfg, batch.embeddings, 0)                 # [n_embd, T]

    def layer_output(self, ctx: Context, x: Tensor, batch, layer: int) -> Tensor:
        if getattr(batch, "embeddings", None) is None or layer >= self.cfg.n_deepstack:
            return x
        return ctx.add(x, deepstack_piece(ctx, self.cfg, batch.embeddings, layer + 1))


def deepstack_piece(ctx: Context, cfg: MRopeConfig, rows: Tensor, k: int) -> Tensor:
    """Piece k (0: the input row) of rows [n_embd_input, T]: [n_embd, T]."""
    n_embd = cfg.n_embd
    view = ctx.view(rows, (n_embd, rows.shape[1]), (4, 4 * cfg.n_embd_input), 4 * n_embd * k)
    return ctx.cont(view)
