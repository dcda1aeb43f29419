"""GLM-4 (THUDM / Zhipu's GLM-4-0414 and GLM-Z1, the dense models): RMS norms
both before and after attention and the MLP (each output normed before its
residual add), q/k/v projections with biases, interleaved ("normal") RoPE over
the first `rope.dimension_count` values of each head (half of it in the
released models), a fused gate/up projection (`ffn_up`, 2 x n_ff wide, gate
first) into a SiLU-gated MLP, and the output tied to the token embedding when
the file has no `output.weight`.  GGUF `general.architecture = glm4` (the MoE
models are `glm4moe`).

As llama.cpp reads it: the RMS norm epsilon is required; q, k and v come from
one fused `attn_qkv` when the file has it, else from three projections (what
the converter writes); the last `nextn_predict_layers` blocks (GLM-OCR's
multi-token-prediction layer) stay in the file and are never run; RoPE takes
no frequency factors and rope scaling is the shared config's.  GLM-4V's text
model (M-RoPE: `rope.dimension_sections`, q and k converted to NeoX's layout)
runs as NeoX RoPE, which is what llama.cpp's M-RoPE is over text while the
fourth section is empty (images are not supported).  Biases llama.cpp does not
add are refused."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pyengine.errors import ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import F32Param, Linear
from pyengine.models import common
from pyengine.models.binding import blocks, module, tensor
from pyengine.models.config import ROPE_NEOX, ROPE_NORMAL
from pyengine.models.registry import register

QKV_BIASES = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_qkv.bias")


@dataclass(frozen=True)
class Glm4Config(common.AttentionConfig):
    n_nextn: int = 0    # trailing multi-token-prediction blocks: in the file, not in n_layer, never run

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Glm4Config":
        key = f.arch_key
        mrope = cls.text_mrope(f)
        if "rope_freqs.weight" in f.tensors:   # llama.cpp's glm4 neither loads nor applies it
            raise UnsupportedError(f"{f.path}: tensor 'rope_freqs.weight' (RoPE frequency factors) is not "
                                   "supported for GLM-4, whose RoPE takes none")
        # the converter keeps HF's interleaved pairs, except for M-RoPE (it permutes q and k to NeoX's)
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX if mrope else ROPE_NORMAL, eps_default=None)
        n_blocks, nextn = kw["n_layer"], f.get_int(key("nextn_predict_layers"), 0)
        if not 0 <= nextn < n_blocks:
            raise ModelError(f"{f.path}: nextn_predict_layers {nextn} must be at least 0 and fewer than "
                             f"block_count {n_blocks}")
        kw.update(n_layer=n_blocks - nextn, n_nextn=nextn)
        cls.check_tensors(f, kw["n_layer"])
        return cls(**kw)

    @staticmethod
    def text_mrope(f: GGUFFile) -> bool:
        """Whether the file asks for M-RoPE (GLM-4V: `rope.dimension_sections` with its first two
        sections nonzero, llama.cpp's test).  Over text, whose positions llama.cpp repeats in the
        first three sections and zeroes in the fourth, M-RoPE is NeoX RoPE as long as the fourth
        section is empty; a file with a fourth section is refused."""
        name = f.arch_key("rope.dimension_sections")
        value = f.metadata.get(name, 0)
        if isinstance(value, np.ndarray) and value.dtype.kind in "iu":
            sections = value.tolist()
        else:   # llama.cpp also takes one number for all four (a string or float is the getter's error)
            sections = [f.get_int(name, 0)] * 4
        if len(sections) < 2 or sections[0] <= 0 or sections[1] <= 0:
            return False
        if len(sections) > 3 and sections[3] != 0:
            raise UnsupportedError(f"{f.path}: M-RoPE with a fourth section ({name} = {sections}) is not "
                                   "supported; GLM-4 files with three sections run (text only)")
        return True

    @staticmethod
    def check_tensors(f: GGUFFile, n_layer: int) -> None:
        """Each block has a fused attn_qkv or all of attn_q, attn_k and attn_v (the
        binder only knows single names), and no bias llama.cpp would not add."""
        extra = next((n for n in f.tensors if n.endswith(".bias") and not n.endswith(QKV_BIASES)), None)
        if extra:   # llama.cpp's glm4 creates no such tensor, so it refuses the file too
            raise UnsupportedError(f"{f.path}: tensor {extra!r} is not supported for GLM-4, which has "
                                   "biases only on its q/k/v projections")
        for i in range(n_layer):
            p = f"blk.{i}."
            if p + "attn_qkv.weight" in f.tensors:
                if p + "attn_qkv.bias" not in f.tensors and p + "attn_q.bias" in f.tensors:
                    raise UnsupportedError(f"{f.path}: block {i} has a fused '{p}attn_qkv.weight' with separate "
                                           "q/k/v biases, which is not supported; use a file with 'attn_qkv.bias'")
                continue
            missing = next((f"{p}attn_{x}.weight" for x in "qkv" if f"{p}attn_{x}.weight" not in f.tensors), None)
            if missing:
                raise ModelError(f"missing tensor '{missing}' (or a fused '{p}attn_qkv.weight') in {f.path}")

    def __post_init__(self) -> None:
        super().__post_init__()
        common.check_range("feed_forward_length", self.n_ff, 1, 1 << 20)


@dataclass(eq=False)
class Attention(common.SelfAttention):
    """q, k and v from the fused projection when the file has it, else from three;
    every one with an optional bias."""

    attn_qkv: Linear | None = tensor("attn_qkv", optional=True, shape=("n_embd", "qkv_dim"))
    attn_q: Linear | None = tensor("attn_q", optional=True, shape=("n_embd", "q_dim"))
    attn_k: Linear | None = tensor("attn_k", optional=True, shape=("n_embd", "kv_dim"))
    attn_v: Linear | None = tensor("attn_v", optional=True, shape=("n_embd", "kv_dim"))

    def project(self, ctx: Context, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if self.attn_qkv is not None:   # (the config checked that one form is complete)
            return common.project_fused(ctx, self.cfg, self.attn_qkv, x)
        return common.project_separate(ctx, self.cfg, self.attn_q, self.attn_k, self.attn_v, x)


@dataclass(eq=False)
class Block(common.SandwichBlock):
    """x + post_norm(attention(pre_norm(x))), then the same around the MLP."""

    attn: Attention = module()
    mlp: common.FusedMLP = module()      # down(silu(gate) * up), gate and up from one ffn_up


@register("glm4")
@dataclass(eq=False)
class Glm4(common.Decoder):
    Config = Glm4Config

    rope_freqs: F32Param | None = None           # refused by the config: GLM-4's RoPE takes none
    layers: list[Block] = blocks("blk")          # the config's n_layer: the nextn blocks are left out
