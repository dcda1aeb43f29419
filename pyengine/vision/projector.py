"""A vision projector file (llama.cpp's mmproj GGUF): validated, bound, and run.

An mmproj holds a vision tower (`v.*` tensors, `clip.vision.*` keys) and the
projector that maps its output into the text model's embedding space (`mm.*`),
with `general.architecture = clip` and the projector's kind in
`clip.vision.projector_type` (older files: `clip.projector_type`).  Each kind
registers its tower class in tower.py; `load_projector` picks it.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict

import numpy as np

from pyengine.errors import GGUFError, ImageError, ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.vision.tower import supported_towers, tower_class

PROJECTOR_KEYS = ("clip.vision.projector_type", "clip.projector_type")
# The embeddings of recent images kept, by the sha256 of their bytes, so a second
# question about the same image runs no tower (its cells come from the prefix cache).
EMBED_CACHE_BYTES = 64 << 20


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
        self.recent = EmbeddingCache(EMBED_CACHE_BYTES)

    @property
    def n_embd(self) -> int:
        """Width of the image embeddings (the text model's input width it was made for)."""
        return self.tower.cfg.n_embd_out

    @property
    def n_image_tokens(self) -> int:
        return self.tower.n_tokens

    def check_fits(self, n_embd_text: int, text_model: str = "the text model") -> None:
        """Fail unless the embeddings are as wide as the rows the text model takes in
        (its n_embd, or more where its layers take pieces of an image's rows too)."""
        if self.n_embd != n_embd_text:
            raise ModelError(f"vision projector {self.path} makes embeddings of width {self.n_embd}, but "
                             f"{text_model} takes image rows of width {n_embd_text}: they were not made "
                             "for each other")

    @property
    def attends_both_ways(self) -> bool:
        """Whether an image's rows see each other both ways in the text model."""
        return self.tower.ATTENDS_BOTH_WAYS

    def embed(self, data: bytes, backend=None) -> np.ndarray:
        """All the image's rows, in prompt order: float32 [n, n_embd]."""
        return _rows(self.embed_pieces(data, backend))

    def embed_pixels(self, rgb: np.ndarray, backend=None) -> np.ndarray:
        """All the rows of uint8 RGB [height, width, 3]."""
        return _rows(self.pieces_of_pixels(rgb, backend))

    def embed_pieces(self, data: bytes, backend=None) -> list:
        """The image as the prompt holds it: text and row blocks in order (Tower.image_pieces);
        the same bytes again are answered from the recent images' cache (its rows read-only)."""
        from pyengine.vision import image
        key = hashlib.sha256(data).digest()
        pieces = self.recent.get(key)
        if pieces is None:
            pieces = self.pieces_of_pixels(image.decode(data), backend)
            for piece in pieces:
                if isinstance(piece, np.ndarray):
                    piece.flags.writeable = False
            self.recent.put(key, pieces)
        return list(pieces)

    def pieces_of_pixels(self, rgb: np.ndarray, backend=None) -> list:
        if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
            raise ImageError(f"pixels must be uint8 [height, width, 3], got {rgb.dtype} {rgb.shape}")
        return self.tower.image_pieces(rgb, backend)

    def close(self) -> None:
        self.gguf.close()


class EmbeddingCache:
    """Least-recently-used image pieces (Tower.image_pieces), at most `max_bytes` of rows."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.used = max_bytes, 0
        self.entries: OrderedDict[bytes, list] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: bytes) -> list | None:
        with self.lock:
            pieces = self.entries.get(key)
            if pieces is not None:
                self.entries.move_to_end(key)
            return pieces

    def put(self, key: bytes, pieces: list) -> None:
        size = _size(pieces)
        if size > self.max_bytes:
            return
        with self.lock:
            old = self.entries.pop(key, None)
            self.used += size - (_size(old) if old is not None else 0)
            self.entries[key] = pieces
            while self.used > self.max_bytes:
                _, dropped = self.entries.popitem(last=False)
                self.used -= _size(dropped)


def _size(pieces: list) -> int:
    return sum(p.nbytes for p in pieces if isinstance(p, np.ndarray))


def _rows(pieces: list) -> np.ndarray:
    return np.concatenate([p for p in pieces if isinstance(p, np.ndarray)])


def load_projector(path: str | os.PathLike, n_embd_text: int | None = None) -> VisionProjector:
    """Open and bind an mmproj; with `n_embd_text` (the width of the image rows the text
    model takes in), also check it fits that text model."""
    from pyengine.vision import idefics3, lfm2, pixtral, qwen2vl, qwen3vl, siglip  # noqa: F401  (register the towers)

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
