"""The vision towers' registry and the hyper-parameters every ViT-style tower reads
(`clip.vision.*`).  Below both projector.py (which loads an mmproj and picks its
tower here) and the tower files (which register themselves here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from pyengine.errors import ModelError, UnsupportedError
from pyengine.gguf import GGUFFile

_TOWERS: dict[str, Callable] = {}


def register_tower(projector_type: str):
    """Class decorator: the tower class for mmproj files of `projector_type`; it has
    `from_gguf(gguf) -> tower`."""
    def add(cls):
        _TOWERS[projector_type] = cls
        return cls
    return add


def tower_class(projector_type: str) -> Callable | None:
    """The tower class registered for `projector_type`, or None."""
    return _TOWERS.get(projector_type)


def supported_towers() -> list[str]:
    return sorted(_TOWERS)


class Tower:
    """What the shared code asks of every tower class, with Gemma 3's answers as the
    defaults; a tower has `preprocess(rgb)` and `encode(preprocessed, backend)`."""

    IMAGE_BEGIN = IMAGE_END = ""   # the text the prompt has around an image's rows
    # An image's rows see each other both ways in the text model (Gemma 3); False: causal,
    # as llama.cpp's mtmd decodes the images of every other projector type.
    ATTENDS_BOTH_WAYS = True

    def image_pieces(self, rgb: np.ndarray, backend=None) -> list:
        """The image as the prompt holds it, in order: text (str, tokenized where it
        stands) and float32 row blocks [n, n_embd_text] (each fed as one batch)."""
        return [self.IMAGE_BEGIN, self.encode(self.preprocess(rgb), backend), self.IMAGE_END]


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

    @property
    def n_embd_out(self) -> int:
        """Width of each row the tower hands the text model."""
        return self.n_embd_text

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


def require_gelu(f: GGUFFile, tower: str) -> None:
    """Fail unless the file's ViT MLP is GELU (clip.use_gelu), the only one bound so far."""
    if not f.get_bool("clip.use_gelu", False) or f.get_bool("clip.use_silu", False):
        raise UnsupportedError(f"{f.path}: {tower} tower with an MLP other than GELU (clip.use_gelu) "
                               "is not supported")


def _triple(f: GGUFFile, key: str) -> tuple[float, float, float]:
    values = f.get_array(key)
    if len(values) != 3:
        raise ModelError(f"{f.path}: {key} must hold 3 values (R, G, B), got {len(values)}")
    out = tuple(float(v) for v in values)
    if not all(np.isfinite(out)):
        raise ModelError(f"{f.path}: {key} holds a non-finite value: {out}")
    return out  # type: ignore[return-value]
