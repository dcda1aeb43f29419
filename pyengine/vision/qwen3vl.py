"""Qwen3-VL's vision tower: dynamic resolution (vision/dynamic.py) with learned
position embeddings, LayerNorm GELU blocks, a patch merger and deepstack mergers.
mmproj `clip.projector_type = qwen3vl_merger` (Qwen3.5's towers are the same).

    patches in merge order -> both frames' convolutions summed + their bias
    + the learned position grid resized to the patch grid (bilinear, corners aligned)
    -> n_layer x (x + attn(LN(x)); x + MLP(LN(x)))   (q/k/v one fused product)
       after block i, where the file has v.deepstack.i: each 2x2 group's rows side
       by side -> LN -> fc1, GELU, fc2 (a deepstack piece)
    -> LN -> each 2x2 group's rows side by side -> mm.0, GELU, mm.2

Each merged token's row is the merger's output followed by the deepstack pieces in
block order: n_embd_text * (1 + n_deepstack) values, which the text model (qwen3vl)
takes apart (models/common.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pyengine.errors import ModelError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import F32Bias, F32Param, LayerNorm, Linear, Param
from pyengine.models.binding import Module, blocks, tensor
from pyengine.vision.dynamic import (BareParam, MergedConfig, MergedPatchTower, PatchGrid, both_frames,
                                     merge_and_project, merge_order)
from pyengine.vision.tower import register_tower, require_gelu


@dataclass(frozen=True)
class Qwen3VLConfig(MergedConfig):
    n_deepstack: int = 0   # blocks whose output also goes through a merger of its own

    @property
    def n_embd_out(self) -> int:
        return self.n_embd_text * (1 + self.n_deepstack)

    @property
    def n_qkv(self) -> int:
        """Rows of the fused q/k/v projection."""
        return 3 * self.n_embd

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Qwen3VLConfig":
        kw = cls.merged_from_gguf(f, "Qwen3-VL")
        require_gelu(f, "a Qwen3-VL")
        n_deepstack = sum(f"v.deepstack.{i}.fc1.weight" in f.tensors for i in range(kw["n_layer"]))
        return cls(n_deepstack=n_deepstack, **kw)


@dataclass(eq=False)
class Block(Module):
    ln1: LayerNorm = tensor("ln1", shape=("n_embd",))
    attn_qkv: Linear = tensor("attn_qkv", shape=("n_embd", "n_qkv"))
    attn_out: Linear = tensor("attn_out", shape=("n_embd", "n_embd"))
    ln2: LayerNorm = tensor("ln2", shape=("n_embd",))
    ffn_up: Linear = tensor("ffn_up", shape=("n_embd", "n_ff"))
    ffn_down: Linear = tensor("ffn_down", shape=("n_ff", "n_embd"))

    def __call__(self, ctx: Context, x: Tensor, grid: PatchGrid) -> Tensor:
        c = self.cfg
        qkv = self.attn_qkv(ctx, self.ln1(ctx, x, c.eps))                          # [3 n_embd, n]
        q, k, v = (ctx.cont(ctx.view(qkv, (c.n_embd, grid.n), (4, 4 * 3 * c.n_embd), 4 * c.n_embd * j))
                   for j in range(3))
        x = ctx.add(x, self.attn_out(ctx, grid.attend(ctx, q, k, v)))
        return ctx.add(x, self.ffn_down(ctx, ctx.gelu(self.ffn_up(ctx, self.ln2(ctx, x, c.eps)))))


@dataclass(eq=False)
class DeepstackMerger(Module):
    """A block's own merger, there where the file has `v.deepstack.{i}.*` (else every
    part None): its norm runs over a 2x2 group's rows side by side."""

    norm: LayerNorm | None = tensor("norm", optional=True, shape=("n_merged",))
    fc1: Linear | None = tensor("fc1", optional=True, shape=("n_merged", "n_merged"))
    fc2: Linear | None = tensor("fc2", optional=True, shape=("n_merged", "n_embd_text"))

    @property
    def present(self) -> bool:
        return self.fc1 is not None

    def check(self, layer: int, path: str) -> None:
        parts = [self.norm is not None, self.fc1 is not None, self.fc2 is not None]
        if any(parts) and not all(parts):
            raise ModelError(f"{path}: v.deepstack.{layer} needs its norm, fc1 and fc2 together")

    def __call__(self, ctx: Context, merged: Tensor) -> Tensor:
        x = self.norm(ctx, merged, self.cfg.eps)
        return self.fc2(ctx, ctx.gelu(self.fc1(ctx, x)))                           # [n_embd_text, n_tokens]


@register_tower("qwen3vl_merger")
@dataclass(eq=False)
class Qwen3VLTower(Module, MergedPatchTower):
    Config = Qwen3VLConfig

    patch_embd: Param = tensor("v.patch_embd", shape=("patch_size", "patch_size", 3, "n_embd"))
    patch_embd_1: BareParam = tensor("v.patch_embd.weight.1", shape=("patch_size", "patch_size", 3, "n_embd"))
    patch_bias: F32Bias = tensor("v.patch_embd", shape=("n_embd",))   # both kernels' bias
    position_embd: F32Param = tensor("v.position_embd")
    layers: list[Block] = blocks("v.blk")
    deepstack: list[DeepstackMerger] = blocks("v.deepstack")
    post_ln: LayerNorm = tensor("v.post_ln", shape=("n_embd",))
    mm_0: Linear = tensor("mm.0", shape=("n_merged", "n_merged"))
    mm_2: Linear = tensor("mm.2", shape=("n_merged", "n_embd_text"))

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Qwen3VLTower":
        tower = super().from_gguf(f)
        for i, merger in enumerate(tower.deepstack):
            merger.check(i, f.path)
        table = tower.position_embd.weight
        side = math.isqrt(table.shape[1]) if len(table.shape) == 2 else 0
        if table.shape[0] != tower.cfg.n_embd or side * side != table.shape[1]:
            raise ModelError(f"{f.path}: v.position_embd.weight must be [n_embd, a square number], "
                             f"got {list(table.shape)}")
        return tower

    def positions(self, n_y: int, n_x: int) -> np.ndarray:
        """float32 [n_patches, n_embd] in merge order: the learned grid resized to n_y x n_x."""
        table = np.ascontiguousarray(self.position_embd.weight.data).view(np.float32)   # raw bytes
        n_embd = self.cfg.n_embd
        side = math.isqrt(table.size // n_embd)
        grid = table.reshape(side, side, n_embd).astype(np.float64)                # y, x, e
        if (n_y, n_x) != (side, side):
            grid = np.einsum("Yy,yxe,Xx->YXe", corner_weights(side, n_y), grid, corner_weights(side, n_x))
        return merge_order(grid.reshape(n_y * n_x, n_embd).astype(np.float32), n_y, n_x)

    def forward(self, ctx: Context, patches: Tensor, n_y: int, n_x: int) -> Tensor:
        c = self.cfg
        grid = PatchGrid(ctx, c, n_y, n_x)
        x = both_frames(ctx, self, patches)                                             # [n_embd, n_patches]
        x = ctx.add(ctx.add(x, ctx.weight(self.patch_bias.bias)), ctx.input(self.positions(n_y, n_x), "positions"))
        pieces = []
        for layer, merger in zip(self.layers, self.deepstack):
            x = layer(ctx, x, grid)
            if merger.present:
                pieces.append(merger(ctx, grid.merged(ctx, x)))
        out = merge_and_project(ctx, self, grid, x)                                     # [n_embd_text, n_tokens]
        for piece in pieces:
            out = ctx.concat(out, piece)
        return out                                                                      # [n_embd_out, n_tokens]


def corner_weights(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in]: bilinear weights with the corners aligned (output i samples input
    i (n_in - 1) / (n_out - 1)), as ggml_interpolate's ALIGN_CORNERS mode."""
    m = np.zeros((n_out, n_in))
    for o in range(n_out):
        src = o * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        lo = min(int(np.floor(src)), n_in - 1)
        hi = min(lo + 1, n_in - 1)
        frac = src - lo
        m[o, lo] += 1 - frac
        m[o, hi] += frac
    return m
