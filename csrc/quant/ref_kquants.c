/* ref_kquants.c - scalar reference kernels of the k-quants (Q2_K .. Q6_K)
 * and of their activation type Q8_K, bit-exact with ggml's layouts.
 *
 * Every weight type decodes a super-block of 256 into small integers plus
 * per-sub-block scales; dequantize and the dot product with Q8_K both work
 * from that decoded form, so the bit layout lives in one place per type.
 * The dot products keep integer sums per super-block and apply the float
 * scales once per super-block, as ggml's kernels do. */
#include <math.h>

#include "internal.h"
#include "kquants.h"

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

/* sum of q[j] * a[j] over 16 elements */
static inline int dot16(const int8_t *q, const int8_t *a) {
    int s = 0;
    for (int l = 0; l < 16; l++) s += q[l] * a[l];
    return s;
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

static void vec_dot_q2_K(int64_t n, float *s, const void *vw, const void *va) {
    const block_q2_K *x = vw;
    const block_q8_K *a = va;
    int8_t q[QK_K];
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        decode_q2_K(&x[i], q);
        int isum = 0, msum = 0;
        for (int g = 0; g < QK_K / 16; g++) {
            isum += (x[i].scales[g] & 0xF) * dot16(q + 16 * g, a[i].qs + 16 * g);
            msum += (x[i].scales[g] >> 4) * a[i].bsums[g];
        }
        const float dall = a[i].d * pe_f16_to_f32(x[i].d);
        const float dmin = a[i].d * pe_f16_to_f32(x[i].dmin);
        sum += dall * isum - dmin * msum;
    }
    *s = sum;
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
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        decode_q3_K(&x[i], q);
        pe_q3k_unpack(x[i].scales, sc);
        int isum = 0;
        for (int g = 0; g < 16; g++) isum += sc[g] * dot16(q + 16 * g, a[i].qs + 16 * g);
        sum += pe_f16_to_f32(x[i].d) * a[i].d * isum;
    }
    *s = sum;
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

/* one super-block's dot with mins: d * sum(scale * q.a) - dmin * sum(min * bsum) */
static float dot_scaled_mins(const int8_t *q, const uint8_t *packed, float d, float dmin, const block_q8_K *a) {
    int isum = 0, msum = 0;
    for (int s = 0; s < 8; s++) {
        uint8_t sc, mn;
        pe_k4_scale_min(s, packed, &sc, &mn);
        isum += sc * (dot16(q + 32 * s, a->qs + 32 * s) + dot16(q + 32 * s + 16, a->qs + 32 * s + 16));
        msum += mn * (a->bsums[2 * s] + a->bsums[2 * s + 1]);
    }
    return d * a->d * isum - dmin * a->d * msum;
}

static void dequantize_q4_K(const void *vx, float *y, int64_t n) {
    const block_q4_K *x = vx;
    int8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        decode_q4_K(&x[i], q);
        dequantize_scaled_mins(q, x[i].scales, pe_f16_to_f32(x[i].d), pe_f16_to_f32(x[i].dmin), y);
    }
}

static void vec_dot_q4_K(int64_t n, float *s, const void *vw, const void *va) {
    const block_q4_K *x = vw;
    const block_q8_K *a = va;
    int8_t q[QK_K];
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        decode_q4_K(&x[i], q);
        sum += dot_scaled_mins(q, x[i].scales, pe_f16_to_f32(x[i].d), pe_f16_to_f32(x[i].dmin), &a[i]);
    }
    *s = sum;
}

static void dequantize_q5_K(const void *vx, float *y, int64_t n) {
    const block_q5_K *x = vx;
    int8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        decode_q5_K(&x[i], q);
        dequantize_scaled_mins(q, x[i].scales, pe_f16_to_f32(x[i].d), pe_f16_to_f32(x[i].dmin), y);
    }
}

static void vec_dot_q5_K(int64_t n, float *s, const void *vw, const void *va) {
    const block_q5_K *x = vw;
    const block_q8_K *a = va;
    int8_t q[QK_K];
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        decode_q5_K(&x[i], q);
        sum += dot_scaled_mins(q, x[i].scales, pe_f16_to_f32(x[i].d), pe_f16_to_f32(x[i].dmin), &a[i]);
    }
    *s = sum;
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

static void vec_dot_q6_K(int64_t n, float *s, const void *vw, const void *va) {
    const block_q6_K *x = vw;
    const block_q8_K *a = va;
    int8_t q[QK_K];
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        decode_q6_K(&x[i], q);
        int isum = 0;
        for (int g = 0; g < 16; g++) isum += x[i].scales[g] * dot16(q + 16 * g, a[i].qs + 16 * g);
        sum += pe_f16_to_f32(x[i].d) * a[i].d * isum;
    }
    *s = sum;
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
