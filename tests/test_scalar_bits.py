"""The scalar reference kernels compute the canonical arithmetic (issue #25):
for every block type, the same bits as the AVX2 table on a lone row (path 0).

Activation quantizers (to Q8_0, Q8_1, Q8_K, F16, BF16), dequantizers and dot
products are compared bit for bit on random blocks (every code pattern, scales
moderate and extreme) over 1 to 40 blocks; and whole models (SmolLM2 and
synthetic ones) give the same logits with PYENGINE_ISA=scalar as with avx2.
x86-64 hosts with AVX2 only: the AVX2 table is the yardstick."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import gguf
import numpy as np
import pytest
from conftest import CHILD_CWD, SYNTH, available_isas, child_env, forced_isa

from pyengine import _core

T = gguf.GGMLQuantizationType

pytestmark = pytest.mark.skipif("avx2" not in available_isas(), reason="the AVX2 table is the yardstick")

FLOAT_TYPES = [T.F32, T.F16, T.BF16]
LEGACY_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL, T.MXFP4]
K_TYPES = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS]
LATTICE_TYPES = [T.IQ1_S, T.IQ1_M, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S]
BLOCK_TYPES = LEGACY_TYPES + K_TYPES + LATTICE_TYPES
BLOCK_COUNTS = range(1, 41)

# byte offsets of each block's f16 fields (IQ1_M keeps its scale in nibbles)
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.IQ4_NL: [0], T.MXFP4: [],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.IQ4_XS: [0],
    T.IQ1_S: [0], T.IQ1_M: [], T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0], T.IQ3_XXS: [0], T.IQ3_S: [0],
}
# byte offsets of each block's E8M0 exponents
E8M0_FIELDS = {T.MXFP4: [0]}


def same_bits(a, b) -> bool:
    """Equal bit for bit, any NaN matching any NaN."""
    a, b = np.asarray(a, np.float32).ravel(), np.asarray(b, np.float32).ravel()
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32)))


def f16_scales(rng, count: int, extreme: bool) -> np.ndarray:
    """f16 bit patterns: moderate values, or any finite one (subnormals to 65504)."""
    if not extreme:
        return rng.uniform(-0.05, 0.05, count).astype(np.float16).view(np.uint16)
    bits = rng.integers(0, 1 << 16, count, dtype=np.uint32).astype(np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] &= 0xFBFF
    return bits


def weight_blocks(qtype: T, nblocks: int, rng, extreme: bool) -> np.ndarray:
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, (nblocks, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        raw[:, off:off + 2] = f16_scales(rng, nblocks, extreme).view(np.uint8).reshape(nblocks, 2)
    for off in E8M0_FIELDS.get(qtype, []):   # moderate: scales 2^-10 .. 2^2; extreme: any
        raw[:, off] = rng.integers(0, 256, nblocks) if extreme else rng.integers(118, 131, nblocks)
    if qtype == T.IQ1_M:  # the f16 in the top nibbles of the four scale words
        d = f16_scales(rng, nblocks, extreme)
        words = raw[:, 48:56].copy().view(np.uint16)
        for k in range(4):
            words[:, k] = (words[:, k] & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12)
        raw[:, 48:56] = words.view(np.uint8)
    return raw.ravel()


def activation_codes(rng, count: int, kind: str) -> np.ndarray:
    """int8 codes as the quantizers give them (never -128): random, or all at
    full magnitude with random signs."""
    if kind == "full":
        return (np.where(rng.random(count) < 0.5, -127, 127)).astype(np.int8)
    return rng.integers(-127, 128, count).astype(np.int8)


def activation_blocks(qtype: int, n: int, rng, extreme: bool, kind: str) -> np.ndarray:
    """n elements of the partner type qtype, raw: random codes, scales."""
    if qtype == T.Q8_K:
        nb = n // 256
        codes = activation_codes(rng, n, kind).reshape(nb, 256)
        d = (10.0 ** rng.uniform(-30, 30, nb) if extreme else rng.uniform(1e-4, 0.05, nb)) * rng.choice([-1, 1], nb)
        bsums = codes.reshape(nb, 16, 16).astype(np.int16).sum(axis=2).astype(np.int16)
        parts = [d.astype(np.float32).reshape(nb, 1).view(np.uint8), codes.view(np.uint8), bsums.view(np.uint8)]
        return np.concatenate(parts, axis=1).ravel()
    nb = n // 32
    parts = [f16_scales(rng, nb, extreme).reshape(nb, 1).view(np.uint8)]
    if qtype == T.Q8_1:
        parts.append(f16_scales(rng, nb, extreme).reshape(nb, 1).view(np.uint8))
    parts.append(activation_codes(rng, n, kind).reshape(nb, 32).view(np.uint8))
    return np.concatenate(parts, axis=1).ravel()


def avx2_and_ref(kernel, *args):
    """kernel(*args) on the AVX2 table and on the reference."""
    with forced_isa("avx2"):
        return kernel(*args, reference=False), kernel(*args, reference=True)


# ---- dot products ------------------------------------------------------------------

@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_block_dot_products_give_avx2s_bits(qtype):
    rng = np.random.default_rng(int(qtype))
    partner = _core.vec_dot_type(int(qtype))
    bs = gguf.GGML_QUANT_SIZES[qtype][0]
    for nblocks in BLOCK_COUNTS:
        n = nblocks * bs
        for extreme in (False, True):
            for kind in ("random", "full"):
                w = weight_blocks(qtype, nblocks, rng, extreme)
                a = activation_blocks(partner, n, rng, extreme, kind)
                fast, ref = avx2_and_ref(_core.vec_dot_blocks, int(qtype), w, a, n)
                assert same_bits(fast, ref), (qtype.name, nblocks, extreme, kind, fast, ref)


FLOAT_LENGTHS = [1, 2, 7, 8, 31, 32, 33, 63, 64, 65, 96, 100, 255, 256, 257, 1000, 1280]


def float_row(qtype: T, x: np.ndarray) -> np.ndarray:
    return _core.quantize(int(qtype), x.astype(np.float32), reference=True)


@pytest.mark.parametrize("qtype", FLOAT_TYPES, ids=lambda t: t.name)
def test_float_dot_products_give_avx2s_bits(qtype):
    rng = np.random.default_rng(5)
    for n in FLOAT_LENGTHS:
        for scale in (1.0, 1e-20, 1e15):
            w = float_row(qtype, rng.standard_normal(n) * scale)
            a = float_row(qtype, rng.standard_normal(n) * scale)
            fast, ref = avx2_and_ref(_core.vec_dot_blocks, int(qtype), w, a, n)
            assert same_bits(fast, ref), (qtype.name, n, scale, fast, ref)


def test_row_dot_products_quantize_like_avx2():
    """The entry that quantizes float activations first (pe_vec_dot_ref) gives
    the AVX2 table's result: the quantizer and the product together."""
    rng = np.random.default_rng(9)
    for qtype in BLOCK_TYPES:
        bs = gguf.GGML_QUANT_SIZES[qtype][0]
        for nblocks in (1, 3, 8):
            n = nblocks * max(bs, 32)
            w = weight_blocks(qtype, n // bs, rng, False)
            x = rng.standard_normal(n).astype(np.float32)
            fast, ref = avx2_and_ref(_core.vec_dot, int(qtype), w, x)
            assert same_bits(fast, ref), (qtype.name, nblocks)


# ---- activation quantizers -----------------------------------------------------------

def special_rows(n: int) -> list[np.ndarray]:
    """Rows next to every edge the quantizers have: zeros, ties (amax 127 makes
    the scale 1), signed zeros, subnormals, huge values, inf and NaN."""
    rows = [np.zeros(n), -np.zeros(n)]
    ties = np.resize(np.array([127.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -126.5, 0.25]), n)
    rows += [ties, ties * 2.0 ** -20, ties * 2.0 ** 100]
    rows.append(np.resize(np.array([1e-40, -3e-42, 0.0, 1e-45]), n))
    rows.append(np.resize(np.array([3e38, -3.4e38, 1.0, -1e30]), n))
    for bad in (np.inf, -np.inf, np.nan):
        row = np.linspace(-1, 1, n)
        row[::37] = bad
        rows.append(row)
    return [r.astype(np.float32) for r in rows]


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q8_1, T.Q8_K, T.F16, T.BF16], ids=lambda t: t.name)
def test_activation_quantizers_give_avx2s_bits(qtype):
    rng = np.random.default_rng(3)
    bs = 256 if qtype == T.Q8_K else 32
    rows = [rng.standard_normal(k * bs).astype(np.float32) * s for k in (1, 2, 5, 40) for s in (1, 1e-30, 1e30)]
    rows += special_rows(4 * bs)
    with np.errstate(invalid="ignore", over="ignore"):
        for x in rows:
            fast, ref = avx2_and_ref(_core.quantize, int(qtype), x)
            assert np.array_equal(fast, ref), (qtype.name, x[:8])


# ---- dequantizers ---------------------------------------------------------------------

@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_dequantizers_give_avx2s_bits(qtype):
    rng = np.random.default_rng(11)
    bs = gguf.GGML_QUANT_SIZES[qtype][0]
    for nblocks in (1, 2, 7, 40):
        for extreme in (False, True):
            w = weight_blocks(qtype, nblocks, rng, extreme)
            fast, ref = avx2_and_ref(_core.dequantize, int(qtype), w, nblocks * bs)
            assert same_bits(fast, ref), (qtype.name, nblocks, extreme)


@pytest.mark.parametrize("qtype", FLOAT_TYPES + [T.Q8_K], ids=lambda t: t.name)
def test_float_and_q8_K_dequantizers_give_avx2s_bits(qtype):
    rng = np.random.default_rng(12)
    if qtype == T.Q8_K:
        data = activation_blocks(T.Q8_K, 256 * 5, rng, True, "random")
        n = 256 * 5
    else:
        n = 1000
        data = rng.integers(0, 256, n * gguf.GGML_QUANT_SIZES[qtype][1], dtype=np.uint8)
    fast, ref = avx2_and_ref(_core.dequantize, int(qtype), data, n)
    assert same_bits(fast, ref), qtype.name


# ---- whole models --------------------------------------------------------------------

# a child process per table: PYENGINE_ISA picks it at import
CHILD = """
import sys, numpy as np
from pyengine import LLM, _core
assert _core.isa() == sys.argv[2], _core.isa()
out = {}
for i, path in enumerate(sys.argv[3:]):
    out[f"m{i}"] = LLM(path, n_ctx=32, n_threads=2).forward_logits([1, 5, 17, 42, 99, 7, 3, 250, 11, 64])
np.savez(sys.argv[1], **out)
"""

SYNTH_MODELS = ["llama-wide-q4_0.gguf", "llama-bpe-q5_1-tied.gguf", "llama-wide-q8_0.gguf", "llama-wide-iq4_nl.gguf",
                "llama-wide-q2_k.gguf", "llama-wide-q3_k_s.gguf", "llama-wide-q4_k_s.gguf", "llama-wide-q6_k.gguf",
                "llama-wide-iq4_xs.gguf", "llama-wide-iq2_xs.gguf", "llama-wide-iq1_m.gguf", "llama-f16.gguf",
                "llama-wide-bf16.gguf", "llama-f32-gqa1.gguf"]


def logits_with(tmp_path, isa: str, models: list) -> dict:
    result = tmp_path / f"{isa}.npz"
    run = subprocess.run([sys.executable, "-c", CHILD, str(result), isa, *map(str, models)],
                         env=child_env(PYENGINE_ISA=isa), cwd=CHILD_CWD, capture_output=True, text=True, timeout=900,
                         check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return dict(np.load(result))


def assert_same_logits(tmp_path, models: list) -> None:
    """The scalar table's logits (and AVX-512's, where the CPU has it) are AVX2's."""
    avx2 = logits_with(tmp_path, "avx2", models)
    for isa in ["scalar"] + (["avx512"] if "avx512" in available_isas() else []):
        other, differ = logits_with(tmp_path, isa, models), {}
        for i, model in enumerate(models):
            s, a = other[f"m{i}"], avx2[f"m{i}"]
            if not np.array_equal(s.view(np.uint32), a.view(np.uint32)):
                differ[pathlib.Path(model).name] = float(np.abs(s - a).max())
        assert not differ, f"{isa} logits differ from AVX2's (max |difference|): {differ}"


# Whole models: beyond the block kernels above, this holds the float vector kernels
# (cpu/vec.c: attention's F16 products, softmax, norms) and the tiles a prompt takes
# (which give vec_dot's bits) to the same arithmetic on both tables.
def test_synthetic_models_scalar_logits_are_avx2s(tmp_path):
    assert_same_logits(tmp_path, [SYNTH / m for m in SYNTH_MODELS])


def test_smollm2_scalar_logits_are_avx2s(tmp_path, smollm2_path):
    assert_same_logits(tmp_path, [smollm2_path])
