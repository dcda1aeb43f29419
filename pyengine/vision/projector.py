"""A vision projector file (llama.cpp's mmproj GGUF): validated, bound, and run.

An mmproj holds a vision tower (`v.*` tensors, `clip.vision.*` keys) and the
projector that maps its output into the text model's embedding space (`mm.*`),
with `general.architecture = clip` and the projector's kind in
`clip.vision.projector_type` (older files: `clip.projector_type`).  Each kind
registers its tower class in tower.py; `load_projector` picks it.
"""

from __future__ import annotations

import os

import numpy as np

from pyengine.errors import GGUFError, ImageError, ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.vision.tower import supported_towers, tower_class

PROJECTOR_KEYS = ("clip.vision.projector_type", "clip.projector_type")


def projector_type(f: GGUFFile) -> str:
    """The file's projector kind, after checking it is a vision mmproj at all."""
    arch = f.get_str("general.architecture", "")
    if arch != "clip":
        raise ModelError(f"{f.path} is not a vision projector: general.architecture is {arch!r}, not 'clip'")
    if not f.get_bool("clip.has_vision_encoder", False):
        raise UnsupportedError(f"{f.path} has no vision encoder (clip.has_vision_encoder is not true)")
    for key in PROJECTOR_KEYS:
        if key in f.metadata:
            return f.get_str(key)
    raise ModelError(f"{f.path}: no projector type ({' or '.join(PROJECTOR_KEYS)})")


class VisionProjector:
    """A loaded mmproj: `embed(image_bytes)` -> float32 [n_image_tokens, n_embd_text]."""

    def __init__(self, path: str, gguf: GGUFFile, kind: str, tower) -> None:
        self.path, self.gguf, self.kind, self.tower = path, gguf, kind, tower

    @property
    def n_embd(self) -> int:
        """Width of the image embeddings (the text model's n_embd it was made for)."""
        return self.tower.cfg.n_embd_text

    @property
    def n_image_tokens(self) -> int:
        return self.tower.n_tokens

    @property
    def image_begin(self) -> str:
        """The text the prompt has before an image's rows."""
        return self.tower.IMAGE_BEGIN

    @property
    def image_end(self) -> str:
        """The text the prompt has after them."""
        return self.tower.IMAGE_END

    @property
    def both_ways(self) -> bool:
        """Whether an image's rows attend to each other both ways in the text model
        (Gemma 3's), or causally (Qwen's); the tower says, both ways unless it says not."""
        return getattr(self.tower, "IMAGE_BOTH_WAYS", True)

    def check_fits(self, n_embd_text: int, text_model: str = "the text model") -> None:
        """Fail unless the embeddings are as wide as the text model's."""
        if self.n_embd != n_embd_text:
            raise ModelError(f"vision projector {self.path} makes embeddings of width {self.n_embd}, but "
                             f"{text_model} has n_embd {n_embd_text}: they were not made for each other")

    def embed(self, data: bytes, backend=None) -> np.ndarray:
        from pyengine.vision import image
        rgb = image.decode(data)
        return self.embed_pixels(rgb, backend)

    def embed_pixels(self, rgb: np.ndarray, backend=None) -> np.ndarray:
        """Embeddings of uint8 RGB [height, width, 3]: [n_tokens, n_embd], or for a tower
        whose tokens form a grid the text model places by row and column (M-RoPE's
        `token_grid`), [n_rows, n_columns, n_embd]."""
        if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
            raise ImageError(f"pixels must be uint8 [height, width, 3], got {rgb.dtype} {rgb.shape}")
        patches = self.tower.preprocess(rgb)
        rows = self.tower.encode(patches, backend)
        grid = getattr(self.tower, "token_grid", None)
        return rows if grid is None else rows.reshape(*grid(patches), rows.shape[-1])

    def close(self) -> None:
        self.gguf.close()


def load_projector(path: str | os.PathLike, n_embd_text: int | None = None) -> VisionProjector:
    """Open and bind an mmproj; with `n_embd_text`, also check it fits that text model."""
    from pyengine.vision import qwen2vl, siglip  # noqa: F401  (registers the towers)

    path = os.fspath(path)
    try:
        f = GGUFFile(path)
    except FileNotFoundError:
        raise GGUFError(f"vision projector {path!r} does not exist") from None
    try:
        kind = projector_type(f)
        cls = tower_class(kind)
        if cls is None:
            raise UnsupportedError(f"{path}: projector type {kind!r} is not supported yet "
                                   f"(supported: {', '.join(supported_towers())})")
        proj = VisionProjector(path, f, kind, cls.from_gguf(f))
        if n_embd_text is not None:
            proj.check_fits(n_embd_text)
    except BaseException:
        f.close()
        raise
    return proj
