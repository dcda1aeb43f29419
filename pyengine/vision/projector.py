"""A vision projector file (llama.cpp's mmproj GGUF): validated, bound, and run.

An mmproj holds a vision tower (`v.*` tensors, `clip.vision.*` keys) and the
projector that maps its output into the text model's embedding space (`mm.*`),
with `general.architecture = clip` and the projector's kind in
`clip.vision.projector_type` (older files: `clip.projector_type`).  Each kind
registers its tower class here; `load_projector` picks it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from pyengine.errors import GGUFError, ImageError, ModelError, UnsupportedError
from pyengine.gguf import GGUFFile

PROJECTOR_KEYS = ("clip.vision.projector_type", "clip.projector_type")

_TOWERS: dict[str, Callable] = {}


def register_tower(projector_type: str):
    """Class decorator: the tower class for mmproj files of `projector_type`; it has
    `from_gguf(gguf) -> tower`."""
    def add(cls):
        _TOWERS[projector_type] = cls
        return cls
    return add


@dataclass(frozen=True)
class VisionConfig:
    """The hyper-parameters every ViT-style tower reads from `clip.vision.*`."""

    image_size: int      # side of the square image the tower takes, in pixels
    patch_size: int      # side of one patch, in pixels
    n_embd: int          # the tower's width
    n_ff: int            # its MLP's hidden width
    n_layer: int
    n_head: int
    eps: float           # its layer norms' epsilon
    n_embd_text: int     # width of the embeddings the projector produces (projection_dim)
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def n_patches(self) -> int:
        return self.patches_per_side ** 2

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def common_from_gguf(cls, f: GGUFFile) -> dict:
        def positive(key: str) -> int:
            value = f.get_int(f"clip.vision.{key}")
            if not 0 < value <= 1 << 20:
                raise ModelError(f"{f.path}: clip.vision.{key} = {value} is out of range")
            return value

        kw = dict(image_size=positive("image_size"), patch_size=positive("patch_size"),
                  n_embd=positive("embedding_length"), n_ff=positive("feed_forward_length"),
                  n_layer=positive("block_count"), n_head=positive("attention.head_count"),
                  n_embd_text=positive("projection_dim"),
                  eps=f.get_float("clip.vision.attention.layer_norm_epsilon", 1e-6),
                  image_mean=_triple(f, "clip.vision.image_mean"), image_std=_triple(f, "clip.vision.image_std"))
        if kw["image_size"] % kw["patch_size"]:
            raise ModelError(f"{f.path}: image size {kw['image_size']} is not a multiple of the patch size "
                             f"{kw['patch_size']}")
        if kw["n_embd"] % kw["n_head"]:
            raise ModelError(f"{f.path}: vision width {kw['n_embd']} does not divide into {kw['n_head']} heads")
        if not (0 < kw["eps"] < 1):
            raise ModelError(f"{f.path}: layer-norm epsilon {kw['eps']} is out of range")
        if any(s <= 0 for s in kw["image_std"]):
            raise ModelError(f"{f.path}: clip.vision.image_std must be positive, got {kw['image_std']}")
        return kw


def _triple(f: GGUFFile, key: str) -> tuple[float, float, float]:
    values = f.get_array(key)
    if len(values) != 3:
        raise ModelError(f"{f.path}: {key} must hold 3 values (R, G, B), got {len(values)}")
    out = tuple(float(v) for v in values)
    if not all(np.isfinite(out)):
        raise ModelError(f"{f.path}: {key} holds a non-finite value: {out}")
    return out  # type: ignore[return-value]


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
        """Embeddings of uint8 RGB [height, width, 3]."""
        if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
            raise ImageError(f"pixels must be uint8 [height, width, 3], got {rgb.dtype} {rgb.shape}")
        return self.tower.encode(self.tower.preprocess(rgb), backend)

    def close(self) -> None:
        self.gguf.close()


def load_projector(path: str | os.PathLike, n_embd_text: int | None = None) -> VisionProjector:
    """Open and bind an mmproj; with `n_embd_text`, also check it fits that text model."""
    from pyengine.vision import siglip  # noqa: F401  (registers the towers)

    path = os.fspath(path)
    try:
        f = GGUFFile(path)
    except FileNotFoundError:
        raise GGUFError(f"vision projector {path!r} does not exist") from None
    try:
        kind = projector_type(f)
        cls = _TOWERS.get(kind)
        if cls is None:
            raise UnsupportedError(f"{path}: projector type {kind!r} is not supported yet "
                                   f"(supported: {', '.join(sorted(_TOWERS))})")
        proj = VisionProjector(path, f, kind, cls.from_gguf(f))
        if n_embd_text is not None:
            proj.check_fits(n_embd_text)
    except BaseException:
        f.close()
        raise
    return proj
