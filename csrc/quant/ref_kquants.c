/* ref_kquants.c - scalar reference kernels of the k-quants (Q2_K .. Q6_K)
 * and of their activation type Q8_K, bit-exact with ggml's layouts.
 *
 * Every weight type decodes a super-block of 256 into small integers plus
 * per-sub-block scales; dequantize and the dot product with Q8_K both work
 * from that decoded form, so the bit layout lives in one place per type.
 * The dot products form exact integer sums per super-block, in eight lanes
 * where the canonical arithmetic keeps lanes (ref_lanes.h), and apply the
 * float scales once per super-block in the x86 kernels' order. */
#include <math.h>

#include "internal.h"
#include "kquants.h"
#include "ref_lanes.h"

/* The reference must not depend on compile flags: keep a*b+c two roundings
 * (fmaf() where the canonical arithmetic fuses). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* ---- Q8_K: the activations ------------------------------------------------ */

/* ggml's quantize_row_q8_K_ref: scale by -127 / (the value of largest
 * magnitude, first one on ties), round to nearest even, keep per-16 sums. */
static void quantize_q8_K(const float *x, void *vy, int64_t n) {
    block_q8_K *y = vy;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float amax = 0, max = 0;
        for (int j = 0; j < QK_K; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) { amax = ax; max = x[j]; }
        }
        if (amax == 0) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) {
            const int v = pe_nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += y[i].qs[16 * g + l];
            y[i].bsums[g] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

static void dequantize_q8_K(const void *vx, float *y, int64_t n) {
    const block_q8_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int j = 0; j < QK_K; j++) *y++ = x[i].d * x[i].qs[j];
}

/* The lane sums of Q2_K, Q3_K, Q5_K and Q6_K: the products of each 32
 * elements go to the lanes by 4 (elements 4t..4t+3 of every 32 to lane t),
 * times the scale of their 16 elements (sc16) or 32 (sc32, sc16 NULL). */
static void scaled_lanes(const int8_t *q, const int8_t *a, const int8_t *sc16, const uint8_t *sc32,
                         int32_t lanes[REF_LANES]) {
    for (int t = 0; t < REF_LANES; t++) lanes[t] = 0;
    for (int c = 0; c < QK_K / 32; c++)
        for (int t = 0; t < REF_LANES; t++) {
            const int e = 32 * c + 4 * t;
            const int scale = sc16 ? sc16[e / 16] : sc32[c];
            lanes[t] += scale * (q[e] * a[e] + q[e + 1] * a[e + 1] + q[e + 2] * a[e + 2] + q[e + 3] * a[e + 3]);
        }
}

/* How the k-quant row products end: the lanes folded, the min chain, and
 * the whole-sum accumulators (Q4_K) added in the x86 kernels' order
 * (unused parts are +0, which turns a -0 result into +0 as there). */
static inline float kquant_result(const float acc[REF_LANES], float chain, float whole, float whole_mins) {
    return ((lanes_sum_halves(acc) + 0.0f) + chain) + (whole - whole_mins);
}

/* ---- Q2_K ------------------------------------------------------------------ */

/* Element e (0..255) sits in qs[(e / 128) * 32 + e % 32] at bits
 * 2 * ((e % 128) / 32); its 4-bit scale / 4-bit min pair is scales[e / 16]. */
static void decode_q2_K(const block_q2_K *b, int8_t q[QK_K]) {
    for (int e = 0; e < QK_K; e++)
        q[e] = (int8_t)((b->qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3);
}

static void dequantize_q2_K(const void *vx, float *y, int64_t n) {
    const block_q2_K *x = vx;
    int8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = pe_f16_to_f32(x[i].d), dmin = pe_f16_to_f32(x[i].dmin);
        decode_q2_K(&x[i], q);
        for (int s = 0; s < QK_K / 16; s++) {
            const float dl = d * (x[i].scales[s] & 0xF), ml = dmin * (x[i].scales[s] >> 4);
            for (int l = 0; l < 16; l++) *y++ = dl * q[16 * s + l] - ml;
        }
    }
}

/* Lanes: the scaled products; the min terms in lane t are sub-blocks 2t and
 * 2t + 1 (mins times bsums).  acc = fma(-da * dmin, min lanes, acc), then
 * acc = fma(da * d, lanes, acc). */
static void vec_dot_q2_K(int64_t n, float *s, const void *vw, const void *va) {
    const block_q2_K *x = vw;
    const block_q8_K *a = va;
    int8_t q[QK_K], sc[16];
    float acc[REF_LANES] = {0};
    for (int64_t i = 0; i < n / QK_K; i++) {
        decode_q2_K(&x[i], q);
        int32_t lanes[REF_LANES], mins[REF_LANES];
        for (int g = 0; g < 16; g++) sc[g] = (int8_t)(x[i].scales[g] & 0xF);
        scaled_lanes(q, a[i].qs, sc, NULL, lanes);
        for (int t = 0; t < REF_LANES; t++)
            mins[t] = (x[i].scales[2 * t] >> 4) * a[i].bsums[2 * t] + (x[i].scales[2 * t + 1] >> 4) * a[i].bsums[2 * t + 1];
        const float dall = a[i].d * pe_f16_to_f32(x[i].d), dmin = -a[i].d * pe_f16_to_f32(x[i].dmin);
        lanes_fma(acc, dmin, mins);
        lanes_fma(acc, dall, lanes);
    }
    *s = lanes_sum_halves(acc);
}

/* ---- Q3_K ------------------------------------------------------------------ */

/* The low 2 bits as in Q2_K; the third bit is hmask[e % 32] bit e / 32, and a
 * clear bit means "subtract 4" (values -4..3). */
static void decode_q3_K(const block_q3_K *b, int8_t q[QK_K]) {
    for (int e = 0; e < QK_K; e++) {
        const int lo = (b->qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        const int hi = (b->hmask[e % 32] >> (e / 32)) & 1;
        q[e] = (int8_t)(lo - (hi ? 0 : 4));
    }
}

static void dequantize_q3_K(const void *vx, float *y, int64_t n) {
    const block_q3_K *x = vx;
    int8_t q[QK_K], sc[16];
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = pe_f16_to_f32(x[i].d);
        decode_q3_K(&x[i], q);
        pe_q3k_unpack(x[i].scales, sc);
        for (int s = 0; s < 16; s++) {
            const float dl = d * sc[s];
            for (int l = 0; l < 16; l++) *y++ = dl * q[16 * s + l];
        }
    }
}

static void vec_dot_q3_K(int64_t n, float *s, const void *vw, const void *va) {
    const block_q3_K *x = vw;
    const block_q8_K *a = va;
    int8_t q[QK_K], sc[16];
    float acc[REF_LANES] = {0};
    for (int64_t i = 0; i < n / QK_K; i++) {
        decode_q3_K(&x[i], q);
        pe_q3k_unpack(x[i].scales, sc);
        int32_t lanes[REF_LANES];
        scaled_lanes(q, a[i].qs, sc, NULL, lanes);
        lanes_fma(acc, a[i].d * pe_f16_to_f32(x[i].d), lanes);
    }
    *s = lanes_sum_halves(acc);
}

/* ---- Q4_K / Q5_K ----------------------------------------------------------- */

/* Q4_K element e: chunk c = e / 64 of 32 bytes, low nibble for the first 32
 * elements of the chunk, high nibble for the next; scale / min e / 32. */
static void decode_q4_K(const block_q4_K *b, int8_t q[QK_K]) {
    for (int e = 0; e < QK_K; e++) {
        const uint8_t byte = b->qs[(e / 64) * 32 + e % 32];
        q[e] = (int8_t)(((e / 32) & 1) ? byte >> 4 : byte & 0xF);
    }
}

/* Q5_K: the Q4_K nibbles plus a fifth bit, qh[e % 32] bit e / 32. */
static void decode_q5_K(const block_q5_K *b, int8_t q[QK_K]) {
    for (int e = 0; e < QK_K; e++) {
        const uint8_t byte = b->qs[(e / 64) * 32 + e % 32];
        const int lo = ((e / 32) & 1) ? byte >> 4 : byte & 0xF;
        q[e] = (int8_t)(lo | (((b->qh[e % 32] >> (e / 32)) & 1) << 4));
    }
}

/* y = d * scale * q - dmin * min over eight sub-blocks of 32 */
static void dequantize_scaled_mins(const int8_t *q, const uint8_t *packed, float d, float dmin, float *y) {
    for (int s = 0; s < 8; s++) {
        uint8_t sc, mn;
        pe_k4_scale_min(s, packed, &sc, &mn);
        const float d1 = d * sc, m1 = dmin * mn;
        for (int l = 0; l < 32; l++) *y++ = d1 * q[32 * s + l] - m1;
    }
}

/* a super-block's min term: sum over sub-blocks of min * (its bsums) */
static int32_t mins_sum(const uint8_t *packed, const block_q8_K *a) {
    int32_t msum = 0;
    for (int k = 0; k < 8; k++) {
        uint8_t sc, mn;
        pe_k4_scale_min(k, packed, &sc, &mn);
        msum += mn * (a->bsums[2 * k] + a->bsums[2 * k + 1]);
    }
    return msum;
}

/* the eight 6-bit sub-block scales */
static void k4_scales(const uint8_t *packed, uint8_t sc[8]) {
    for (int k = 0; k < 8; k++) {
        uint8_t mn;
        pe_k4_scale_min(k, packed, &sc[k], &mn);
    }
}

static void dequantize_q4_K(const void *vx, float *y, int64_t n) {
    const block_q4_K *x = vx;
    int8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        decode_q4_K(&x[i], q);
        dequantize_scaled_mins(q, x[i].scales, pe_f16_to_f32(x[i].d), pe_f16_to_f32(x[i].dmin), y);
    }
}

/* Q4_K: the whole integer sum and the min term multiply-added into one
 * float each, whole = fma(sum, dw * da, whole), whole_mins likewise with
 * dmin * da; the result whole - whole_mins. */
static void vec_dot_q4_K(int64_t n, float *s, const void *vw, const void *va) {
    const block_q4_K *x = vw;
    const block_q8_K *a = va;
    int8_t q[QK_K];
    const float zero[REF_LANES] = {0};
    float whole = 0.0f, whole_mins = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        decode_q4_K(&x[i], q);
        uint8_t sc[8];
        k4_scales(x[i].scales, sc);
        int32_t lanes[REF_LANES], total = 0;
        scaled_lanes(q, a[i].qs, NULL, sc, lanes);
        for (int t = 0; t < REF_LANES; t++) total += lanes[t];
        const float d = pe_f16_to_f32(x[i].d) * a[i].d, dmin = pe_f16_to_f32(x[i].dmin) * a[i].d;
        whole = fmaf((float)total, d, whole);
        whole_mins = fmaf((float)mins_sum(x[i].scales, &a[i]), dmin, whole_mins);
    }
    *s = kquant_result(zero, 0.0f, whole, whole_mins);
}

static void dequantize_q5_K(const void *vx, float *y, int64_t n) {
    const block_q5_K *x = vx;
    int8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        decode_q5_K(&x[i], q);
        dequantize_scaled_mins(q, x[i].scales, pe_f16_to_f32(x[i].d), pe_f16_to_f32(x[i].dmin), y);
    }
}

/* Q5_K: lanes (scale per 32), acc = fma(da * d, lanes, acc); the min term
 * as one float chain, chain += (-da * dmin) * mins. */
static void vec_dot_q5_K(int64_t n, float *s, const void *vw, const void *va) {
    const block_q5_K *x = vw;
    const block_q8_K *a = va;
    int8_t q[QK_K];
    float acc[REF_LANES] = {0}, chain = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        decode_q5_K(&x[i], q);
        uint8_t sc[8];
        k4_scales(x[i].scales, sc);
        int32_t lanes[REF_LANES];
        scaled_lanes(q, a[i].qs, NULL, sc, lanes);
        const float d = a[i].d * pe_f16_to_f32(x[i].d), dmin = -a[i].d * pe_f16_to_f32(x[i].dmin);
        lanes_fma(acc, d, lanes);
        chain += dmin * (float)mins_sum(x[i].scales, &a[i]);
    }
    *s = kquant_result(acc, chain, 0.0f, 0.0f);
}

/* ---- Q6_K ------------------------------------------------------------------ */

/* Element e: half h = e / 128, quarter k = (e % 128) / 32, l = e % 32.  The low
 * nibble comes from ql[h*64 + (k & 1)*32 + l] (low nibble for k < 2, high for
 * k >= 2), the top 2 bits from qh[h*32 + l] at bits 2k; values -32..31 and the
 * int8 scale is scales[e / 16]. */
static void decode_q6_K(const block_q6_K *b, int8_t q[QK_K]) {
    for (int e = 0; e < QK_K; e++) {
        const int h = e / 128, k = (e % 128) / 32, l = e % 32;
        const uint8_t byte = b->ql[h * 64 + (k & 1) * 32 + l];
        const int lo = k < 2 ? byte & 0xF : byte >> 4;
        const int hi = (b->qh[h * 32 + l] >> (2 * k)) & 3;
        q[e] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

static void dequantize_q6_K(const void *vx, float *y, int64_t n) {
    const block_q6_K *x = vx;
    int8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = pe_f16_to_f32(x[i].d);
        decode_q6_K(&x[i], q);
        for (int s = 0; s < 16; s++) {
            const float dl = d * x[i].scales[s];
            for (int l = 0; l < 16; l++) *y++ = dl * q[16 * s + l];
        }
    }
}

/* Q6_K as Q4_K: per super-block one exact integer, the unsigned codes'
 * (0..63) scaled products less their offset of 32 as 32 * sum_j scale_j *
 * bsum_j (below 2^29 in magnitude); whole = fma(total, d * da, whole).  (One
 * integer, not a float lane per group of four elements: the prompt tiles
 * then need one multiply per 4-byte group, vpdpbusd, not two.) */
static void vec_dot_q6_K(int64_t n, float *s, const void *vw, const void *va) {
    const block_q6_K *x = vw;
    const block_q8_K *a = va;
    int8_t q[QK_K];
    const float zero[REF_LANES] = {0};
    float whole = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        decode_q6_K(&x[i], q);
        for (int e = 0; e < QK_K; e++) q[e] = (int8_t)(q[e] + 32);
        const int8_t *sc = x[i].scales;
        int32_t lanes[REF_LANES], total = 0;
        scaled_lanes(q, a[i].qs, sc, NULL, lanes);
        for (int t = 0; t < REF_LANES; t++) total += lanes[t];
        for (int j = 0; j < QK_K / 16; j++) total -= 32 * sc[j] * a[i].bsums[j];
        whole = fmaf((float)total, pe_f16_to_f32(x[i].d) * a[i].d, whole);
    }
    *s = kquant_result(zero, 0.0f, whole, 0.0f);
}

/* ---- table ------------------------------------------------------------------ */

void pe_fill_ref_kquants(pe_kernels *k) {
    k->type[PE_TYPE_Q8_K] = (pe_type_kernels){dequantize_q8_K, quantize_q8_K, NULL};
    k->type[PE_TYPE_Q2_K] = (pe_type_kernels){dequantize_q2_K, pe_quantize_q2_K_ref, vec_dot_q2_K};
    k->type[PE_TYPE_Q3_K] = (pe_type_kernels){dequantize_q3_K, pe_quantize_q3_K_ref, vec_dot_q3_K};
    k->type[PE_TYPE_Q4_K] = (pe_type_kernels){dequantize_q4_K, pe_quantize_q4_K_ref, vec_dot_q4_K};
    k->type[PE_TYPE_Q5_K] = (pe_type_kernels){dequantize_q5_K, pe_quantize_q5_K_ref, vec_dot_q5_K};
    k->type[PE_TYPE_Q6_K] = (pe_type_kernels){dequantize_q6_K, pe_quantize_q6_K_ref, vec_dot_q6_K};
    pe_fill_ref_iq4(k);
}
