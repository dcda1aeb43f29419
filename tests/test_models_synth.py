"""Parity of every synthetic model (tests/data/synth) with llama.cpp's recorded
outputs and with an exact float64 computation of the same weights.

How close is close.  Both engines quantize activations before each quantized
matmul (Q8_0 / Q8_1 / Q8_K) and keep K/V in F16, each with its own rounding
details, so their logits differ by that noise; on these random-weight models
it is a few hundredths (more where the logits themselves are large), and
argmaxes flip where the two best logits are that close.  So each model gets:

* a bound on argmax agreement over all positions of the 3 prompts, and every
  disagreement must be a near-tie: llama.cpp's token is within TIE of our best
  logit, TIE = 2 x the top-10 tolerance (each engine may sit up to one
  tolerance off, in opposite directions);
* a bound on |ours - llama.cpp| over the 10 largest logits at the last position;
* greedy continuations equal to llama.cpp's up to the first near-tie;
* against the exact float64 reference (tests/model_reference.py): our top-10
  error at most about twice llama.cpp's own (see EXACT_RATIO), and our
  argmax agreeing with the exact one about as often as llama.cpp's does.
  This is what tells a correct engine from a subtly wrong one: a wrong rope
  base, norm or scale moves logits by tenths to units, not by hundredths.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pytest

from gguf import GGUFValueType

from conftest import available_isas, forced_isa
from model_parity import DATA, DROP, CaseRun, compare, golden, load, prompt_logits, rewrite, run_case
from model_reference import Reference
from pyengine.errors import ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.kvcache import KeyRotator, KVCache
from pyengine.ml.nn import CacheSpec, RecurrentSpec
from pyengine.ml.context import Backend
from pyengine.runner.engine import Engine
from pyengine.runner.forward import Forward
from pyengine.sample import SamplingOptions
from pyengine.tokenizer import Tokenizer


@dataclass(frozen=True)
class Bounds:
    argmax: float   # least fraction of prompt positions whose argmax equals llama.cpp's
    top10: float    # largest |ours - llama.cpp| over llama.cpp's 10 largest last-position logits

    @property
    def tie(self) -> float:
        return 2 * self.top10


# Float weights: only summation order and the F16 KV cache differ; measured
# top-10 differences 3e-4 (F32), 1.3e-3 (F16), 7e-3 (BF16: activations are
# rounded to BF16 for the dot products, in both engines).
FLOAT = {
    "llama-f32-gqa1": Bounds(argmax=1.0, top10=0.002),
    "llama-f16": Bounds(argmax=1.0, top10=0.005),
    "llama-wide-bf16": Bounds(argmax=0.97, top10=0.02),   # measured 351/354; 3 flips within 0.006
}

# Quantized weights.  Measured argmax agreement with llama.cpp: 96.0% (Q2_K) to
# 100%; llama.cpp itself agrees with the exact float64 argmax at only 95.8% (Q2_K)
# to 99% of these positions, so 94% is the honest floor.  Top-10: measured
# <= 0.041 for all but two models, bound 0.05 (0.1 for Q2_K/Q3_K as the issue
# allows).  gemma2 (logits ~15-30, embeddings scaled by 8) and the tied Q5_1
# model (logits ~17-39) carry proportionally larger noise: measured 0.104 and
# 0.256, where llama.cpp's own distance from the exact result is 0.098 and 0.30.
# Since every row takes one arithmetic (a row's alone, never the product llama.cpp
# picks for a batch of 8+ rows), the k-quant models measure (avx512 / avx2 / scalar):
# Q4_K 0.022 / 0.021 / 0.022, Q6_K 0.018 / 0.019 / 0.019, Q2_K 0.015 / 0.018 / 0.020,
# Q3_K 0.026 / 0.026 / 0.021, Q4_0 0.014 / 0.016, IQ4_XS 0.029; Q5_K 0.054 / 0.054 / 0.045,
# whose distance from the exact result (0.0345) is llama.cpp's own (0.0355): bound 0.07.
QUANT_ARGMAX = 0.94
QUANT = {
    "llama-spm-q4_0": Bounds(QUANT_ARGMAX, 0.05),
    "llama-bpe-q5_1-tied": Bounds(QUANT_ARGMAX, 0.35),
    "llama-wide-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    "llama-wide-q4_0": Bounds(QUANT_ARGMAX, 0.05),
    "llama-wide-q2_k": Bounds(QUANT_ARGMAX, 0.1),
    "llama-wide-q3_k_s": Bounds(QUANT_ARGMAX, 0.1),
    "llama-wide-q4_k_s": Bounds(QUANT_ARGMAX, 0.05),
    "llama-wide-q5_k_s": Bounds(QUANT_ARGMAX, 0.07),
    "llama-wide-q6_k": Bounds(QUANT_ARGMAX, 0.05),
    "llama-wide-iq4_nl": Bounds(QUANT_ARGMAX, 0.05),
    "llama-wide-iq4_xs": Bounds(QUANT_ARGMAX, 0.05),
    "qwen2-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    "qwen3-q4_1": Bounds(QUANT_ARGMAX, 0.05),
    "qwen3moe-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    "qwen3moe-mxfp4": Bounds(0.99, 0.05),   # MXFP4 experts (MOSTLY_MXFP4_MOE)
    # qwen3vlmoe (scripts/make_synth_qwen3vlmoe.py): qwen3moe's layers over interleaved M-RoPE
    # sections 4/2/2/8, text at (p, p, p, 0): 8 of the 16 pairs unturned; recorded by the AVX-512
    # build (extra buffer types off); met to 5e-6 (354/354) on every ISA; the exact model sits
    # 0.024 / 98.9% from llama.cpp
    "qwen3vlmoe-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    "gemma2-q8_0": Bounds(QUANT_ARGMAX, 0.15),
    "phi3-q5_0": Bounds(QUANT_ARGMAX, 0.05),
    # scripts/make_synth_<arch>.py, recorded by llama.cpp's AVX2 build: its Q8_0 products are its
    # AVX-512 build's, so these are met bit for bit too (olmo2: top-10 <= 0.021 on the scalar table)
    "granite-q8_0": Bounds(QUANT_ARGMAX, 0.05),   # measured 354/354, top-10 5e-6 on every ISA
    "olmo2-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    "smollm3-q8_0": Bounds(QUANT_ARGMAX, 0.05),   # scalar: top-10 <= 0.036; layer 3 without RoPE
    "llama-yarn-q8_0": Bounds(QUANT_ARGMAX, 0.05),   # YaRN x4 over 64; scalar 353/354, top-10 0.0035
    "hunyuan-dense-q8_0": Bounds(QUANT_ARGMAX, 0.05),   # scalar: top-10 0.024, argmax 346/354
    # recorded by llama.cpp's AVX-512 build (extra buffer types off), met bit for bit there;
    # ernie4_5 (head size 64, q twice n_embd): avx2 350/354, top-10 0.029; scalar 350/354, 0.031;
    # exaone4 (64 layers, llama.cpp's only hybrid depth): scalar top-10 <= 0.022, argmax 351/354
    "ernie4_5-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    "exaone4-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    # glm4 (pre- and post-norms, q/k/v biases, interleaved RoPE over half of each head, fused
    # gate/up): met bit for bit on every table here (scalar, avx2, avxvnni, avx512)
    "glm4-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    # mistral3: YaRN x8 over 64 (log multiplier 1, ramp ends 4 / 0.5) and a query temperature of 0.3
    # stepping every 64 positions; bit for bit on avx2/avxvnni/avx512, scalar 353/354, top-10 0.016
    "mistral3-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    # gpt-oss (scripts/make_synth_gpt_oss.py): sinks, a 16-token window on the even layers, YaRN x8,
    # biased experts with the clamped SwiGLU; recorded by the AVX-512 build (extra buffer types off);
    # met to 1e-5 (354/354) on scalar, avx2 and avx512, 0.040 from the exact result as llama.cpp is
    "gpt-oss-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    # Mixtral (scripts/make_synth_mixtral.py): a llama file with 4 experts, 2 used, softmax routing
    # renormalised over the chosen; recorded by the AVX-512 build (extra buffer types off)
    "mixtral-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    # GLM-4.5 (scripts/make_synth_glm4moe.py): a dense first layer, sigmoid routing with a selection
    # bias, renormalised and scaled x2.5, a shared expert, partial NeoX RoPE, q/k head norms, a
    # NextN block left unrun; recorded by the AVX-512 build (extra buffer types off)
    "glm4moe-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    # Llama 4 (scripts/make_synth_llama4.py): a NoPE layer in 4 with the temperature, L2 q/k norms on
    # the RoPE layers, every 2nd layer one expert (input scaled by its sigmoid) plus a shared one;
    # recorded by the AVX-512 build (extra buffer types off, a full-size chunked cache)
    "llama4-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    # deepseek2 (scripts/make_synth_deepseek2.py): MLA with a q LoRA over a latent cache, YaRN x4
    # with DeepSeek's mscale in the scores, sigmoid routing with a selection bias in 4 groups of 2
    # experts (2 kept), a shared expert; recorded by the AVX-512 build (extra buffer types off);
    # met on scalar, avx2 and avx512; live (scripts/live_parity.py, 15 unseen sequences of 8-480
    # tokens): argmax 99.97% (one near-tie), top-10 < 1e-5 but for one sequence's 0.029
    "deepseek2-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    # qwen35 (scripts/make_synth_qwen35.py): three Gated DeltaNet layers (two value heads per q/k
    # head, conv kernel 4, the chunked delta rule over the 301-token prompt) and one gated attention
    # layer with partial RoPE; recorded by the AVX-512 build (extra buffer types off); met to 5e-6
    # (354/354) on avx512; the exact model sits 0.035 / 95.8% from llama.cpp
    "qwen35-q8_0": Bounds(0.99, 0.05),
    # qwen35moe (scripts/make_synth_qwen35moe.py): the same layers with 4 experts (2 used) and a
    # sigmoid-gated shared expert; met to 5e-6 (354/354) on avx512; the exact model sits 0.077 /
    # 91.8% from llama.cpp (near-tied expert choices flip under Q8_0)
    "qwen35moe-q8_0": Bounds(0.99, 0.05),
    # lfm2 (scripts/make_synth_lfm2.py): short convolutions (window 3) in 4 of 6 layers, attention
    # with q/k head norms in the others; recorded by the AVX-512 build (extra buffer types off);
    # met to 5e-6 (354/354) on avx512; llama.cpp and we sit 0.31 / 95% from the exact result
    # (B, C and x multiply: their activations' Q8_0 rounding compounds)
    "lfm2-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    # mamba2 (scripts/make_synth_mamba2.py): 3 Mamba-2 mixers (8 heads in 2 groups, state 16, a
    # 4-tap convolution); recorded by the AVX-512 build (extra buffer types off); met to 5e-6
    # (354/354) on avx512; llama.cpp and we sit 0.044 / 92% from the exact result
    "mamba2-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    # granitehybrid (scripts/make_synth_granitehybrid.py): 3 Mamba-2 layers and one attention layer,
    # Granite's four multipliers, dense MLPs; recorded by the AVX-512 build (extra buffer types off);
    # avx512: 5e-6 on the 12- and 41-token prompts, the 301-token one drifts to 0.009 (argmax 298/301,
    # near-ties of <= 0.011), as close to the exact result as llama.cpp (0.024 against its 0.025)
    "granitehybrid-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    # nemotron_h (scripts/make_synth_nemotron_h.py): 3 Mamba-2 layers, one unroped attention layer and
    # 2 squared-ReLU MLP layers, read from the per-layer head_count_kv / feed_forward_length; recorded
    # by the AVX-512 build (extra buffer types off); met to 5e-6 (354/354) on every ISA; the exact
    # model sits 0.074 / 96.6% from llama.cpp
    "nemotron_h-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    # nemotron_h_moe (scripts/make_synth_nemotron_h_moe.py): the same kinds of layer with 8 sigmoid-routed
    # squared-ReLU experts (2 used) and a shared expert in the MLP layers; met to 5e-6 (354/354) on every
    # ISA; the exact model sits 0.56 / 92.7% from llama.cpp (near-tied expert choices flip under Q8_0:
    # isolated positions 1.0 away, the rest about 0.1)
    "nemotron_h_moe-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    # falcon-h1 (scripts/make_synth_falcon_h1.py): 3 layers of attention and a Mamba-2 mixer side by
    # side (no ssm_norm in layer 1); recorded by the AVX-512 build (extra buffer types off); every ISA:
    # 5e-6 on the 12- and 41-token prompts, the 301-token one drifts to 0.019 (argmax 353/354, greedy
    # equal up to a near-tie at token 21); the exact model sits 0.147 / 92.9% from llama.cpp
    "falcon-h1-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    # qwen3next (scripts/make_synth_qwen3next.py): qwen35moe's shapes with beta and alpha from the
    # per-q/k-head grouped ssm_ba and each q/k head serving the value heads next to one another;
    # recorded by the AVX-512 build (extra buffer types off); met to 5e-6 (354/354) on scalar, avx2
    # and avx512; the exact model sits 0.16 / 91% from llama.cpp.  (Seeds 3080 and 3083 gave files
    # where both engines agree to 5e-6 but for sudden 0.04-0.6 jumps at a few late positions of the
    # 301-token prompt, as qwen35moe shows live; not an expert near-tie by the exact router's gaps)
    "qwen3next-q8_0": Bounds(0.99, 0.05),
    # lfm2moe (scripts/make_synth_lfm2moe.py): lfm2's layers, two dense then sigmoid-routed experts
    # (4, 2 used) chosen with exp_probs_b; recorded by the AVX-512 build (extra buffer types off);
    # met to 5e-6 (354/354) on scalar and avx512; the exact model sits 0.14 / 90% from llama.cpp
    "lfm2moe-q8_0": Bounds(QUANT_ARGMAX, 0.05),
    # granitehybrid-moe (scripts/make_synth_granitehybrid_moe.py): the Granite 4 hybrid with 4
    # experts (2 used, softmax renormalised) and an ungated shared expert in every layer; recorded
    # by the AVX-512 build (extra buffer types off); met to 5e-6 (354/354) on scalar and avx512;
    # the exact model sits 0.21 / 89.5% from llama.cpp
    "granitehybrid-moe-q8_0": Bounds(QUANT_ARGMAX, 0.05),
}
# The lattice types, quantized from llama-wide-bf16 and recorded with llama.cpp's
# AVX2 build by scripts/make_iq_synth.py (llama.cpp's AVX-512 build was not at hand).
# Measured on every ISA: argmax 347-351/354, top-10 <= 0.041, greedy equal up to
# near-ties of <= 0.012, and as close to the exact result as llama.cpp (0.029-0.057
# against its 0.028-0.070).
LATTICE = {f"llama-wide-{t}": Bounds(QUANT_ARGMAX, 0.05)
           for t in ("iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s")}
BOUNDS = {**FLOAT, **QUANT, **LATTICE}
MODELS = sorted(BOUNDS)

# Ours vs the exact result, relative to llama.cpp vs the exact result: at most
# twice llama.cpp's error or 0.02 more than it, whichever is larger.  Measured
# ratios over the ISAs: 0.59 to 1.55, and 1.87 for qwen3-q4_1 under the scalar
# kernels (0.033 vs llama.cpp's 0.018).  A wrong rope, norm or scale costs > 0.1.
EXACT_RATIO = 2.0
EXACT_MARGIN = 0.02
EXACT_ARGMAX_SLACK = 0.03   # measured: at most 1.4% below llama.cpp's agreement


def test_every_synthetic_model_has_bounds():
    on_disk = {p.stem for p in (DATA / "synth").glob("*.gguf")}
    assert on_disk == set(BOUNDS)


ISAS = available_isas()
BEST_ISA = ISAS[-1]


@lru_cache(maxsize=1)
def backend() -> Backend:
    return Backend(2)


@lru_cache(maxsize=None)
def runs(name: str, isa: str = BEST_ISA) -> tuple[list[dict], list[CaseRun]]:
    """The model over its golden prompts with one instruction set's kernels."""
    model = load(DATA / "synth" / f"{name}.gguf")
    cases = golden(DATA / "golden" / "synth" / f"{name}.json")
    with forced_isa(isa):
        return cases, [run_case(model, backend(), c["ids"], len(c["greedy"])) for c in cases]


@lru_cache(maxsize=None)
def exact(name: str) -> list[np.ndarray]:
    ref = Reference(DATA / "synth" / f"{name}.gguf")
    return [ref.forward(c["ids"]) for c in runs(name)[0]]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", MODELS)
def test_argmax_matches_llamacpp(name, isa):
    bounds = BOUNDS[name]
    cases, results = runs(name, isa)
    agreements = [compare(r, c) for r, c in zip(results, cases)]
    equal = np.concatenate([a.argmax_equal for a in agreements])
    assert equal.mean() >= bounds.argmax, f"{name}: argmax agrees at {equal.sum()}/{equal.size} positions"
    gaps = np.concatenate([a.tie_gaps for a in agreements])
    assert gaps.size == 0 or gaps.max() <= bounds.tie, f"{name}: a disagreement that is no near-tie: {gaps.max()}"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", MODELS)
def test_top_logits_match_llamacpp(name, isa):
    cases, results = runs(name, isa)
    worst = max(compare(r, c).top10_diff for r, c in zip(results, cases))
    assert worst <= BOUNDS[name].top10, f"{name}: top-10 logits differ by {worst}"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", MODELS)
def test_greedy_matches_llamacpp_until_a_near_tie(name, isa):
    cases, results = runs(name, isa)
    for r, c in zip(results, cases):
        a = compare(r, c)
        if a.greedy_match < len(c["greedy"]):
            assert a.greedy_gap <= BOUNDS[name].tie, (
                f"{name}: greedy differs at token {a.greedy_match} by {a.greedy_gap}, no near-tie")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", MODELS)
def test_as_close_to_exact_as_llamacpp(name, isa):
    cases, results = runs(name, isa)
    ours_err, cpp_err, ours_agree, cpp_agree = 0.0, 0.0, [], []
    for r, c, ref in zip(results, cases, exact(name)):
        top = np.asarray(c["top_ids"][:10])
        ours_err = max(ours_err, float(np.abs(r.logits[-1][top] - ref[-1][top]).max()))
        cpp_err = max(cpp_err, float(np.abs(np.asarray(c["top_logits"][:10]) - ref[-1][top]).max()))
        ours_agree.append(r.logits.argmax(axis=1) == ref.argmax(axis=1))
        cpp_agree.append(np.asarray(c["argmax"]) == ref.argmax(axis=1))
    assert ours_err <= max(EXACT_RATIO * cpp_err, cpp_err + EXACT_MARGIN), f"{name}: {ours_err} vs {cpp_err}"
    ours_rate, cpp_rate = np.concatenate(ours_agree).mean(), np.concatenate(cpp_agree).mean()
    assert ours_rate >= cpp_rate - EXACT_ARGMAX_SLACK, f"{name}: exact argmax {ours_rate} vs llama.cpp's {cpp_rate}"


def test_sliding_window_changes_the_result():
    """gemma2-q8_0 slides an 8-token window over its even layers; over the
    301-token prompt that must matter (else the parity above proves nothing
    about windows)."""
    cases, results = runs("gemma2-q8_0")
    model = load(DATA / "synth" / "gemma2-q8_0.gguf")
    assert [spec.window for spec in model.cache_layout()] == [8, 0, 8]
    _set_cfg(model, dataclasses.replace(model.cfg, sliding_window=1 << 20))
    unwindowed = run_case(model, backend(), cases[2]["ids"], 1)
    assert np.abs(unwindowed.logits - results[2].logits).max() > 0.5


def test_exaone4_window_changes_the_result():
    """exaone4-q8_0 slides an 8-token window over two layers in three; over the
    301-token prompt that must matter."""
    cases, results = runs("exaone4-q8_0")
    model = load(DATA / "synth" / "exaone4-q8_0.gguf")
    assert [s.window for s in model.cache_layout()][:6] == [8, 8, 0, 8, 8, 0]
    _set_cfg(model, dataclasses.replace(model.cfg, sliding_window=1 << 20))
    assert np.abs(run_case(model, backend(), cases[2]["ids"], 1).logits - results[2].logits).max() > 0.5


def test_gpt_oss_variants_are_far_from_llamacpp():
    """The exact gpt-oss with one piece wrong (sinks dropped, the window on the odd
    layers instead of the even ones, the SwiGLU unclamped) is far outside the
    bounds the engine meets, in its top-10 at the last position and in its argmax
    over the prompt's rows: the parity above tells each piece right from wrong."""
    cases, _ = runs("gpt-oss-q8_0")
    ref = Reference(DATA / "synth" / "gpt-oss-q8_0.gguf")
    bounds = BOUNDS["gpt-oss-q8_0"]
    ids = cases[2]["ids"]                        # 301 tokens: past the 16-token window
    x, pos = ref.t("token_embd.weight")[np.asarray(ids)], np.arange(len(ids))
    top = np.asarray(cases[2]["top_ids"][:10])
    for wrong in ({"sinks": False}, {"window_on_even": False}, {"clamp": False}):
        logits = ref.arch_gpt_oss(x, pos, **wrong)
        top10 = np.abs(logits[-1][top] - np.asarray(cases[2]["top_logits"][:10])).max()
        argmax = (logits.argmax(axis=1) == np.asarray(cases[2]["argmax"])).mean()
        assert top10 > 2 * bounds.top10 and argmax < bounds.argmax - 0.1, (wrong, top10, argmax)


QWEN35_VARIANTS = [("qwen35-q8_0", {"decay": False}), ("qwen35-q8_0", {"tiled_heads": False}),
                   ("qwen35moe-q8_0", {"decay": False}), ("qwen35moe-q8_0", {"tiled_heads": False}),
                   ("qwen35moe-q8_0", {"shared_gate": False}),
                   ("qwen3next-q8_0", {"decay": False}), ("qwen3next-q8_0", {"tiled_heads": True}),
                   ("qwen3next-q8_0", {"grouped_ba": False}), ("qwen3next-q8_0", {"shared_gate": False})]


@pytest.mark.parametrize(("name", "wrong"), QWEN35_VARIANTS)
def test_qwen35_variants_are_far_from_llamacpp(name, wrong):
    """The exact Qwen3.5 (dense, MoE) with the delta rule's decay left out, with value
    head h reading q/k head h // 2 instead of GGUF's tiled h % 2, or (MoE) the shared
    expert without its gate, is far outside the bounds (measured: top-10 2.3 / 2.2 and
    4.0 / 3.0 / 0.72 away, argmax 10-15% and 56% of the rows, where the exact models are
    0.035 / 95.8% and 0.077 / 91.8%).  Qwen3-Next the other way round (tiled h % 2 is wrong
    there), or with ssm_ba read as all betas then all alphas: top-10 3.6 / 2.7 / 1.5 / 2.8,
    argmax 8-57%, the exact model 0.16 / 91%."""
    bounds = BOUNDS[name]
    top10, rate = distance_over_cases(name, **wrong)
    assert top10 > 10 * bounds.top10 and rate < bounds.argmax - 0.3, (wrong, top10, rate)


@pytest.mark.parametrize("wrong", [{"interleaved": False}, {"fourth_turns": True}])
def test_qwen3vl_moe_rope_variants_are_far_from_llamacpp(wrong):
    """Qwen3-VL-MoE's text rope with the sections as runs of pairs (Qwen2-VL's M-RoPE) or
    with the fourth stream turned by the text position (NeoX rope) is outside the bounds
    (measured: top-10 0.15 / 0.19, argmax 91.2% / 87.3%; the exact model 0.024 / 98.9%)."""
    bounds = BOUNDS["qwen3vlmoe-q8_0"]
    top10, rate = distance_over_cases("qwen3vlmoe-q8_0", **wrong)
    assert top10 > 2 * bounds.top10 and rate < bounds.argmax, (wrong, top10, rate)


def distance_over_cases(name: str, **wrong) -> tuple[float, float]:
    """How far the exact model `name` (its architecture's reference, with `wrong`) is from
    llama.cpp's record: the largest top-10 difference over the prompts and the fraction of
    all positions whose argmax agrees."""
    cases, _ = runs(name)
    ref = Reference(DATA / "synth" / f"{name}.gguf")
    forward = getattr(ref, "arch_" + ref.w.arch.replace("-", "_"))
    top10, argmax = 0.0, []
    for case in cases:
        ids = np.asarray(case["ids"])
        logits = forward(ref.t("token_embd.weight")[ids], np.arange(len(ids)), **wrong)
        top = np.asarray(case["top_ids"][:10])
        top10 = max(top10, float(np.abs(logits[-1][top] - np.asarray(case["top_logits"][:10])).max()))
        argmax.append(logits.argmax(axis=1) == np.asarray(case["argmax"]))
    return top10, float(np.concatenate(argmax).mean())


def test_lfm2_variants_are_far_from_llamacpp():
    """The exact LFM2 with its convolution window a token short (the oldest tap
    dropped) or the C gate left out is far outside the bounds the engine meets, and
    farther from llama.cpp than the exact model is."""
    cases, _ = runs("lfm2-q8_0")
    ref = Reference(DATA / "synth" / "lfm2-q8_0.gguf")
    bounds = BOUNDS["lfm2-q8_0"]
    ids = cases[2]["ids"]
    x, pos = ref.t("token_embd.weight")[np.asarray(ids)], np.arange(len(ids))
    top = np.asarray(cases[2]["top_ids"][:10])

    def distance(**wrong) -> tuple[float, float]:
        logits = ref.arch_lfm2(x, pos, **wrong)
        top10 = np.abs(logits[-1][top] - np.asarray(cases[2]["top_logits"][:10])).max()
        return top10, (logits.argmax(axis=1) == np.asarray(cases[2]["argmax"])).mean()

    exact_top10, exact_argmax = distance()
    for wrong in ({"window_short": True}, {"gate_c": False}):
        top10, argmax = distance(**wrong)
        assert top10 > 10 * exact_top10 and top10 > 20 * bounds.top10, (wrong, top10)
        assert argmax < exact_argmax - 0.5, (wrong, argmax)


@pytest.mark.parametrize("wrong", [{"selection_bias": False}, {"renormalise": False}])
def test_lfm2moe_variants_are_far_from_llamacpp(wrong):
    """The exact LFM2-MoE choosing its experts without the exp_probs_b bias, or weighting
    them by their sigmoid scores without renormalising them, is far outside the bounds
    (measured: top-10 1.7 / 1.4 away, argmax 66% / 68%, where the exact model is 0.14 / 90%)."""
    bounds = BOUNDS["lfm2moe-q8_0"]
    top10, rate = distance_over_cases("lfm2moe-q8_0", **wrong)
    assert top10 > 10 * bounds.top10 and rate < bounds.argmax - 0.2, (wrong, top10, rate)


def test_mamba2_variants_are_far_from_llamacpp():
    """The exact Mamba-2 with the state's decay left out (exp(dt A) taken as 1) or its
    convolution window a token short is far outside the bounds the engine meets."""
    cases, _ = runs("mamba2-q8_0")
    ref = Reference(DATA / "synth" / "mamba2-q8_0.gguf")
    bounds = BOUNDS["mamba2-q8_0"]
    ids = cases[2]["ids"]
    x, pos = ref.t("token_embd.weight")[np.asarray(ids)], np.arange(len(ids))
    top = np.asarray(cases[2]["top_ids"][:10])
    for wrong in ({"decay": False}, {"window_short": True}):
        logits = ref.arch_mamba2(x, pos, **wrong)
        top10 = np.abs(logits[-1][top] - np.asarray(cases[2]["top_logits"][:10])).max()
        argmax = (logits.argmax(axis=1) == np.asarray(cases[2]["argmax"])).mean()
        assert top10 > 20 * bounds.top10 and argmax < 0.5, (wrong, top10, argmax)


def test_granitehybrid_variants_are_far_from_llamacpp():
    """The exact Granite 4 hybrid with its Mamba-2 decay left out or without the residual
    multiplier is far outside the bounds the engine meets."""
    cases, _ = runs("granitehybrid-q8_0")
    ref = Reference(DATA / "synth" / "granitehybrid-q8_0.gguf")
    bounds = BOUNDS["granitehybrid-q8_0"]
    ids = cases[2]["ids"]
    x, pos = ref.t("token_embd.weight")[np.asarray(ids)], np.arange(len(ids))
    top = np.asarray(cases[2]["top_ids"][:10])
    for wrong in ({"decay": False}, {"residual_scale": False}):
        logits = ref.arch_granitehybrid(x, pos, **wrong)
        top10 = np.abs(logits[-1][top] - np.asarray(cases[2]["top_logits"][:10])).max()
        argmax = (logits.argmax(axis=1) == np.asarray(cases[2]["argmax"])).mean()
        assert top10 > 5 * bounds.top10 and argmax < 0.5, (wrong, top10, argmax)


@pytest.mark.parametrize(("name", "wrong"), [("nemotron_h-q8_0", {"decay": False}),
                                             ("nemotron_h-q8_0", {"squared": False}),
                                             ("nemotron_h_moe-q8_0", {"decay": False}),
                                             ("nemotron_h_moe-q8_0", {"squared": False}),
                                             ("nemotron_h_moe-q8_0", {"probs_bias": False}),
                                             ("falcon-h1-q8_0", {"decay": False}),
                                             ("falcon-h1-q8_0", {"neox": False})])
def test_nemotron_h_and_falcon_h1_variants_are_far_from_llamacpp(name, wrong):
    """The exact Nemotron-H (dense, MoE) with its Mamba-2 decay left out, its MLPs' ReLU not
    squared or (MoE) the experts chosen without exp_probs_b, and the exact Falcon-H1 with the
    decay left out or interleaved instead of NeoX RoPE, are far outside the bounds (measured:
    top-10 3.9 / 2.7, 5.0 / 3.0 / 4.4 and 4.6 / 1.5 away, argmax 8% / 14%, 3% / 19% / 28% and
    2% / 48%, where the exact models are 0.074 / 96.6%, 0.56 / 92.7% and 0.147 / 92.9%)."""
    bounds = BOUNDS[name]
    exact_top10, exact_argmax = distance_over_cases(name)
    top10, argmax = distance_over_cases(name, **wrong)
    assert top10 > 20 * bounds.top10 and top10 > 5 * exact_top10, (wrong, top10)
    assert argmax < exact_argmax - 0.4, (wrong, argmax)


def test_nemotron_h_layers_are_what_the_per_layer_counts_say(tmp_path):
    """Mamba-2 where head_count_kv and feed_forward_length are both 0, attention where only
    the latter is, an MLP elsewhere; only the first two kinds keep cache entries.  The epsilon
    comes from attention.layer_norm_epsilon (the file has no RMS key).  A file whose counts
    contradict its tensors or one without an epsilon is refused."""
    model = load(DATA / "synth" / "nemotron_h-q8_0.gguf")
    assert model.cfg.kinds == ("ssm", "mlp", "ssm", "attention", "mlp", "ssm")
    assert model.cfg.cache_slots == (0, None, 1, 2, None, 3)
    assert [type(s) for s in model.cache_layout()] == [RecurrentSpec, RecurrentSpec, CacheSpec, RecurrentSpec]
    assert model.cfg.eps == pytest.approx(1e-5) and model.cfg.n_ff == 128 and model.cfg.head_dim == 16
    every_layer_attends = load(rewrite(tmp_path, "nemotron_h-q8_0",
                                       meta={"nemotron_h.attention.head_count_kv": (2, GGUFValueType.UINT32)}))
    with pytest.raises(ModelError, match="layer 0 of a nemotron_h model must hold only the attention sublayer"):
        every_layer_attends.cache_layout()
    with pytest.raises(ModelError, match="blk.1.ffn_up"):   # an MLP of length 0
        load(rewrite(tmp_path, "nemotron_h-q8_0", meta={"nemotron_h.feed_forward_length": DROP}))
    with pytest.raises(ModelError, match="layer_norm_epsilon"):
        load(rewrite(tmp_path, "nemotron_h-q8_0", meta={"nemotron_h.attention.layer_norm_epsilon": DROP}))


def test_nemotron_h_moe_reads_its_experts(tmp_path):
    """nemotron_h_moe runs through the nemotron_h model with experts in its MLP layers; the
    latent projections of Nemotron 3 Super and expert groups are refused."""
    model = load(DATA / "synth" / "nemotron_h_moe-q8_0.gguf")
    c = model.cfg
    assert c.kinds == ("ssm", "mlp", "attention", "ssm", "mlp")
    assert (c.n_expert, c.n_expert_used, c.n_ff_exp, c.n_ff_shexp) == (8, 2, 32, 64)
    assert c.norm_expert_weights and c.expert_weights_scale == pytest.approx(2.5)
    assert [b.moe is not None for b in model.layers] == [False, True, False, False, True]
    for key in ("moe_latent_size", "expert_group_count"):
        with pytest.raises(UnsupportedError, match=key.split("_")[0]):
            load(rewrite(tmp_path, "nemotron_h_moe-q8_0", meta={f"nemotron_h_moe.{key}": (8, GGUFValueType.UINT32)}))


def test_falcon_h1_layers_keep_attention_and_a_state(tmp_path):
    """Every Falcon-H1 layer keeps K/V (the first n_layer cache entries) and a Mamba-2 state
    (the next n_layer); ssm_norm is optional per layer; the MLP norm is the bare ffn_norm,
    which the file must have."""
    model = load(DATA / "synth" / "falcon-h1-q8_0.gguf")
    assert [type(s) for s in model.cache_layout()] == [CacheSpec] * 3 + [RecurrentSpec] * 3
    assert [b.mixer.ssm_norm is None for b in model.layers] == [False, True, False]
    with pytest.raises(ModelError, match="blk.1.ffn_norm"):
        load(rewrite(tmp_path, "falcon-h1-q8_0", drop=("blk.1.ffn_norm",)))
@pytest.mark.parametrize("wrong", [{"renormalise": False}, {"shared": False}, {"decay": False}])
def test_granitehybrid_moe_variants_are_far_from_llamacpp(wrong):
    """The exact Granite 4 hybrid with experts, their weights not renormalised over the
    chosen, the shared expert left out, or the Mamba-2 decay left out, is far outside the
    bounds (measured: top-10 1.0 / 0.63 / 2.4+ away, argmax 61% / 47% / < 10%, where the exact
    model is 0.21 / 89.5%)."""
    bounds = BOUNDS["granitehybrid-moe-q8_0"]
    top10, rate = distance_over_cases("granitehybrid-moe-q8_0", **wrong)
    assert top10 > 10 * bounds.top10 and rate < bounds.argmax - 0.2, (wrong, top10, rate)


def test_deepseek2_variants_are_far_from_llamacpp():
    """The exact DeepSeek-2 with one piece wrong (no YaRN mscale in the score scale,
    the absorbed head's width kv_lora_rank + n_rot as the scale's divisor instead of
    the query head's, the expert groups ignored, the selection bias ignored) is far
    from llama.cpp, much farther than the exact model itself.  (The exact model is
    not close to llama.cpp's quantized run: near-tied expert choices flip under Q8_0
    activations and later positions attend to the flipped rows, so its argmax agrees
    on 86% of the prompts' rows and its top-10 differ by up to 0.12; the engine, whose
    products round as llama.cpp's, meets the bounds above.)  Measured on the 41- and
    301-token prompts: exact 0.116 / 86%; the variants 2.1-3.0 / 11-54%."""
    cases, _ = runs("deepseek2-q8_0")
    ref = Reference(DATA / "synth" / "deepseek2-q8_0.gguf")

    def distance(**wrong) -> tuple[float, float]:
        top10, argmax = [], []
        for case in cases[1:]:
            ids = case["ids"]
            x, pos = ref.t("token_embd.weight")[np.asarray(ids)], np.arange(len(ids))
            logits = ref.arch_deepseek2(x, pos, **wrong)
            top = np.asarray(case["top_ids"][:10])
            top10.append(np.abs(logits[-1][top] - np.asarray(case["top_logits"][:10])).max())
            argmax.append(logits.argmax(axis=1) == np.asarray(case["argmax"]))
        return max(top10), np.concatenate(argmax).mean()

    exact_top10, exact_argmax = distance()
    for wrong in ({"mscale": False}, {"absorbed_width": True}, {"groups": False}, {"probs_bias": False}):
        top10, argmax = distance(**wrong)
        assert top10 > 10 * exact_top10 and argmax < exact_argmax - 0.25, (wrong, top10, argmax)


def test_deepseek2_cache_holds_the_latent_only():
    """A layer's cache row is kv_lora_rank + n_rot values with no V rows (V is read as
    the row's prefix), not full per-head keys and values."""
    model = load(DATA / "synth" / "deepseek2-q8_0.gguf")
    c = model.cfg
    assert [(s.k_dim, s.v_dim) for s in model.cache_layout()] == [(64 + 32, 0)] * 4
    full = c.n_head * (c.q_head_dim + c.v_head_dim)
    assert (c.kv_row, full) == (96, 384)   # a quarter of full K/V, per token and layer


def test_deepseek2_older_conversion_is_refused_by_name(tmp_path):
    """A file with the combined attn_kv_b (older converters) is refused with what to do,
    not with a missing-tensor error."""
    drop = tuple(f"blk.{i}.attn_{n}_b.weight" for i in range(4) for n in "kv")
    kv_b = {f"blk.{i}.attn_kv_b.weight": np.zeros((4 * (32 + 32), 64), np.float32) for i in range(4)}
    path = rewrite(tmp_path, "deepseek2-q8_0", drop=drop, add=kv_b)
    with pytest.raises(UnsupportedError, match="re-convert"):
        load(path)


def test_deepseek2_memory_estimate_counts_the_latent_row():
    """The server's estimate before loading (F16 rows) counts the latent + rope row once:
    4 layers x 96 values x 2 bytes; DeepSeek-V2-Lite's keys give 27 x 576 x 2 = 31,104 bytes
    a token, against 276,480 for full per-head K/V (16 heads x (192 + 128) values)."""
    from pyengine.server.models import _kv_bytes_per_cell
    meta = GGUFFile(DATA / "synth" / "deepseek2-q8_0.gguf").metadata
    assert _kv_bytes_per_cell(meta, "deepseek2") == 4 * 96 * 2
    lite = {"deepseek2.block_count": 27, "deepseek2.attention.head_count": 16, "deepseek2.embedding_length": 2048,
            "deepseek2.attention.head_count_kv": 1, "deepseek2.attention.key_length": 576,
            "deepseek2.attention.value_length": 512, "deepseek2.attention.kv_lora_rank": 512,
            "deepseek2.attention.key_length_mla": 192, "deepseek2.attention.value_length_mla": 128}
    assert _kv_bytes_per_cell(lite, "deepseek2") == 31104


def test_gpt_oss_window_on_the_even_layers():
    model = load(DATA / "synth" / "gpt-oss-q8_0.gguf")
    assert [spec.window for spec in model.cache_layout()] == [16, 0, 16, 0]


def far_from_llamacpp(name: str, wrong_logits) -> None:
    """The exact model with one piece wrong, wrong_logits(ref, x, pos) over the 301-token
    prompt, is far outside the bounds the engine meets: in its top-10 at the last
    position and in its argmax over the prompt's rows."""
    cases, _ = runs(name)
    ref = Reference(DATA / "synth" / f"{name}.gguf")
    bounds = BOUNDS[name]
    ids = cases[2]["ids"]
    logits = wrong_logits(ref, ref.t("token_embd.weight")[np.asarray(ids)], np.arange(len(ids)))
    top = np.asarray(cases[2]["top_ids"][:10])
    top10 = np.abs(logits[-1][top] - np.asarray(cases[2]["top_logits"][:10])).max()
    argmax = (logits.argmax(axis=1) == np.asarray(cases[2]["argmax"])).mean()
    assert top10 > 2 * bounds.top10 and argmax < bounds.argmax - 0.1, (top10, argmax)


def test_mixtral_runs_experts_and_renormalises():
    """mixtral-q8_0 is a llama file with experts: every layer binds them, and the
    exact model without renormalising the chosen experts' weights is far off."""
    model = load(DATA / "synth" / "mixtral-q8_0.gguf")
    assert model.cfg.n_expert == 4 and all(hasattr(b.mlp, "ffn_gate_inp") for b in model.layers)
    far_from_llamacpp("mixtral-q8_0", lambda ref, x, pos: ref.arch_llama(x, pos, renormalise=False))


def test_glm4moe_layers_and_variants():
    """glm4moe-q8_0 runs 3 of its 4 blocks (the NextN block stays unrun), the first
    dense, the others routed experts with a shared one; the exact model with one
    piece wrong (no selection bias, no routed scaling, no shared expert, the
    interleaved rope instead of NeoX's) is far off."""
    model = load(DATA / "synth" / "glm4moe-q8_0.gguf")
    assert model.cfg.n_layer == 3 and model.cfg.n_nextn == 1
    assert [type(b).__name__ for b in model.layers] == ["DenseBlock", "MoeBlock", "MoeBlock"]
    for wrong in ({"selection_bias": False}, {"routed_scale": False}, {"shared": False}, {"neox": False}):
        far_from_llamacpp("glm4moe-q8_0", lambda ref, x, pos: ref.arch_glm4moe(x, pos, **wrong))


def test_llama4_layers_and_variants():
    """llama4-q8_0 has experts on layers 1 and 3 and no rope on layer 3; the exact
    model with one piece wrong (no q/k L2 norm, rope on the NoPE layer, no shared
    expert) is far off."""
    model = load(DATA / "synth" / "llama4-q8_0.gguf")
    assert [type(b).__name__ for b in model.layers] == ["Block", "MoeBlock", "Block", "MoeBlock"]
    assert [model.cfg.uses_rope(i) for i in range(4)] == [True, True, True, False]
    keys = np.random.default_rng(3).standard_normal((6, 2, 16)).astype(np.float32)   # [T, Hkv, hd] numpy order
    moved = [shifted_keys(model, keys, layer) for layer in (2, 3)]
    assert np.abs(moved[0] - keys).max() > 0.1 and np.array_equal(moved[1], keys)   # the NoPE layer's stay
    for wrong in ({"kq_norm": False}, {"nope": False}, {"shared": False}):
        far_from_llamacpp("llama4-q8_0", lambda ref, x, pos: ref.arch_llama4(x, pos, **wrong))


def shifted_keys(model, keys: np.ndarray, layer: int, delta: int = 5) -> np.ndarray:
    """Keys [n, Hkv, hd] of `layer` after a context shift of `delta` positions."""
    from pyengine.ml.context import Context

    ctx = Context(backend())
    k = ctx.input(keys, "k")                                            # [hd, Hkv, T]
    out = ctx.cont(model.shift_keys(ctx, k, ctx.input(np.full(len(keys), delta, np.int32), "pos"), layer))
    ctx.set_output(out)
    ctx.compute()
    return ctx.read(out).reshape(keys.shape)


def test_llama4_temperature_steps_past_the_chunk():
    """The NoPE layers' query factor: 1 up to position 8190, then
    log(floor((pos + 1) / 8192) + 1) * 0.1 + 1 (llama.cpp's offset of 1)."""
    from pyengine.models.llama4 import temperature_table

    table = temperature_table(3 * 8192)
    pos = np.array([0, 8190, 8191, 16382, 16383, 24575])
    want = np.log(np.floor((pos + 1.0) / 8192) + 1.0) * 0.1 + 1.0
    np.testing.assert_allclose(table[pos], want, rtol=1e-7)
    assert table[8190] == 1.0 and table[8191] > 1.0


def small_chunks(monkeypatch, chunk: int = 16):
    """llama4-q8_0 with its RoPE layers' attention chunk made `chunk` tokens (llama.cpp
    fixes 8192, which tests/data/golden/synth/llama4-long-q8_0.json reaches)."""
    from pyengine.models import llama4

    monkeypatch.setattr(llama4, "CHUNK", chunk)
    return load(DATA / "synth" / "llama4-q8_0.gguf")


def test_llama4_attends_within_chunks(monkeypatch):
    """With 16-token chunks, a 120-token prompt: the logits near the exact model's with
    the same chunks (measured: per position at most 0.049 off in the median, argmax
    95%: the one-expert routing has near-ties), far from it without them (2.3, 25%)."""
    model = small_chunks(monkeypatch)
    assert [(s.window, s.chunked) for s in model.cache_layout()] == [(16, True)] * 3 + [(0, False)]
    ids = runs("llama4-q8_0")[0][2]["ids"][:120]
    ours = prompt_logits(Forward(model, backend(), KVCache(model.cache_layout(), 256)), ids)
    ref = Reference(DATA / "synth" / "llama4-q8_0.gguf")
    x, pos = ref.t("token_embd.weight")[np.asarray(ids)], np.arange(len(ids))
    for chunk, near in ((16, True), (8192, False)):
        exact = ref.arch_llama4(x, pos, chunk=chunk)
        off = np.median(np.abs(ours - exact).max(axis=1)[16:])
        argmax = (ours.argmax(axis=1) == exact.argmax(axis=1))[16:].mean()
        assert (off < 0.1 and argmax >= 0.9) if near else (off > 1.0 and argmax < 0.5), (chunk, off, argmax)
    assert np.array_equal(ours[:16], prompt_logits(Forward(model, backend(), KVCache(model.cache_layout(), 256)),
                                                   ids[:16]))


def test_llama4_chunks_free_their_cells(monkeypatch):
    """The chunked group frees the cells of past chunks (its ring of 2 x (16 + 4) + 8
    cells for 3 prompts of up to 100 tokens and up to 60 generated each): the same
    logits and greedy tokens as a chunked group as large as the context."""
    model = small_chunks(monkeypatch)
    tok = Tokenizer.from_gguf(GGUFFile(DATA / "synth" / "llama4-q8_0.gguf"))
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, 500, n).tolist() for n in (100, 37, 61)]
    outputs = {}
    for full in (True, False):
        engine = Engine(model, tok, backend(), n_ctx=256, n_batch=8, n_parallel=2, swa_margin=4, swa_full=full)
        try:
            chunked = next(g for g in engine.cache.attention.groups if g.chunked)
            assert chunked.n_cells == (512 if full else 2 * (16 + 4) + 8)
            logits = engine.submit(prompts[0], max_tokens=0, all_logits=True).result().logits
            handles = [engine.submit(p, SamplingOptions(temperature=0.0, repeat_penalty=1.0), max_tokens=60)
                       for p in prompts]
            outputs[full] = (logits, [h.result().tokens for h in handles])
        finally:
            engine.close()
    assert np.array_equal(outputs[True][0], outputs[False][0])
    assert outputs[True][1] == outputs[False][1]
    assert sum(len(t) for t in outputs[True][1]) > 100      # (one prompt's continuation ends early)


def test_llama4_past_the_first_chunk_as_llama_cpp(monkeypatch):
    """8320 tokens (scripts/make_synth_llama4.py --long): at the last 160 positions, 128
    of them past llama.cpp's first chunk of 8192, the top 10 within 0.05 of llama.cpp's
    and the argmax as its (measured 0.035, 158 of 160); with one chunk for everything,
    past 8192 the top 10 is 3.95 off and the argmax 53%."""
    from pyengine.models import llama4

    rec = json.loads((DATA / "golden" / "synth" / "llama4-long-q8_0.json").read_text())
    top, want = np.asarray(rec["top_ids"]), np.asarray(rec["top_logits"])
    real = llama4.CHUNK
    past = real - rec["first_recorded"]                        # the first recorded row past the chunk
    for chunk in (real, 1 << 20):
        monkeypatch.setattr(llama4, "CHUNK", chunk)
        model = load(DATA / "synth" / "llama4-q8_0.gguf")
        # make_synth_llama4.long_sequence's tokens
        ids = np.random.default_rng(rec["seed"]).integers(3, model.cfg.n_vocab, rec["n_tokens"]).tolist()
        ours = prompt_logits(Forward(model, backend(), KVCache(model.cache_layout(), rec["n_tokens"])), ids)
        ours = ours[rec["first_recorded"]:]
        top10 = np.abs(np.take_along_axis(ours, top, axis=1) - want).max(axis=1)
        argmax = (ours.argmax(axis=1) == np.asarray(rec["argmax"])).mean()
        if chunk == real:
            assert top10.max() <= 0.05 and argmax >= 0.975, (top10.max(), argmax)
        else:
            assert top10[:past].max() <= 0.05 and np.median(top10[past:]) > 0.3, np.median(top10[past:])


def phi3_longrope(tmp_path):
    """phi3-q5_0 plus LongRoPE factor tensors, original context 64, attn_factor 1.19."""
    rng = np.random.default_rng(7)
    pairs = 8                                                  # rope.dimension_count 16 / 2
    return rewrite(tmp_path, "phi3-q5_0",
                   add={"rope_factors_short.weight": 1 + rng.random(pairs),
                        "rope_factors_long.weight": 1 + 8 * rng.random(pairs)},
                   meta={"phi3.rope.scaling.original_context_length": (64, GGUFValueType.UINT32),
                         "phi3.rope.scaling.attn_factor": (1.19, GGUFValueType.FLOAT32)})


def test_phi3_longrope_factors(tmp_path):
    """Phi-3 with LongRoPE factors (phi3-q5_0 plus factor tensors and keys): the
    short set while the context fits rope.scaling.original_context_length, the
    long set beyond it, cos/sin scaled by rope.scaling.attn_factor; checked
    against the exact reference, which chooses the same way."""
    path = phi3_longrope(tmp_path)
    model, ref = load(path), Reference(path)
    ids = runs("phi3-q5_0")[0][1]["ids"]                       # 41 tokens
    ours = {}
    for n_ctx in (48, 128):                                    # within / beyond the original 64
        ours[n_ctx] = prompt_logits(Forward(model, backend(), KVCache(model.cache_layout(), n_ctx)), ids)
        ref.n_ctx = n_ctx
        # phi3-q5_0 without factors: ours vs exact at most 0.071 over all positions
        assert np.abs(ours[n_ctx] - ref.forward(ids)).max() <= 0.15
    assert np.abs(ours[48] - ours[128]).max() > 0.5
    assert np.abs(ours[48] - runs("phi3-q5_0")[1][1].logits).max() > 0.5


def test_phi3_longrope_follows_the_context_per_sequence(tmp_path):
    """llama.cpp picks LongRoPE's set by the context one sequence may fill (n_ctx_seq,
    llama_model::get_rope_factors), not by the cache's size: 4 sequences of up to 48
    tokens in 192 cells rope with the short set (the original context is 64), as one
    sequence in 48 cells does, in a graph (Forward's n_ctx_seq, the engine's n_ctx)
    and in a context shift (KeyRotator's, which must be told it)."""
    path = phi3_longrope(tmp_path)
    model = load(path)
    assert model.rope_factors(64) is model.rope_factors_short
    assert model.rope_factors(65) is model.rope_factors_long
    ids = runs("phi3-q5_0")[0][1]["ids"]                       # 41 tokens

    def logits(n_cells, n_ctx_seq=None):
        return prompt_logits(Forward(model, backend(), KVCache(model.cache_layout(), n_cells), n_ctx_seq=n_ctx_seq),
                             ids)

    lone, wide = logits(48), logits(4 * 48)
    assert np.abs(lone - wide).max() > 0.5                     # the whole cache: the long set
    assert np.array_equal(logits(4 * 48, n_ctx_seq=48), lone)
    gguf = GGUFFile(path)
    engine = Engine(model, Tokenizer.from_gguf(gguf), backend(), n_ctx=48, n_parallel=4, background=False)
    try:                                                       # the engine tells both its n_ctx
        assert np.array_equal(prompt_logits(engine.forward, ids), lone)
        assert engine.rotator.n_ctx_seq == 48
    finally:
        engine.close()
    cache = KVCache(model.cache_layout(), 48)
    Forward(model, backend(), cache)(np.array(ids[:12], np.int32), np.arange(12), np.zeros(12), np.array([11]))
    with pytest.raises(ModelError, match="context per sequence"):
        cache.shift(0, 2, 3, KeyRotator(model, backend()))


@pytest.mark.parametrize("variant", ["qwen3-q4_1", "gemma2-q8_0", "smollm3-q8_0", "llama-yarn-q8_0",
                                     "ernie4_5-q8_0", "hunyuan-dense-q8_0", "exaone4-q8_0", "glm4-q8_0",
                                     "mistral3-q8_0", "gpt-oss-q8_0", "deepseek2-q8_0", "mixtral-q8_0", "glm4moe-q8_0",
                                     "llama4-q8_0", "qwen3vlmoe-q8_0",
                                     "phi3-longrope-short", "phi3-longrope-long"])
def test_context_shift_rerotates_keys_like_a_fresh_run(tmp_path, variant):
    """After a context shift the moved keys of layer 0 (which depend only on the
    token and its position) must equal those of a fresh run at the new positions:
    the re-rotation uses each layer's rope (Gemma's per-layer base, Phi-3's
    LongRoPE factors without a second attn_factor; M-RoPE's fourth stream, which
    text holds at 0, left unturned: turned by the shift too it lands 0.15 away)."""
    path = phi3_longrope(tmp_path) if variant.startswith("phi3") else DATA / "synth" / f"{variant}.gguf"
    n_cells = 128 if variant.endswith("long") else 32          # beyond / within the original 64
    model = load(path)
    tokens = np.array([5, 17, 42, 99, 7, 300, 12, 8, 64, 65, 3, 4], np.int32)
    n, keep, drop = len(tokens), 2, 3

    def run(tok):
        cache = KVCache(model.cache_layout(), n_cells)
        Forward(model, backend(), cache)(tok, np.arange(len(tok)), np.zeros(len(tok)), np.array([len(tok) - 1]))
        return cache

    def keys(cache, cells):
        return cache.k[0][cells].view(np.float16).astype(np.float32)

    shifted = run(tokens)
    before = keys(shifted, np.arange(keep + drop, n))
    shifted.shift(0, keep, drop, KeyRotator(model, backend(), n_ctx_seq=n_cells))
    kept = np.r_[tokens[:keep], tokens[keep + drop:]]
    fresh = run(kept)
    got = keys(shifted, shifted.layer_group[0].cells.cells_of(0))
    want = keys(fresh, np.arange(len(kept)))
    assert np.abs(got - want).max() <= 0.02 * max(1.0, np.abs(want).max())
    assert np.abs(before - want[keep:]).max() > 10 * np.abs(got - want).max()


def _set_cfg(module, cfg) -> None:
    """Give a bound model (and every sub-module) another config."""
    module.cfg = cfg
    for value in vars(module).values():
        for child in value if isinstance(value, list) else [value]:
            if hasattr(child, "cfg"):
                _set_cfg(child, cfg)
