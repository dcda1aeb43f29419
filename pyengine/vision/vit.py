"""The pieces SigLIP-style vision towers share (Gemma 3's, Idefics3/SmolVLM's): the
patch embedding, non-causal attention over one image's patches, the pre-norm ViT
block, and the graph kept per backend and computed again for every image.

    patches (S/p)^2 x 3p^2 -> patch embedding (a product) + bias + learned position
    embeddings -> n_layer x (x + attn(LN(x)); x + MLP(LN(x))) -> post LN

The convolution is a product over patches cut out in numpy (image.patches).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from pyengine.gguf import GGUFFile
from pyengine.ml.context import F32, Backend, Context, Tensor
from pyengine.ml.nn import F32Param, LayerNorm, Linear, RMSNorm, Weight, linears
from pyengine.models.binding import Module, bind, blocks, tensor
from pyengine.vision.tower import Tower


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


class PatchAttention:
    """Non-causal multi-head attention over one image's patches, head by head in products
    (the text models' attention op walks cells token by token: fine for a prompt, slow
    over the 4096 x 4096 pairs of one 896-pixel image - 85 s a block against about 40 s
    for the whole block this way, on a busy 2-core host where llama.cpp takes 20 s):

        scores_h = softmax(k_h^T q_h * scale)      [n keys, n queries]
        out_h    = v_h scores_h                    [head_dim, n queries]

    Each head's output is written into its rows of one F32 scratch [n_embd, n] (set_rows,
    the writes chained), which the output projection then reads whole."""

    def __init__(self, ctx: Context, n: int, n_head: int, head_dim: int) -> None:
        self.n, self.n_head, self.head_dim = n, n_head, head_dim
        self.heads = np.zeros((n * n_head, head_dim), np.float32)   # [n_embd, n] as rows of head_dim
        self.out = ctx.cache(self.heads, F32, (head_dim, n * n_head), "patch_heads")
        # head h of patch j is row j * n_head + h of the scratch
        self.slots = [ctx.input(np.arange(n, dtype=np.int32) * n_head + h, f"head_slots.{h}")
                      for h in range(n_head)]

    def __call__(self, ctx: Context, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        n, hd = self.n, self.head_dim
        d = hd * self.n_head
        scale = 1.0 / math.sqrt(hd)
        out = self.out
        for h in range(self.n_head):
            def head(x: Tensor, h: int = h) -> Tensor:                               # [hd, n]
                return ctx.cont(ctx.view(x, (hd, n), (4, 4 * d), 4 * hd * h))
            scores = ctx.softmax(ctx.scale(ctx.mul_mat(head(k), head(q)), scale))     # [n keys, n queries]
            out = ctx.set_rows(out, ctx.mul_mat(ctx.transpose(head(v)), scores), self.slots[h])
        return ctx.reshape(ctx.cont(out), (d, n))                                     # [n_embd, n]


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

    def __call__(self, ctx: Context, x: Tensor, attend: Callable[[Context, Tensor, Tensor, Tensor], Tensor]) -> Tensor:
        eps = self.cfg.eps
        q, k, v = linears(ctx, (self.attn_q, self.attn_k, self.attn_v), self.ln1(ctx, x, eps))
        x = ctx.add(x, self.attn_out(ctx, attend(ctx, q, k, v)))
        return ctx.add(x, self.ffn_down(ctx, self.activation(ctx, self.ffn_up(ctx, self.ln2(ctx, x, eps)))))

    def activation(self, ctx: Context, x: Tensor) -> Tensor:
        """The MLP's: GELU (a tower whose file says otherwise overrides it)."""
        return ctx.gelu(x)


@dataclass(eq=False)
class SiglipTower(Module, Tower):
    """A SigLIP ViT over square images of the file's size, each giving cfg.n_tokens rows;
    a tower adds its projector's tensors, `forward` (vit() then the projector) and
    `preprocess`.  Its class attribute Config reads the file's hyper-parameters."""

    patch_embd: PatchEmbedding = tensor("v.patch_embd", shape=("patch_size", "patch_size", 3, "n_embd"))
    position_embd: F32Param = tensor("v.position_embd", shape=("n_embd", "n_patches"))
    pre_ln: LayerNorm | None = tensor("v.pre_ln", optional=True, shape=("n_embd",))
    layers: list[Block] = blocks("v.blk")
    post_ln: LayerNorm | None = tensor("v.post_ln", optional=True, shape=("n_embd",))

    @classmethod
    def from_gguf(cls, f: GGUFFile):
        tower = bind(cls, f, cls.Config.from_gguf(f))
        tower.bound()
        c = tower.cfg
        tower._graphs = TowerGraphs(tower.forward, c.n_patches, 3 * c.patch_size ** 2, (c.n_tokens, c.n_embd_text))
        return tower

    def bound(self) -> None:
        """Called once the tensors are bound (e.g. to lay a weight out as the graph takes it)."""

    @property
    def n_tokens(self) -> int:
        return self.cfg.n_tokens

    def vit(self, ctx: Context, patches: Tensor, positions: Tensor | None = None) -> Tensor:
        """The ViT over one image's patches: [n_embd, n_patches] after the post LN (if any);
        `positions` [n_embd, n_patches] in place of the file's (an image of another size)."""
        c = self.cfg
        if positions is None:
            positions = ctx.weight(self.position_embd.weight)
        x = ctx.add(self.patch_embd(ctx, patches), positions)                       # [n_embd, n_patches]
        if self.pre_ln is not None:
            x = self.pre_ln(ctx, x, c.eps)
        attend = PatchAttention(ctx, patches.shape[1], c.n_head, c.head_dim)
        for layer in self.layers:
            x = layer(ctx, x, attend)
        return x if self.post_ln is None else self.post_ln(ctx, x, c.eps)

    def encode_one(self, patches: np.ndarray, backend: Backend | None = None) -> np.ndarray:
        """float32 [n_tokens, n_embd_text] of one image's patches [n_patches, 3 p^2]."""
        return self._graphs(patches, backend)


class TowerGraphs:
    """A tower's graph for one image, built once per backend and computed again for every
    image (one image at a time: the graph's input and scratch buffers are shared)."""

    def __init__(self, forward: Callable[[Context, Tensor], Tensor], n_patches: int, patch_width: int,
                 out_shape: tuple[int, int]) -> None:
        self.forward, self.in_shape, self.out_shape = forward, (n_patches, patch_width), out_shape
        self._built: dict[int, tuple] = {}
        self._lock = threading.Lock()

    def __call__(self, patches: np.ndarray, backend: Backend | None = None) -> np.ndarray:
        """float32 out_shape of one image's patches [n_patches, patch_width]."""
        with self._lock:
            ctx, inp, out = self._graph(backend)
            np.copyto(inp, patches)
            ctx.compute()
            return ctx.read(out).reshape(self.out_shape).copy()

    def _graph(self, backend: Backend | None):
        key = id(backend)
        built = self._built.get(key)
        if built is None:
            ctx = Context(backend or Backend())
            inp = np.zeros(self.in_shape, np.float32)
            out = self.forward(ctx, ctx.input(inp, "patches"))
            ctx.set_output(out)
            built = self._built[key] = (ctx, inp, out)
        return built


@dataclass(eq=False)
class RmsSwigluBlock(Module):
    """The pre-norm block of the RMS-normed towers (Pixtral's, Qwen2.5-VL's): x + attn(RMS(x)),
    then x + SwiGLU(RMS(x)); `attend(ctx, q, k, v)` is the tower's attention (its
    positions, its mask) over the projections [n_embd, n]."""

    ln1: RMSNorm = tensor("ln1", shape=("n_embd",))
    attn_q: Linear = tensor("attn_q", shape=("n_embd", "n_embd"))
    attn_k: Linear = tensor("attn_k", shape=("n_embd", "n_embd"))
    attn_v: Linear = tensor("attn_v", shape=("n_embd", "n_embd"))
    attn_out: Linear = tensor("attn_out", shape=("n_embd", "n_embd"))
    ln2: RMSNorm = tensor("ln2", shape=("n_embd",))
    ffn_gate: Linear = tensor("ffn_gate", shape=("n_embd", "n_ff"))
    ffn_up: Linear = tensor("ffn_up", shape=("n_embd", "n_ff"))
    ffn_down: Linear = tensor("ffn_down", shape=("n_ff", "n_embd"))

    def __call__(self, ctx: Context, x: Tensor, attend: Callable[[Context, Tensor, Tensor, Tensor], Tensor]) -> Tensor:
        eps = self.cfg.eps
        q, k, v = linears(ctx, (self.attn_q, self.attn_k, self.attn_v), self.ln1(ctx, x, eps))
        x = ctx.add(x, self.attn_out(ctx, attend(ctx, q, k, v)))
        gate, up = linears(ctx, (self.ffn_gate, self.ffn_up), self.ln2(ctx, x, eps))
        return ctx.add(x, self.ffn_down(ctx, ctx.swiglu(gate, up)))
