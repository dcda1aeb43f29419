/* ref_legacy.c - scalar reference kernels of the 32-element block types
 * Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q8_1.
 *
 * The weight quantizers are GGML's reference algorithm (the same bytes as
 * gguf's); dequantization is exact.  The activation quantizers (Q8_0, Q8_1)
 * and the dot products are the canonical arithmetic every ISA computes bit
 * for bit (ref_lanes.h): the x86 kernels' rounding rule, lanes and order. */
#include <math.h>

#include "blocks.h"
#include "internal.h"
#include "ref_lanes.h"

/* The reference must not depend on compile flags: keep a*b+c two roundings
 * even when the build targets a CPU with FMA. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* ---- block statistics ------------------------------------------------------ */

/* The element of largest magnitude, sign kept (the first one on ties): the
 * symmetric types map it to the most negative code. */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static void min_max(const float *x, int n, float *min_out, float *max_out) {
    float min = 3.402823466e+38f, max = -3.402823466e+38f;
    for (int j = 0; j < n; j++) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    *min_out = min;
    *max_out = max;
}

/* Truncate toward zero (the C cast GGML uses) and clamp to [0, hi]; the
 * range test comes first so NaN or infinite inputs never reach the cast. */
static inline uint8_t trunc_code(float v, int hi) {
    if (!(v > 0.0f)) return 0;
    if (v >= (float)hi) return (uint8_t)hi;
    return (uint8_t)(int)v;
}

/* The 5th bits of a Q5 block: element j's bit is bit j of qh. */
static inline uint32_t q5_high_bits(const uint8_t qh[4]) {
    uint32_t h;
    memcpy(&h, qh, sizeof h);
    return h;
}

/* ---- quantize ---------------------------------------------------------------- */

static void quantize_q4_0(const float *x, void *vy, int64_t n) {
    block_q4_0 *y = vy;
    for (int64_t ib = 0; ib < n / QK4_0; ib++, x += QK4_0) {
        const float d = signed_absmax(x, QK4_0) / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[ib].d = pe_f32_to_f16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const uint8_t lo = trunc_code(x[j] * id + 8.5f, 15);
            const uint8_t hi = trunc_code(x[j + QK4_0 / 2] * id + 8.5f, 15);
            y[ib].qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

static void quantize_q4_1(const float *x, void *vy, int64_t n) {
    block_q4_1 *y = vy;
    for (int64_t ib = 0; ib < n / QK4_1; ib++, x += QK4_1) {
        float min, max;
        min_max(x, QK4_1, &min, &max);
        const float d = (max - min) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        y[ib].d = pe_f32_to_f16(d);
        y[ib].m = pe_f32_to_f16(min);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const uint8_t lo = trunc_code((x[j] - min) * id + 0.5f, 15);
            const uint8_t hi = trunc_code((x[j + QK4_1 / 2] - min) * id + 0.5f, 15);
            y[ib].qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

/* Store 32 five-bit codes: low nibbles in qs, 5th bits in qh. */
static void pack_q5(const uint8_t q[32], uint8_t qs[16], uint8_t qh_out[4]) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
        qh |= (uint32_t)((q[j] >> 4) & 1) << j;
        qh |= (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
    }
    memcpy(qh_out, &qh, sizeof qh);
}

static void quantize_q5_0(const float *x, void *vy, int64_t n) {
    block_q5_0 *y = vy;
    for (int64_t ib = 0; ib < n / QK5_0; ib++, x += QK5_0) {
        const float d = signed_absmax(x, QK5_0) / -16;
        const float id = d ? 1.0f / d : 0.0f;
        uint8_t q[QK5_0];
        for (int j = 0; j < QK5_0; j++) q[j] = trunc_code(x[j] * id + 16.5f, 31);
        y[ib].d = pe_f32_to_f16(d);
        pack_q5(q, y[ib].qs, y[ib].qh);
    }
}

static void quantize_q5_1(const float *x, void *vy, int64_t n) {
    block_q5_1 *y = vy;
    for (int64_t ib = 0; ib < n / QK5_1; ib++, x += QK5_1) {
        float min, max;
        min_max(x, QK5_1, &min, &max);
        const float d = (max - min) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        uint8_t q[QK5_1];
        for (int j = 0; j < QK5_1; j++) q[j] = trunc_code((x[j] - min) * id + 0.5f, 31);
        y[ib].d = pe_f32_to_f16(d);
        y[ib].m = pe_f32_to_f16(min);
        pack_q5(q, y[ib].qs, y[ib].qh);
    }
}

/* The activation quantizer, the same bits on every ISA: codes are
 * x * (127 / amax) rounded to nearest even (the product rounded first), d =
 * amax / 127; amax is taken in eight lanes as the SIMD code takes it, so a
 * NaN lands where it lands there.  Codes out of range (NaN, inf) become
 * INT32_MIN before they saturate to int8 (-128); Q8_1's sum adds the int32
 * codes with wrap-around, as the vector adds do. */
static float quantize_block_q8(const float *x, int32_t q[QK8_0]) {
    float amax[REF_LANES] = {0};
    for (int j = 0; j < QK8_0; j++) amax[j % REF_LANES] = lanes_max(amax[j % REF_LANES], fabsf(x[j]));
    const float max_abs = lanes_max_halves(amax);
    const float mul = max_abs != 0.0f ? 127.0f / max_abs : 0.0f;
    for (int j = 0; j < QK8_0; j++) q[j] = lanes_round_i32(x[j] * mul);
    return max_abs / 127.0f;
}

static void quantize_q8_0(const float *x, void *vy, int64_t n) {
    block_q8_0 *y = vy;
    for (int64_t ib = 0; ib < n / QK8_0; ib++, x += QK8_0) {
        int32_t q[QK8_0];
        const float d = quantize_block_q8(x, q);
        y[ib].d = pe_f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++) y[ib].qs[j] = lanes_saturate_i8(q[j]);
    }
}

static void quantize_q8_1(const float *x, void *vy, int64_t n) {
    block_q8_1 *y = vy;
    for (int64_t ib = 0; ib < n / QK8_1; ib++, x += QK8_1) {
        int32_t q[QK8_1];
        const float d = quantize_block_q8(x, q);
        uint32_t sum = 0;
        for (int j = 0; j < QK8_1; j++) {
            y[ib].qs[j] = lanes_saturate_i8(q[j]);
            sum += (uint32_t)q[j];
        }
        y[ib].d = pe_f32_to_f16(d);
        /* s uses the float scale, not its f16 rounding */
        y[ib].s = pe_f32_to_f16((float)(int32_t)sum * d);
    }
}

/* ---- dequantize -------------------------------------------------------------- */

static void dequantize_q4_0(const void *vx, float *y, int64_t n) {
    const block_q4_0 *x = vx;
    for (int64_t ib = 0; ib < n / QK4_0; ib++, y += QK4_0) {
        const float d = pe_f16_to_f32(x[ib].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j] = (float)((x[ib].qs[j] & 0x0F) - 8) * d;
            y[j + QK4_0 / 2] = (float)((x[ib].qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequantize_q4_1(const void *vx, float *y, int64_t n) {
    const block_q4_1 *x = vx;
    for (int64_t ib = 0; ib < n / QK4_1; ib++, y += QK4_1) {
        const float d = pe_f16_to_f32(x[ib].d), m = pe_f16_to_f32(x[ib].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            y[j] = (float)(x[ib].qs[j] & 0x0F) * d + m;
            y[j + QK4_1 / 2] = (float)(x[ib].qs[j] >> 4) * d + m;
        }
    }
}

/* The 32 five-bit codes of a Q5 block. */
static void unpack_q5(const uint8_t qs[16], const uint8_t qh[4], int q[32]) {
    const uint32_t h = q5_high_bits(qh);
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0x0F) | (int)(((h >> j) & 1) << 4);
        q[j + 16] = (qs[j] >> 4) | (int)(((h >> (j + 16)) & 1) << 4);
    }
}

static void dequantize_q5_0(const void *vx, float *y, int64_t n) {
    const block_q5_0 *x = vx;
    for (int64_t ib = 0; ib < n / QK5_0; ib++, y += QK5_0) {
        const float d = pe_f16_to_f32(x[ib].d);
        int q[QK5_0];
        unpack_q5(x[ib].qs, x[ib].qh, q);
        for (int j = 0; j < QK5_0; j++) y[j] = (float)(q[j] - 16) * d;
    }
}

static void dequantize_q5_1(const void *vx, float *y, int64_t n) {
    const block_q5_1 *x = vx;
    for (int64_t ib = 0; ib < n / QK5_1; ib++, y += QK5_1) {
        const float d = pe_f16_to_f32(x[ib].d), m = pe_f16_to_f32(x[ib].m);
        int q[QK5_1];
        unpack_q5(x[ib].qs, x[ib].qh, q);
        for (int j = 0; j < QK5_1; j++) y[j] = (float)q[j] * d + m;
    }
}

static void dequantize_q8_0(const void *vx, float *y, int64_t n) {
    const block_q8_0 *x = vx;
    for (int64_t ib = 0; ib < n / QK8_0; ib++, y += QK8_0) {
        const float d = pe_f16_to_f32(x[ib].d);
        for (int j = 0; j < QK8_0; j++) y[j] = (float)x[ib].qs[j] * d;
    }
}

/* GGML has no Q8_1 dequantizer; this one is for tests and tools. */
static void dequantize_q8_1(const void *vx, float *y, int64_t n) {
    const block_q8_1 *x = vx;
    for (int64_t ib = 0; ib < n / QK8_1; ib++, y += QK8_1) {
        const float d = pe_f16_to_f32(x[ib].d);
        for (int j = 0; j < QK8_1; j++) y[j] = (float)x[ib].qs[j] * d;
    }
}

/* ---- dot products ------------------------------------------------------------
 *
 * Per block, eight exact integer sums (lane t: elements 4t..4t+3) are
 * multiply-added into eight float accumulators, acc = fma(dw * da, sum, acc)
 * with dw * da rounded once; the _1 types' min terms run as one float chain,
 * mins = mins + mw * sa (two roundings); the result is the lanes folded by
 * halves, plus mins. */

/* lane t = the products of elements 4t..4t+3 of a block */
static void block_lanes(const int w[32], const int8_t *a, int32_t lanes[REF_LANES]) {
    for (int t = 0; t < REF_LANES; t++) {
        const int e = 4 * t;
        lanes[t] = w[e] * a[e] + w[e + 1] * a[e + 1] + w[e + 2] * a[e + 2] + w[e + 3] * a[e + 3];
    }
}

/* the 32 four-bit codes of a block in element order, minus offset */
static void unpack_q4(const uint8_t qs[16], int offset, int q[32]) {
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0x0F) - offset;
        q[j + 16] = (qs[j] >> 4) - offset;
    }
}

/* One block's lanes multiply-added with d = dw * da. */
static void legacy_step(const int w[32], const int8_t *a, float d, float acc[REF_LANES]) {
    int32_t lanes[REF_LANES];
    block_lanes(w, a, lanes);
    lanes_fma(acc, d, lanes);
}

/* the lanes folded, plus the min chain (0 for the _0 types, which still
 * turns a -0 into +0 as the SIMD code's addition does) */
static inline float legacy_result(const float acc[REF_LANES], float mins) { return lanes_sum_halves(acc) + mins; }

static void vec_dot_q4_0_q8_0(int64_t n, float *s, const void *vw, const void *va) {
    const block_q4_0 *x = vw;
    const block_q8_0 *y = va;
    float acc[REF_LANES] = {0};
    for (int64_t ib = 0; ib < n / QK8_0; ib++) {
        int q[32];
        unpack_q4(x[ib].qs, 8, q);
        legacy_step(q, y[ib].qs, pe_f16_to_f32(x[ib].d) * pe_f16_to_f32(y[ib].d), acc);
    }
    *s = legacy_result(acc, 0.0f);
}

static void vec_dot_q4_1_q8_1(int64_t n, float *s, const void *vw, const void *va) {
    const block_q4_1 *x = vw;
    const block_q8_1 *y = va;
    float acc[REF_LANES] = {0}, mins = 0.0f;
    for (int64_t ib = 0; ib < n / QK8_1; ib++) {
        int q[32];
        unpack_q4(x[ib].qs, 0, q);
        legacy_step(q, y[ib].qs, pe_f16_to_f32(x[ib].d) * pe_f16_to_f32(y[ib].d), acc);
        mins += pe_f16_to_f32(x[ib].m) * pe_f16_to_f32(y[ib].s);
    }
    *s = legacy_result(acc, mins);
}

static void vec_dot_q5_0_q8_0(int64_t n, float *s, const void *vw, const void *va) {
    const block_q5_0 *x = vw;
    const block_q8_0 *y = va;
    float acc[REF_LANES] = {0};
    for (int64_t ib = 0; ib < n / QK8_0; ib++) {
        int q[QK5_0];
        unpack_q5(x[ib].qs, x[ib].qh, q);
        for (int j = 0; j < QK5_0; j++) q[j] -= 16;
        legacy_step(q, y[ib].qs, pe_f16_to_f32(x[ib].d) * pe_f16_to_f32(y[ib].d), acc);
    }
    *s = legacy_result(acc, 0.0f);
}

static void vec_dot_q5_1_q8_1(int64_t n, float *s, const void *vw, const void *va) {
    const block_q5_1 *x = vw;
    const block_q8_1 *y = va;
    float acc[REF_LANES] = {0}, mins = 0.0f;
    for (int64_t ib = 0; ib < n / QK8_1; ib++) {
        int q[QK5_1];
        unpack_q5(x[ib].qs, x[ib].qh, q);
        legacy_step(q, y[ib].qs, pe_f16_to_f32(x[ib].d) * pe_f16_to_f32(y[ib].d), acc);
        mins += pe_f16_to_f32(x[ib].m) * pe_f16_to_f32(y[ib].s);
    }
    *s = legacy_result(acc, mins);
}

static void vec_dot_q8_0_q8_0(int64_t n, float *s, const void *vw, const void *va) {
    const block_q8_0 *x = vw;
    const block_q8_0 *y = va;
    float acc[REF_LANES] = {0};
    for (int64_t ib = 0; ib < n / QK8_0; ib++) {
        int q[QK8_0];
        for (int j = 0; j < QK8_0; j++) q[j] = x[ib].qs[j];
        legacy_step(q, y[ib].qs, pe_f16_to_f32(x[ib].d) * pe_f16_to_f32(y[ib].d), acc);
    }
    *s = legacy_result(acc, 0.0f);
}

void pe_fill_ref_legacy(pe_kernels *k) {
    k->type[PE_TYPE_Q4_0] = (pe_type_kernels){dequantize_q4_0, quantize_q4_0, vec_dot_q4_0_q8_0};
    k->type[PE_TYPE_Q4_1] = (pe_type_kernels){dequantize_q4_1, quantize_q4_1, vec_dot_q4_1_q8_1};
    k->type[PE_TYPE_Q5_0] = (pe_type_kernels){dequantize_q5_0, quantize_q5_0, vec_dot_q5_0_q8_0};
    k->type[PE_TYPE_Q5_1] = (pe_type_kernels){dequantize_q5_1, quantize_q5_1, vec_dot_q5_1_q8_1};
    k->type[PE_TYPE_Q8_0] = (pe_type_kernels){dequantize_q8_0, quantize_q8_0, vec_dot_q8_0_q8_0};
    /* Q8_1 is only an activation format: no weight dot product */
    k->type[PE_TYPE_Q8_1] = (pe_type_kernels){dequantize_q8_1, quantize_q8_1, NULL};
}
