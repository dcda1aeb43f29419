"""ERNIE 4.5, the dense models (Baidu's ERNIE-4.5-0.3B): Llama's block -- RMSNorm,
grouped-query attention, SiLU-gated MLP, interleaved ("normal") RoPE -- with a head
size of its own (`attention.key_length`; the 0.3B model has 16 heads of 128 over
n_embd 1024), optional q/k/v biases and the output tied to the token embedding
when the file has no `output.weight`.  GGUF `general.architecture = ernie4_5`
(the MoE models, `ernie4_5-moe`, are another architecture).

As llama.cpp reads it: the RMS norm epsilon is required, RoPE turns whole heads
(`rope.dimension_count` must equal the head size) and never takes frequency
factors, key and value heads are the same size, and rope scaling is the shared
config's.  An attention output bias, which llama.cpp loads but never adds, is
refused rather than silently dropped or added."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.errors import UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml.nn import F32Param
from pyengine.models import common
from pyengine.models.config import ROPE_NORMAL
from pyengine.models.registry import register


@dataclass(frozen=True)
class Ernie45Config(common.AttentionConfig):
    ROPE_WHOLE_HEADS = True

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Ernie45Config":
        biased = next((n for n in f.tensors if n.endswith(".attn_output.bias")), None)
        if biased:   # llama.cpp loads it but never adds it; the model would: neither answer is safe
            raise UnsupportedError(f"{f.path}: tensor {biased!r} (an attention output bias) is not supported "
                                   "for ERNIE 4.5; no released ERNIE 4.5 model has one")
        return cls(**cls.common_from_gguf(f, rope_mode=ROPE_NORMAL, eps_default=None))   # pairs of consecutive values


@register("ernie4_5")
@dataclass(eq=False)
class Ernie45(common.Decoder):
    """The shared decoder and blocks (q/k/v with optional biases, rope asked of the
    config) with ERNIE's config; `rope_freqs` is not bound (llama.cpp ropes without it)."""

    Config = Ernie45Config

    rope_freqs: F32Param | None = None
