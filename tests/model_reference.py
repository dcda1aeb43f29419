"""An exact float64 reference of every architecture pyengine runs, in numpy.

Written independently of the engine: weights are dequantized with the `gguf`
package, every step is computed in float64 (no F16 KV cache, no activation
quantization), and attention is the textbook causal softmax.  For quantized
models it tells how far a fast engine (ours or llama.cpp) is from the exact
result of the same weights; see tests/test_models_synth.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


class Weights:
    """GGUF tensors as float64 arrays in numpy order ([out, in]); metadata by key."""

    def __init__(self, path) -> None:
        self.reader = GGUFReader(str(path))
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.arch = self.meta("general.architecture")

    def meta(self, key: str, default=None):
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def hp(self, name: str, default=None):
        return self.meta(f"{self.arch}.{name}", default)

    def has(self, name: str) -> bool:
        return name in self.tensors

    def __getitem__(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@dataclass
class Rope:
    n_dims: int
    base: float
    neox: bool
    scale: float = 1.0            # positions are multiplied by this (linear scaling)
    factors: np.ndarray | None = None
    attn_factor: float = 1.0
    # YaRN, as ggml's rope computes it (rope_yarn): per pair, the scaled angle blended
    # with the unscaled one by a ramp, and cos/sin times 1 + 0.1 ln(1 / scale)
    ext_factor: float = 0.0       # weight of the ramp; 0 = no YaRN
    n_ctx_orig: int = 0           # the context the ramp counts turns over
    beta_fast: float = 32.0       # pairs turning at least this often there keep the unscaled angle
    beta_slow: float = 1.0        # pairs turning at most this often take the scaled one
    still: np.ndarray | None = None   # bool [n_dims / 2]: pairs left unturned (M-RoPE's fourth stream over text)

    def yarn_ramp(self) -> np.ndarray:
        """[n_dims / 2] weight of each pair's unscaled angle (ggml_rope_yarn_corr_dims)."""
        def corr_dim(turns: float) -> float:   # the pair that turns `turns` times over n_ctx_orig
            return self.n_dims * math.log(self.n_ctx_orig / (turns * 2 * math.pi)) / (2 * math.log(self.base))
        low = max(0.0, math.floor(corr_dim(self.beta_fast)))
        high = min(self.n_dims - 1.0, math.ceil(corr_dim(self.beta_slow)))
        return 1.0 - np.clip((np.arange(self.n_dims // 2) - low) / max(0.001, high - low), 0.0, 1.0)

    def __call__(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """x [T, heads, head_dim]; rotates the first n_dims values of each head."""
        half = self.n_dims // 2
        inv_freq = self.base ** (-np.arange(half) * 2.0 / self.n_dims)
        if self.factors is not None:
            inv_freq = inv_freq / self.factors[:half]
        unscaled = pos[:, None] * inv_freq[None, :]                      # [T, half]
        if self.still is not None:
            unscaled = np.where(self.still[None, :], 0.0, unscaled)
        angle, mscale = unscaled * self.scale, self.attn_factor
        if self.ext_factor:
            mix = self.yarn_ramp()[None, :] * self.ext_factor
            angle = angle * (1 - mix) + unscaled * mix
            mscale *= 1.0 + 0.1 * math.log(1.0 / self.scale)
        cos = (np.cos(angle) * mscale)[:, None, :]
        sin = (np.sin(angle) * mscale)[:, None, :]
        out = x.copy()
        if self.neox:
            a, b = x[..., :half], x[..., half:self.n_dims]
            out[..., :half] = a * cos - b * sin
            out[..., half:self.n_dims] = a * sin + b * cos
        else:
            a, b = x[..., 0:self.n_dims:2], x[..., 1:self.n_dims:2]
            out[..., 0:self.n_dims:2] = a * cos - b * sin
            out[..., 1:self.n_dims:2] = a * sin + b * cos
        return out


def fourth_stream(sections: list[int], n_pairs: int, interleaved: bool) -> np.ndarray:
    """bool [n_pairs]: the pairs M-RoPE's fourth stream turns.  Sections repeat every
    sum(sections) pairs; interleaved (Qwen3-VL), streams 0, 1, 2 take turns pair by
    pair while each has pairs left; else each stream a run of pairs (Qwen2-VL)."""
    sector = np.arange(n_pairs) % sum(sections)
    if interleaved:
        return sector >= 3 * np.asarray(sections)[sector % 3]
    return sector >= sum(sections[:3])


def attend(q, k, v, pos, *, scale: float, softcap: float = 0.0, window: int = 0) -> np.ndarray:
    """Causal attention of q [T, H, hd] over k, v [T, Hkv, hd] -> [T, H*hd]."""
    n_tok, n_head, hd = q.shape
    group = n_head // k.shape[1]
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    scores = np.einsum("thd,shd->hts", q, k) * scale
    if softcap > 0:
        scores = softcap * np.tanh(scores / softcap)
    visible = pos[None, :] <= pos[:, None]
    if window > 0:
        visible &= (pos[:, None] - pos[None, :]) < window
    scores = np.where(visible[None], scores, -np.inf)
    out = np.einsum("hts,shd->thd", softmax(scores), v)
    return out.reshape(n_tok, -1)   # [T, H * v's head size] (DeepSeek's differs from q's)


class Reference:
    """One model's forward pass over a whole prompt (positions 0..T-1)."""

    def __init__(self, path) -> None:
        w = self.w = Weights(path)
        self.n_layer = w.hp("block_count")
        self.n_head = w.hp("attention.head_count")
        self.n_head_kv = w.hp("attention.head_count_kv", self.n_head)
        n_embd = self.n_embd = w.hp("embedding_length")
        self.head_dim = w.hp("attention.key_length", n_embd // self.n_head if self.n_head else 0)   # (0: no attention)
        self.eps = w.hp("attention.layer_norm_rms_epsilon", 1e-5)
        self.rope_dims = w.hp("rope.dimension_count", self.head_dim)
        self.rope_base = w.hp("rope.freq_base", 10000.0)
        self.scaling = self.rope_scaling()
        self.cache: dict[str, np.ndarray] = {}
        self.n_ctx: int | None = None      # the context size a run is configured for (Phi-3)

    def rope_scaling(self) -> dict:
        """Rope's scaling keywords from rope.scaling.* as llama.cpp reads them: the type
        (linear when absent), scale = 1 / factor (else the older scale_linear) unless
        the type is none, and for yarn ggml's YaRN with the attention factor llama.cpp
        derives: YaRN's 1 + 0.1 ln(factor) (1 for a factor <= 1) over ggml's own
        1 + 0.1 ln(factor), times rope.scaling.attn_factor (which applies without YaRN too)."""
        hp = self.w.hp
        kind = hp("rope.scaling.type", "linear")
        factor = hp("rope.scaling.factor", hp("rope.scale_linear", 0.0))
        scale = 1.0 / factor if factor and kind != "none" else 1.0
        attn = hp("rope.scaling.attn_factor", 1.0)
        if kind != "yarn":
            return dict(scale=scale, attn_factor=attn)
        f = 1.0 / scale
        attn *= (1.0 + 0.1 * math.log(f) if f > 1 else 1.0) / (1.0 + 0.1 * math.log(f))
        return dict(scale=scale, attn_factor=attn, ext_factor=1.0,
                    n_ctx_orig=hp("rope.scaling.original_context_length", 0) or hp("context_length"))

    def t(self, name: str) -> np.ndarray:
        if name not in self.cache:
            self.cache[name] = self.w[name]
        return self.cache[name]

    def linear(self, name: str, x: np.ndarray) -> np.ndarray:
        y = x @ self.t(f"{name}.weight").T
        if self.w.has(f"{name}.bias"):
            y = y + self.t(f"{name}.bias")
        return y

    def norm(self, name: str, x: np.ndarray) -> np.ndarray:
        return rms_norm(x, self.t(f"{name}.weight"), self.eps)

    def heads(self, x: np.ndarray, n: int) -> np.ndarray:
        return x.reshape(x.shape[0], n, self.head_dim)

    def logits(self, x: np.ndarray) -> np.ndarray:
        out = "output" if self.w.has("output.weight") else "token_embd"
        return self.linear(out, self.norm("output_norm", x))

    # -- the pieces architectures combine --------------------------------------

    def qkv(self, p: str, h: np.ndarray):
        if self.w.has(f"{p}attn_qkv.weight"):                      # fused (Phi-3)
            qkv = self.linear(f"{p}attn_qkv", h)
            qd, kvd = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
            q, k, v = qkv[:, :qd], qkv[:, qd:qd + kvd], qkv[:, qd + kvd:]
        else:
            q, k, v = (self.linear(f"{p}attn_{n}", h) for n in "qkv")
        q, k, v = self.heads(q, self.n_head), self.heads(k, self.n_head_kv), self.heads(v, self.n_head_kv)
        if self.w.has(f"{p}attn_q_norm.weight"):
            q, k = self.norm(f"{p}attn_q_norm", q), self.norm(f"{p}attn_k_norm", k)
        return q, k, v

    def self_attention(self, p: str, h, pos, rope: Rope, *, scale=None, softcap=0.0, window=0):
        q, k, v = self.qkv(p, h)
        o = attend(rope(q, pos), rope(k, pos), v, pos, softcap=softcap, window=window,
                   scale=scale if scale is not None else 1.0 / math.sqrt(self.head_dim))
        return self.linear(f"{p}attn_output", o)

    def gated_mlp(self, p: str, h, act=silu, suffix: str = ""):
        """suffix: another MLP of the block (`_shexp`: a shared expert)."""
        if not self.w.has(f"{p}ffn_gate{suffix}.weight"):          # fused gate/up (Phi-3)
            gu = self.linear(f"{p}ffn_up", h)
            half = gu.shape[1] // 2
            return self.linear(f"{p}ffn_down", act(gu[:, :half]) * gu[:, half:])
        return self.linear(f"{p}ffn_down{suffix}",
                           act(self.linear(f"{p}ffn_gate{suffix}", h)) * self.linear(f"{p}ffn_up{suffix}", h))

    def moe(self, p: str, h, *, renormalise: bool = True):
        n_used = self.w.hp("expert_used_count")
        probs = softmax(self.linear(f"{p}ffn_gate_inp", h))          # [T, E]
        gate, up, down = (self.t(f"{p}ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            chosen = np.argsort(-probs[t], kind="stable")[:n_used]
            weights = probs[t, chosen] / (probs[t, chosen].sum() if renormalise else 1.0)
            for e, wt in zip(chosen, weights):
                y = silu(gate[e] @ h[t]) * (up[e] @ h[t])
                out[t] += wt * (down[e] @ y)
        return out

    # -- architectures -----------------------------------------------------------

    def forward(self, ids) -> np.ndarray:
        ids = np.asarray(ids)
        pos = np.arange(len(ids))
        x = self.t("token_embd.weight")[ids]
        return getattr(self, f"arch_{self.w.arch.replace('-', '_')}")(x, pos)

    def pre_norm_stack(self, x, pos, rope: Rope, ffn) -> np.ndarray:
        for i in range(self.n_layer):
            p = f"blk.{i}."
            freqs = self.t("rope_freqs.weight") if self.w.has("rope_freqs.weight") else rope.factors
            r = replace(rope, factors=freqs)
            x = x + self.self_attention(p, self.norm(f"{p}attn_norm", x), pos, r)
            x = x + ffn(p, self.norm(f"{p}ffn_norm", x))
        return self.logits(x)

    # Llama; Mixtral is a llama file with experts: every layer's MLP is then the
    # softmax-routed experts (renormalise=False: the wrong variant the tests measure)
    def arch_llama(self, x, pos, *, renormalise: bool = True):
        def ffn(p, h):
            if self.w.has(f"{p}ffn_gate_inp.weight"):
                return self.moe(p, h, renormalise=renormalise)
            return self.gated_mlp(p, h)
        return self.pre_norm_stack(x, pos, Rope(self.rope_dims, self.rope_base, neox=False, **self.scaling), ffn)

    def arch_qwen2(self, x, pos):
        return self.pre_norm_stack(x, pos, Rope(self.rope_dims, self.rope_base, neox=True, **self.scaling),
                                   self.gated_mlp)

    arch_qwen3 = arch_qwen2

    def arch_qwen3moe(self, x, pos):
        return self.pre_norm_stack(x, pos, Rope(self.rope_dims, self.rope_base, neox=True, **self.scaling), self.moe)

    def arch_qwen3vlmoe(self, x, pos, *, interleaved: bool = True, fourth_turns: bool = False):
        """Qwen3-MoE over text positions (p, p, p, 0): the pairs of the fourth stream stay
        unturned; which pairs those are, interleaved M-RoPE says (wrong: a run of pairs
        per stream as Qwen2-VL, or the fourth stream at p: NeoX rope)."""
        sections = [int(s) for s in self.w.meta(f"{self.w.arch}.rope.dimension_sections")]
        rope = Rope(self.rope_dims, self.rope_base, neox=True, **self.scaling,
                    still=None if fourth_turns else fourth_stream(sections, self.rope_dims // 2, interleaved))
        return self.pre_norm_stack(x, pos, rope, self.moe)

    def arch_phi3(self, x, pos):
        # LongRoPE: the "short" factors while the context fits the original training
        # length, the "long" ones beyond it (the context is the prompt unless set)
        n_ctx = self.n_ctx or len(pos)
        n_ctx_orig = self.w.hp("rope.scaling.original_context_length", self.w.hp("context_length"))
        which = "short" if n_ctx <= n_ctx_orig else "long"
        name = f"rope_factors_{which}.weight"
        factors = self.t(name) if self.w.has(name) else None
        rope = Rope(self.rope_dims, self.rope_base, neox=True, factors=factors, **self.scaling)
        return self.pre_norm_stack(x, pos, rope, self.gated_mlp)

    def gemma_stack(self, x, pos, *, pattern: int, window: int, base_local: float, softcap: float,
                    final_softcap: float, scale_local: float | None = None) -> np.ndarray:
        x = x * math.sqrt(self.n_embd)
        local_scaling = self.scaling if scale_local is None else dict(self.scaling, scale=scale_local)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            local = i % pattern < pattern - 1
            rope = Rope(self.rope_dims, base_local if local else self.rope_base, neox=True,
                        **(local_scaling if local else self.scaling))
            h = self.self_attention(p, self.norm(f"{p}attn_norm", x), pos, rope, softcap=softcap,
                                    window=window if local else 0)
            x = x + self.norm(f"{p}post_attention_norm", h)
            h = self.gated_mlp(p, self.norm(f"{p}ffn_norm", x), act=gelu_tanh)
            x = x + self.norm(f"{p}post_ffw_norm", h)
        logits = self.logits(x)
        return final_softcap * np.tanh(logits / final_softcap) if final_softcap > 0 else logits

    def arch_gemma2(self, x, pos):
        return self.gemma_stack(x, pos, pattern=2, window=self.w.hp("attention.sliding_window", 4096),
                                base_local=self.rope_base,
                                softcap=self.w.hp("attn_logit_softcapping", 50.0),
                                final_softcap=self.w.hp("final_logit_softcapping", 30.0))

    def arch_gemma3(self, x, pos):
        return self.gemma_stack(x, pos, pattern=6, window=self.w.hp("attention.sliding_window"),
                                base_local=10000.0, softcap=0.0, final_softcap=0.0, scale_local=1.0)

    def arch_granite(self, x, pos):
        # Llama with four multipliers.  As llama.cpp reads them: embedding_scale,
        # residual_scale and attention.scale missing or 0 mean no scaling
        # (1/sqrt(head_dim) for the scores); logit_scale (required) divides the
        # logits; rope.scaling.finetuned false turns RoPE off.
        hp = self.w.hp
        res, attn_scale = hp("residual_scale", 0.0) or 1.0, hp("attention.scale", 0.0) or None
        factors = self.t("rope_freqs.weight") if self.w.has("rope_freqs.weight") else None
        rope = Rope(self.rope_dims, self.rope_base, neox=False, factors=factors, **self.scaling)
        if not hp("rope.scaling.finetuned", True):
            rope = lambda v, _pos: v  # noqa: E731
        x = x * (hp("embedding_scale", 0.0) or 1.0)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            x = x + res * self.self_attention(p, self.norm(f"{p}attn_norm", x), pos, rope, scale=attn_scale)
            x = x + res * self.gated_mlp(p, self.norm(f"{p}ffn_norm", x))
        return self.logits(x) / hp("logit_scale")

    def arch_granitehybrid(self, x, pos, *, decay: bool = True, residual_scale: bool = True,
                           renormalise: bool = True, shared: bool = True):
        # Granite 4 hybrids: Granite's multipliers around layers that are attention where
        # head_count_kv > 0 and Mamba-2 mixers (mamba2_mixer) where it is 0, each with a
        # gated MLP.  The keywords make the wrong variants the tests measure.
        hp = self.w.hp
        counts = [int(n) for n in hp("attention.head_count_kv")]
        self.n_head_kv = max(counts)
        res = (hp("residual_scale", 0.0) or 1.0) if residual_scale else 1.0
        rope = Rope(self.rope_dims, self.rope_base, neox=False, **self.scaling)
        if not hp("rope.scaling.finetuned", True):
            rope = lambda v, _pos: v  # noqa: E731
        x = x * (hp("embedding_scale", 0.0) or 1.0)
        for i, n_kv in enumerate(counts):
            p = f"blk.{i}."
            h = self.norm(f"{p}attn_norm", x)
            if n_kv:
                h = self.self_attention(p, h, pos, rope, scale=hp("attention.scale", 0.0) or None)
            else:
                h = self.mamba2_mixer(p, h, decay=decay)
            x = x + res * h
            x = x + res * self.granite_ffn(p, self.norm(f"{p}ffn_norm", x), renormalise=renormalise, shared=shared)
        return self.logits(x) / (hp("logit_scale", 0.0) or 1.0)

    def granite_ffn(self, p: str, h, *, renormalise: bool = True, shared: bool = True):
        """The gated MLP, or where the layer has a router its experts (softmax, renormalised over
        the chosen) plus the ungated shared expert where there is one."""
        if not self.w.has(f"{p}ffn_gate_inp.weight"):
            return self.gated_mlp(p, h)
        out = self.moe(p, h, renormalise=renormalise)
        if shared and self.w.has(f"{p}ffn_up_shexp.weight"):
            out = out + self.gated_mlp(p, h, suffix="_shexp")
        return out

    def arch_smollm3(self, x, pos):
        # Llama's block with interleaved ("normal") RoPE, except that every fourth
        # layer, (i + 1) % 4 == 0, attends without any position encoding (llama.cpp
        # hard-codes n_no_rope_layer_step = 4 for SmolLM3) and that no rope_freqs
        # factors are ever applied; the output is tied unless output.weight exists.
        rope = Rope(self.rope_dims, self.rope_base, neox=False, **self.scaling)

        def nope(t, _pos):
            return t

        for i in range(self.n_layer):
            p = f"blk.{i}."
            r = rope if (i + 1) % 4 else nope
            x = x + self.self_attention(p, self.norm(f"{p}attn_norm", x), pos, r)
            x = x + self.gated_mlp(p, self.norm(f"{p}ffn_norm", x))
        return self.logits(x)

    def arch_ernie4_5(self, x, pos):
        # Llama's block with the head size of attention.key_length (q may be wider
        # than n_embd), optional q/k/v biases (self.linear adds any), interleaved
        # ("normal") RoPE over whole heads and never with rope_freqs factors; the
        # output is tied unless output.weight exists.
        rope = Rope(self.rope_dims, self.rope_base, neox=False, **self.scaling)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            x = x + self.self_attention(p, self.norm(f"{p}attn_norm", x), pos, rope)
            x = x + self.gated_mlp(p, self.norm(f"{p}ffn_norm", x))
        return self.logits(x)

    def arch_hunyuan_dense(self, x, pos):
        # Llama's block with NeoX RoPE; each q and k head RMS-normed AFTER RoPE
        # (Qwen3 norms before it); no rope_freqs factors; tied output unless
        # output.weight exists.  rope.scaling.alpha (NTK), if set, multiplies the
        # base by alpha^(hd / (hd - 2)), as llama.cpp does.
        hd, alpha = self.head_dim, self.w.hp("rope.scaling.alpha", 0.0)
        base = self.rope_base * (alpha ** (hd / (hd - 2)) if alpha > 0 else 1.0)
        rope = Rope(self.rope_dims, base, neox=True, **self.scaling)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = self.norm(f"{p}attn_norm", x)
            q, k, v = (self.linear(f"{p}attn_{n}", h) for n in "qkv")
            q, k, v = self.heads(q, self.n_head), self.heads(k, self.n_head_kv), self.heads(v, self.n_head_kv)
            q = self.norm(f"{p}attn_q_norm", rope(q, pos))
            k = self.norm(f"{p}attn_k_norm", rope(k, pos))
            o = attend(q, k, v, pos, scale=1.0 / math.sqrt(hd))
            x = x + self.linear(f"{p}attn_output", o)
            x = x + self.gated_mlp(p, self.norm(f"{p}ffn_norm", x))
        return self.logits(x)

    def arch_exaone4(self, x, pos):
        # No pre-norms: q/k/v come from the residual stream itself, q and k are
        # RMS-normed per head, and the attention and MLP outputs are RMS-normed
        # before their residual adds; NeoX RoPE with rope_freqs.  llama.cpp makes
        # only a 64-layer model hybrid: there the layers marked in
        # attention.sliding_window_pattern (a per-layer array, else a period n:
        # i % n < n - 1, every layer for n = 0; 4 when missing) attend to the last
        # attention.sliding_window tokens (4096 when missing) with RoPE, the
        # others to everything without RoPE.  Any other depth ropes every layer
        # and has no window.
        hp = self.w.hp
        factors = self.t("rope_freqs.weight") if self.w.has("rope_freqs.weight") else None
        rope = Rope(self.rope_dims, self.rope_base, neox=True, factors=factors, **self.scaling)

        def nope(t, _pos):
            return t

        sliding, window = [True] * self.n_layer, 0
        if self.n_layer == 64:
            pattern, window = hp("attention.sliding_window_pattern", 4), hp("attention.sliding_window", 4096)
            if isinstance(pattern, (list, np.ndarray)):
                sliding = [bool(v) for v in pattern[:self.n_layer]]
            else:
                sliding = [pattern == 0 or i % pattern < pattern - 1 for i in range(self.n_layer)]
        for i in range(self.n_layer):
            p = f"blk.{i}."
            q, k, v = self.qkv(p, x)                               # per-head q/k norms
            r = rope if sliding[i] else nope
            o = attend(r(q, pos), r(k, pos), v, pos, scale=1.0 / math.sqrt(self.head_dim),
                       window=window if sliding[i] else 0)
            x = x + self.norm(f"{p}post_attention_norm", self.linear(f"{p}attn_output", o))
            x = x + self.norm(f"{p}post_ffw_norm", self.gated_mlp(p, x))
        return self.logits(x)

    def arch_glm4(self, x, pos):
        # RMS norms before attention and the MLP and on each one's output before its
        # residual add; q/k/v with biases (fused attn_qkv or three projections: self.qkv
        # takes either); RoPE over the first rope.dimension_count values of each head in
        # interleaved pairs, never with rope_freqs, or for GLM-4V's M-RoPE (the first two
        # rope.dimension_sections set) NeoX's halves, which is M-RoPE over text; a fused
        # gate/up ffn_up into SiLU; the last nextn_predict_layers blocks never run; the
        # output tied unless output.weight exists.
        sections = list(self.w.hp("rope.dimension_sections", [0, 0]))
        rope = Rope(self.rope_dims, self.rope_base, neox=sections[0] > 0 and sections[1] > 0, **self.scaling)
        for i in range(self.n_layer - self.w.hp("nextn_predict_layers", 0)):
            p = f"blk.{i}."
            h = self.self_attention(p, self.norm(f"{p}attn_norm", x), pos, rope)
            x = x + self.norm(f"{p}post_attention_norm", h)
            h = self.gated_mlp(p, self.norm(f"{p}ffn_norm", x))
            x = x + self.norm(f"{p}post_ffw_norm", h)
        return self.logits(x)

    def arch_mistral3(self, x, pos):
        # Llama's block (interleaved RoPE with rope_freqs when present, biases when
        # present) with, as llama.cpp reads them: YaRN's ramp ends from
        # rope.scaling.yarn_beta_fast / _slow (32 and 1 when missing) and, with
        # rope.scaling.yarn_log_multiplier m != 0, a rope magnitude of
        # (1 + 0.1 ln f) / (1 + 0.1 m ln f) in place of 1 + 0.1 ln f; and, with
        # attention.temperature_scale beta != 0, every query times
        # 1 + beta ln(floor(pos / n) + 1) after RoPE, n the original context.
        hp = self.w.hp
        scaling = dict(self.scaling)
        if scaling.get("ext_factor"):
            f, m = 1.0 / scaling["scale"], hp("rope.scaling.yarn_log_multiplier", 0.0)

            def mscale(k):
                return 1.0 + 0.1 * k * math.log(f) if f > 1 else 1.0

            magnitude = mscale(1.0) / mscale(m) if m else mscale(1.0)
            scaling.update(attn_factor=hp("rope.scaling.attn_factor", 1.0) * magnitude / (1.0 + 0.1 * math.log(f)),
                           beta_fast=hp("rope.scaling.yarn_beta_fast", 32.0),
                           beta_slow=hp("rope.scaling.yarn_beta_slow", 1.0))
        factors = self.t("rope_freqs.weight") if self.w.has("rope_freqs.weight") else None
        rope = Rope(self.rope_dims, self.rope_base, neox=False, factors=factors, **scaling)
        beta = hp("attention.temperature_scale", 0.0)
        n_orig = hp("rope.scaling.original_context_length", 0) or hp("context_length")
        temperature = 1.0 + beta * np.log(np.floor(pos / n_orig) + 1.0) if beta else np.ones(len(pos))
        for i in range(self.n_layer):
            p = f"blk.{i}."
            q, k, v = self.qkv(p, self.norm(f"{p}attn_norm", x))
            q = rope(q, pos) * temperature[:, None, None]
            o = attend(q, rope(k, pos), v, pos, scale=1.0 / math.sqrt(self.head_dim))
            x = x + self.linear(f"{p}attn_output", o)
            x = x + self.gated_mlp(p, self.norm(f"{p}ffn_norm", x))
        return self.logits(x)

    def arch_olmo2(self, x, pos):
        # No pre-norms.  q and k are RMS-normed over all of a token's values (not
        # per head) before the split into heads and NeoX RoPE; the attention and
        # MLP outputs are RMS-normed before their residual adds.
        rope = Rope(self.rope_dims, self.rope_base, neox=True, **self.scaling)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            q, k, v = (self.linear(f"{p}attn_{n}", x) for n in "qkv")
            q, k = self.norm(f"{p}attn_q_norm", q), self.norm(f"{p}attn_k_norm", k)
            q, k, v = self.heads(q, self.n_head), self.heads(k, self.n_head_kv), self.heads(v, self.n_head_kv)
            o = attend(rope(q, pos), rope(k, pos), v, pos, scale=1.0 / math.sqrt(self.head_dim))
            x = x + self.norm(f"{p}post_attention_norm", self.linear(f"{p}attn_output", o))
            x = x + self.norm(f"{p}post_ffw_norm", self.gated_mlp(p, x))
        return self.logits(x)

    # lfm2: attention where head_count_kv > 0 (q/k head norms, NeoX RoPE), else a short
    # convolution: B, C, x from in_proj, C * conv(B * x) over a causal window of l_cache
    # tokens, out_proj; SiLU-gated MLPs; token_embd_norm as the final norm.  The keywords
    # make the wrong variants the tests measure (the window a token short, the C gate dropped).
    def arch_lfm2(self, x, pos, *, window_short: bool = False, gate_c: bool = True, ffn=None):
        counts = [int(n) for n in self.w.hp("attention.head_count_kv")]
        self.n_head_kv = max(counts)
        rope = Rope(self.rope_dims, self.rope_base, neox=True, **self.scaling)
        for i, n_kv in enumerate(counts):
            p = f"blk.{i}."
            h = self.norm(f"{p}attn_norm", x)
            if n_kv:
                x = x + self.self_attention(p, h, pos, rope)
            else:
                x = x + self.short_conv(p, h, window_short=window_short, gate_c=gate_c)
            x = x + (ffn or self.gated_mlp)(p, self.norm(f"{p}ffn_norm", x))
        return self.linear("output" if self.w.has("output.weight") else "token_embd",
                           self.norm("token_embd_norm", x))

    def arch_lfm2moe(self, x, pos, *, selection_bias: bool = True, renormalise: bool = True, **wrong):
        """LFM2's layers with, past the leading_dense_block_count dense ones, sigmoid-routed
        experts chosen with the exp_probs_b bias and always renormalised; selection_bias=False
        and renormalise=False make the wrong variants."""
        n_dense = self.w.hp("leading_dense_block_count", 0)

        def ffn(p, h):
            if int(p.split(".")[1]) < n_dense:
                return self.gated_mlp(p, h)
            return self.sigmoid_moe(p, h, selection_bias=selection_bias, routed_scale=False, norm=renormalise)
        return self.arch_lfm2(x, pos, ffn=ffn, **wrong)

    def short_conv(self, p: str, h, *, window_short: bool = False, gate_c: bool = True):
        n = h.shape[1]
        bcx = self.linear(f"{p}shortconv.in_proj", h)                  # [T, 3n]
        b, c, v = bcx[:, :n], bcx[:, n:2 * n], bcx[:, 2 * n:]
        w = self.t(f"{p}shortconv.conv.weight")                      # [n, K]: oldest tap first
        k = w.shape[1]
        bx = np.concatenate([np.zeros((k - 1, n)), b * v])           # the zero window before the prompt
        taps = range(1, k) if window_short else range(k)             # short: the oldest token dropped
        y = sum(w[:, j] * bx[j:j + len(h)] for j in taps)
        return self.linear(f"{p}shortconv.out_proj", c * y if gate_c else y)

    # mamba2: per layer x + mixer(norm(x)), no attention, no MLP.  The mixer: z, xBC, dt
    # from ssm_in; xBC through the causal convolution (with its bias) and SiLU; the scan
    # per head h (group g = h // (heads / groups)): dt' = softplus(dt + dt_bias),
    # S = S exp(dt' A) + B_g (dt' x_h)^T, y = S^T C_g + D x_h; silu(z) * y, RMS-normed per
    # group, ssm_out.  The keywords make the wrong variants the tests measure.
    def arch_mamba2(self, x, pos, *, decay: bool = True, window_short: bool = False):
        for i in range(self.n_layer):
            p = f"blk.{i}."
            x = x + self.mamba2_mixer(p, self.norm(f"{p}attn_norm", x), decay=decay, window_short=window_short)
        return self.logits(x)

    def mamba2_mixer(self, p: str, h, *, decay: bool = True, window_short: bool = False):
        hp = self.w.hp
        d_inner, n_state, n_head, n_group = (hp(f"ssm.{k}") for k in
                                             ("inner_size", "state_size", "time_step_rank", "group_count"))
        n_tok, head_dim = len(h), d_inner // n_head
        zxbcdt = self.linear(f"{p}ssm_in", h)
        n_conv = d_inner + 2 * n_group * n_state
        z, xbc, dt = zxbcdt[:, :d_inner], zxbcdt[:, d_inner:d_inner + n_conv], zxbcdt[:, d_inner + n_conv:]
        w = self.t(f"{p}ssm_conv1d.weight")                          # [n_conv, K]: oldest tap first
        k = w.shape[1]
        xx = np.concatenate([np.zeros((k - 1, n_conv)), xbc])
        taps = range(1, k) if window_short else range(k)
        xbc = silu(sum(w[:, j] * xx[j:j + n_tok] for j in taps) + self.t(f"{p}ssm_conv1d.bias"))
        xs = xbc[:, :d_inner].reshape(n_tok, n_head, head_dim)
        bs = xbc[:, d_inner:d_inner + n_group * n_state].reshape(n_tok, n_group, n_state)
        cs = xbc[:, d_inner + n_group * n_state:].reshape(n_tok, n_group, n_state)
        dt = np.logaddexp(0.0, dt + self.t(f"{p}ssm_dt.bias"))       # softplus
        a, d = self.t(f"{p}ssm_a").reshape(-1), self.t(f"{p}ssm_d").reshape(-1)
        group = np.arange(n_head) // (n_head // n_group)
        state = np.zeros((n_head, n_state, head_dim))
        y = np.empty((n_tok, n_head, head_dim))
        for t in range(n_tok):
            keep = np.exp(dt[t] * a) if decay else np.ones(n_head)
            state = state * keep[:, None, None] + np.einsum("hn,hp->hnp", bs[t, group], xs[t] * dt[t][:, None])
            y[t] = np.einsum("hnp,hn->hp", state, cs[t, group]) + d[:, None] * xs[t]
        y = silu(z) * y.reshape(n_tok, d_inner)
        if self.w.has(f"{p}ssm_norm.weight"):                        # (optional in Falcon-H1)
            g = y.reshape(n_tok, n_group, d_inner // n_group)
            g = g / np.sqrt((g * g).mean(axis=-1, keepdims=True) + self.eps) * self.t(f"{p}ssm_norm.weight")
            y = g.reshape(n_tok, d_inner)
        return self.linear(f"{p}ssm_out", y)

    # nemotron_h: per layer x + sublayer(norm(x)), the sublayer a Mamba-2 mixer where
    # head_count_kv and feed_forward_length are both 0, attention without any position
    # encoding where only the latter is, else down(relu(up h)^2).  The RMS epsilon falls
    # back to attention.layer_norm_epsilon.  The keywords make the wrong variants the tests
    # measure (the decay left out, the ReLU not squared).
    def arch_nemotron_h(self, x, pos, *, decay: bool = True, squared: bool = True, probs_bias: bool = True):
        hp = self.w.hp
        self.eps = hp("attention.layer_norm_rms_epsilon", hp("attention.layer_norm_epsilon"))
        counts, ffn = ([int(n) for n in hp(k)] for k in ("attention.head_count_kv", "feed_forward_length"))
        self.n_head_kv = max(counts)
        for i, (n_kv, n_ff) in enumerate(zip(counts, ffn)):
            p = f"blk.{i}."
            h = self.norm(f"{p}attn_norm", x)
            if n_ff and self.w.has(f"{p}ffn_gate_inp.weight"):
                h = self.relu2_experts(p, h, squared=squared, probs_bias=probs_bias)
            elif n_ff:
                h = self.relu2_mlp(p, h, squared=squared)
            elif n_kv:
                h = self.self_attention(p, h, pos, lambda v, _pos: v)
            else:
                h = self.mamba2_mixer(p, h, decay=decay)
            x = x + h
        return self.logits(x)

    # nemotron_h_moe: nemotron_h whose MLP layers are experts (relu2_experts)
    arch_nemotron_h_moe = arch_nemotron_h

    def relu2_mlp(self, p: str, h, *, squared: bool = True, suffix: str = ""):
        r = np.maximum(self.linear(f"{p}ffn_up{suffix}", h), 0.0)
        return self.linear(f"{p}ffn_down{suffix}", r * r if squared else r)

    # Nemotron-H's experts: scores sigmoid(router), the expert_used_count best by score plus
    # exp_probs_b (which only chooses), weighted by their scores, renormalised when
    # expert_weights_norm, times expert_weights_scale; each expert down(relu(up h)^2); plus
    # the shared expert, the same without routing.
    def relu2_experts(self, p: str, h, *, squared: bool = True, probs_bias: bool = True):
        hp = self.w.hp
        n_used, scale = hp("expert_used_count"), hp("expert_weights_scale", 0.0) or 1.0
        probs = 1.0 / (1.0 + np.exp(-self.linear(f"{p}ffn_gate_inp", h)))            # [T, E]
        chosen_by = probs + self.t(f"{p}exp_probs_b.bias") if probs_bias else probs
        up, down = self.t(f"{p}ffn_up_exps.weight"), self.t(f"{p}ffn_down_exps.weight")
        out = self.relu2_mlp(p, h, squared=squared, suffix="_shexp")
        for t in range(h.shape[0]):
            chosen = np.argsort(-chosen_by[t], kind="stable")[:n_used]
            weights = probs[t, chosen] / (probs[t, chosen].sum() if hp("expert_weights_norm", False) else 1.0)
            for e, wt in zip(chosen, weights * scale):
                r = np.maximum(up[e] @ h[t], 0.0)
                out[t] += wt * (down[e] @ (r * r if squared else r))
        return out

    # falcon-h1: per layer h = norm(x); x + attention(h) (NeoX RoPE) + mamba2_mixer(h), then
    # a gated MLP after `blk.N.ffn_norm` (a bare name).  The keywords make the wrong
    # variants the tests measure (interleaved RoPE, the decay left out).
    def arch_falcon_h1(self, x, pos, *, neox: bool = True, decay: bool = True):
        rope = Rope(self.rope_dims, self.rope_base, neox=neox, **self.scaling)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = self.norm(f"{p}attn_norm", x)
            x = x + self.self_attention(p, h, pos, rope) + self.mamba2_mixer(p, h, decay=decay)
            x = x + self.gated_mlp(p, rms_norm(x, self.t(f"{p}ffn_norm"), self.eps))
        return self.logits(x)

    # gpt-oss: q/k/v/o biases, a sink logit per head in every softmax, a window on
    # the even layers, NeoX RoPE with the file's scaling, a post-attention norm and
    # experts with biases and the clamped SwiGLU, weighted by a softmax over the
    # chosen experts' logits.  The keywords make the wrong variants the tests
    # measure (sinks dropped, the window on the odd layers, no clamp).
    def arch_gpt_oss(self, x, pos, *, sinks: bool = True, window_on_even: bool = True, clamp: bool = True):
        window = self.w.hp("attention.sliding_window")
        rope = Rope(self.rope_dims, self.rope_base, neox=True, **self.scaling)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            q, k, v = self.qkv(p, self.norm(f"{p}attn_norm", x))
            sink = self.t(f"{p}attn_sinks.weight") if sinks else None
            sliding = (i % 2 == 0) == window_on_even
            o = attend_with_sinks(rope(q, pos), rope(k, pos), v, pos, scale=1.0 / math.sqrt(self.head_dim),
                                  window=window if sliding else 0, sinks=sink)
            x = x + self.linear(f"{p}attn_output", o)
            x = x + self.oai_moe(p, self.norm(f"{p}post_attention_norm", x), clamp=clamp)
        return self.logits(x)

    def oai_moe(self, p: str, h, *, clamp: bool = True, alpha: float = 1.702, limit: float = 7.0):
        n_used = self.w.hp("expert_used_count")
        logits = self.linear(f"{p}ffn_gate_inp", h)                     # [T, E]
        w = {n: (self.t(f"{p}ffn_{n}_exps.weight"), self.t(f"{p}ffn_{n}_exps.bias")) for n in ("gate", "up", "down")}
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            chosen = np.argsort(-logits[t], kind="stable")[:n_used]
            for e, wt in zip(chosen, softmax(logits[t, chosen])):
                g = w["gate"][0][e] @ h[t] + w["gate"][1][e]
                u = w["up"][0][e] @ h[t] + w["up"][1][e]
                if clamp:
                    g, u = np.minimum(g, limit), np.clip(u, -limit, limit)
                y = g / (1.0 + np.exp(-alpha * g)) * (u + 1.0)
                out[t] += wt * (w["down"][0][e] @ y + w["down"][1][e])
        return out

    # deepseek2: Multi-head Latent Attention in its plain (MHA) form, each head's keys
    # and values decompressed from the normed latent through attn_k_b / attn_v_b (the
    # engine runs the absorbed form over the latent itself, so this checks it); the
    # query through the q LoRA (or a plain attn_q); normal RoPE on the last n_rot
    # values of q and on the shared key part, its magnitude 1 under YaRN as llama.cpp
    # takes DeepSeek's mscale equal to mscale_all_dim; the scores scaled by
    # mscale^2 / sqrt(head size), mscale = 1 + 0.1 L ln(factor), L the file's log
    # multiplier / 0.1.  Then a dense MLP on the leading layers, experts after.
    # The keywords make the wrong variants the tests measure.
    def arch_deepseek2(self, x, pos, *, mscale: bool = True, absorbed_width: bool = False,
                       groups: bool = True, probs_bias: bool = True):
        hp = self.w.hp
        n_rope, rank = self.rope_dims, hp("attention.kv_lora_rank")
        head_k = hp("attention.key_length_mla", self.head_dim)
        nope = head_k - n_rope
        scaling = dict(self.scaling)
        f = 1.0 / scaling["scale"]
        log_mul = hp("rope.scaling.yarn_log_multiplier", 0.0) / 0.1
        if scaling.get("ext_factor"):
            scaling["attn_factor"] = hp("rope.scaling.attn_factor", 1.0) / (1.0 + 0.1 * math.log(f))
        rope = Rope(n_rope, self.rope_base, neox=False, **scaling)
        m = (1.0 + 0.1 * log_mul * math.log(f)) * hp("rope.scaling.attn_factor", 1.0) if mscale else 1.0
        width = rank + n_rope if absorbed_width else head_k   # the absorbed head's width: the wrong divisor
        scale = m * m / math.sqrt(width)
        n_dense = hp("leading_dense_block_count", 0)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = self.norm(f"{p}attn_norm", x)
            if self.w.has(f"{p}attn_q.weight"):
                q = self.linear(f"{p}attn_q", h)
            else:
                q = self.linear(f"{p}attn_q_b", self.norm(f"{p}attn_q_a_norm", self.linear(f"{p}attn_q_a", h)))
            q = q.reshape(len(pos), self.n_head, head_k)                         # [T, H, nope + rope]
            kv = self.linear(f"{p}attn_kv_a_mqa", h)                             # [T, rank + rope]
            latent = self.norm(f"{p}attn_kv_a_norm", kv[:, :rank])               # [T, rank]
            k_pe = rope(kv[:, None, rank:], pos)                                 # [T, 1, rope]
            k_nope = np.einsum("hrd,tr->thd", self.t(f"{p}attn_k_b.weight"), latent)  # [T, H, nope]
            v = np.einsum("hvr,tr->thv", self.t(f"{p}attn_v_b.weight"), latent)      # [T, H, v]
            q = np.concatenate([q[..., :nope], rope(q[..., nope:], pos)], axis=-1)
            k = np.concatenate([k_nope, np.repeat(k_pe, self.n_head, axis=1)], axis=-1)
            x = x + self.linear(f"{p}attn_output", attend(q, k, v, pos, scale=scale))
            h = self.norm(f"{p}ffn_norm", x)
            if i < n_dense:
                x = x + self.gated_mlp(p, h)
            else:
                x = x + self.deepseek_moe(p, h, groups=groups, probs_bias=probs_bias)
        return self.logits(x)

    def deepseek_moe(self, p: str, h, *, groups: bool = True, probs_bias: bool = True):
        """Routed experts (gated scores + the selection bias, within the best groups by
        their two best scores) weighted by the gated scores, plus the shared experts."""
        hp = self.w.hp
        n_used, n_group = hp("expert_used_count"), hp("expert_group_count", 1) if groups else 1
        n_group_used = hp("expert_group_used_count", 1)
        logits = self.linear(f"{p}ffn_gate_inp", h)                              # [T, E]
        sigmoid = hp("expert_gating_func", 1) == 2
        probs = 1.0 / (1.0 + np.exp(-logits)) if sigmoid else softmax(logits)
        select = probs + self.t(f"{p}exp_probs_b.bias") if probs_bias and self.w.has(f"{p}exp_probs_b.bias") else probs
        gate, up, down = (self.t(f"{p}ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
        per = select.shape[1] // n_group
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            s = select[t].copy()
            if n_group > 1:
                best2 = np.sort(s.reshape(n_group, per), axis=1)[:, -2:].sum(axis=1)
                kept = np.argsort(-best2, kind="stable")[:n_group_used]
                s[~np.isin(np.arange(s.size) // per, kept)] = -np.inf
            chosen = np.argsort(-s, kind="stable")[:n_used]
            weights = probs[t, chosen]
            if hp("expert_weights_norm", False):
                weights = weights / weights.sum()
            weights = weights * (hp("expert_weights_scale", 0.0) or 1.0)
            for e, wt in zip(chosen, weights):
                out[t] += wt * (down[e] @ (silu(gate[e] @ h[t]) * (up[e] @ h[t])))
        shared = self.linear(f"{p}ffn_down_shexp",
                             silu(self.linear(f"{p}ffn_gate_shexp", h)) * self.linear(f"{p}ffn_up_shexp", h))
        return out + shared


    # -- Qwen3.5: gated attention and Gated DeltaNet layers -------------------------

    def arch_qwen35(self, x, pos, *, decay: bool = True, tiled_heads: bool = True, ffn=None, **delta):
        """decay=False: the delta rule without its per-token decay; tiled_heads=False:
        value head h reads q/k head h // (Hv / Hk) instead of h % Hk (GGUF's order)."""
        ffn = ffn or self.gated_mlp
        interval = self.w.hp("full_attention_interval", 4)
        rope = Rope(self.rope_dims, self.rope_base, neox=True, **self.scaling)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = self.norm(f"{p}attn_norm", x)
            if (i + 1) % interval:
                x = x + self.gated_delta_net(p, h, decay=decay, tiled_heads=tiled_heads, **delta)
            else:
                x = x + self.gated_attention(p, h, pos, rope)
            x = x + ffn(p, self.norm(f"{p}post_attention_norm", x))
        return self.logits(x)

    def arch_qwen35moe(self, x, pos, *, shared_gate: bool = True, **wrong):
        """shared_gate=False: the shared expert added without its sigmoid gate."""
        def ffn(p, h):
            shared = self.gated_mlp(p, h, suffix="_shexp")
            if shared_gate:
                shared = shared / (1.0 + np.exp(-(h @ self.t(f"{p}ffn_gate_inp_shexp.weight"))))[:, None]
            return self.moe(p, h) + shared
        return self.arch_qwen35(x, pos, ffn=ffn, **wrong)

    def arch_qwen3next(self, x, pos, *, tiled_heads: bool = False, **wrong):
        """Qwen3.5-MoE's layers with beta and alpha from ssm_ba and value head h on q/k head
        h // (Hv / Hk); tiled_heads=True (Qwen3.5's h % Hk) and grouped_ba=False are wrong here."""
        return self.arch_qwen35moe(x, pos, tiled_heads=tiled_heads, **wrong)

    def gated_attention(self, p: str, h, pos, rope: Rope):
        """Each attn_q head is a query then a gate; the output times sigmoid(gate)."""
        n_tok, hd = h.shape[0], self.head_dim
        qg = self.linear(f"{p}attn_q", h).reshape(n_tok, self.n_head, 2, hd)
        q, gate = self.norm(f"{p}attn_q_norm", qg[:, :, 0]), qg[:, :, 1].reshape(n_tok, -1)
        k = self.norm(f"{p}attn_k_norm", self.heads(self.linear(f"{p}attn_k", h), self.n_head_kv))
        v = self.heads(self.linear(f"{p}attn_v", h), self.n_head_kv)
        o = attend(rope(q, pos), rope(k, pos), v, pos, scale=1.0 / math.sqrt(hd))
        return self.linear(f"{p}attn_output", o / (1.0 + np.exp(-gate)))

    def delta_gate_inputs(self, p: str, h, n_k: int, n_v: int, *, grouped_ba: bool = True):
        """beta's and alpha's logits [T, Hv]: from ssm_beta and ssm_alpha, or from Qwen3-Next's
        ssm_ba, per q/k head its value heads' betas then their alphas (grouped_ba=False: all
        the betas, then all the alphas, the wrong reading)."""
        if not self.w.has(f"{p}ssm_ba.weight"):
            return self.linear(f"{p}ssm_beta", h), self.linear(f"{p}ssm_alpha", h)
        ba = self.linear(f"{p}ssm_ba", h)                                       # [T, 2*Hv]
        if not grouped_ba:
            return ba[:, :n_v], ba[:, n_v:]
        ba = ba.reshape(len(h), n_k, 2, n_v // n_k)
        return ba[:, :, 0].reshape(len(h), n_v), ba[:, :, 1].reshape(len(h), n_v)

    def gated_delta_net(self, p: str, h, *, decay: bool = True, tiled_heads: bool = True, grouped_ba: bool = True):
        hp = self.w.hp
        dk, n_k, n_v = hp("ssm.state_size"), hp("ssm.group_count"), hp("ssm.time_step_rank")
        dv = hp("ssm.inner_size") // n_v
        n_tok = h.shape[0]
        mixed = self.linear(f"{p}attn_qkv", h)                                  # [T, channels]
        w = self.t(f"{p}ssm_conv1d.weight")                                     # [channels, K]
        kern = w.shape[1]
        padded = np.concatenate([np.zeros((kern - 1, mixed.shape[1])), mixed])
        conv = silu(sum(padded[j:j + n_tok] * w[:, j] for j in range(kern)))
        key_dim = n_k * dk
        def l2(x):
            return x / np.maximum(np.sqrt((x * x).sum(-1, keepdims=True)), self.eps)
        q = l2(conv[:, :key_dim].reshape(n_tok, n_k, dk))
        k = l2(conv[:, key_dim:2 * key_dim].reshape(n_tok, n_k, dk))
        v = conv[:, 2 * key_dim:].reshape(n_tok, n_v, dv)
        beta, alpha = self.delta_gate_inputs(p, h, n_k, n_v, grouped_ba=grouped_ba)
        beta = 1.0 / (1.0 + np.exp(-beta))                                      # [T, Hv]
        alpha = alpha + self.t(f"{p}ssm_dt.bias")
        g = np.logaddexp(0.0, alpha) * self.t(f"{p}ssm_a")                      # softplus * -exp(A_log)
        kh = [hv % n_k if tiled_heads else hv // (n_v // n_k) for hv in range(n_v)]
        out = np.zeros((n_tok, n_v, dv))
        for hv in range(n_v):
            S = np.zeros((dk, dv))
            for t in range(n_tok):
                if decay:
                    S = S * np.exp(g[t, hv])
                kt = k[t, kh[hv]]
                S = S + np.outer(kt, beta[t, hv] * (v[t, hv] - S.T @ kt))
                out[t, hv] = S.T @ q[t, kh[hv]] / math.sqrt(dk)
        z = self.linear(f"{p}attn_gate", h).reshape(n_tok, n_v, dv)
        o = self.norm(f"{p}ssm_norm", out) * silu(z)
        return self.linear(f"{p}ssm_out", o.reshape(n_tok, -1))
    # GLM-4.5: pre-norm blocks (the second norm named post_attention_norm), q/k/v biases,
    # q/k head norms where present, NeoX RoPE over part of each head; the first
    # leading_dense_block_count layers dense, the others sigmoid-routed experts chosen with
    # the exp_probs_b bias, plus the shared expert; the last nextn_predict_layers blocks
    # never run.  The keywords make the wrong variants the tests measure.
    def arch_glm4moe(self, x, pos, *, selection_bias: bool = True, routed_scale: bool = True,
                     shared: bool = True, neox: bool = True):
        n_run = self.n_layer - self.w.hp("nextn_predict_layers", 0)
        n_dense = self.w.hp("leading_dense_block_count", 0)
        rope = Rope(self.rope_dims, self.rope_base, neox=neox, **self.scaling)
        for i in range(n_run):
            p = f"blk.{i}."
            x = x + self.self_attention(p, self.norm(f"{p}attn_norm", x), pos, rope)
            h = self.norm(f"{p}post_attention_norm", x)
            if i < n_dense:
                x = x + self.gated_mlp(p, h)
                continue
            x = x + self.sigmoid_moe(p, h, selection_bias=selection_bias, routed_scale=routed_scale)
            if shared:
                x = x + self.linear(f"{p}ffn_down_shexp",
                                    silu(self.linear(f"{p}ffn_gate_shexp", h)) * self.linear(f"{p}ffn_up_shexp", h))
        return self.logits(x)

    def sigmoid_moe(self, p: str, h, *, selection_bias: bool = True, routed_scale: bool = True,
                    norm: bool | None = None):
        """norm: renormalise the chosen weights (None: as the file's expert_weights_norm says)."""
        n_used = self.w.hp("expert_used_count")
        probs = 1.0 / (1.0 + np.exp(-self.linear(f"{p}ffn_gate_inp", h)))             # [T, E]
        select = probs + self.t(f"{p}exp_probs_b.bias") if selection_bias else probs
        scale = self.w.hp("expert_weights_scale", 0.0) if routed_scale else 0.0
        gate, up, down = (self.t(f"{p}ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            chosen = np.argsort(-select[t], kind="stable")[:n_used]
            weights = probs[t, chosen]
            if self.w.hp("expert_weights_norm", False) if norm is None else norm:
                weights = weights / max(weights.sum(), 6.103515625e-5)
            weights = weights * (scale or 1.0)
            for e, wt in zip(chosen, weights):
                out[t] += wt * (down[e] @ (silu(gate[e] @ h[t]) * (up[e] @ h[t])))
        return out


    # Llama 4: every 4th layer NoPE (its queries times the temperature
    # log(floor((pos + 1) / 8192) + 1) * 0.1 + 1), the others RoPE then a weightless
    # q/k RMS norm, attending within chunks of `chunk` tokens; every
    # interleave_moe_layer_step-th layer the top expert on its input times
    # sigmoid(logit), plus the shared expert.  The keywords make the wrong variants
    # the tests measure (and chunk a size the tests can reach).
    def arch_llama4(self, x, pos, *, chunk: int = 8192, kq_norm: bool = True, nope: bool = True,
                    weight_before: bool = True, shared: bool = True):
        step = self.w.hp("interleave_moe_layer_step")
        rope = Rope(self.rope_dims, self.rope_base, neox=False, **self.scaling)
        temp = np.log(np.floor((pos + 1.0) / 8192) + 1.0) * 0.1 + 1.0
        visible = (pos[None, :] <= pos[:, None]) & (pos[None, :] // chunk == pos[:, None] // chunk)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            q, k, v = self.qkv(p, self.norm(f"{p}attn_norm", x))
            roped = not nope or (i + 1) % 4 != 0
            if roped:
                q, k = rope(q, pos), rope(k, pos)
                if kq_norm:
                    q, k = rms_norm(q, 1.0, self.eps), rms_norm(k, 1.0, self.eps)
            else:
                q = q * temp[:, None, None]
            o = attend_masked(q, k, v, visible if roped else pos[None, :] <= pos[:, None],
                              scale=1.0 / math.sqrt(self.head_dim))
            x = x + self.linear(f"{p}attn_output", o)
            h = self.norm(f"{p}ffn_norm", x)
            if (i + 1) % step:
                x = x + self.gated_mlp(p, h)
                continue
            x = x + self.top1_sigmoid_moe(p, h, weight_before=weight_before)
            if shared:
                x = x + self.linear(f"{p}ffn_down_shexp",
                                    silu(self.linear(f"{p}ffn_gate_shexp", h)) * self.linear(f"{p}ffn_up_shexp", h))
        return self.logits(x)

    def top1_sigmoid_moe(self, p: str, h, *, weight_before: bool = True):
        logits = self.linear(f"{p}ffn_gate_inp", h)                                   # [T, E]
        gate, up, down = (self.t(f"{p}ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            e = int(np.argmax(logits[t]))
            wt = 1.0 / (1.0 + np.exp(-logits[t, e]))
            x = h[t] * wt if weight_before else h[t]
            y = down[e] @ (silu(gate[e] @ x) * (up[e] @ x))
            out[t] = y if weight_before else wt * y
        return out


def attend_masked(q, k, v, visible, *, scale: float) -> np.ndarray:
    """Attention of q [T, H, hd] over k, v [T, Hkv, hd] where visible [T, T] allows."""
    n_tok, n_head, hd = q.shape
    group = n_head // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.where(visible[None], np.einsum("thd,shd->hts", q, k) * scale, -np.inf)
    return np.einsum("hts,shd->thd", softmax(scores), v).reshape(n_tok, n_head * hd)


def attend_with_sinks(q, k, v, pos, *, scale: float, window: int = 0, sinks=None) -> np.ndarray:
    """attend(), with each head's sink logit (sinks [H], or None) joining its
    softmax denominator, without a value."""
    if sinks is None:
        return attend(q, k, v, pos, scale=scale, window=window)
    n_tok, n_head, hd = q.shape
    group = n_head // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("thd,shd->hts", q, k) * scale
    visible = pos[None, :] <= pos[:, None]
    if window > 0:
        visible &= (pos[:, None] - pos[None, :]) < window
    scores = np.where(visible[None], scores, -np.inf)
    sink = np.broadcast_to(np.asarray(sinks, np.float64)[:, None, None], (n_head, n_tok, 1))
    mx = np.maximum(scores.max(-1, keepdims=True), sink)
    e = np.exp(scores - mx)
    p = e / (e.sum(-1, keepdims=True) + np.exp(sink - mx))
    return np.einsum("hts,shd->thd", p, v).reshape(n_tok, n_head * hd)


# ---- encoders ---------------------------------------------------------------------------


def layer_norm(x: np.ndarray, w: np.ndarray, b, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ALiBi's per-head slopes (Press et al.; for a head count that is no power of
    two, the odd powers of the next scale fill the rest, as ggml does)."""
    n_log2 = 2 ** int(math.floor(math.log2(n_head)))
    m0, m1 = 2.0 ** (-max_bias / n_log2), 2.0 ** (-(max_bias / 2.0) / n_log2)
    return np.array([m0 ** (h + 1) if h < n_log2 else m1 ** (2 * (h - n_log2) + 1) for h in range(n_head)])


def attend_bidirectional(q, k, v, pos, *, scale: float, window: int = 0, alibi: float = 0.0) -> np.ndarray:
    """Every token of q [T, H, hd] attends every token of k, v [T, Hkv, hd] (with a
    window: those at most window // 2 positions away, either side; with an ALiBi max
    bias, each head's scores minus its slope times the distance) -> [T, H*hd]."""
    n_tok, n_head, hd = q.shape
    group = n_head // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("thd,shd->hts", q, k) * scale
    if alibi > 0:
        distance = np.abs(pos[:, None] - pos[None, :])
        scores = scores - alibi_slopes(n_head, alibi)[:, None, None] * distance[None]
    if window > 0:
        visible = np.abs(pos[:, None] - pos[None, :]) <= window // 2
        scores = np.where(visible[None], scores, -np.inf)
    return np.einsum("hts,shd->thd", softmax(scores), v).reshape(n_tok, n_head * hd)


class EncoderReference(Reference):
    """An encoder's final hidden states [T, n_embd] of one whole sequence (positions
    0..T-1, token type 0), and its classification head.

    causal / swap_norms / global_only / no_alibi / renormalise / no_dense build wrong
    variants (a causal mask; the LayerNorms before each sublayer where the model has
    them after each residual add, or the other way round; no sliding window; no ALiBi;
    the chosen experts' weights renormalised; EmbeddingGemma without its dense
    projections), for the tests that show such a mistake is caught."""

    def __init__(self, path, *, causal: bool = False, swap_norms: bool = False, global_only: bool = False,
                 no_alibi: bool = False, renormalise: bool = False, no_dense: bool = False) -> None:
        super().__init__(path)
        if self.w.arch != "gemma-embedding":   # (its norms are RMS norms: the base's epsilon)
            self.eps = self.w.hp("attention.layer_norm_epsilon")
        self.causal, self.swap_norms, self.global_only, self.no_alibi = causal, swap_norms, global_only, no_alibi
        self.renormalise, self.no_dense = renormalise, no_dense

    def layer_norm(self, name: str, x: np.ndarray) -> np.ndarray:
        bias = self.t(f"{name}.bias") if self.w.has(f"{name}.bias") else 0.0
        return layer_norm(x, self.t(f"{name}.weight"), bias, self.eps)

    def hidden(self, ids) -> np.ndarray:
        ids = np.asarray(ids)
        pos = np.arange(len(ids))
        x = self.t("token_embd.weight")[ids]
        if self.w.has("token_types.weight"):
            x = x + self.t("token_types.weight")[0]
        return getattr(self, f"encoder_{self.w.arch.replace('-', '_')}")(x, pos)

    def classify(self, pooled: np.ndarray) -> np.ndarray:
        """The head: BERT's tanh(cls x); ModernBERT's GELU then its bias-free cls.norm."""
        x = pooled
        if self.w.has("cls.weight"):
            if self.w.arch == "modern-bert":
                x = self.layer_norm("cls.norm", gelu_tanh(self.linear("cls", x)))
            else:
                x = np.tanh(self.linear("cls", x))
        if self.w.has("cls.output.weight"):
            x = self.linear("cls.output", x)
        return x

    def rank(self, ids, *, first_row: bool = False) -> np.ndarray:
        """A pair's score: the head over the rows' mean (ModernBERT's default) or the
        first row (BERT's; first_row: the wrong variant for ModernBERT)."""
        h = self.hidden(ids)
        return self.classify(h[0] if first_row or self.w.arch != "modern-bert" else h.mean(axis=0))

    def attention(self, p: str, h, pos, rope: Rope | None, alibi: float = 0.0):
        if self.w.has(f"{p}attn_q_norm.weight"):   # Jina's: LayerNorms over the whole q and k
            q = self.layer_norm(f"{p}attn_q_norm", self.linear(f"{p}attn_q", h))
            k = self.layer_norm(f"{p}attn_k_norm", self.linear(f"{p}attn_k", h))
            q, k, v = self.heads(q, self.n_head), self.heads(k, self.n_head_kv), \
                self.heads(self.linear(f"{p}attn_v", h), self.n_head_kv)
        else:
            q, k, v = self.qkv(p, h)
        if rope is not None:
            q, k = rope(q, pos), rope(k, pos)
        scale = 1.0 / math.sqrt(self.head_dim)
        if self.causal:   # (without ALiBi: the variant only needs to be wrong)
            o = attend(q, k, v, pos, scale=scale)
        else:
            o = attend_bidirectional(q, k, v, pos, scale=scale, alibi=alibi)
        return self.linear(f"{p}attn_output", o)

    def post_norm_stack(self, x, pos, rope: Rope | None, ffn, alibi: float = 0.0) -> np.ndarray:
        x = self.layer_norm("token_embd_norm", x)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            if self.swap_norms:
                x = x + self.attention(p, self.layer_norm(f"{p}attn_output_norm", x), pos, rope, alibi)
                x = x + ffn(p, self.layer_norm(f"{p}layer_output_norm", x))
            else:
                h = self.layer_norm(f"{p}attn_output_norm", x + self.attention(p, x, pos, rope, alibi))
                if self.w.has(f"{p}attn_norm_2.weight"):   # Jina's: the layer's input added again
                    h = self.layer_norm(f"{p}attn_norm_2", h + x)
                x = self.layer_norm(f"{p}layer_output_norm", h + ffn(p, h))
        return x

    def gelu_mlp(self, p: str, h):
        return self.linear(f"{p}ffn_down", gelu_tanh(self.linear(f"{p}ffn_up", h)))

    def encoder_bert(self, x, pos):
        return self.post_norm_stack(x + self.t("position_embd.weight")[pos], pos, None, self.gelu_mlp)

    def encoder_jina_bert_v2(self, x, pos):
        def gelu_gated(p, h):
            return self.gated_mlp(p, h, act=gelu_tanh)
        return self.post_norm_stack(x, pos, None, gelu_gated, alibi=0.0 if self.no_alibi else 8.0)

    def encoder_nomic_bert(self, x, pos):
        return self.post_norm_stack(x, pos, Rope(self.rope_dims, self.rope_base, neox=True), self.gated_mlp)

    def encoder_nomic_bert_moe(self, x, pos):
        """nomic-bert's stack with BERT's GELU MLP; layer i with i % moe_every_n_layers == 1
        routes to ungated GELU experts instead."""
        every = self.w.hp("moe_every_n_layers", 0)

        def ffn(p, h):
            layer = int(p.split(".")[1])
            return self.gelu_experts(p, h) if every and layer % every == 1 else self.gelu_mlp(p, h)
        return self.post_norm_stack(x, pos, Rope(self.rope_dims, self.rope_base, neox=True), ffn)

    def gelu_experts(self, p: str, h):
        """Softmax router; the expert_used_count most probable run down(gelu(up x)),
        weighted by their probabilities as they are (llama.cpp's nomic-bert-moe)."""
        n_used = self.w.hp("expert_used_count")
        probs = softmax(self.linear(f"{p}ffn_gate_inp", h))          # [T, E]
        up, down = self.t(f"{p}ffn_up_exps.weight"), self.t(f"{p}ffn_down_exps.weight")
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            chosen = np.argsort(-probs[t], kind="stable")[:n_used]
            weights = probs[t, chosen] / (probs[t, chosen].sum() if self.renormalise else 1.0)
            for e, wt in zip(chosen, weights):
                out[t] += wt * (down[e] @ gelu_tanh(up[e] @ h[t]))
        return out

    def encoder_gemma_embedding(self, x, pos):
        """Gemma 3's sandwich blocks, bidirectional: embeddings times sqrt(n_embd), queries
        times 1/sqrt(head size); in each group of sliding_window_pattern layers all but
        the last see |distance| <= window // 2 (rope.freq_base_swa); the final RMS norm,
        then dense_2 and dense_3 on every row (linear: the same as after pooling)."""
        window = 0 if self.global_only else self.w.hp("attention.sliding_window")
        pattern = self.w.hp("attention.sliding_window_pattern", 6)
        base_local = self.w.hp("rope.freq_base_swa", 10000.0)
        x = x * math.sqrt(self.n_embd)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            local = i % pattern < pattern - 1
            rope = Rope(self.rope_dims, base_local if local else self.rope_base, neox=True)
            q, k, v = self.qkv(p, self.norm(f"{p}attn_norm", x))
            q, k = rope(q, pos), rope(k, pos)
            scale = 1.0 / math.sqrt(self.head_dim)
            o = (attend(q, k, v, pos, scale=scale) if self.causal
                 else attend_bidirectional(q, k, v, pos, scale=scale, window=window if local else 0))
            x = x + self.norm(f"{p}post_attention_norm", self.linear(f"{p}attn_output", o))
            h = self.gated_mlp(p, self.norm(f"{p}ffn_norm", x), act=gelu_tanh)
            x = x + self.norm(f"{p}post_ffw_norm", h)
        x = self.norm("output_norm", x)
        for dense in ("dense_2", "dense_3"):
            if self.w.has(f"{dense}.weight") and not self.no_dense:
                x = self.linear(dense, x)
        return x

    def encoder_modern_bert(self, x, pos):
        """Pre-norm blocks (no norm before layer 0's attention), bias-free LayerNorms,
        GEGLU, a final norm; every `sliding_window_pattern`-th layer from the first is
        global (rope.freq_base), the others see |distance| <= window // 2
        (rope.freq_base_swa)."""
        window = 0 if self.global_only else self.w.hp("attention.sliding_window", 0)
        period = self.w.hp("attention.sliding_window_pattern", 3)
        base_local = self.w.hp("rope.freq_base_swa", self.rope_base)
        x = self.layer_norm("token_embd_norm", x)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            local = window > 0 and i % period != 0
            rope = Rope(self.rope_dims, base_local if local else self.rope_base, neox=True)
            has_norm = self.w.has(f"{p}attn_norm.weight")
            h = self.layer_norm(f"{p}attn_norm", x) if has_norm and not self.swap_norms else x
            q, k, v = self.qkv(p, h)
            q, k = rope(q, pos), rope(k, pos)
            scale = 1.0 / math.sqrt(self.head_dim)
            o = (attend(q, k, v, pos, scale=scale) if self.causal
                 else attend_bidirectional(q, k, v, pos, scale=scale, window=window if local else 0))
            x = x + self.linear(f"{p}attn_output", o)
            if self.swap_norms:   # post-norm: after the residual adds
                x = self.layer_norm(f"{p}attn_norm", x) if has_norm else x
                x = self.layer_norm(f"{p}ffn_norm", x + self.geglu(p, x))
            else:
                x = x + self.geglu(p, self.layer_norm(f"{p}ffn_norm", x))
        return self.layer_norm("output_norm", x)

    def geglu(self, p: str, h):
        gate_up = self.linear(f"{p}ffn_up", h)
        n_ff = gate_up.shape[1] // 2
        return self.linear(f"{p}ffn_down", gelu_tanh(gate_up[:, :n_ff]) * gate_up[:, n_ff:])
