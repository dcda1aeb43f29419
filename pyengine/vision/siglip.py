"""Gemma 3's vision tower: a SigLIP ViT, then an average pool and a projection into
the text model's embedding space.  mmproj `clip.vision.projector_type = gemma3`.

    image [3, S, S] -> patches (S/p)^2 x 3p^2 -> patch embedding (a product) + bias
    + learned position embeddings -> n_layer x (x + attn(LN(x)); x + MLP(LN(x)))
    -> post LN -> average pool k x k over the patch grid -> RMS norm (soft-embedding
    norm) -> projection [n_embd_text, (S/p/k)^2]

Attention inside the image is not causal: every patch sees every patch; it is
composed of products and a softmax per head (PatchAttention), in F32.  The
convolution is a product over patches cut out in numpy; the pool is a product
with a constant [n_patches, n_tokens] matrix of 1/k^2.  The graph is built once per
backend and computed again for every image.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from pyengine.errors import ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import F16, F32, Backend, Context, Tensor
from pyengine.ml.nn import F32Param, LayerNorm, Linear, Param, RMSNorm, Weight, linears
from pyengine.models.binding import Module, bind, blocks, tensor
from pyengine.vision import image
from pyengine.vision.tower import VisionConfig, register_tower
from pyengine.vision.vit import PatchAttention

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
        if not f.get_bool("clip.use_gelu", False) or f.get_bool("clip.use_silu", False):
            raise UnsupportedError(f"{f.path}: a Gemma 3 tower with an MLP other than GELU (clip.use_gelu) "
                                   "is not supported")
        pool = f.get_int("clip.vision.projector.scale_factor", POOL_DEFAULT)
        per_side = kw["image_size"] // kw["patch_size"]
        if pool < 1 or per_side % pool:
            raise ModelError(f"{f.path}: the pool side {pool} does not divide the {per_side} patches per side")
        return cls(pool=pool, **kw)


@dataclass(eq=False)
class PatchEmbedding:
    """A convolution with stride = kernel = the patch side: weight [p, p, 3, n_embd]."""

    weight: Weight
    bias: Weight

    PARTS = {"weight": True, "bias": True}
    F32_PARTS = ("bias",)

    def __call__(self, ctx: Context, patches: Tensor) -> Tensor:
        p, _, c, n_embd = self.weight.shape
        kernel = Weight(self.weight.name, self.weight.type, (p * p * c, n_embd), self.weight.data)
        return ctx.add(ctx.mul_mat(ctx.weight(kernel), patches), ctx.weight(self.bias))   # [n_embd, n_patches]


@dataclass(eq=False)
class Block(Module):
    ln1: LayerNorm = tensor("ln1", shape=("n_embd",))
    attn_q: Linear = tensor("attn_q", shape=("n_embd", "n_embd"))
    attn_k: Linear = tensor("attn_k", shape=("n_embd", "n_embd"))
    attn_v: Linear = tensor("attn_v", shape=("n_embd", "n_embd"))
    attn_out: Linear = tensor("attn_out", shape=("n_embd", "n_embd"))
    ln2: LayerNorm = tensor("ln2", shape=("n_embd",))
    ffn_up: Linear = tensor("ffn_up", shape=("n_embd", "n_ff"))
    ffn_down: Linear = tensor("ffn_down", shape=("n_ff", "n_embd"))

    def __call__(self, ctx: Context, x: Tensor, attend: PatchAttention) -> Tensor:
        eps = self.cfg.eps
        q, k, v = linears(ctx, (self.attn_q, self.attn_k, self.attn_v), self.ln1(ctx, x, eps))
        x = ctx.add(x, self.attn_out(ctx, attend(ctx, q, k, v)))
        return ctx.add(x, self.ffn_down(ctx, ctx.gelu(self.ffn_up(ctx, self.ln2(ctx, x, eps)))))


@register_tower("gemma3")
@dataclass(eq=False)
class Gemma3Tower(Module):
    Config = Gemma3VisionConfig
    IMAGE_BEGIN, IMAGE_END = "<start_of_image>", "<end_of_image>"   # the text around an image (llama.cpp's)

    patch_embd: PatchEmbedding = tensor("v.patch_embd", shape=("patch_size", "patch_size", 3, "n_embd"))
    position_embd: F32Param = tensor("v.position_embd", shape=("n_embd", "n_patches"))
    pre_ln: LayerNorm | None = tensor("v.pre_ln", optional=True, shape=("n_embd",))
    layers: list[Block] = blocks("v.blk")
    post_ln: LayerNorm = tensor("v.post_ln", shape=("n_embd",))
    soft_emb_norm: RMSNorm = tensor("mm.soft_emb_norm", shape=("n_embd",))
    input_projection: Param = tensor("mm.input_projection", shape=("n_embd_text", "n_embd"))

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Gemma3Tower":
        tower = bind(cls, f, Gemma3VisionConfig.from_gguf(f))
        tower.input_projection.weight = _transposed(tower.input_projection.weight)
        tower._graphs = {}
        tower._lock = threading.Lock()
        return tower

    @property
    def n_tokens(self) -> int:
        return self.cfg.n_tokens

    def preprocess(self, rgb: np.ndarray) -> np.ndarray:
        """uint8 RGB [h, w, 3] -> the patches the graph takes, float32 [n_patches, 3 p^2]."""
        c = self.cfg
        planes = image.normalize(image.resize_square(rgb, c.image_size), c.image_mean, c.image_std)
        return image.patches(planes, c.patch_size)

    def forward(self, ctx: Context, patches: Tensor) -> Tensor:
        c = self.cfg
        x = ctx.add(self.patch_embd(ctx, patches), ctx.weight(self.position_embd.weight))   # [n_embd, n_patches]
        if self.pre_ln is not None:
            x = self.pre_ln(ctx, x, c.eps)
        attend = PatchAttention(ctx, c.n_patches, c.n_head, c.head_dim)
        for layer in self.layers:
            x = layer(ctx, x, attend)
        x = self.post_ln(ctx, x, c.eps)
        pooled = ctx.mul_mat(ctx.transpose(x), ctx.input(pool_matrix(c), "pool"))      # [n_embd, n_tokens]
        x = self.soft_emb_norm(ctx, pooled, c.eps)
        return ctx.mul_mat(ctx.weight(self.input_projection.weight), x)                 # [n_embd_text, n_tokens]

    def encode(self, patches: np.ndarray, backend: Backend | None = None) -> np.ndarray:
        """float32 [n_tokens, n_embd_text] of preprocessed patches."""
        with self._lock:
            ctx, inp, out = self._graph(backend)
            np.copyto(inp, patches)
            ctx.compute()
            return ctx.read(out).reshape(self.cfg.n_tokens, self.cfg.n_embd_text).copy()

    def _graph(self, backend: Backend | None):
        key = id(backend)
        built = self._graphs.get(key)
        if built is None:
            ctx = Context(backend or Backend())
            inp = np.zeros((self.cfg.n_patches, 3 * self.cfg.patch_size ** 2), np.float32)
            out = self.forward(ctx, ctx.input(inp, "patches"))
            ctx.set_output(out)
            built = self._graphs[key] = (ctx, inp, out)
        return built


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
