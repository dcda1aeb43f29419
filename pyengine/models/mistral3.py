"""Mistral 3: the text model of Ministral 3 (3B, 8B, 14B), Devstral Small 2 and
Mistral Small 3.1 / 3.2 as llama.cpp's converter writes them
(`Mistral3ForConditionalGeneration`, `Ministral3ForCausalLM`, and Mistral-format
checkpoints with `llama_4_scaling`).  GGUF `general.architecture = mistral3`.

Llama's block -- RMSNorm, grouped-query attention (q/k/v/output biases when the
file has them), interleaved ("normal") RoPE over whole heads with `rope_freqs`
when present, a SiLU-gated MLP, the output tied to the token embedding when the
file has no `output.weight` -- plus two things, read as llama.cpp reads them
(llama-model.cpp, LLM_ARCH_MISTRAL3; models/mistral3.cpp; llama-context.cpp):

* YaRN with the file's ramp ends (`rope.scaling.yarn_beta_fast` / `_slow`,
  else 32 and 1) and magnitude: with `rope.scaling.yarn_log_multiplier` m != 0
  q and k are scaled by mscale(f, 1) / mscale(f, m), mscale(f, m) = 1 + 0.1 m ln f
  (1 for Ministral 3's m = 1), else by mscale(f, 1), f = rope.scaling.factor;
* Llama 4's attention temperature: with `attention.temperature_scale` beta != 0,
  every query is multiplied after RoPE by 1 + beta ln(floor(pos / n) + 1),
  n = the original context (`rope.scaling.original_context_length`, else
  `context_length`).  The factor depends on the position alone, so it is read
  from a table over positions by the batch's positions: a decode step re-runs
  the same graph.  Keys are not scaled, so a context shift re-ropes them only.

Files with experts (`expert_count` > 0), which llama.cpp also runs as mistral3,
are refused."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from pyengine.errors import ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Context, Tensor
from pyengine.models import common
from pyengine.models.config import F32, ROPE_NORMAL, YARN_BETA_FAST, YARN_BETA_SLOW, yarn_attn_factor
from pyengine.models.registry import register

MAX_CONTEXT = 1 << 24


@lru_cache(maxsize=8)
def temperature_table(beta: float, floor_scale: int, n: int) -> np.ndarray:
    """[n] the query factor of positions 0..n-1, as llama.cpp's attention-temperature
    input computes it (its position offset is 0 for mistral3): pos / floor_scale in
    float, floored, then log(. + 1) * beta + 1 in double, stored as float."""
    steps = np.floor(np.arange(n, dtype=np.float32) / F32(floor_scale))
    values, which = np.unique(steps, return_inverse=True)
    factors = np.array([math.log(float(s) + 1.0) * float(F32(beta)) + 1.0 for s in values])
    return factors[which].astype(np.float32)


@dataclass(frozen=True)
class Mistral3Config(common.AttentionConfig):
    ROPE_WHOLE_HEADS = True
    temp_scale: float = 0.0                  # attention.temperature_scale (beta); 0 = no temperature
    temp_floor: int = 0                      # positions per temperature step (the original context)

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Mistral3Config":
        key = f.arch_key
        if f.get_int(key("expert_count"), 0) > 0:
            raise UnsupportedError(f"{f.path}: mistral3 files with experts (MoE) are not supported yet; "
                                   "only the dense Mistral 3 models run")
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NORMAL, eps_default=None,   # q/k permuted: normal layout
                                  equal_heads=False)   # (checked below, as llama.cpp words it)
        value_dim = f.get_int(key("attention.value_length"), kw["head_dim"])
        if value_dim != kw["head_dim"]:   # llama.cpp asserts equal head sizes for mistral3
            raise ModelError(f"{f.path}: value head size {value_dim} differs from key head size {kw['head_dim']}")
        kw["rope_attn_factor"] = yarn_attn_factor(kw["rope_scale"], kw["rope_ext_factor"],
                                                  f.get_float(key("rope.scaling.attn_factor"), 1.0),
                                                  f.get_float(key("rope.scaling.yarn_log_multiplier"), 0.0))
        temp = f.get_float(key("attention.temperature_scale"), 0.0)
        orig_key = key("rope.scaling.original_context_length")
        if temp != 0 and f.get_int(orig_key, 1) == 0:   # llama.cpp: "invalid n_ctx_orig_yarn"
            raise ModelError(f"{f.path}: {orig_key} is 0, but the attention temperature steps by it")
        return cls(**kw, rope_beta_fast=f.get_float(key("rope.scaling.yarn_beta_fast"), YARN_BETA_FAST),
                   rope_beta_slow=f.get_float(key("rope.scaling.yarn_beta_slow"), YARN_BETA_SLOW),
                   temp_scale=temp, temp_floor=kw["n_ctx_orig"] if temp != 0 else 0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not math.isfinite(self.temp_scale):
            raise ModelError(f"attention.temperature_scale must be finite, got {self.temp_scale}")
        if self.temp_scale != 0 and not 1 <= self.temp_floor <= MAX_CONTEXT:
            raise ModelError(f"attention temperature step {self.temp_floor} is out of range (1..{MAX_CONTEXT})")


@register("mistral3")
@dataclass(eq=False)
class Mistral3(common.Decoder):
    Config = Mistral3Config

    def temperature(self, ctx: Context, batch) -> Tensor | None:
        """[1, 1, T] each token's query factor, looked up by its position (None without
        temperature).  The table covers the training context and the cache, whichever
        is larger: a position past both fails in the lookup."""
        c = self.cfg
        if c.temp_scale == 0:
            return None
        n = min(max(c.n_ctx_train, batch.attn_inputs(0).k.shape[1]), MAX_CONTEXT)
        table = ctx.input(temperature_table(c.temp_scale, c.temp_floor, n), "attn_temp", (1, n))
        return ctx.reshape(ctx.get_rows(table, batch.positions), (1, 1, -1))

    def layer_inputs(self, ctx: Context, batch) -> common.LayerInputs:
        ff = self.freq_factors(ctx)
        return common.LayerInputs(freq_factors=ff, q_factor=self.temperature(ctx, batch))   # [1, 1, T]
