"""The pieces of the Qwen-VL text models: M-RoPE and deepstack image features.

M-RoPE splits the rotated pairs into sections (`rope.dimension_sections`, e.g.
16/24/24/0 pairs of a 128-wide head) turned by a token's time, row and column
positions (Qwen2-VL, Qwen2.5-VL: a run of pairs per stream; Qwen3-VL: the streams
take turns pair by pair, `ROPE_IMROPE`; pairs none of the first three takes go
to the fourth).  A text token carries its position in the first three streams and
0 in the fourth (as llama.cpp fills a text batch's); an image's rows carry (t,
t + row, t + column, 0), t the image's first position, and the text after the
image goes on from t + max(rows, columns), as llama.cpp's mtmd places them.  The graph reads the
positions as I32 [4, n] (`ROPE_STREAMS`: the runner fills them); the cache and its
masks keep the tokens' order, which is the same.

Deepstack (Qwen3-VL): the tower hands each image row over as n_embd * (1 + n)
values - the row the text model takes in, then one more n_embd piece for each of
the first n layers, added to that layer's output (`n_deepstack_layers`).  Text
tokens bring no such pieces (llama.cpp pads them with zeros).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.errors import ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import ROPE_MROPE, Context, Tensor
from pyengine.models import common


@dataclass(frozen=True)
class MRopeConfig(common.AttentionConfig):
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
        common.check_range("n_deepstack_layers", self.n_deepstack, 0, self.n_layer)

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
class MRopeDecoder(common.Decoder):
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
