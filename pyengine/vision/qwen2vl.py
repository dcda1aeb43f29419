"""Qwen2-VL's and Qwen2.5-VL's vision towers: dynamic resolution (vision/dynamic.py)
with a 2D rope over each patch's row and column and a patch merger into the text
model's embedding space.

    patches in merge order -> both frames' convolutions summed
    Qwen2.5-VL (mmproj `clip.projector_type = qwen2.5vl_merger`):
      -> n_layer x (x + attn(RMS(x)); x + SwiGLU(RMS(x))) -> RMS norm
    Qwen2-VL (`qwen2vl_merger`):
      -> n_layer x (x + attn(LN(x)); x + MLP(LN(x))) -> LN, the MLP's activation
         quick GELU, x sigmoid(1.702 x) (GELU where the file says clip.use_gelu)
    -> each 2x2 group's rows side by side -> mm.0, GELU, mm.2

Layers whose index + 1 is a multiple of `clip.vision.n_wa_pattern` see every patch;
the others only the patches of their window (112 x 112 pixels of merged tokens, as
llama.cpp cuts them), given as an additive mask - attention does not depend on
the order of its keys, so the patches keep merge order where llama.cpp regroups
them window by window (Qwen2-VL's layers all see every patch).  The output is one
row per merged token, row by row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pyengine.errors import ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import LayerNorm, Linear, Param, RMSNorm
from pyengine.models.binding import Module, blocks, tensor
from pyengine.vision import vit
from pyengine.vision.dynamic import (MERGE, BareParam, MergedConfig, MergedPatchTower, PatchGrid, both_frames,
                                     merge_and_project)
from pyengine.vision.tower import register_tower

WINDOW_PIXELS = 112        # side of an attention window (llama.cpp's default for Qwen2.5-VL)
MASKED = -1e30             # the window mask's "not seen" (exp underflows to 0)
QUICK_GELU = 1.702         # quick GELU: x sigmoid(1.702 x)


@dataclass(frozen=True)
class Qwen25VLConfig(MergedConfig):
    wa_pattern: int = 0        # every wa_pattern-th layer attends fully; 0: all do

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Qwen25VLConfig":
        kw = cls.merged_from_gguf(f, "Qwen2.5-VL")
        if not f.get_bool("clip.use_silu", False):
            raise UnsupportedError(f"{f.path}: a Qwen2.5-VL tower without the SwiGLU MLP (clip.use_silu) "
                                   "is not supported")
        if "clip.vision.n_wa_pattern" not in f.metadata:
            raise ModelError(f"{f.path}: a Qwen2.5-VL tower needs clip.vision.n_wa_pattern")
        wa = f.get_int("clip.vision.n_wa_pattern")
        if not 0 <= wa <= kw["n_layer"]:
            raise ModelError(f"{f.path}: clip.vision.n_wa_pattern = {wa} is out of range")
        return cls(wa_pattern=wa, **kw)


def window_mask(n_y: int, n_x: int, patch: int) -> np.ndarray:
    """float32 [n_patches, n_patches] (query rows): 0 where both patches' merged tokens
    lie in one window, MASKED elsewhere."""
    t_y, t_x = n_y // MERGE, n_x // MERGE
    side = max(1, WINDOW_PIXELS // patch // MERGE)           # a window's side, in merged tokens
    ty, tx = np.divmod(np.arange(t_y * t_x), t_x)
    window = (ty // side) * -(-t_x // side) + tx // side      # per merged token
    per_patch = np.repeat(window, MERGE * MERGE)
    return np.where(per_patch[:, None] == per_patch[None, :], 0.0, MASKED).astype(np.float32)


@register_tower("qwen2.5vl_merger")
@dataclass(eq=False)
class Qwen25VLTower(Module, MergedPatchTower):
    Config = Qwen25VLConfig

    # Qwen's two video frames' kernels: a still image is both frames, so both convolve it
    patch_embd: Param = tensor("v.patch_embd", shape=("patch_size", "patch_size", 3, "n_embd"))
    patch_embd_1: BareParam = tensor("v.patch_embd.weight.1", shape=("patch_size", "patch_size", 3, "n_embd"))
    layers: list[vit.RmsSwigluBlock] = blocks("v.blk")
    post_ln: RMSNorm = tensor("v.post_ln", shape=("n_embd",))
    mm_0: Linear = tensor("mm.0", shape=("n_merged", "n_merged"))
    mm_2: Linear = tensor("mm.2", shape=("n_merged", "n_embd_text"))

    def forward(self, ctx: Context, patches: Tensor, n_y: int, n_x: int) -> Tensor:
        c = self.cfg
        grid = PatchGrid(ctx, c, n_y, n_x)
        window = ctx.input(window_mask(n_y, n_x, c.patch_size), "window_mask")
        x = both_frames(ctx, self, patches)                                             # [n_embd, n_patches]
        for i, layer in enumerate(self.layers):
            full = c.wa_pattern == 0 or (i + 1) % c.wa_pattern == 0
            mask = None if full else window
            x = layer(ctx, x, lambda ctx, q, k, v, mask=mask: grid.attend(ctx, q, k, v, mask))
        return merge_and_project(ctx, self, grid, x)


@dataclass(frozen=True)
class Qwen2VLConfig(MergedConfig):
    quick_gelu: bool = True   # the MLP's activation: quick GELU, else (clip.use_gelu) GELU

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Qwen2VLConfig":
        kw = cls.merged_from_gguf(f, "Qwen2-VL")
        if f.get_bool("clip.use_silu", False):
            raise UnsupportedError(f"{f.path}: a Qwen2-VL tower with a SiLU MLP (clip.use_silu) is not supported")
        if f.get_int("clip.vision.n_wa_pattern", 0):
            raise UnsupportedError(f"{f.path}: windowed attention (clip.vision.n_wa_pattern) in a Qwen2-VL "
                                   "tower is not supported")
        return cls(quick_gelu=not f.get_bool("clip.use_gelu", False), **kw)


@dataclass(eq=False)
class QuickGeluBlock(vit.Block):
    """The LayerNorm ViT block, its MLP's activation as the file says (llama.cpp's
    default, without clip.use_gelu, is quick GELU)."""

    def activation(self, ctx: Context, x: Tensor) -> Tensor:
        if not self.cfg.quick_gelu:
            return ctx.gelu(x)
        return ctx.mul(x, ctx.sigmoid(ctx.scale(x, QUICK_GELU)))


@register_tower("qwen2vl_merger")
@dataclass(eq=False)
class Qwen2VLTower(Module, MergedPatchTower):
    Config = Qwen2VLConfig

    patch_embd: Param = tensor("v.patch_embd", shape=("patch_size", "patch_size", 3, "n_embd"))
    patch_embd_1: BareParam = tensor("v.patch_embd.weight.1", shape=("patch_size", "patch_size", 3, "n_embd"))
    pre_ln: LayerNorm | None = tensor("v.pre_ln", optional=True, shape=("n_embd",))
    layers: list[QuickGeluBlock] = blocks("v.blk")
    post_ln: LayerNorm = tensor("v.post_ln", shape=("n_embd",))
    mm_0: Linear = tensor("mm.0", shape=("n_merged", "n_merged"))
    mm_2: Linear = tensor("mm.2", shape=("n_merged", "n_embd_text"))

    def forward(self, ctx: Context, patches: Tensor, n_y: int, n_x: int) -> Tensor:
        c = self.cfg
        grid = PatchGrid(ctx, c, n_y, n_x)
        x = both_frames(ctx, self, patches)                                             # [n_embd, n_patches]
        if self.pre_ln is not None:
            x = self.pre_ln(ctx, x, c.eps)
        for layer in self.layers:
            x = layer(ctx, x, grid.attend)
        return merge_and_project(ctx, self, grid, x)
