"""Pieces the ViT-style vision towers share: non-causal attention over one image's
patches, composed of products and a softmax per head."""

from __future__ import annotations

import math

import numpy as np

from pyengine.ml.context import F32, Context, Tensor


class PatchAttention:
    """Non-causal multi-head attention over one image's `n` patches, head by head in
    products (the text models' attention op walks cells token by token: fine for a
    prompt, slow over the 4096 x 4096 pairs of one 896-pixel image - 85 s a block against
    about 40 s for the whole block this way, on a busy 2-core host where llama.cpp takes
    20 s):

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
