"""DeepSeek-V2 / V3 (and the models on their architecture): Multi-head Latent
Attention and a mixture of experts with shared experts.

Attention (MLA): each token's keys and values are compressed into one latent
vector of kv_lora_rank values (attn_kv_a_mqa, RMS-normed) plus one small
roped key part shared by every head (n_rot values).  The cache holds just
that row per token.  The queries (through a q LoRA, attn_q_a -> norm ->
attn_q_b, or a plain attn_q in V2-Lite) split per head into a part without
position (nope) and a roped part; the nope part is absorbed through the
head's attn_k_b into the latent space, so that attention runs over the
cached rows directly, as a single KV head of width kv_lora_rank + n_rot
whose values are the latent itself (a prefix of the row); each head's output
latent then goes through its attn_v_b, and attn_output mixes the heads.
The scores are scaled by mscale^2 / sqrt(nope + rope), mscale being YaRN's
factor as DeepSeek applies it (llama.cpp's kq_scale).

The first `leading_dense_block_count` layers have a dense SiLU MLP; the rest
route each token to `expert_used_count` experts chosen by gated scores
(softmax or sigmoid, `expert_gating_func`) plus an optional per-expert bias
(exp_probs_b, for the choice only) within the best expert groups, weighted
by the gated scores (normalised and scaled as the file says), plus the
shared experts' MLP.  GGUF `deepseek2`, with the split attn_k_b / attn_v_b
tensors of current converters."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pyengine.errors import ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml import nn
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import F32Bias, F32Param, Linear, RMSNorm
from pyengine.models import common
from pyengine.models.binding import Module, blocks, module, tensor
from pyengine.models.config import ROPE_NORMAL, _logf, yarn_attn_factor
from pyengine.models.registry import register

MAX_EXPERTS = 1024
GATING_SOFTMAX, GATING_SIGMOID = 1, 2   # llama.cpp's expert_gating_func values
F32 = np.float32


@dataclass(frozen=True)
class Deepseek2Config(common.AttentionConfig):
    q_lora_rank: int = 0           # 0: a plain attn_q (V2-Lite)
    kv_lora_rank: int = 0          # the latent's width
    n_nope: int = 0                # per-head query/key values without position
    v_head_dim: int = 0            # per-head value width after attn_v_b
    n_dense_lead: int = 0          # leading layers with a dense MLP
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_expert_shared: int = 0
    sigmoid_gating: bool = False
    n_group: int = 1
    n_group_used: int = 1
    norm_expert_weights: bool = False
    expert_weights_scale: float = 1.0

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Deepseek2Config":
        key = f.arch_key
        if "blk.0.attn_kv_b.weight" in f.tensors and "blk.0.attn_k_b.weight" not in f.tensors:
            raise UnsupportedError(f"{f.path}: an older DeepSeek-2 conversion (one attn_kv_b per layer); pyengine "
                                   "runs the split attn_k_b / attn_v_b of current convert_hf_to_gguf.py: re-convert it")
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NORMAL, equal_heads=False)
        # current converters write the absorbed (MQA) shape as key/value_length and the
        # per-head MHA sizes as *_mla; older files have the MHA sizes only
        head_k = f.get_int(key("attention.key_length_mla"), kw["head_dim"])
        head_v = f.get_int(key("attention.value_length_mla"), f.get_int(key("attention.value_length"), head_k))
        gating = f.get_int(key("expert_gating_func"), GATING_SOFTMAX)
        if gating not in (GATING_SOFTMAX, GATING_SIGMOID):
            raise UnsupportedError(f"{f.path}: expert_gating_func {gating} is not supported (softmax 1, sigmoid 2)")
        log_mul = f.get_float(key("rope.scaling.yarn_log_multiplier"), 0.0)
        log_mul = float(F32(log_mul) / F32(0.1))    # llama.cpp cancels the converter's factor 0.1
        kw.update(
            head_dim=head_k,
            n_head_kv=1,
            q_lora_rank=f.get_int(key("attention.q_lora_rank"), 0),
            kv_lora_rank=f.get_int(key("attention.kv_lora_rank"), 0),
            n_nope=head_k - kw["rope_dims"],
            v_head_dim=head_v,
            n_dense_lead=f.get_int(key("leading_dense_block_count"), 0),
            n_expert=f.get_int(key("expert_count"), 0),
            n_expert_used=f.get_int(key("expert_used_count"), 0),
            n_ff_exp=f.get_int(key("expert_feed_forward_length"), 0),
            n_expert_shared=f.get_int(key("expert_shared_count"), 0),
            sigmoid_gating=gating == GATING_SIGMOID,
            n_group=max(1, f.get_int(key("expert_group_count"), 1)),
            n_group_used=max(1, f.get_int(key("expert_group_used_count"), 1)),
            norm_expert_weights=f.get_bool(key("expert_weights_norm"), False),
            expert_weights_scale=f.get_float(key("expert_weights_scale"), 0.0) or 1.0,
        )
        # llama.cpp takes DeepSeek's mscale equal to mscale_all_dim (the log multiplier), so
        # with one the rope's factor is get_mscale(f, m) / get_mscale(f, m) = 1 (before ggml's)
        kw["rope_attn_factor"] = yarn_attn_factor(kw["rope_scale"], kw["rope_ext_factor"],
                                                  f.get_float(key("rope.scaling.attn_factor"), 1.0),
                                                  1.0 if log_mul else 0.0)
        kw["attn_scale"] = kq_scale(kw["rope_attn_factor"], kw["rope_scale"], log_mul, head_k)
        return cls(**kw)

    def __post_init__(self) -> None:
        super().__post_init__()
        common.check_range("attention.kv_lora_rank", self.kv_lora_rank, 1, 1 << 16)
        common.check_range("attention.q_lora_rank", self.q_lora_rank, 0, 1 << 16)
        common.check_range("per-head key values without rope", self.n_nope, 1, 1 << 12)
        common.check_range("attention.value_length", self.v_head_dim, 1, 1 << 12)
        common.check_range("expert_count", self.n_expert, 1, MAX_EXPERTS)
        common.check_range("expert_used_count", self.n_expert_used, 1, self.n_expert)
        common.check_range("leading_dense_block_count", self.n_dense_lead, 0, self.n_layer)
        common.check_range("expert_feed_forward_length", self.n_ff_exp, 1, 1 << 20)
        common.check_range("expert_shared_count", self.n_expert_shared, 0, 64)
        common.check_range("expert_group_count", self.n_group, 1, self.n_expert)
        common.check_range("expert_group_used_count", self.n_group_used, 1, self.n_group)
        if self.n_expert % self.n_group:
            raise ModelError(f"{self.n_expert} experts do not split into {self.n_group} groups")
        if not math.isfinite(self.expert_weights_scale):
            raise ModelError(f"expert_weights_scale must be finite, got {self.expert_weights_scale}")

    # derived sizes the tensors are checked against
    @property
    def q_head_dim(self) -> int:
        return self.n_nope + self.rope_dims

    @property
    def q_out(self) -> int:
        return self.n_head * self.q_head_dim

    @property
    def kv_row(self) -> int:
        """What the cache holds per token: the latent, then the roped key part."""
        return self.kv_lora_rank + self.rope_dims

    @property
    def o_in(self) -> int:
        return self.n_head * self.v_head_dim

    @property
    def n_ff_shexp(self) -> int:
        return self.n_ff_exp * self.n_expert_shared

    def cache_layout(self) -> list[nn.CacheSpec]:
        # one row of kv_lora_rank + n_rot values; V is read from it (a prefix), so no V rows
        return [nn.CacheSpec(k_dim=self.kv_row, v_dim=0) for _ in range(self.n_layer)]


def kq_scale(rope_attn_factor: float, freq_scale: float, log_mul: float, head_k: int) -> float:
    """llama.cpp's kq_scale for DeepSeek-2 in its float steps: the rope's attention factor
    with ggml's YaRN factor put back, times DeepSeek's mscale, squared over sqrt(head_k)."""
    ln = _logf(F32(1) / F32(freq_scale))
    attn_org = F32(rope_attn_factor) * (F32(1) + F32(0.1) * ln)
    mscale = attn_org * (F32(1) + F32(0.1) * F32(log_mul) * ln)
    return float(F32(1) * mscale * mscale / F32(math.sqrt(float(head_k))))


@dataclass(frozen=True)
class MlaInputs(common.LayerInputs):
    heads: Tensor | None = None   # i32 [H, T]: 0..H-1 per token (each head's own attn_k_b / attn_v_b)


@dataclass(eq=False)
class LatentAttention(Module):
    attn_q_a: Linear | None = tensor("attn_q_a", optional=True, shape=("n_embd", "q_lora_rank"))
    attn_q_a_norm: RMSNorm | None = tensor("attn_q_a_norm", optional=True, shape=("q_lora_rank",))
    attn_q_b: Linear | None = tensor("attn_q_b", optional=True, shape=("q_lora_rank", "q_out"))
    attn_q: Linear | None = tensor("attn_q", optional=True, shape=("n_embd", "q_out"))
    attn_kv_a_mqa: Linear = tensor("attn_kv_a_mqa", shape=("n_embd", "kv_row"))
    attn_kv_a_norm: RMSNorm = tensor("attn_kv_a_norm", shape=("kv_lora_rank",))
    attn_k_b: nn.Experts = tensor("attn_k_b", shape=("n_nope", "kv_lora_rank", "n_head"))
    attn_v_b: nn.Experts = tensor("attn_v_b", shape=("kv_lora_rank", "v_head_dim", "n_head"))
    attn_output: Linear = tensor("attn_output", shape=("o_in", "n_embd"))

    def query(self, ctx: Context, x: Tensor) -> Tensor:
        if self.attn_q is not None:
            return self.attn_q(ctx, x)                                              # [H*hk, T]
        if self.attn_q_a is None or self.attn_q_b is None or self.attn_q_a_norm is None:
            raise ModelError("deepseek2: the file has neither attn_q nor attn_q_a / attn_q_a_norm / attn_q_b")
        return self.attn_q_b(ctx, self.attn_q_a_norm(ctx, self.attn_q_a(ctx, x), self.cfg.eps))

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: MlaInputs) -> Tensor:
        c, n_tokens, f = self.cfg, x.shape[1], common.F32_BYTES
        hk, r, rope = c.q_head_dim, c.kv_lora_rank, c.rope_dims
        q = self.query(ctx, x)                                                      # [H*hk, T]
        strides = (f, hk * f, c.q_out * f)
        q_nope = ctx.cont(ctx.view(q, (c.n_nope, c.n_head, n_tokens), strides))      # [nope, H, T]
        q_pe = ctx.cont(ctx.view(q, (rope, c.n_head, n_tokens), strides, c.n_nope * f))  # [rope, H, T]
        kv = self.attn_kv_a_mqa(ctx, x)                                             # [r + rope, T]
        latent = self.attn_kv_a_norm(ctx, ctx.cont(ctx.rows_slice(kv, 0, r)), c.eps)  # [r, T]
        k_pe = ctx.cont(ctx.view(kv, (rope, 1, n_tokens), (f, c.kv_row * f, c.kv_row * f), r * f))  # [rope, 1, T]
        q_pe = c.rope(ctx, q_pe, batch.positions)
        k_pe = c.rope(ctx, k_pe, batch.positions)
        q_lat = self.attn_k_b(ctx, q_nope, inputs.heads)                            # [r, H, T]: q absorbed
        q = ctx.concat(q_lat, q_pe)                                                 # [r + rope, H, T]
        row = ctx.concat(latent, ctx.reshape(k_pe, (rope, n_tokens)))               # [r + rope, T]
        o = nn.latent_attention(ctx, batch, layer, q, row, v_dim=r, scale=c.attn_scale)  # [r*H, T]
        o = self.attn_v_b(ctx, ctx.reshape(o, (r, c.n_head, n_tokens)), inputs.heads)  # [v, H, T]
        return self.attn_output(ctx, ctx.reshape(o, (c.o_in, n_tokens)))


@dataclass(eq=False)
class SharedMLP(Module):
    # optional, as the experts: the leading dense layers have none
    ffn_gate_shexp: Linear | None = tensor("ffn_gate_shexp", optional=True, shape=("n_embd", "n_ff_shexp"))
    ffn_up_shexp: Linear | None = tensor("ffn_up_shexp", optional=True, shape=("n_embd", "n_ff_shexp"))
    ffn_down_shexp: Linear | None = tensor("ffn_down_shexp", optional=True, shape=("n_ff_shexp", "n_embd"))

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        gate, up = nn.linears(ctx, (self.ffn_gate_shexp, self.ffn_up_shexp), x)
        return self.ffn_down_shexp(ctx, ctx.swiglu(gate, up))


@dataclass(eq=False)
class MoE(Module):
    # every tensor optional: a leading dense layer binds none of them (Block.mlp checks)
    ffn_gate_inp: Linear | None = tensor("ffn_gate_inp", optional=True, shape=("n_embd", "n_expert"))  # the router
    exp_probs_b: F32Bias | None = tensor("exp_probs_b", optional=True)
    ffn_gate_exps: nn.Experts | None = tensor("ffn_gate_exps", optional=True, shape=("n_embd", "n_ff_exp", "n_expert"))
    ffn_up_exps: nn.Experts | None = tensor("ffn_up_exps", optional=True, shape=("n_embd", "n_ff_exp", "n_expert"))
    ffn_down_exps: nn.Experts | None = tensor("ffn_down_exps", optional=True, shape=("n_ff_exp", "n_embd", "n_expert"))
    shared: SharedMLP = module()

    def complete(self) -> bool:
        s = self.shared
        return None not in (self.ffn_gate_inp, self.ffn_gate_exps, self.ffn_up_exps, self.ffn_down_exps,
                            s.ffn_gate_shexp, s.ffn_up_shexp, s.ffn_down_shexp)

    def weights(self, ctx: Context, logits: Tensor, chosen: Tensor) -> Tensor:
        c = self.cfg
        if c.sigmoid_gating:
            w = ctx.moe_sigmoid_weights(logits, chosen, c.norm_expert_weights)     # [U, T]
        else:
            w = ctx.moe_weights(logits, chosen, c.norm_expert_weights)             # [U, T]
        return common.scaled(ctx, w, c.expert_weights_scale)

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        c, n_tokens = self.cfg, x.shape[1]
        logits = self.ffn_gate_inp(ctx, x)                                          # [E, T]
        bias = ctx.weight(self.exp_probs_b.bias) if self.exp_probs_b is not None else None
        chosen = ctx.moe_route(logits, c.n_expert_used, sigmoid=c.sigmoid_gating, bias=bias,
                               n_group=c.n_group, n_group_used=c.n_group_used)      # i32 [U, T]
        weights = self.weights(ctx, logits, chosen)                                 # [U, T]
        xe = ctx.reshape(x, (c.n_embd, 1, n_tokens))                                # one input for all U
        gate = self.ffn_gate_exps(ctx, xe, chosen)                                  # [F, U, T]
        up = self.ffn_up_exps(ctx, xe, chosen)                                      # [F, U, T]
        routed = ctx.weighted_sum(self.ffn_down_exps(ctx, ctx.swiglu(gate, up), chosen), weights)  # [n_embd, T]
        return ctx.add(routed, self.shared(ctx, x))


@dataclass(eq=False)
class Block(Module):
    """x + attn(norm(x)), then + (dense MLP or experts)(norm(.))."""

    attn_norm: RMSNorm = tensor("attn_norm", shape=("n_embd",))
    attn: LatentAttention = module()
    ffn_norm: RMSNorm = tensor("ffn_norm", shape=("n_embd",))
    ffn_gate: Linear | None = tensor("ffn_gate", optional=True, shape=("n_embd", "n_ff"))
    ffn_up: Linear | None = tensor("ffn_up", optional=True, shape=("n_embd", "n_ff"))
    ffn_down: Linear | None = tensor("ffn_down", optional=True, shape=("n_ff", "n_embd"))
    moe: MoE = module()

    def mlp(self, ctx: Context, x: Tensor, layer: int) -> Tensor:
        if layer < self.cfg.n_dense_lead:
            if self.ffn_gate is None or self.ffn_up is None or self.ffn_down is None:
                raise ModelError(f"deepseek2: dense layer {layer} lacks ffn_gate / ffn_up / ffn_down")
            gate, up = nn.linears(ctx, (self.ffn_gate, self.ffn_up), x)
            return self.ffn_down(ctx, ctx.swiglu(gate, up))
        if not self.moe.complete():
            raise ModelError(f"deepseek2: MoE layer {layer} lacks its router, expert or shared-expert tensors")
        return self.moe(ctx, x)

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: MlaInputs) -> Tensor:
        eps = self.cfg.eps
        x = ctx.add(x, self.attn(ctx, self.attn_norm(ctx, x, eps), batch, layer, inputs))
        return ctx.add(x, self.mlp(ctx, self.ffn_norm(ctx, x, eps), layer))


@register("deepseek2")
@dataclass(eq=False)
class Deepseek2(common.Decoder):
    Config = Deepseek2Config

    rope_freqs: F32Param | None = None
    layers: list[Block] = blocks("blk")

    def __post_init__(self) -> None:
        self._heads: dict[int, np.ndarray] = {}   # i32 [T, H] head ids per batch size, kept for the graphs

    def layer_inputs(self, ctx: Context, batch) -> MlaInputs:
        n_tokens, n_head = batch.tokens.shape[0], self.cfg.n_head
        heads = self._heads.get(n_tokens)
        if heads is None:
            heads = np.ascontiguousarray(np.broadcast_to(np.arange(n_head, dtype=np.int32), (n_tokens, n_head)))
            self._heads[n_tokens] = heads
        return MlaInputs(heads=ctx.input(heads, "mla_heads"))

    @property
    def shift_head_dim(self) -> int:
        """A context shift hands each cached row whole (kvcache/rotate.py)."""
        return self.cfg.kv_row

    def shift_keys(self, ctx: Context, k: Tensor, positions: Tensor, layer: int,
                   n_ctx_seq: int | None = None) -> Tensor:
        """Rows k [r + rope, 1, n]: the latent stays, the roped part turns (a pure rotation)."""
        c, n, f = self.cfg, k.shape[2], common.F32_BYTES
        r, rope = c.kv_lora_rank, c.rope_dims
        latent = ctx.cont(ctx.view(k, (r, 1, n), (f, c.kv_row * f, c.kv_row * f)))
        k_pe = ctx.cont(ctx.view(k, (rope, 1, n), (f, c.kv_row * f, c.kv_row * f), r * f))
        return ctx.concat(latent, c.rotation_only().rope(ctx, k_pe, positions))      # [r + rope, 1, n]
