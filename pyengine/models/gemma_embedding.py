"""EmbeddingGemma (gemma-embedding): Gemma 3's text blocks (RMS norms before and after
attention and the GELU(tanh)-gated MLP, RMS norms on each q and k head, embeddings
scaled by sqrt(n_embd), queries scaled by 1/sqrt(head size)) read as an encoder:
attention is bidirectional, and in every group of `attention.sliding_window_pattern`
layers (6) all but the last see only the tokens at most sliding_window / 2 positions
away on either side (llama.cpp's symmetric window), roped with `rope.freq_base_swa`
(10000 where absent); a final RMS norm.  A file converted with the sentence-transformers
dense modules has `dense_2` (n_embd -> dense_2_feat_out) and `dense_3` (back to
n_embd), which llama.cpp applies after pooling; both are linear without biases, so
applying them to every row first gives the same pooled vector (mean, cls or last)
and the rows llama.cpp returns for pooling none.  GGUF `gemma-embedding`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyengine.errors import ModelError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import Linear, RMSNorm
from pyengine.models import common
from pyengine.models.binding import blocks, tensor
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register

SWA_PATTERN = 6             # llama.cpp's default for gemma-embedding
LOCAL_ROPE_BASE = 10000.0   # llama.cpp's rope.freq_base_swa where the file has none


@dataclass(frozen=True)
class GemmaEmbeddingConfig(common.SlidingWindowConfig):
    causal: bool = False   # an encoder's tokens see their whole sequence (within a window)

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "GemmaEmbeddingConfig":
        key = f.arch_key
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX, eps_default=1e-6)
        if key("attention.sliding_window") not in f.metadata:
            raise ModelError(f"{f.path}: missing metadata key {key('attention.sliding_window')!r} "
                             "(EmbeddingGemma needs its window)")
        kw.update(attn_scale=1.0 / math.sqrt(max(kw["head_dim"], 1)), scale_query=True,
                  sliding_window=f.get_int(key("attention.sliding_window")),
                  swa_pattern=f.get_int(key("attention.sliding_window_pattern"), SWA_PATTERN),
                  rope_base_local=f.get_float(key("rope.freq_base_swa"), LOCAL_ROPE_BASE), rope_scale_local=1.0)
        return cls(**kw)


@register("gemma-embedding")
@dataclass(eq=False)
class GemmaEmbedding(common.Encoder):
    Config = GemmaEmbeddingConfig

    token_types: None = None
    token_embd_norm: None = None
    head_cls: None = None   # (llama.cpp reads no classification head for gemma-embedding)
    layers: list[common.GemmaBlock] = blocks("blk")
    output_norm: RMSNorm = tensor("output_norm", shape=("n_embd",))
    dense_2: Linear | None = tensor("dense_2", optional=True, shape=("n_embd", None))
    dense_3: Linear | None = tensor("dense_3", optional=True, shape=(None, "n_embd"))

    def embed(self, ctx: Context, batch) -> Tensor:
        return ctx.scale(self.token_embd(ctx, batch.tokens), math.sqrt(self.cfg.n_embd))   # [n_embd, T]

    def final(self, ctx: Context, x: Tensor) -> Tensor:
        x = self.output_norm(ctx, x, self.cfg.eps)                                 # [n_embd, n_out]
        if self.dense_2 is not None:
            x = self.dense_2(ctx, x)                                               # [dense_2_feat_out, n_out]
        if self.dense_3 is not None:
            x = self.dense_3(ctx, x)                                               # [n_embd, n_out]
        if x.shape[0] != self.cfg.n_embd:
            raise ModelError(f"dense_2 / dense_3 map the embedding to {x.shape[0]} values, not n_embd "
                             f"({self.cfg.n_embd}) as llama.cpp requires")
        return x
