"""LFM2-VL's vision tower: a SigLIP2 NaFlex ViT at the image's own resolution, then a
pixel unshuffle, a LayerNorm and a 2-layer GELU MLP into the text model's embedding
space.  mmproj `clip.vision.projector_type = lfm2`; the text model is an `lfm2`.

    image -> resized (bilinear), the aspect kept, to whole s p-pixel squares holding
    64..256 tokens (s = clip.vision.projector.scale_factor) -> patches -> + the learned
    position grid resized to the patch grid (bilinear, antialiased, as llama.cpp's
    ggml_interpolate) -> vit.py's ViT -> pixel unshuffle s x s -> LayerNorm -> mm.1,
    GELU, mm.2

An image whose aligned size holds over twice the largest count is cut instead into
a grid of 512-pixel tiles (2..10 of them, the grid's aspect nearest the image's; the
image fitted into the grid and padded with black) plus a thumbnail at the sizes
above.  The prompt holds them as llama.cpp's mtmd places them:

    <|image_start|> (image) <|image_end|>
    <|image_start|><|img_row_1_col_1|> (tile) <|img_row_1_col_2|> (tile) ... <|img_thumbnail|> (thumbnail) <|image_end|>

The text model attends to the image's rows causally.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from pyengine.errors import ImageError, ModelError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Backend, Context, Tensor
from pyengine.ml.nn import LayerNorm, Linear
from pyengine.models.binding import tensor
from pyengine.vision import image
from pyengine.vision.tower import VisionConfig, register_tower, require_gelu
from pyengine.vision.vit import SiglipTower, TowerGraphs

MIN_TOKENS, MAX_TOKENS = 64, 256         # an image's tokens (llama.cpp's, from LFM2-VL's processor)
TILE, MIN_TILES, MAX_TILES = 512, 2, 10  # the tiling of a large image
TILE_TOLERANCE = 2.0                     # tiled once its aligned size holds over this x MAX_TOKENS' pixels
IMAGE_BEGIN, IMAGE_END, THUMBNAIL = "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"
TILE_TEXT = "<|img_row_{row}_col_{col}|>"
NORM_EPS = 1e-5                          # mm.input_norm: PyTorch's default LayerNorm


@dataclass(frozen=True)
class Lfm2VisionConfig(VisionConfig):
    merge: int = 2   # the pixel unshuffle's side, in patches

    @property
    def align(self) -> int:
        """An image's sides are multiples of this many pixels (one token's square)."""
        return self.patch_size * self.merge

    @property
    def n_merged(self) -> int:
        return self.n_embd * self.merge ** 2

    @property
    def n_tokens(self) -> int:
        """Tokens of an image of the file's own size."""
        return (self.patches_per_side // self.merge) ** 2

    @property
    def min_pixels(self) -> int:
        return MIN_TOKENS * self.align ** 2

    @property
    def max_pixels(self) -> int:
        return MAX_TOKENS * self.align ** 2

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Lfm2VisionConfig":
        kw = cls.common_from_gguf(f)
        require_gelu(f, "an LFM2")
        merge = f.get_int("clip.vision.projector.scale_factor", 0)
        if not 2 <= merge <= 8:
            raise ModelError(f"{f.path}: the pixel unshuffle side clip.vision.projector.scale_factor = {merge} "
                             "is out of range (2..8)")
        return cls(merge=merge, **kw)


@register_tower("lfm2")
@dataclass(eq=False)
class Lfm2Tower(SiglipTower):
    Config = Lfm2VisionConfig
    ATTENDS_BOTH_WAYS = False

    input_norm: LayerNorm | None = tensor("mm.input_norm", optional=True, shape=("n_merged",))
    mm_1: Linear = tensor("mm.1", shape=("n_merged", "n_embd_text"))
    mm_2: Linear = tensor("mm.2", shape=("n_embd_text", "n_embd_text"))

    def bound(self) -> None:
        n_pos = self.position_embd.weight.shape[1]
        side = math.isqrt(n_pos)
        if side * side != n_pos:
            raise ModelError(f"v.position_embd.weight holds {n_pos} positions, not a square grid")
        self._sizes: dict[tuple[int, int], TowerGraphs] = {}
        self._sizes_lock = threading.Lock()

    def preprocess(self, rgb: np.ndarray) -> list[np.ndarray]:
        """uint8 RGB -> the pixels of each image the tower sees, in prompt order: the
        image resized, or its tiles row by row and then its thumbnail."""
        c = self.cfg
        h, w = rgb.shape[:2]
        ow, oh = smart_size(w, h, c.align, c.min_pixels, c.max_pixels)
        overview = image.resize(rgb, ow, oh, "bilinear")
        if not should_tile(w, h, c.patch_size, c.align, c.max_pixels):
            return [overview]
        cols, rows = tile_grid(w, h)
        refined = image.resize_padded(rgb, cols * TILE, rows * TILE, "bilinear")
        tiles = [refined[r * TILE:(r + 1) * TILE, q * TILE:(q + 1) * TILE] for r in range(rows) for q in range(cols)]
        return tiles + [overview]

    def image_pieces(self, rgb: np.ndarray, backend=None) -> list:
        parts = self.preprocess(rgb)
        blocks = [self.encode_pixels(p, backend) for p in parts]
        if len(blocks) == 1:
            return [IMAGE_BEGIN, blocks[0], IMAGE_END]
        cols, _ = tile_grid(rgb.shape[1], rgb.shape[0])
        pieces: list = [IMAGE_BEGIN]
        for i, rows in enumerate(blocks[:-1]):
            pieces += [TILE_TEXT.format(row=i // cols + 1, col=i % cols + 1), rows]
        return pieces + [THUMBNAIL, blocks[-1], IMAGE_END]

    def encode(self, parts: list[np.ndarray], backend: Backend | None = None) -> list[np.ndarray]:
        return [self.encode_pixels(p, backend) for p in parts]

    def encode_pixels(self, pixels: np.ndarray, backend: Backend | None = None) -> np.ndarray:
        """float32 [n_tokens, n_embd_text] of uint8 RGB whose sides are multiples of the alignment."""
        c = self.cfg
        h, w = pixels.shape[:2]
        if h % c.align or w % c.align:
            raise ImageError(f"image {w}x{h} is not in whole {c.align}-pixel squares")
        patches = image.patches(image.normalize(pixels, c.image_mean, c.image_std), c.patch_size)
        return self._graphs_for(w // c.patch_size, h // c.patch_size)(patches, backend)

    def _graphs_for(self, width: int, height: int) -> TowerGraphs:
        with self._sizes_lock:
            graphs = self._sizes.get((width, height))
            if graphs is None:
                n_tokens = (width // self.cfg.merge) * (height // self.cfg.merge)
                graphs = self._sizes[(width, height)] = TowerGraphs(
                    lambda ctx, patches: self.forward_at(ctx, patches, width, height), width * height,
                    3 * self.cfg.patch_size ** 2, (n_tokens, self.cfg.n_embd_text))
            return graphs

    def forward(self, ctx: Context, patches: Tensor) -> Tensor:
        side = self.cfg.patches_per_side
        return self.forward_at(ctx, patches, side, side)

    def forward_at(self, ctx: Context, patches: Tensor, width: int, height: int) -> Tensor:
        """[n_embd_text, n_tokens] of an image of width x height patches."""
        c = self.cfg
        table = np.ascontiguousarray(self.position_embd.weight.to_f32().data).view(np.float32)   # raw bytes
        grid = positions_resized(table, c.n_embd, width, height)
        x = self.vit(ctx, patches, ctx.input(grid, "positions"))                        # [n_embd, n_patches]
        order = unshuffle_matrix(width, height, c.merge)                                # [n_patches, picks]
        picked = ctx.mul_mat(ctx.transpose(x), ctx.input(order, "unshuffle"))           # [n_embd, picks]
        x = ctx.reshape(picked, (c.n_merged, order.shape[0] // c.merge ** 2))          # [n_merged, n_tokens]
        if self.input_norm is not None:
            x = self.input_norm(ctx, x, NORM_EPS)
        return self.mm_2(ctx, ctx.gelu(self.mm_1(ctx, x)))                              # [n_embd_text, n_tokens]


def smart_size(width: int, height: int, align: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(width, height) in whole `align` squares, the aspect kept, holding min..max pixels:
    llama.cpp's calc_size_preserved_ratio, its float32 steps included."""
    f32, f = np.float32, np.float32(align)

    def rounded(x) -> int:
        return int(math.floor(f32(x) / f + f32(0.5))) * align   # std::round: halves away from zero

    w_bar, h_bar = max(align, rounded(width)), max(align, rounded(height))
    if w_bar * h_bar > max_pixels:
        beta = np.sqrt(f32(height) * f32(width) / f32(max_pixels))
        h_bar = max(align, int(math.floor(f32(f32(height) / beta) / f)) * align)
        w_bar = max(align, int(math.floor(f32(f32(width) / beta) / f)) * align)
    elif w_bar * h_bar < min_pixels:
        beta = np.sqrt(f32(min_pixels) / (f32(height) * f32(width)))
        h_bar = int(math.ceil(f32(f32(height) * beta) / f)) * align
        w_bar = int(math.ceil(f32(f32(width) * beta) / f)) * align
    return w_bar, h_bar


def should_tile(width: int, height: int, patch: int, align: int, max_pixels: int) -> bool:
    """Whether the image, its sides rounded (halves to even) to whole `align` squares,
    holds over TILE_TOLERANCE times max_pixels."""
    h_bar = max(patch, round(height / align) * align)
    w_bar = max(patch, round(width / align) * align)
    return float(h_bar) * float(w_bar) > max_pixels * TILE_TOLERANCE


def tile_grid(width: int, height: int) -> tuple[int, int]:
    """(columns, rows): of the grids of MIN_TILES..MAX_TILES tiles (smaller ones first),
    the one whose aspect is nearest the image's; of two as near, the later one when the
    image covers over half of its area."""
    aspect = np.float32(width) / np.float32(height)
    grids: list[tuple[int, int]] = []
    for n in range(MIN_TILES, MAX_TILES + 1):
        for w in range(1, n + 1):
            for h in range(1, n + 1):
                if MIN_TILES <= w * h <= MAX_TILES and (w, h) not in grids:
                    grids.append((w, h))
    grids.sort(key=lambda g: g[0] * g[1])
    best, best_diff = (1, 1), np.float32(np.inf)
    for w, h in grids:
        diff = abs(aspect - np.float32(w) / np.float32(h))
        if diff < best_diff:
            best, best_diff = (w, h), diff
        elif diff == best_diff and np.float32(width * height) > 0.5 * np.float32(TILE * TILE * w * h):
            best = (w, h)
    return best


def positions_resized(table: np.ndarray, n_embd: int, width: int, height: int) -> np.ndarray:
    """float32 [width * height, n_embd] (numpy order): the square grid of learned position
    embeddings resized to width x height, bilinear and antialiased (a triangle filter
    widened by the shrink factor, each output's weights summing to one), as PyTorch's
    interpolate and llama.cpp's ggml_interpolate do; the grid itself if it fits."""
    side = math.isqrt(table.size // n_embd)
    grid = np.asarray(table, np.float64).reshape(side, side, n_embd)                   # y, x, e
    if (width, height) != (side, side):
        grid = np.einsum("Yy,yxe,Xx->YXe", _resize_weights(side, height), grid, _resize_weights(side, width))
    return np.ascontiguousarray(grid.reshape(width * height, n_embd), dtype=np.float32)


def _resize_weights(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in]: each output's antialiased bilinear weights over the inputs."""
    scale = n_in / n_out
    support = max(scale, 1.0)
    m = np.zeros((n_out, n_in))
    for o in range(n_out):
        center = (o + 0.5) * scale
        lo, hi = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), n_in)
        taps = np.arange(lo, hi)
        w = np.maximum(0.0, 1.0 - np.abs((taps - center + 0.5) / support))
        m[o, lo:hi] = w / w.sum()
    return m


def unshuffle_matrix(width: int, height: int, s: int) -> np.ndarray:
    """[n_tokens * s^2, n_patches] (numpy order) of 0/1: column j of the product picks the
    patch that lands j-th - token by token (row by row), within a token its s x s square
    row by row - so that s^2 consecutive columns are one token."""
    ty, tx, dy, dx = np.meshgrid(np.arange(height // s), np.arange(width // s), np.arange(s), np.arange(s),
                                 indexing="ij")
    src = ((ty * s + dy) * width + tx * s + dx).reshape(-1)
    m = np.zeros((src.size, width * height), np.float32)
    m[np.arange(src.size), src] = 1.0
    return m
