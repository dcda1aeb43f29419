"""Test vectors for the NEON kernels: inputs and the bits the x86 AVX2 table
gives for them, which the NEON kernels must give too (issue #25: one
arithmetic per op on every ISA, x86's lone-row path the canonical one).

    PYENGINE_ISA=avx2 python tests/neon_vectors.py OUT

writes OUT; tests/c/neon_vectors_check.c, cross-compiled for arm64 and run
under qemu (tests/test_neon_cross.py), reads it and compares bit for bit.

The file: the 8 bytes "PEVEC01\\0", then records, little-endian:
    u32 op, u32 type, i64 n, then three byte strings (u64 length + bytes):
    QUANTIZE  (from_float of type): floats in, -, the blocks out
    TO_FLOAT  (to_float of type):   blocks in, -, the floats out
    VEC_DOT   (vec_dot of type):    weight blocks, activation blocks (of the
                                    type's partner, quantized by x86), the float
    GRID      (pe_iq_grid_set):     type is the grid's PE_IQ_GRID_* id, its bytes
                                    (the lattice grids, as the engine has them)
Only kernels the NEON table has are recorded: the check fails on a record
whose kernel it lacks."""

from __future__ import annotations

import os
import struct
import sys

import numpy as np

MAGIC = b"PEVEC01\0"
QUANTIZE, TO_FLOAT, VEC_DOT, GRID = 1, 2, 3, 4

# type ids (csrc/include/pe.h)
F32, F16, BF16 = 0, 1, 30
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 = 2, 3, 6, 7, 8, 9
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = 10, 11, 12, 13, 14, 15
IQ4_NL, IQ4_XS = 20, 23
MXFP4 = 39
IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ3_S, IQ2_S, IQ1_M = 16, 17, 18, 19, 21, 22, 29
LATTICE = (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M)

# byte offsets of each block's f16 scales: random blocks get finite ones there
F16_FIELDS = {Q4_0: (0,), Q4_1: (0, 2), Q5_0: (0,), Q5_1: (0, 2), Q8_0: (0,),
              Q2_K: (80, 82), Q3_K: (108,), Q4_K: (0, 2), Q5_K: (0, 2), Q6_K: (208,),
              IQ4_NL: (0,), IQ4_XS: (0,), MXFP4: (), **{t: (0,) for t in LATTICE if t != IQ1_M}}
# byte offsets of each block's E8M0 exponents: random blocks get small scales there when moderate
E8M0_FIELDS = {MXFP4: (0,)}

# the kernels of csrc/cpu/arm/*.c
NEON_QUANTIZE = (Q8_0, Q8_1, Q8_K, F16, BF16)
NEON_TO_FLOAT = (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, Q8_K)
NEON_VEC_DOT = (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS,
                *LATTICE, MXFP4)


class Writer:
    def __init__(self, f):
        self.f = f
        self.f.write(MAGIC)
        self.count = 0

    def record(self, op: int, type_id: int, n: int, *parts: bytes) -> None:
        parts = (*parts, b"", b"", b"")[:3]
        self.f.write(struct.pack("<IIq", op, type_id, n))
        for p in parts:
            self.f.write(struct.pack("<Q", len(p)) + p)
        self.count += 1


def activations(rng: np.random.Generator, n: int, kind: int) -> np.ndarray:
    """Floats to quantize: gaussian; with spikes; halves and integers (ties
    of the rounding once scaled by 127 / amax = 1); tiny and huge values;
    a few nonzero; products with the scale that round to a tie as floats
    while the exact product is no tie (a fused multiply would differ);
    gaussian with infinities and NaNs (a quiet one and one with a payload)
    here and there."""
    if kind == 0:
        x = rng.standard_normal(n)
    elif kind == 1:
        x = rng.standard_normal(n) * 0.1
        x[rng.integers(0, n, max(1, n // 64))] = rng.choice([-40.0, 40.0, 7.5])
    elif kind == 2:
        x = rng.integers(-254, 255, n) / 2.0
        x[::32] = 127.0   # amax 127 in every block of 32: the scale is 1
    elif kind == 3:
        x = rng.standard_normal(n) * 1e-4
    elif kind == 4:
        x = rng.standard_normal(n) * 3e4
    elif kind == 5:
        x = np.zeros(n)
        x[rng.integers(0, n, 3)] = rng.standard_normal(3)
    elif kind == 6:
        x = near_ties(rng, n)
    else:
        x = rng.standard_normal(n).astype(np.float32)
        odd = np.array([np.inf, -np.inf, np.nan, np.uint32(0x7FA00001).view(np.float32),
                        np.uint32(0xFFC00000).view(np.float32)], np.float32)
        at = rng.integers(0, n, max(1, n // 100))
        x[at] = rng.choice(odd, at.size)
    return np.ascontiguousarray(x, dtype=np.float32)


def near_ties(rng: np.random.Generator, n: int) -> np.ndarray:
    """amax 3.3 (as -3.3) opening every block of 32; the rest within a few
    ulps of (k + 0.5) / (127 / 3.3), where float32 x * scale rounds to k + 0.5."""
    scale = np.float32(127) / np.float32(3.3)
    picked = []
    for k in range(-126, 126):
        x0 = np.float32((k + 0.5) / float(scale))
        for d in range(-4, 5):
            c = (x0.view(np.int32) + np.int32(d)).view(np.float32)
            if abs(c) < 3.3 and np.float32(c * scale) == k + 0.5 and float(c) * float(scale) != k + 0.5:
                picked.append(c)
    x = rng.choice(np.array(picked, np.float32), n)
    x[::32] = -3.3
    return x


def specials(rng: np.random.Generator, n: int) -> np.ndarray:
    """Floats for the F16 / BF16 conversions: infinities, NaNs, signed zeros,
    float32 subnormals, values past f16's range, halfway cases of both."""
    pool = np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 1e-40, -3e-39, 65504.0, 65520.0, 7e4,
                     6.1e-5, 5.96e-8, 2.98e-8, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -8,
                     1.0 + 3 * 2.0 ** -8, -(1.0 + 2.0 ** -8), 3.4e38], np.float32)
    x = rng.choice(pool, n)
    plain = rng.random(n) < 0.3
    x[plain] = rng.standard_normal(int(plain.sum()))
    return x


def f16_bits(rng: np.random.Generator, moderate: bool) -> int:
    """A finite f16 scale: within +-0.05 when moderate, else any."""
    if moderate:
        return int(np.float16(rng.uniform(-0.05, 0.05)).view(np.uint16))
    h = int(rng.integers(0, 1 << 16))
    return h & 0xFBFF if (h & 0x7C00) == 0x7C00 else h


def random_blocks(rng: np.random.Generator, c, type_id: int, n: int, moderate: bool) -> np.ndarray:
    """Blocks of every bit pattern, their f16 scales finite (small when moderate)."""
    data = rng.integers(0, 256, c.row_bytes(type_id, n), dtype=np.uint8)
    bb = c.block_bytes(type_id)
    for b in range(len(data) // bb):
        block = data[b * bb:(b + 1) * bb]
        if type_id == IQ1_M:   # its f16: the top nibbles of the four scale words (bytes 49, 51, 53, 55)
            h = f16_bits(rng, moderate)
            for k in range(4):
                block[49 + 2 * k] = (block[49 + 2 * k] & 0x0F) | ((h >> 4 * k & 0xF) << 4)
            continue
        for off in F16_FIELDS[type_id]:
            h = f16_bits(rng, moderate)
            block[off:off + 2] = (h & 0xFF, h >> 8)
        for off in E8M0_FIELDS.get(type_id, ()):
            if moderate:   # scales 2^-10 .. 2^2
                block[off] = rng.integers(118, 131)
    return data


def float_row(rng: np.random.Generator, type_id: int, n: int) -> np.ndarray:
    x = rng.standard_normal(n).astype(np.float32)
    if type_id == F32:
        return x.view(np.uint8)
    if type_id == F16:
        return x.astype(np.float16).view(np.uint8)
    return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)   # BF16


def lengths(c, type_id: int) -> list[int]:
    bs = c.block_size(type_id)
    if bs == 1:   # float rows: tails past the 32-element steps too
        return [1, 7, 32, 100, 256, 1000, 4096 + 13]
    return [bs * k for k in (1, 2, 3, 5, 8, 16, 33)]


def write(path: str) -> int:
    from pyengine import _core as c

    assert c.isa() == "avx2", f"run with PYENGINE_ISA=avx2 (the table is {c.isa()})"
    rng = np.random.default_rng(25)
    with open(path, "wb") as f:
        return write_records(c, rng, Writer(f))


def write_records(c, rng: np.random.Generator, out: Writer) -> int:

    from pyengine import iq_grids

    for grid_id, class_name, dtype in iq_grids.GRIDS:
        values = iq_grids.levels(class_name, dtype)
        assert values is not None, f"the gguf package lacks the {class_name} grid"
        out.record(GRID, grid_id, 0, values.view(np.uint8).tobytes())

    for t in NEON_QUANTIZE:
        for n in lengths(c, Q8_K if t == Q8_K else Q8_0):
            rows = [activations(rng, n, kind) for kind in range(8)]
            if t in (F16, BF16):
                rows.append(specials(rng, n))
            for x in rows:
                out.record(QUANTIZE, t, n, x.tobytes(), b"", c.quantize(t, x, reference=False).tobytes())

    for t in NEON_TO_FLOAT:
        for n in lengths(c, t)[:5]:
            if t in (F16, BF16):
                rows = [float_row(rng, t, n)]
            elif t == Q8_K:
                rows = [c.quantize(Q8_K, activations(rng, n, k), reference=False) for k in (0, 4)]
            else:
                rows = [c.quantize(t, activations(rng, n, 0)), random_blocks(rng, c, t, n, False)]
            for w in rows:
                out.record(TO_FLOAT, t, n, w.tobytes(), b"", c.dequantize(t, w, n).tobytes())

    for t in NEON_VEC_DOT:
        partner = c.vec_dot_type(t)
        for n in lengths(c, t):
            # weights: quantized (where the reference quantizes the type), random
            # with moderate scales, random with any finite scales (infinities
            # and NaNs in the sums); activations of several kinds, with NaNs
            # but for Q8_0 partners: x86 quantizes a NaN to -128, and its
            # products of -128 with signed codes wrap (sign_epi8) or saturate
            # (maddubs), an edge the NEON kernels do not copy (it would cost
            # every block)
            for case in range(5 if partner != Q8_0 else 4):
                if t in (F32, F16, BF16):
                    w, a = float_row(rng, t, n), float_row(rng, t, n)
                else:
                    if case == 0 and t not in LATTICE:
                        w = c.quantize(t, activations(rng, n, 0))
                    else:
                        w = random_blocks(rng, c, t, n, case < 4)
                    a = c.quantize(partner, activations(rng, n, (0, 1, 2, 4, 7)[case]), reference=False)
                s = np.float32(c.vec_dot_blocks(t, w, a, n))
                out.record(VEC_DOT, t, n, w.tobytes(), a.tobytes(), s.tobytes())
    return out.count


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    os.environ.setdefault("PYENGINE_ISA", "avx2")
    print(f"{write(sys.argv[1])} records")
