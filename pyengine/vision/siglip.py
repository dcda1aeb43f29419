"""Gemma 3's vision tower: a SigLIP ViT, then an average pool and a projection into
the text model's embedding space.  mmproj `clip.vision.projector_type = gemma3`.

    image [3, S, S] -> patches (S/p)^2 x 3p^2 -> patch embedding (a product) + bias
    + learned position embeddings -> n_layer x (x + attn(LN(x)); x + MLP(LN(x)))
    -> post LN -> average pool k x k over the patch grid -> RMS norm (soft-embedding
    norm) -> projection [n_embd_text, (S/p/k)^2]

The ViT is vit.py's (shared with the other SigLIP towers); the pool is a product
with a constant [n_patches, n_tokens] matrix of 1/k^2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pyengine.errors import ModelError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import F16, F32, Backend, Context, Tensor
from pyengine.ml.nn import Param, RMSNorm, Weight
from pyengine.models.binding import tensor
from pyengine.vision import image
from pyengine.vision.tower import VisionConfig, register_tower, require_gelu
from pyengine.vision.vit import SiglipTower

POOL_DEFAULT = 4   # Gemma 3's pool side when the file does not say (clip.vision.projector.scale_factor)


@dataclass(frozen=True)
class Gemma3VisionConfig(VisionConfig):
    pool: int = POOL_DEFAULT   # the average pool's side, in patches

    @property
    def tokens_per_side(self) -> int:
        return self.patches_per_side // self.pool

    @property
    def n_tokens(self) -> int:
        return self.tokens_per_side ** 2

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Gemma3VisionConfig":
        kw = cls.common_from_gguf(f)
        require_gelu(f, "a Gemma 3")
        pool = f.get_int("clip.vision.projector.scale_factor", POOL_DEFAULT)
        per_side = kw["image_size"] // kw["patch_size"]
        if pool < 1 or per_side % pool:
            raise ModelError(f"{f.path}: the pool side {pool} does not divide the {per_side} patches per side")
        return cls(pool=pool, **kw)


@register_tower("gemma3")
@dataclass(eq=False)
class Gemma3Tower(SiglipTower):
    Config = Gemma3VisionConfig
    IMAGE_BEGIN, IMAGE_END = "<start_of_image>", "<end_of_image>"   # the text around an image (llama.cpp's)

    soft_emb_norm: RMSNorm = tensor("mm.soft_emb_norm", shape=("n_embd",))
    input_projection: Param = tensor("mm.input_projection", shape=("n_embd_text", "n_embd"))

    def bound(self) -> None:
        self.input_projection.weight = _transposed(self.input_projection.weight)

    def preprocess(self, rgb: np.ndarray) -> np.ndarray:
        """uint8 RGB [h, w, 3] -> the patches the graph takes, float32 [n_patches, 3 p^2]."""
        c = self.cfg
        planes = image.normalize(image.resize_square(rgb, c.image_size), c.image_mean, c.image_std)
        return image.patches(planes, c.patch_size)

    def forward(self, ctx: Context, patches: Tensor) -> Tensor:
        c = self.cfg
        x = self.vit(ctx, patches)                                                     # [n_embd, n_patches]
        pooled = ctx.mul_mat(ctx.transpose(x), ctx.input(pool_matrix(c), "pool"))      # [n_embd, n_tokens]
        x = self.soft_emb_norm(ctx, pooled, c.eps)
        return ctx.mul_mat(ctx.weight(self.input_projection.weight), x)                 # [n_embd_text, n_tokens]

    def encode(self, patches: np.ndarray, backend: Backend | None = None) -> np.ndarray:
        """float32 [n_tokens, n_embd_text] of preprocessed patches."""
        return self.encode_one(patches, backend)


def pool_matrix(c: Gemma3VisionConfig) -> np.ndarray:
    """[n_tokens, n_patches] (numpy order): row t holds 1/k^2 at the k x k patches that
    average into token t (tokens and patches both row by row)."""
    per_side, k = c.patches_per_side, c.pool
    ys, xs = np.divmod(np.arange(c.n_patches), per_side)
    token = (ys // k) * c.tokens_per_side + xs // k
    m = np.zeros((c.n_tokens, c.n_patches), np.float32)
    m[token, np.arange(c.n_patches)] = 1.0 / (k * k)
    return m


def _transposed(w: Weight) -> Weight:
    """mm.input_projection [n_embd_text, n_embd] (GGML order, as the file has it) turned to
    the [n_embd, n_embd_text] a product takes; F16 stays F16 (llama.cpp multiplies it so),
    anything else becomes F32."""
    n_text, n_embd = w.shape
    if w.type == F16:
        values = np.frombuffer(np.ascontiguousarray(w.data).tobytes(), np.float16)
    else:
        values = w.to_f32().data
    values = np.ascontiguousarray(values.reshape(n_embd, n_text).T)
    return Weight(w.name, F16 if w.type == F16 else F32, (n_embd, n_text), values)
