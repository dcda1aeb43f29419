"""Idefics3's vision tower (SmolVLM, SmolVLM2): a SigLIP ViT over tiles of the image,
then a pixel shuffle and one linear projection into the text model's embedding space.
mmproj `clip.vision.projector_type = idefics3`; the text model is a `llama`.

    image -> resized (Lanczos) so its longer side is the file's preprocessing size
    (clip.vision.preproc_image_size), then up to whole tiles of S x S -> the tiles row
    by row, and the whole image at S x S (the global image) -> each: patches ->
    vit.py's ViT -> pixel shuffle s x s (s = clip.vision.projector.scale_factor: each
    s x s square of patches becomes one token of s^2 n_embd) -> mm.model.fc

The prompt holds the tiles, then the global image, as llama.cpp's mtmd places them:

    <fake_token_around_image><row_1_col_1> (tile) <fake_token_around_image><row_1_col_2> (tile) ...
    \\n  (between rows)  ...
    \\n\\n<fake_token_around_image><global-img> (global image) <fake_token_around_image>

Each tile is its own block of rows; the text model attends to them causally.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pyengine.errors import ImageError, ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Backend, Context, Tensor
from pyengine.ml.nn import Linear
from pyengine.models.binding import tensor
from pyengine.vision import image
from pyengine.vision.tower import VisionConfig, register_tower, require_gelu
from pyengine.vision.vit import SiglipTower

TILE_TEXT = "<fake_token_around_image><row_{row}_col_{col}>"   # before each tile (rows, columns from 1)
ROW_END = "\n"                                                # between two rows of tiles
GLOBAL_BEGIN = "\n\n<fake_token_around_image><global-img>"
GLOBAL_END = "<fake_token_around_image>"
MAX_TILES = 64   # tiles of one image; SmolVLM's own limit is 4 x 4 (2048 / 512)


@dataclass(frozen=True)
class Idefics3VisionConfig(VisionConfig):
    shuffle: int = 2          # the pixel shuffle's side, in patches
    longest_edge: int = 0     # the longer side an image is resized to before it is tiled

    @property
    def n_tokens(self) -> int:
        """Tokens of one tile (or of the global image)."""
        return (self.patches_per_side // self.shuffle) ** 2

    @property
    def n_merged(self) -> int:
        """Width of a token after the pixel shuffle."""
        return self.n_embd * self.shuffle ** 2

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Idefics3VisionConfig":
        kw = cls.common_from_gguf(f)
        require_gelu(f, "an Idefics3")
        shuffle = f.get_int("clip.vision.projector.scale_factor", 0)
        per_side = kw["image_size"] // kw["patch_size"]
        if shuffle < 2 or per_side % shuffle:
            raise ModelError(f"{f.path}: the pixel shuffle side clip.vision.projector.scale_factor = {shuffle} "
                             f"does not divide the {per_side} patches per side (or is under 2)")
        longest = f.get_int("clip.vision.preproc_image_size", 0)
        if longest <= 0:
            raise UnsupportedError(f"{f.path}: an Idefics3 projector without clip.vision.preproc_image_size "
                                   "(an older conversion) is not supported; convert it again")
        if not kw["image_size"] <= longest <= kw["image_size"] * 8:
            raise ModelError(f"{f.path}: clip.vision.preproc_image_size {longest} is out of range for tiles of "
                             f"{kw['image_size']}")
        return cls(shuffle=shuffle, longest_edge=longest, **kw)


@dataclass(frozen=True)
class Tiles:
    """A preprocessed image: its tiles' patches row by row, and the global image's."""

    rows: int
    cols: int
    tiles: tuple[np.ndarray, ...]   # each float32 [n_patches, 3 p^2]
    overview: np.ndarray


@register_tower("idefics3")
@dataclass(eq=False)
class Idefics3Tower(SiglipTower):
    Config = Idefics3VisionConfig
    ATTENDS_BOTH_WAYS = False

    fc: Linear = tensor("mm.model.fc", shape=("n_merged", "n_embd_text"))

    def preprocess(self, rgb: np.ndarray) -> Tiles:
        """uint8 RGB [h, w, 3] -> the tiles' and the global image's patches."""
        c = self.cfg
        refined, rows, cols = tiled(rgb, c.image_size, c.longest_edge)
        s = c.image_size

        def patches(pixels: np.ndarray) -> np.ndarray:
            return image.patches(image.normalize(pixels, c.image_mean, c.image_std), c.patch_size)

        tiles = tuple(patches(refined[r * s:(r + 1) * s, q * s:(q + 1) * s]) for r in range(rows) for q in range(cols))
        return Tiles(rows, cols, tiles, patches(lanczos(refined, s, s)))

    def forward(self, ctx: Context, patches: Tensor) -> Tensor:
        c = self.cfg
        x = self.vit(ctx, patches)                                                     # [n_embd, n_patches]
        shuffled = ctx.get_rows(x, ctx.input(shuffle_order(c), "shuffle"))            # [n_embd, n_patches]
        return self.fc(ctx, ctx.reshape(shuffled, (c.n_merged, c.n_tokens)))           # [n_embd_text, n_tokens]

    def encode(self, tiles: Tiles, backend: Backend | None = None) -> list[np.ndarray]:
        """float32 [n_tokens, n_embd_text] of each tile, row by row, then of the global image."""
        return [self.encode_one(t, backend) for t in (*tiles.tiles, tiles.overview)]

    def image_pieces(self, rgb: np.ndarray, backend=None) -> list:
        tiles = self.preprocess(rgb)
        *tile_rows, overview = self.encode(tiles, backend)
        pieces: list = []
        for r in range(tiles.rows):
            for q in range(tiles.cols):
                pieces += [TILE_TEXT.format(row=r + 1, col=q + 1), tile_rows[r * tiles.cols + q]]
            if r + 1 < tiles.rows:
                pieces.append(ROW_END)
        return pieces + [GLOBAL_BEGIN, overview, GLOBAL_END]


def tiled(rgb: np.ndarray, tile: int, longest_edge: int) -> tuple[np.ndarray, int, int]:
    """(the image resized to whole tiles, rows, columns), as Idefics3's processor does: the
    longer side to `longest_edge` keeping the aspect (the shorter one truncated, then made
    even), then each side up to a multiple of `tile` (the aspect not kept)."""
    h, w = rgb.shape[:2]
    aspect = w / h
    if w >= h:
        rw, rh = longest_edge, int(longest_edge / aspect)
        rh += rh % 2
    else:
        rw, rh = int(longest_edge * aspect), longest_edge
        rw += rw % 2
    if rw < 1 or rh < 1:
        raise ImageError(f"image {w}x{h} is too narrow to tile (it would be {rw}x{rh} pixels)")
    rows, cols = -(-rh // tile), -(-rw // tile)
    if rows * cols > MAX_TILES:
        raise ImageError(f"image {w}x{h} would be cut into {rows * cols} tiles, more than {MAX_TILES}")
    return lanczos(lanczos(rgb, rw, rh), cols * tile, rows * tile), rows, cols


def lanczos(rgb: np.ndarray, width: int, height: int) -> np.ndarray:
    return image.resize(rgb, width, height, "lanczos")


def shuffle_order(c: Idefics3VisionConfig) -> np.ndarray:
    """int32 [n_patches]: the patches in the order the pixel shuffle reads them - token
    by token (row by row), and within a token its s x s square row by row - so that the
    gathered rows, read s^2 at a time, are the tokens."""
    per_side, s = c.patches_per_side, c.shuffle
    ty, tx, dy, dx = np.meshgrid(*(np.arange(n) for n in (per_side // s, per_side // s, s, s)), indexing="ij")
    return ((ty * s + dy) * per_side + tx * s + dx).reshape(-1).astype(np.int32)
