"""Qwen2-VL (and Qwen2.5-VL, whose GGUF text model is the same architecture): Qwen2
blocks with M-RoPE.  GGUF `general.architecture = qwen2vl`.

M-RoPE splits the rotated pairs into sections (`rope.dimension_sections`, e.g.
16/24/24/0 pairs of a 128-wide head) turned by a token's time, row and column
positions.  A text token carries one position in all three streams (M-RoPE is
then NeoX rope, bit for bit); an image's rows carry (t, t + row, t + column), t
the image's first position, and the text after the image goes on from t +
max(rows, columns), as llama.cpp's mtmd places them.  The graph reads the
positions as I32 [4, n] (`ROPE_STREAMS`: the runner fills them, the fourth
stream 0); the cache and its masks keep the tokens' order, which is the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.errors import ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import ROPE_MROPE, Context, Tensor
from pyengine.models import common
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register


@dataclass(frozen=True)
class Qwen2VLConfig(common.AttentionConfig):
    rope_sections: tuple[int, int, int, int] = (0, 0, 0, 0)   # rotated pairs per position stream

    ROPE_STREAMS = 4   # positions per token the graph takes (t, row, column, unused)

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Qwen2VLConfig":
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX)
        key = f.arch_key("rope.dimension_sections")
        if key not in f.metadata:
            raise ModelError(f"{f.path}: an M-RoPE model needs {key}")
        sections = [int(v) for v in f.get_array(key)]
        if len(sections) < 3 or len(sections) > 4:
            raise ModelError(f"{f.path}: {key} must hold 3 or 4 values, got {sections}")
        return cls(rope_sections=tuple((sections + [0])[:4]), **kw)

    def __post_init__(self) -> None:
        super().__post_init__()
        if any(s < 0 for s in self.rope_sections) or not 0 < sum(self.rope_sections) <= self.rope_dims // 2:
            raise ModelError(f"rope.dimension_sections {list(self.rope_sections)} must be >= 0 and hold "
                             f"1..{self.rope_dims // 2} rotated pairs")
        if self.rope_ext_factor != 0:
            raise UnsupportedError("YaRN scaling with M-RoPE is not supported")

    def layer_rope(self, ctx: Context, x: Tensor, positions: Tensor, layer: int,
                   freq_factors: Tensor | None = None) -> Tensor:
        """M-RoPE over positions I32 [4, n]."""
        if freq_factors is not None:
            raise UnsupportedError("rope frequency factors with M-RoPE are not supported")
        return ctx.rope_multi(x, positions, n_dims=self.rope_dims, sections=self.rope_sections,
                              mode=ROPE_MROPE, base=self.rope_base, scale=self.rope_scale)


@register("qwen2vl")
@dataclass(eq=False)
class Qwen2VL(common.Decoder):
    Config = Qwen2VLConfig

    def shift_keys(self, ctx: Context, k: Tensor, positions: Tensor, layer: int,
                   n_ctx_seq: int | None = None) -> Tensor:
        """Moving cached keys by d in every stream is NeoX rope by d (the rotations of one
        pair compose), so the shift is the plain rope over the 1-d shift."""
        return self.cfg.rotation_only().rope(ctx, k, positions)
