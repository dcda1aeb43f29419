"""SmolLM3: Llama's block (RMSNorm, grouped-query attention, SiLU-gated MLP,
interleaved "normal" RoPE, output tied to the token embedding when the file
has no `output.weight`) where every fourth layer -- layers 3, 7, 11, ... --
attends without any position encoding ("NoPE").  GGUF `smollm3`.

llama.cpp hard-codes the step (`hparams.n_no_rope_layer_step = 4`, read from
no GGUF key) and ropes without frequency factors, so neither comes from the
file here.  Which layers rope is asked of the config (`layer_rope`), so the
attention is the shared one and a context shift leaves the NoPE layers'
keys alone (they carry no position to move)."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.gguf import GGUFFile
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import F32Param
from pyengine.models import common
from pyengine.models.config import MAX_LAYERS, ROPE_NORMAL
from pyengine.models.registry import register

NO_ROPE_LAYER_STEP = 4   # llama.cpp's value for SmolLM3; GGUF does not store it


@dataclass(frozen=True)
class SmolLM3Config(common.AttentionConfig):
    ROPE_WHOLE_HEADS = True
    no_rope_step: int = NO_ROPE_LAYER_STEP   # layer i attends without RoPE when (i + 1) % step == 0

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "SmolLM3Config":
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NORMAL, eps_default=None)   # q/k permuted: normal layout
        return cls(**kw, no_rope_step=NO_ROPE_LAYER_STEP)

    def __post_init__(self) -> None:
        super().__post_init__()
        common.check_range("no-RoPE layer step", self.no_rope_step, 1, MAX_LAYERS)

    def uses_rope(self, layer: int) -> bool:
        return (layer + 1) % self.no_rope_step != 0

    def layer_rope(self, ctx: Context, x: Tensor, positions: Tensor, layer: int,
                   freq_factors: Tensor | None = None) -> Tensor:
        """RoPE on most layers (never with frequency factors); the NoPE layers return x as it is."""
        return self.rope(ctx, x, positions) if self.uses_rope(layer) else x


@register("smollm3")
@dataclass(eq=False)
class SmolLM3(common.Decoder):
    """The shared decoder and blocks (optional q/k/v biases, as llama.cpp's graph allows)
    with SmolLM3's config; `rope_freqs` is not bound (llama.cpp ropes without it)."""

    Config = SmolLM3Config

    rope_freqs: F32Param | None = None
