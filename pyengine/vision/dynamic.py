"""The pieces of the dynamic-resolution towers (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): a
ViT over the image at (nearly) its own resolution whose patches are merged 2x2
into the text model's tokens.

    image -> resized so each side is a multiple of 2p (p-pixel patches merged 2x2),
    within 8..4096 merged tokens, the aspect kept (padded black to the multiple)
    -> patches, each 2x2 group of patches consecutive ("merge order")
    -> two patch convolutions summed (Qwen's two video frames: a still image is
       both) -> the tower's blocks, attending with 2D rope -> one row per merged
       token, row by row over the merged grid

The 2D rope turns each head's first half of pairs by the patch's row and the second
by its column (ggml's vision rope).  A tower file adds its blocks and its merger
(`forward`) and its config's keys.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from pyengine.errors import ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import F32, ROPE_VISION, Backend, Context, Tensor
from pyengine.ml.nn import Param, Weight
from pyengine.models.binding import bind
from pyengine.vision import image
from pyengine.vision.tower import Tower, VisionConfig

MERGE = 2                  # patches merged per side into one token
MIN_TOKENS, MAX_TOKENS = 8, 4096   # merged tokens an image may make (the Qwen-VL preprocessors')
ROPE_BASE = 10000.0


@dataclass(frozen=True)
class MergedConfig(VisionConfig):
    """VisionConfig of a tower whose patches are merged 2x2."""

    @property
    def n_merged(self) -> int:
        """Width of a 2x2 group's rows side by side (the merger's input and hidden width)."""
        return self.n_embd * MERGE * MERGE

    @property
    def align(self) -> int:
        """What each side of the resized image is a multiple of, in pixels."""
        return self.patch_size * MERGE

    @classmethod
    def merged_from_gguf(cls, f: GGUFFile, tower: str) -> dict:
        """The shared keys, checked for a 2x2 merge and the 2D rope's head width."""
        kw = cls.common_from_gguf(f)
        merge = f.get_int("clip.vision.spatial_merge_size", MERGE)
        if merge != MERGE:
            raise UnsupportedError(f"{f.path}: spatial merge {merge} is not supported ({tower} merges 2x2)")
        if (kw["n_embd"] // kw["n_head"]) % 4:
            raise ModelError(f"{f.path}: the 2D rope needs a head width that is a multiple of 4")
        return kw


def target_size(height: int, width: int, align: int) -> tuple[int, int]:
    """(height, width) llama.cpp resizes an image to: the sides rounded to `align`, then
    scaled (aspect kept, in float as clip.cpp computes it) into MIN..MAX_TOKENS tokens."""
    min_pixels, max_pixels = MIN_TOKENS * align * align, MAX_TOKENS * align * align
    f32 = np.float32

    def rounded(x, how) -> int:
        return int(how(f32(x) / f32(align))) * align

    h_bar = max(align, rounded(height, lambda v: np.floor(v + f32(0.5)) if v >= 0 else np.ceil(v - f32(0.5))))
    w_bar = max(align, rounded(width, lambda v: np.floor(v + f32(0.5)) if v >= 0 else np.ceil(v - f32(0.5))))
    if h_bar * w_bar > max_pixels:
        beta = np.sqrt(f32(height) * f32(width) / f32(max_pixels))
        h_bar = max(align, rounded(f32(height) / beta, np.floor))
        w_bar = max(align, rounded(f32(width) / beta, np.floor))
    elif h_bar * w_bar < min_pixels:
        beta = np.sqrt(f32(min_pixels) / (f32(height) * f32(width)))
        h_bar = rounded(f32(height) * beta, np.ceil)
        w_bar = rounded(f32(width) * beta, np.ceil)
    return h_bar, w_bar


def resize_padded(rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """`rgb` scaled (Pillow's bicubic, aspect kept) to fit height x width, centred on
    black: llama.cpp's resize with its default padding."""
    from PIL import Image

    h, w = rgb.shape[:2]
    if (h, w) == (height, width):
        return rgb
    scale = min(np.float32(width) / np.float32(w), np.float32(height) / np.float32(h))
    new_w = min(int(np.ceil(np.float32(w) * scale)), width)
    new_h = min(int(np.ceil(np.float32(h) * scale)), height)
    scaled = np.asarray(resize_two_pass(Image.fromarray(rgb, "RGB"), new_w, new_h), dtype=np.uint8)
    out = np.zeros((height, width, 3), np.uint8)
    top, left = (height - new_h) // 2, (width - new_w) // 2
    out[top:top + new_h, left:left + new_w] = scaled
    return out


def resize_two_pass(img, width: int, height: int):
    """Pillow's bicubic resize, the width first and then the height, each pass rounded
    to 8 bits: llama.cpp's resampler (Pillow's own, whole, may take the passes the
    other way round, a few levels off on a tall image)."""
    from PIL import Image

    if width != img.width:
        img = img.resize((width, img.height), Image.BICUBIC)
    return img.resize((width, height), Image.BICUBIC) if height != img.height else img


def merge_order(rows: np.ndarray, n_y: int, n_x: int) -> np.ndarray:
    """Rows in raster order over an n_y x n_x patch grid -> each 2x2 group's four
    consecutive (groups row by row, inside a group row by row)."""
    k = rows.shape[1]
    grid = rows.reshape(n_y // MERGE, MERGE, n_x // MERGE, MERGE, k)
    return np.ascontiguousarray(grid.transpose(0, 2, 1, 3, 4)).reshape(n_y * n_x, k)


def patch_positions(n_y: int, n_x: int) -> np.ndarray:
    """int32 [n_patches, 4]: each patch's (row, column, row, column), in merge order."""
    ys, xs = np.mgrid[0:n_y, 0:n_x]
    rc = np.stack([ys.ravel(), xs.ravel()], axis=1)
    rc = merge_order(rc, n_y, n_x)
    return np.ascontiguousarray(np.concatenate([rc, rc], axis=1), np.int32)


class PatchGrid:
    """One image size's graph inputs (patch positions, the heads' scratch) and its
    attention: per head, softmax(k^T q * scale [+ mask]) then v times it, in F32
    products, each head's rows written into one scratch (set_rows)."""

    def __init__(self, ctx: Context, cfg: MergedConfig, n_y: int, n_x: int) -> None:
        self.cfg, self.n_y, self.n_x, self.n = cfg, n_y, n_x, n_y * n_x
        self.positions = ctx.input(patch_positions(n_y, n_x), "patch_positions")
        self.heads = np.zeros((self.n * cfg.n_head, cfg.head_dim), np.float32)   # [n_embd, n] as rows of head_dim
        self.out = ctx.cache(self.heads, F32, (cfg.head_dim, self.n * cfg.n_head), "patch_heads")
        # head h of patch j is row j * n_head + h of the scratch
        self.slots = [ctx.input(np.arange(self.n, dtype=np.int32) * cfg.n_head + h, f"head_slots.{h}")
                      for h in range(cfg.n_head)]

    def rope(self, ctx: Context, x: Tensor) -> Tensor:
        """2D rope of [n_embd, n] as [head_dim, n_head, n] (ggml's vision rope: n_dims is
        half the head, a quarter of it per stream)."""
        hd = self.cfg.head_dim
        heads = ctx.reshape(x, (hd, self.cfg.n_head, self.n))
        return ctx.rope_multi(heads, self.positions, n_dims=hd // 2, sections=(hd // 4,) * 4,
                              mode=ROPE_VISION, base=ROPE_BASE)

    def attend(self, ctx: Context, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        c, n = self.cfg, self.n
        hd = c.head_dim
        q, k = self.rope(ctx, q), self.rope(ctx, k)                           # [hd, H, n]
        scale = 1.0 / math.sqrt(hd)
        out = self.out
        for h in range(c.n_head):
            def head(x: Tensor, h: int = h) -> Tensor:                       # [hd, n]
                return ctx.cont(ctx.view(x, (hd, n), (4, 4 * c.n_embd), 4 * hd * h))
            scores = ctx.scale(ctx.mul_mat(head(k), head(q)), scale)         # [n keys, n queries]
            if mask is not None:
                scores = ctx.add(scores, mask)
            vh = ctx.view(v, (hd, n), (4, 4 * c.n_embd), 4 * hd * h)
            out = ctx.set_rows(out, ctx.mul_mat(ctx.transpose(ctx.cont(vh)), ctx.softmax(scores)), self.slots[h])
        return ctx.reshape(ctx.cont(out), (c.n_embd, n))                     # [n_embd, n]

    def merged(self, ctx: Context, x: Tensor) -> Tensor:
        """[n_embd, n] in merge order -> [n_merged, n / 4]: each 2x2 group's rows side by side."""
        return ctx.reshape(x, (self.cfg.n_merged, self.n // (MERGE * MERGE)))


@dataclass(eq=False)
class BareParam(Param):
    """A tensor named without a `.weight` part (the second frame's kernel, `v.patch_embd.weight.1`)."""

    BARE = True


def merge_and_project(ctx: Context, tower, grid: PatchGrid, x: Tensor) -> Tensor:
    """The merger: the tower's post norm, each 2x2 group's rows side by side, mm.0, GELU,
    mm.2: [n_embd_text, n_tokens]."""
    x = grid.merged(ctx, tower.post_ln(ctx, x, tower.cfg.eps))                          # a 2x2 group a column
    return tower.mm_2(ctx, ctx.gelu(tower.mm_0(ctx, x)))


def patch_conv(ctx: Context, w: Weight, patches: Tensor) -> Tensor:
    """A convolution with stride = kernel = the patch side, as one product: weight
    [p, p, 3, n_embd], patches [3 p^2, n_patches] -> [n_embd, n_patches]."""
    p, _, c, n_embd = w.shape
    return ctx.mul_mat(ctx.weight(Weight(w.name, w.type, (p * p * c, n_embd), w.data)), patches)


def both_frames(ctx: Context, tower, patches: Tensor) -> Tensor:
    """Qwen's two video frames' kernels (`patch_embd`, `patch_embd_1`) over a still image,
    which is both frames: the two convolutions summed, [n_embd, n_patches]."""
    return ctx.add(patch_conv(ctx, tower.patch_embd.weight, patches),
                   patch_conv(ctx, tower.patch_embd_1.weight, patches))


class MergedPatchTower(Tower):
    """What the merged-patch towers share: preprocessing, the rows as a grid for M-RoPE,
    one graph per image size.  A tower has `forward(ctx, patches, n_y, n_x)` ->
    [n_embd_out, n_tokens] and a config class (MergedConfig) as `Config`."""

    IMAGE_BEGIN, IMAGE_END = "<|vision_start|>", "<|vision_end|>"   # the text around an image (mtmd's)
    ATTENDS_BOTH_WAYS = False   # the image's rows attend causally in the text model (mtmd's non-causal list)

    @classmethod
    def from_gguf(cls, f: GGUFFile):
        tower = bind(cls, f, cls.Config.from_gguf(f))
        tower._graphs = {}
        tower._lock = threading.Lock()
        return tower

    def preprocess(self, rgb: np.ndarray) -> np.ndarray:
        """uint8 RGB [h, w, 3] -> float32 [n_patches, 3 p^2] in merge order, the image
        resized as llama.cpp's mtmd does; the result's `grid` tells its patch grid."""
        c = self.cfg
        height, width = target_size(rgb.shape[0], rgb.shape[1], c.align)
        planes = image.normalize(resize_padded(rgb, height, width), c.image_mean, c.image_std)
        n_y, n_x = height // c.patch_size, width // c.patch_size
        return PatchRows(merge_order(image.patches(planes, c.patch_size), n_y, n_x), (n_y, n_x))

    def token_grid(self, patches: np.ndarray) -> tuple[int, int]:
        """(rows, columns) of the merged tokens an image's patches make."""
        n_y, n_x = patches.grid
        return n_y // MERGE, n_x // MERGE

    def image_pieces(self, rgb: np.ndarray, backend=None) -> list:
        """The image's rows as a grid [rows, columns, n_embd_out]: the text model places
        each by its row and column (M-RoPE)."""
        patches = self.preprocess(rgb)
        rows = self.encode(patches, backend)
        return [self.IMAGE_BEGIN, rows.reshape(*self.token_grid(patches), rows.shape[-1]), self.IMAGE_END]

    def encode(self, patches: np.ndarray, backend: Backend | None = None) -> np.ndarray:
        """float32 [n_tokens, n_embd_out] of preprocessed patches (PatchRows), tokens
        row by row over the merged grid."""
        n_y, n_x = patches.grid
        with self._lock:
            ctx, inp, out = self._graph(backend, n_y, n_x)
            np.copyto(inp, patches)
            ctx.compute()
            n_tokens = n_y * n_x // (MERGE * MERGE)
            return ctx.read(out).reshape(n_tokens, self.cfg.n_embd_out).copy()

    def _graph(self, backend: Backend | None, n_y: int, n_x: int):
        key = (id(backend), n_y, n_x)
        built = self._graphs.get(key)
        if built is None:
            if len(self._graphs) >= MAX_GRAPHS:
                self._graphs.pop(next(iter(self._graphs)))
            ctx = Context(backend or Backend())
            inp = np.zeros((n_y * n_x, 3 * self.cfg.patch_size ** 2), np.float32)
            out = self.forward(ctx, ctx.input(inp, "patches"), n_y, n_x)
            ctx.set_output(out)
            built = self._graphs[key] = (ctx, inp, out)
        return built


MAX_GRAPHS = 4   # image sizes whose graphs are kept (each holds its n_patches^2 scores)


class PatchRows(np.ndarray):
    """An image's patch rows that remember their grid (patches down, patches across)."""

    def __new__(cls, rows: np.ndarray, grid: tuple[int, int]) -> "PatchRows":
        obj = np.asarray(rows).view(cls)
        obj.grid = grid
        return obj

    def __array_finalize__(self, obj) -> None:
        self.grid = getattr(obj, "grid", None)
