"""nomic-bert-moe (nomic-embed-text-v2-moe): nomic-bert's post-norm blocks with
rotary positions (NeoX) and a fused q/k/v projection, but BERT's ungated GELU MLP
(biased up and down), and on every `moe_every_n_layers`-th layer, counted from the
second (layer i with i % n == 1, as llama.cpp picks them), routed experts instead:
the router's softmax over all experts, the `expert_used_count` most probable run
gelu(up x) -> down, summed weighted by their probabilities as they are (llama.cpp
neither renormalises nor scales them for this architecture).  Attention is
bidirectional.  GGUF `general.architecture = nomic-bert-moe`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.gguf import GGUFFile
from pyengine.ml.context import Context, Tensor
from pyengine.models import common
from pyengine.models.binding import blocks, module
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register


@dataclass(frozen=True)
class NomicBertMoeConfig(common.EncoderConfig, common.ExpertsConfig):
    moe_every_n_layers: int = 0   # 0: no expert layers

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "NomicBertMoeConfig":
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX)
        kw.update(cls.experts_from_gguf(f, n_ff_exp=kw["n_ff"]))
        # llama.cpp's MoE call for this architecture: no renormalisation, no scale
        kw.update(norm_expert_weights=False, expert_weights_scale=1.0,
                  moe_every_n_layers=f.get_int(f.arch_key("moe_every_n_layers"), 0))
        return cls(**kw)

    def __post_init__(self) -> None:
        super().__post_init__()
        common.check_range("moe_every_n_layers", self.moe_every_n_layers, 0, 1 << 16)
        if self.moe_every_n_layers > 0 and self.n_layer > 1:
            self.check_experts()

    def is_moe(self, layer: int) -> bool:
        return self.moe_every_n_layers > 0 and layer % self.moe_every_n_layers == 1


@dataclass(eq=False)
class GeluExperts(common.SoftmaxExperts):
    """SoftmaxExperts' routing (weights as they are: the config neither renormalises nor
    scales them) over ungated experts: down(gelu(up x))."""

    ffn_gate_exps: None = None

    def experts(self, ctx: Context, x: Tensor, chosen: Tensor) -> Tensor:
        x = ctx.reshape(x, (self.cfg.n_embd, 1, x.shape[-1]))                      # one input for all U
        up = ctx.gelu(self.ffn_up_exps(ctx, x, chosen))                             # [F, U, T]
        return self.ffn_down_exps(ctx, up, chosen)                                  # [n_embd, U, T]


@dataclass(eq=False)
class Block(common.EncoderBlock):
    attn: common.FusedAttention = module()


@dataclass(eq=False)
class MoeBlock(Block):
    mlp: GeluExperts = module()


def block_kind(cfg: NomicBertMoeConfig, layer: int) -> type:
    return MoeBlock if cfg.is_moe(layer) else Block


@register("nomic-bert-moe")
@dataclass(eq=False)
class NomicBertMoe(common.Encoder):
    Config = NomicBertMoeConfig

    head_cls: None = None   # (llama.cpp reads no classification head for nomic-bert-moe)
    layers: list[Block] = blocks("blk", kind=block_kind)
