"""The float kernels (csrc/cpu/vec.c) and the row-wise ops give the same bits on every
instruction set: each kernel has one order of operations, which the scalar table writes out
and the AVX2 and AVX-512 tables follow (16 lanes, folds by halves, one exp).  NEON: the x86
results, recorded, are checked bit for bit by tests/c/neon_vec_check.c under qemu."""

from __future__ import annotations

import pathlib
import struct
import subprocess
import sys

import numpy as np
import pytest
from conftest import CHILD_CWD, available_isas, child_env, forced_isa

from pyengine import _core
from pyengine.ml.context import ROPE_NEOX, ROPE_NORMAL, Backend, Context
from pyengine.store import resolve_model

ROOT = pathlib.Path(__file__).resolve().parents[1]
ISAS = [isa for isa in available_isas() if not isa.startswith("neon")]
LENGTHS = [*range(1, 70), 95, 127, 128, 129, 191, 255, 256, 257, 299, 300]
# exp_sum's, silu's and the conversions' edges: NaN, infinities, results that overflow,
# underflow to subnormals or to zero, signed zeros
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 88.7, 89.0, -87.0, -90.0, -100.0, -103.5, -104.0,
                     -150.0, 200.0, -200.0, 1e-40, -1e-40, 65504.0, 65520.0, 6e-8, 3e-8, -65519.0], np.float32)


def bits(a) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype == np.float64:
        return a.view(np.uint64)
    return a.view(np.uint32) if a.dtype == np.float32 else a.view(np.uint16)


def per_isa(fn) -> dict:
    """fn() under each table, its results as bits."""
    out = {}
    for isa in ISAS:
        with forced_isa(isa):
            out[isa] = [bits(np.asarray(r).copy()) for r in fn()]
    return out


def assert_same_bits(results: dict, what: str) -> None:
    first = next(iter(results))
    for isa, got in results.items():
        for i, (a, b) in enumerate(zip(results[first], got)):
            assert np.array_equal(a, b), f"{what}: {isa} differs from {first} in result {i}"


def inputs(n: int, seed: int, special: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed * 1000 + n)
    x = (rng.standard_normal(n) * rng.choice([0.5, 4.0, 30.0])).astype(np.float32)
    if special:
        at = rng.choice(n, size=min(n, 1 + n // 8), replace=False)
        x[at] = rng.choice(SPECIALS, size=at.size)
    return x, rng.standard_normal(n).astype(np.float32)


ELEMENTWISE = ["exp_sum", "max", "max_nan", "scale_max", "sum_sq", "silu_mul", "gelu_mul", "scale_round_f16",
               "f32_to_f16"]


def kernel_call(name: str, x: np.ndarray, u: np.ndarray):
    scalar = {"exp_sum": float(np.nanmax(np.where(np.isinf(x), np.nan, x), initial=0.0)), "scale_max": 0.37,
              "scale_round_f16": 0.3}.get(name, 0.0)
    return _core.vec_kernel(name, x, u, scalar)


def test_there_are_tables_to_compare():
    assert len(ISAS) >= 2 and ISAS[0] == "scalar", ISAS


def test_lanes_is_one_value_for_every_table():
    lanes = set()
    for isa in ISAS:
        with forced_isa(isa):
            lanes.add(_core.attn_lanes())
    assert lanes == {16}


@pytest.mark.parametrize("name", ELEMENTWISE)
@pytest.mark.parametrize("special", [False, True])
def test_elementwise_kernels_give_the_same_bits(name, special):
    for n in LENGTHS:
        x, u = inputs(n, 1, special)
        if name == "exp_sum" and special:
            x = np.where(np.isnan(x), -np.inf, x)   # softmax scores: -inf for masked slots, no NaN
        results = per_isa(lambda: [r for r in kernel_call(name, x, u) if r is not None])
        assert_same_bits(results, f"{name} n={n}")


def test_f16_to_f32_gives_the_same_bits_for_every_half():
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    results = per_isa(lambda: [_core.vec_kernel("f16_to_f32", every)[0]])
    assert_same_bits(results, "f16_to_f32")


def test_exp_is_accurate():
    """The one exp (vec_math.h's pe_expf) is an exp: within 3 ulp (2.2 measured) from where it
    underflows to where it overflows."""
    x = np.linspace(-103, 88.7, 100003, dtype=np.float32)
    with forced_isa(ISAS[-1]):
        y, _ = _core.vec_kernel("exp_sum", x, None, 0.0)
    want = np.exp(x.astype(np.float64))
    assert np.all(np.abs(y - want) <= 3 * np.spacing(want.astype(np.float32)))
    scores = x[x <= 0]   # softmax's range: the sum is right too
    _, total = _core.vec_kernel("exp_sum", scores, None, 0.0)
    assert abs(total - want[x <= 0].sum()) <= 1e-6 * want[x <= 0].sum()


def half_rows(rng, rows: int, n: int) -> np.ndarray:
    return rng.standard_normal((rows, n)).astype(np.float16).view(np.uint16)


@pytest.mark.parametrize("nacc", [1, 4])
def test_score_products_give_the_same_bits(nacc):
    rng = np.random.default_rng(7)
    for n in [1, 7, 16, 33, 64, 80, 96, 128, 130, 192, 256, 300]:
        for nx, ny in [(1, 1), (2, 3), (3, 4), (4, 4), (4, 1)]:
            x = rng.standard_normal((nx, n)).astype(np.float16).astype(np.float32)
            y = half_rows(rng, ny, n)
            results = per_isa(lambda: [_core.attn_scores_f16(x, y, nacc)])
            assert_same_bits(results, f"scores n={n} {nx}x{ny} nacc={nacc}")


def probabilities(rng, nh: int, n: int) -> np.ndarray:
    p = rng.random((nh, n)).astype(np.float32)
    p[rng.random((nh, n)) < 0.2] = 0.0   # masked slots
    return (p / np.maximum(p.sum(axis=1, keepdims=True), 1.0)).astype(np.float16).astype(np.float32)


@pytest.mark.parametrize("nacc", [1, 4])
def test_value_products_give_the_same_bits(nacc):
    rng = np.random.default_rng(8)
    for n in [1, 5, 16, 64, 100, 128, 192, 576]:
        for hd in [8, 16, 40, 64, 128]:
            for nh in [1, 2, 3, 4]:
                p = probabilities(rng, nh, n)
                v = half_rows(rng, n, hd)
                cell = rng.permutation(n).astype(np.int32)
                cell[rng.random(n) < 0.1] = -1
                results = per_isa(lambda: [_core.attn_values_f16(p, v, cell, nacc)])
                assert_same_bits(results, f"values n={n} hd={hd} nh={nh} nacc={nacc}")
                # a slot whose probability is 0 is skipped: an infinite V row there leaves head 0 finite
                zero = (p[0] == 0) & (cell >= 0)
                v[cell[zero]] = 0x7C00   # the rows those slots read
                results = per_isa(lambda: [_core.attn_values_f16(p, v, cell, nacc)])
                assert_same_bits(results, f"values with inf n={n} hd={hd} nh={nh} nacc={nacc}")
                assert np.isfinite(results[ISAS[0]][0].view(np.float32)[0]).all()


def test_transposed_value_products_give_the_same_bits_and_the_slot_order_sums():
    rng = np.random.default_rng(9)
    for n in [16, 48, 64, 128, 320]:
        for hd in [4, 12, 64]:
            for nh in [1, 2, 3, 4]:
                p = probabilities(rng, nh, n)
                v = half_rows(rng, n, hd)
                vt = np.ascontiguousarray(v.T)
                results = per_isa(lambda: [_core.vec_values_t_f16(p, vt)])
                assert_same_bits(results, f"values_t n={n} hd={hd} nh={nh}")
                # the same sums as the product with V in cells 0..n-1 (nacc 1)
                with forced_isa(ISAS[-1]):
                    rows = _core.attn_values_f16(p, v, np.arange(n, dtype=np.int32), 1)
                assert np.array_equal(bits(rows), results[ISAS[-1]][0])


# ---- the ops -----------------------------------------------------------------------


def graph_bits(build) -> dict:
    """build(ctx) -> output tensor, computed under each table, as bits."""
    def once():
        ctx = Context(Backend(1))
        out = build(ctx)
        ctx.set_output(out)
        ctx.compute()
        return [ctx.read(out).copy()]
    return per_isa(once)


def rows(rng, t: int, n: int, special: bool = False) -> np.ndarray:
    x = (rng.standard_normal((t, n)) * 3).astype(np.float32)
    if special:
        x[rng.random((t, n)) < 0.05] = rng.choice(SPECIALS[1:], size=1)[0]
    return x


@pytest.mark.parametrize("op", ["rms_norm", "rms_norm_w", "softmax", "softcap", "silu", "gelu", "swiglu", "geglu",
                                "scale", "add", "mul"])
def test_row_ops_give_the_same_bits(op):
    rng = np.random.default_rng(10)
    for n in [1, 3, 8, 17, 64, 100, 576, 1000]:
        a, b = rows(rng, 3, n), rows(rng, 3, n)
        w = rng.standard_normal(n).astype(np.float32)

        def build(ctx, a=a, b=b, w=w):
            x, y = ctx.input(a, "a"), ctx.input(b, "b")
            return {"rms_norm": lambda: ctx.rms_norm(x, None, 1e-6), "rms_norm_w": lambda: ctx.rms_norm(x, ctx.input(w, "w"), 1e-5),
                    "softmax": lambda: ctx.softmax(x), "softcap": lambda: ctx.softcap(x, 30.0), "silu": lambda: ctx.silu(x),
                    "gelu": lambda: ctx.gelu(x), "swiglu": lambda: ctx.swiglu(x, y), "geglu": lambda: ctx.geglu(x, y),
                    "scale": lambda: ctx.scale(x, 0.125), "add": lambda: ctx.add(x, y), "mul": lambda: ctx.mul(x, y)}[op]()
        assert_same_bits(graph_bits(build), f"{op} n={n}")


@pytest.mark.parametrize("mode", [ROPE_NORMAL, ROPE_NEOX])
@pytest.mark.parametrize("yarn", [False, True])
def test_rope_gives_the_same_bits_and_is_a_rotation(mode, yarn):
    rng = np.random.default_rng(11)
    t, nh, hd, n_dims = 9, 3, 64, 48
    x = rng.standard_normal((t, nh, hd)).astype(np.float32)
    pos = rng.integers(0, 30000, t).astype(np.int32)
    kw = dict(n_dims=n_dims, mode=mode, base=10000.0, scale=0.25 if yarn else 1.0, ext_factor=1.0 if yarn else 0.0,
              attn_factor=1.0, beta_fast=32.0, beta_slow=1.0, n_ctx_orig=4096)

    def build(ctx):
        return ctx.rope(ctx.input(x, "x"), ctx.input(pos, "pos"), **kw)
    results = graph_bits(build)
    assert_same_bits(results, "rope")
    if not yarn:   # the angles are right to float precision
        got = results[ISAS[0]][0].view(np.float32).reshape(t, nh, hd)
        # the angles as GGML builds them: the position times theta_scale again and again, in float
        theta_scale = np.float32(10000.0 ** (np.float32(-2.0) / np.float32(n_dims)))
        theta = np.empty((t, n_dims // 2), np.float32)
        theta[:, 0] = pos
        for i in range(1, n_dims // 2):
            theta[:, i] = theta[:, i - 1] * theta_scale
        theta = theta.astype(np.float64)
        if mode == ROPE_NEOX:
            x0, x1, g0, g1 = x[..., :n_dims // 2], x[..., n_dims // 2:n_dims], got[..., :n_dims // 2], got[..., n_dims // 2:n_dims]
        else:
            x0, x1, g0, g1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2], got[..., 0:n_dims:2], got[..., 1:n_dims:2]
        c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        np.testing.assert_allclose(g0, x0 * c - x1 * s, atol=2e-6)
        np.testing.assert_allclose(g1, x0 * s + x1 * c, atol=2e-6)
        assert np.array_equal(got[..., n_dims:], x[..., n_dims:])


@pytest.mark.parametrize("t", [1, 5, 64])
@pytest.mark.parametrize("softcap", [0.0, 50.0])
def test_attention_gives_the_same_bits(t, softcap):
    rng = np.random.default_rng(12)
    hd, hkv, group, n_cells = 64, 2, 3, 200
    q = rng.standard_normal((t, group * hkv, hd)).astype(np.float32)
    k = half_rows(rng, n_cells, hkv * hd)
    v = half_rows(rng, n_cells, hkv * hd)
    mask = np.zeros((t, n_cells), np.float32)
    for i in range(t):
        mask[i, n_cells - t + i + 1:] = -np.inf

    def build(ctx):
        return ctx.attn(ctx.input(q, "q"), ctx.cache(k, 1, (hd * hkv, n_cells), "k"),
                        ctx.cache(v, 1, (hd * hkv, n_cells), "v"), ctx.input(mask, "mask"),
                        ctx.input(np.array([n_cells], np.int32), "kv_len"), n_head_kv=hkv, scale=hd ** -0.5,
                        softcap=softcap)
    assert_same_bits(graph_bits(build), f"attention t={t}")


# ---- whole models --------------------------------------------------------------------

LOGITS = """
import sys, numpy as np
from pyengine import LLM
llm = LLM(sys.argv[1], n_threads=1, n_ctx=256)
ids = [int(i) for i in np.random.default_rng(5).integers(10, 5000, 61)]
prompt = np.asarray(llm.forward_logits(ids[:60]), np.float32)
sys.stdout.buffer.write(prompt.tobytes())
"""


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_a_model_gives_the_same_logits_on_every_isa(model):
    """The portable C table is the canonical arithmetic: every SIMD table this CPU runs must
    give its bits, so an AVX2-only CPU is checked as well as one with AVX-512."""
    path = resolve_model(model)
    assert len(ISAS) >= 2, f"this CPU lacks a table to compare: {ISAS}"
    out = {}
    for isa in ISAS:
        run = subprocess.run([sys.executable, "-c", LOGITS, str(path)], env=child_env(PYENGINE_ISA=isa),
                             cwd=CHILD_CWD, capture_output=True, timeout=900, check=False)
        assert run.returncode == 0, run.stderr.decode(errors="replace")[-3000:]
        out[isa] = np.frombuffer(run.stdout, np.uint32)
    assert out["scalar"].size > 0
    for isa in ISAS:
        assert np.array_equal(out[isa], out["scalar"]), f"{isa} differs from the portable table"


# ---- NEON: the x86 results checked under qemu ------------------------------------------------

CC = "aarch64-linux-gnu-gcc"
NEON_BUILDS = {"dotprod": (["-march=armv8.2-a+dotprod+fp16"], []),
               "nodot": (["-march=armv8-a", "-DPE_NEON_NODOT=1"], ["-cpu", "cortex-a72"])}


def record(name: str, dims: tuple, s: float, ins: list[np.ndarray], outs: list[np.ndarray], result: float = 0.0) -> bytes:
    """One case for neon_vec_check.c: name, 4 dims, the scalar, the inputs' and the expected
    outputs' bytes, the returned value."""
    blob = b"".join(np.ascontiguousarray(a).tobytes() for a in ins)
    want = b"".join(np.ascontiguousarray(a).tobytes() for a in outs)
    return (struct.pack("<16s4if", name.encode(), *dims, s) + struct.pack("<I", len(blob)) + blob
            + struct.pack("<I", len(want)) + want + struct.pack("<d", result))


def recording() -> bytes:
    """Cases over every kernel, as this machine's best x86 table computes them."""
    cases = []
    with forced_isa(ISAS[-1]):
        for n in [1, 2, 7, 15, 16, 17, 31, 33, 64, 100, 257, 300]:
            for special in (False, True):
                x, u = inputs(n, 3, special)
                for name in ELEMENTWISE:
                    xe = np.where(np.isnan(x), -np.inf, x) if name == "exp_sum" else x
                    y, r = kernel_call(name, xe, u)
                    s = {"exp_sum": float(np.nanmax(np.where(np.isinf(xe), np.nan, xe), initial=0.0)),
                         "scale_max": 0.37, "scale_round_f16": 0.3}.get(name, 0.0)
                    cases.append(record(name, (n, 0, 0, 0), s, [xe, u], [] if y is None else [y], r))
        every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
        cases.append(record("f16_to_f32", (every.size, 0, 0, 0), 0.0, [every], [_core.vec_kernel("f16_to_f32", every)[0]]))
        rng = np.random.default_rng(13)
        for nacc in (1, 4):
            for n in [7, 16, 64, 96, 128, 130]:
                for nx, ny in [(1, 1), (3, 4), (4, 2)]:
                    x = rng.standard_normal((nx, n)).astype(np.float16).astype(np.float32)
                    y = half_rows(rng, ny, n)
                    cases.append(record("dot_tile", (n, nx, ny, nacc), 0.0, [x, y], [_core.attn_scores_f16(x, y, nacc)]))
            for n, hd, nh in [(5, 8, 1), (64, 64, 3), (128, 64, 4), (576, 64, 2), (100, 40, 2)]:
                p = probabilities(rng, nh, n)
                v = half_rows(rng, n, hd)
                cell = rng.permutation(n).astype(np.int32)
                cell[rng.random(n) < 0.1] = -1
                cases.append(record("values_f16", (n, nh, hd, nacc), 0.0, [p, v, cell],
                                    [_core.attn_values_f16(p, v, cell, nacc)]))
        for n, hd, nh in [(16, 4, 1), (64, 64, 3), (320, 12, 4)]:
            p = probabilities(rng, nh, n)
            vt = np.ascontiguousarray(half_rows(rng, n, hd).T)
            cases.append(record("values_t_f16", (n, nh, hd, 0), 0.0, [p, vt], [_core.vec_values_t_f16(p, vt)]))
    return struct.pack("<I", len(cases)) + b"".join(cases)


@pytest.mark.parametrize("build", NEON_BUILDS)
def test_neon_tables_give_the_x86_bits_under_qemu(tmp_path, build):
    import shutil

    missing = [tool for tool in (CC, "qemu-aarch64") if shutil.which(tool) is None]
    assert not missing, f"install gcc-aarch64-linux-gnu and qemu-user (missing: {missing})"
    flags, cpu = NEON_BUILDS[build]
    exe = tmp_path / "neon_vec_check"
    # -O2 alone: vec.c keeps its a*b+c unfused whatever the flags
    subprocess.run([CC, "-O2", "-static", "-DPE_ARCH_ARM=1", *flags, "-Icsrc/include",
                    "-Icsrc/core", "-Icsrc/quant", "-Icsrc/cpu", "tests/c/neon_vec_check.c", "csrc/cpu/arm/neon_vec.c",
                    "csrc/cpu/gelu.c", "-lm", "-o", str(exe)], cwd=ROOT, check=True, capture_output=True, text=True)
    cases = tmp_path / "cases.bin"
    cases.write_bytes(recording())
    run = subprocess.run(["qemu-aarch64", *cpu, "-L", "/usr/aarch64-linux-gnu", str(exe), str(cases)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "cases passed" in run.stdout
