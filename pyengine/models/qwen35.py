"""Qwen3.5 (dense): a hybrid of gated attention and Gated DeltaNet layers.  GGUF `qwen35`.

Every `full_attention_interval`-th layer (the 4th, 8th, ... by default) attends;
the others are linear-attention layers whose memory is a fixed-size delta-rule
state per sequence (the cache's recurrent kind).  Each block norms its input,
adds the mixer's output, then norms again (`post_attention_norm`) into a SwiGLU
MLP.  The norm weights are used as the file has them: the converter already
folded Qwen's (1 + w) into them.

Attention layers: `attn_q` yields per head the query then a gate of the same
size; q and k are RMS-normed per head, roped over the first rope.dimension_count
dims (NeoX pairs; the file's rope sections are M-RoPE's, which for text, where
every section sees the same position, is this rope), and the attention output
is multiplied by sigmoid(gate) before `attn_output`.

Linear layers: `attn_qkv` gives the q, k, v channels, run through a causal
depthwise convolution (`ssm_conv1d`, kernel ssm.conv_kernel) and SiLU; q and k
(ssm.group_count heads of ssm.state_size) are L2-normed; per value head
(ssm.time_step_rank of them) beta = sigmoid(ssm_beta x) and the log decay
g = softplus(ssm_alpha x + ssm_dt.bias) * ssm_a (the file holds -exp(A_log));
the gated delta rule gives o, which is RMS-normed per head (`ssm_norm`), times
silu(attn_gate x), then projected by `ssm_out`.  The layers are common.py's
(DeltaNetConfig, GatedAttention, DeltaNet, DeltaNetHybridBlock), shared with the
MoE variants."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.errors import ModelError
from pyengine.gguf import GGUFFile
from pyengine.models import common
from pyengine.models.binding import blocks, module
from pyengine.models.registry import register


@dataclass(frozen=True)
class Qwen35Config(common.DeltaNetConfig):
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Qwen35Config":
        return cls(**cls.delta_from_gguf(f))


@dataclass(eq=False)
class Block(common.DeltaNetHybridBlock):
    mlp: common.MLP = module()


@register("qwen35")
@dataclass(eq=False)
class Qwen35(common.Decoder):
    Config = Qwen35Config

    rope_freqs: None = None
    layers: list[Block] = blocks("blk")

    def shift_keys(self, ctx, k, positions, layer, n_ctx_seq=None):
        raise ModelError("qwen35 keeps recurrent states, which cannot be shifted")
