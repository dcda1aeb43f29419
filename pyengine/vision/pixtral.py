"""Pixtral's vision tower (Pixtral-12B; with a 2x2 patch merger, Mistral Small 3.1 / 3.2):
mmproj `clip.vision.projector_type = pixtral` (llama.cpp has no other string for either).

    image, resized (bicubic) keeping its aspect so that each side is a multiple of p*m pixels
    (p: patch side, m: clip.vision.spatial_merge_size, 1 for Pixtral-12B) and its
    token count within [8, 1024] -> R x C patches -> patch embedding (a product)
    -> RMS pre-norm -> n_layer x (x + attn(RMS(x)) with 2D RoPE; x + SwiGLU(RMS(x)))
    -> [m > 1: RMS norm, each m x m patch block merged into one vector, a product]
    -> GELU MLP (mm.1, mm.2) into the text model's width
    -> the [IMG_BREAK] embedding (v.token_embd.img_break) after each row of tokens
       but the last; the prompt then has the text [IMG_END]

2D RoPE: each head's first half is rotated by the patch's row, its second half by its
column, both as normal (adjacent-pair) RoPE over head_dim/2 dimensions; the second
half's frequencies are the odd rungs of the head_dim ladder (base^(-(4i+2)/head_dim)),
the first half's the even ones.  It is two rope ops over views of q and k and a concat.

Unlike Gemma 3's, the image's rows are fed to the text model causally (llama.cpp's
mtmd_decode_use_non_causal is false for this projector).  The graph depends on the
patch grid, so one is built per grid size (and backend) and a few are kept.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from pyengine.errors import ImageError, ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import F16, F32, Backend, Context, Tensor
from pyengine.ml.nn import BareF32Param, Linear, Param, RMSNorm, Weight
from pyengine.models.binding import Module, bind, blocks, tensor
from pyengine.vision import image, resample
from pyengine.vision.tower import Tower, VisionConfig, register_tower
from pyengine.vision.vit import PatchAttention, RmsSwigluBlock

ROPE_THETA = 10000.0            # llama.cpp's for Pixtral (the file has no key for it)
MIN_TOKENS, MAX_TOKENS = 8, 1024   # llama.cpp's limits on an image's tokens (before [IMG_BREAK]s)
GRAPHS_KEPT = 4                 # graphs of distinct grid sizes kept built


@dataclass(frozen=True)
class PixtralVisionConfig(VisionConfig):
    merge: int = 1   # side of the patch block merged into one token (clip.vision.spatial_merge_size)

    @property
    def align(self) -> int:
        """What each side of the resized image is a multiple of, in pixels."""
        return self.patch_size * self.merge

    @property
    def n_tokens_max(self) -> int:
        """Tokens of the largest image, [IMG_BREAK]s included (a square of MAX_TOKENS)."""
        side = math.isqrt(MAX_TOKENS)
        return side * side + side - 1

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "PixtralVisionConfig":
        kw = cls.common_from_gguf(f)
        if not f.get_bool("clip.use_silu", False) or f.get_bool("clip.use_gelu", False):
            raise UnsupportedError(f"{f.path}: a Pixtral tower with an MLP other than SwiGLU (clip.use_silu) "
                                   "is not supported")
        if kw["n_embd"] // kw["n_head"] % 4:
            raise ModelError(f"{f.path}: head size {kw['n_embd'] // kw['n_head']} is not a multiple of 4 "
                             "(2D RoPE rotates pairs in each half of a head)")
        merge = f.get_int("clip.vision.spatial_merge_size", 1)
        if not 1 <= merge <= 8:
            raise ModelError(f"{f.path}: clip.vision.spatial_merge_size = {merge} is out of range")
        return cls(merge=merge, **kw)


@dataclass(frozen=True)
class Pixels:
    """A preprocessed image: its patches float32 [rows * cols, 3 p^2], row by row."""

    patches: np.ndarray
    rows: int   # patches down the image
    cols: int   # patches across it


def target_size(width: int, height: int, c: PixtralVisionConfig) -> tuple[int, int]:
    """(width, height) the image is resized to, as llama.cpp's calc_size_preserved_ratio
    computes it (in float32): each side rounded to a multiple of `align`, then scaled
    down (floored) to the pixel cap or up (ceiled) to the floor, keeping the aspect."""
    f = np.float32
    a = c.align
    min_pixels, max_pixels = MIN_TOKENS * a * a, MAX_TOKENS * a * a

    def by(x, rounding) -> int:
        return int(rounding(f(x) / f(a))) * a

    w_bar = max(a, by(width, lambda v: math.floor(v + f(0.5))))
    h_bar = max(a, by(height, lambda v: math.floor(v + f(0.5))))
    if w_bar * h_bar > max_pixels:
        beta = np.sqrt(f(height) * f(width) / f(max_pixels), dtype=f)
        h_bar, w_bar = max(a, by(f(height) / beta, math.floor)), max(a, by(f(width) / beta, math.floor))
    elif w_bar * h_bar < min_pixels:
        beta = np.sqrt(f(min_pixels) / (f(height) * f(width)), dtype=f)
        h_bar, w_bar = by(f(height) * beta, math.ceil), by(f(width) * beta, math.ceil)
    return w_bar, h_bar


def resize_fit(rgb: np.ndarray, width: int, height: int) -> np.ndarray:
    """`rgb` scaled (bicubic, llama.cpp's resampler) to fit width x height keeping its
    aspect, centred on black (llama.cpp's img_tool::resize with its default PAD_CEIL);
    unchanged if it is that size already."""
    h0, w0 = rgb.shape[:2]
    if (w0, h0) == (width, height):
        return rgb
    scale = min(np.float32(width) / np.float32(w0), np.float32(height) / np.float32(h0))
    new_w = min(math.ceil(np.float32(w0) * scale), width)
    new_h = min(math.ceil(np.float32(h0) * scale), height)
    out = np.zeros((height, width, 3), np.uint8)
    top, left = (height - new_h) // 2, (width - new_w) // 2
    out[top:top + new_h, left:left + new_w] = resample.resize(rgb, new_w, new_h, "bicubic")
    return out


class Grid:
    """What a graph over a rows x cols patch grid needs: the 2D RoPE positions and the
    attention's scratch."""

    def __init__(self, ctx: Context, cfg: PixtralVisionConfig, rows: int, cols: int) -> None:
        self.cfg, self.rows, self.cols, self.n = cfg, rows, cols, rows * cols
        row_of, col_of = np.divmod(np.arange(self.n, dtype=np.int32), cols)
        self.pos_row = ctx.input(row_of.astype(np.int32), "pos_row")
        self.pos_col = ctx.input(col_of.astype(np.int32), "pos_col")
        self.attend = PatchAttention(ctx, self.n, cfg.n_head, cfg.head_dim)

    def rope(self, ctx: Context, x: Tensor) -> Tensor:
        """x [n_embd, n]: each head's first half rotated by row, second half by column."""
        hd, nh, n = self.cfg.head_dim, self.cfg.n_head, self.n
        half = hd // 2
        # the second half's rungs sit between the first half's: base^(-2/hd) further down
        odd = float(np.float32(ROPE_THETA ** (-2.0 / hd)))

        def half_of(i: int) -> Tensor:
            return ctx.view(x, (half, nh, n), (4, 4 * hd, 4 * hd * nh), 4 * half * i)

        first = ctx.rope(half_of(0), self.pos_row, n_dims=half, mode=0, base=ROPE_THETA)
        second = ctx.rope(half_of(1), self.pos_col, n_dims=half, mode=0, base=ROPE_THETA, scale=odd)
        return ctx.reshape(ctx.concat(first, second), (hd * nh, n))


@register_tower("pixtral")
@dataclass(eq=False)
class PixtralTower(Module, Tower):
    Config = PixtralVisionConfig
    IMAGE_BEGIN, IMAGE_END = "", "[IMG_END]"   # the text around an image (llama.cpp's)
    ATTENDS_BOTH_WAYS = False                  # the image's rows are fed causally

    patch_embd: Param = tensor("v.patch_embd", shape=("patch_size", "patch_size", 3, "n_embd"))
    pre_ln: RMSNorm | None = tensor("v.pre_ln", optional=True, shape=("n_embd",))
    layers: list[RmsSwigluBlock] = blocks("v.blk")
    post_ln: RMSNorm | None = tensor("v.post_ln", optional=True, shape=("n_embd",))
    input_norm: RMSNorm | None = tensor("mm.input_norm", optional=True, shape=("n_embd",))
    patch_merger: Param | None = tensor("mm.patch_merger", optional=True)
    mm_1: Linear = tensor("mm.1", shape=("n_embd", "n_embd_text"))
    mm_2: Linear = tensor("mm.2", shape=("n_embd_text", "n_embd_text"))
    img_break: BareF32Param = tensor("v.token_embd.img_break", shape=("n_embd_text",))

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "PixtralTower":
        tower = bind(cls, f, PixtralVisionConfig.from_gguf(f))
        c = tower.cfg
        if (tower.patch_merger is None) != (c.merge == 1) or (tower.patch_merger is None) != (tower.input_norm is None):
            raise ModelError(f"{f.path}: spatial_merge_size {c.merge} needs mm.patch_merger.weight and "
                             "mm.input_norm.weight (and only then)")
        if tower.patch_merger is not None:
            tower.patch_merger.weight = _merger_by_offset(tower.patch_merger.weight, c)
        tower._graphs = OrderedDict()
        tower._lock = threading.Lock()
        return tower

    @property
    def n_tokens(self) -> int:
        """The most tokens an image takes (their count depends on its size)."""
        return self.cfg.n_tokens_max

    def preprocess(self, rgb: np.ndarray) -> Pixels:
        """uint8 RGB [h, w, 3] -> its patches at the size llama.cpp resizes it to."""
        c = self.cfg
        width, height = target_size(rgb.shape[1], rgb.shape[0], c)
        planes = image.normalize(resize_fit(rgb, width, height), c.image_mean, c.image_std)
        return Pixels(image.patches(planes, c.patch_size), height // c.patch_size, width // c.patch_size)

    def forward(self, ctx: Context, patches: Tensor, grid: Grid) -> Tensor:
        c = self.cfg
        p = c.patch_size
        kernel = Weight(self.patch_embd.weight.name, self.patch_embd.weight.type, (p * p * 3, c.n_embd),
                        self.patch_embd.weight.data)
        x = ctx.mul_mat(ctx.weight(kernel), patches)                                   # [n_embd, n]
        if self.pre_ln is not None:
            x = self.pre_ln(ctx, x, c.eps)
        for layer in self.layers:
            x = layer(ctx, x, lambda ctx, q, k, v: grid.attend(ctx, grid.rope(ctx, q), grid.rope(ctx, k), v))
        if self.post_ln is not None:
            x = self.post_ln(ctx, x, c.eps)
        if self.patch_merger is not None:
            x = self.merge(ctx, self.input_norm(ctx, x, c.eps), grid)
        x = self.mm_2(ctx, ctx.gelu(self.mm_1(ctx, x)))                                # [n_embd_text, tokens]
        return self.with_breaks(ctx, x, grid.rows // c.merge, grid.cols // c.merge)

    def merge(self, ctx: Context, x: Tensor, grid: Grid) -> Tensor:
        """x [n_embd, n] -> [n_embd, n / m^2]: each m x m block of patches gathered into one
        vector (offset by offset, the merger's columns reordered to match at load), then
        multiplied by the merger."""
        m, d = self.cfg.merge, self.cfg.n_embd
        ids = ctx.input(merge_order(grid.rows, grid.cols, m), "merge_order")
        blocks_ = ctx.reshape(ctx.get_rows(x, ids), (d * m * m, grid.n // (m * m)))
        return ctx.mul_mat(ctx.weight(self.patch_merger.weight), blocks_)

    def with_breaks(self, ctx: Context, x: Tensor, rows: int, cols: int) -> Tensor:
        """x [n_embd_text, rows * cols] -> [n_embd_text, rows * (cols + 1)]: the [IMG_BREAK]
        embedding after each row (the reader drops the last one)."""
        n_text = self.cfg.n_embd_text
        table = ctx.reshape(ctx.weight(self.img_break.weight), (n_text, 1))
        breaks = ctx.get_rows(table, ctx.input(np.zeros(rows, np.int32), "break_rows"))   # [n_text, rows]
        joined = ctx.concat(ctx.reshape(x, (n_text * cols, rows)), breaks)
        return ctx.reshape(joined, (n_text, rows * (cols + 1)))

    def encode(self, pixels: Pixels, backend: Backend | None = None) -> np.ndarray:
        """float32 [tokens, n_embd_text] of a preprocessed image, [IMG_BREAK]s included."""
        c = self.cfg
        if not isinstance(pixels, Pixels) or pixels.patches.shape != (pixels.rows * pixels.cols, 3 * c.patch_size ** 2):
            raise ImageError("Pixtral's tower takes the Pixels its preprocess() makes")
        if pixels.rows % c.merge or pixels.cols % c.merge:
            raise ImageError(f"a {pixels.cols}x{pixels.rows} patch grid does not merge in {c.merge}x{c.merge} blocks")
        rows, cols = pixels.rows // c.merge, pixels.cols // c.merge
        with self._lock:
            ctx, inp, out = self._graph(backend, pixels.rows, pixels.cols)
            np.copyto(inp, pixels.patches)
            ctx.compute()
            return ctx.read(out).reshape(rows * (cols + 1), c.n_embd_text)[:-1].copy()

    def _graph(self, backend: Backend | None, rows: int, cols: int):
        key = (id(backend), rows, cols)
        built = self._graphs.get(key)
        if built is None:
            ctx = Context(backend or Backend())
            inp = np.zeros((rows * cols, 3 * self.cfg.patch_size ** 2), np.float32)
            out = self.forward(ctx, ctx.input(inp, "patches"), Grid(ctx, self.cfg, rows, cols))
            ctx.set_output(out)
            built = self._graphs[key] = (ctx, inp, out)
            while len(self._graphs) > GRAPHS_KEPT:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        return built


def merge_order(rows: int, cols: int, m: int) -> np.ndarray:
    """int32 patch indices: for each merged token (row by row), its m x m patches offset
    by offset (row within the block, then column)."""
    ty, tx, oy, ox = np.meshgrid(np.arange(rows // m), np.arange(cols // m), np.arange(m), np.arange(m),
                                 indexing="ij")
    return ((ty * m + oy) * cols + tx * m + ox).reshape(-1).astype(np.int32)


def _merger_by_offset(w: Weight, c: PixtralVisionConfig) -> Weight:
    """mm.patch_merger [n_embd * m^2, n_embd] (GGML order) takes each block as llama.cpp's
    im2col lays it out: channel by channel, the m x m offsets inside.  merge() gathers it
    offset by offset instead, so the columns are reordered once here; F16 stays F16
    (a permutation is exact), anything else becomes F32."""
    m2, d = c.merge * c.merge, c.n_embd
    if w.shape != (d * m2, d):
        raise ModelError(f"mm.patch_merger.weight has shape {w.shape}, expected {(d * m2, d)}")
    if w.type == F16:
        values = np.frombuffer(np.ascontiguousarray(w.data).tobytes(), np.float16)
    else:
        values = w.to_f32().data
    by_channel = values.reshape(d, d, m2)                       # [out, channel, offset]
    by_offset = np.ascontiguousarray(by_channel.transpose(0, 2, 1)).reshape(-1)
    return Weight(w.name, F16 if w.type == F16 else F32, w.shape, by_offset)
