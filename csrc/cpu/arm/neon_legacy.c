/* neon_legacy.c - AArch64 NEON kernels of the float types (F32 F16 BF16)
 * and the legacy block types (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0, Q8_1 as the
 * activation format), with the dot-product instructions (sdot) when the
 * compiler targets them.
 *
 * Every kernel gives the x86 AVX2 table's bits (issue #25).  Dequantizers
 * and the F16 / BF16 conversions are exact or round to nearest even, as
 * x86's; the activation quantizers multiply by 127 / amax and round half to
 * even, as x86's do.  The dot products form x86's integer lanes per block
 * (lane t: elements 4t..4t+3), as two int32x4, and multiply-add them into
 * x86's one 8-lane float chain, held as two float32x4; two blocks'
 * f16 scales convert in one instruction.
 *
 * One edge is not x86's: a NaN activation quantizes to -128 (x86's cvtps),
 * and x86's products of -128 with negative codes wrap (sign_epi8) where
 * sdot's do not, so such a row's dots differ (copying that would cost every
 * block; the row is garbage either way). */
#include "blocks.h"
#include "internal.h"

#if defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>

#include "neon_common.h"

/* The quantizers need a multiply and an add rounded separately. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* ---- helpers ------------------------------------------------------------------ */

static inline uint32_t load_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The first two halves of two weight blocks and their activation blocks
 * (d and m, d and s) multiplied pairwise: [dw0*da0, mw0*sa0, dw1*da1, mw1*sa1]. */
static inline float32x4_t scale_pairs(const void *w0, const void *w1, const void *a0, const void *a1) {
    uint32x4_t h = vdupq_n_u32(load_u32(w0));
    h = vsetq_lane_u32(load_u32(w1), h, 1);
    h = vsetq_lane_u32(load_u32(a0), h, 2);
    h = vsetq_lane_u32(load_u32(a1), h, 3);
    const float16x8_t halves = vreinterpretq_f16_u32(h);
    return vmulq_f32(vcvt_f32_f16(vget_low_f16(halves)), vcvt_high_f32_f16(halves));
}

static inline float f16_to_f32(pe_f16 h) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

/* 0x10 in byte i where bit i of the 32 bits is set: [bits 0..15], [16..31]. */
static inline void fifth_bits(const uint8_t *qh, uint8x16_t *lo, uint8x16_t *hi) {
    static const uint8_t pick_lo[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    static const uint8_t pick_hi[16] = {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t bytes = vreinterpretq_u8_u32(vdupq_n_u32(load_u32(qh)));
    const uint8x16_t mask = vld1q_u8(bit), b4 = vdupq_n_u8(0x10);
    *lo = vandq_u8(vtstq_u8(vqtbl1q_u8(bytes, vld1q_u8(pick_lo)), mask), b4);
    *hi = vandq_u8(vtstq_u8(vqtbl1q_u8(bytes, vld1q_u8(pick_hi)), mask), b4);
}

/* ---- weight codes per block ------------------------------------------------------ */

/* Each gives a block's 32 codes as signed bytes: elements 0..15, 16..31. */
typedef struct { int8x16_t lo, hi; } codes32;

static inline codes32 nibbles(const uint8_t *qs, int offset) {
    const uint8x16_t raw = vld1q_u8(qs);
    const int8x16_t off = vdupq_n_s8((int8_t)offset);
    codes32 c = {vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0F))), off),
                 vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), off)};
    return c;
}

static inline codes32 fives(const uint8_t *qs, const uint8_t *qh, int offset) {
    const uint8x16_t raw = vld1q_u8(qs);
    uint8x16_t h_lo, h_hi;
    fifth_bits(qh, &h_lo, &h_hi);
    const int8x16_t off = vdupq_n_s8((int8_t)offset);
    codes32 c = {vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(raw, vdupq_n_u8(0x0F)), h_lo)), off),
                 vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(raw, 4), h_hi)), off)};
    return c;
}

static inline codes32 codes_q4_0(const block_q4_0 *b) { return nibbles(b->qs, 8); }
static inline codes32 codes_q4_1(const block_q4_1 *b) { return nibbles(b->qs, 0); }
static inline codes32 codes_q5_0(const block_q5_0 *b) { return fives(b->qs, b->qh, 16); }
static inline codes32 codes_q5_1(const block_q5_1 *b) { return fives(b->qs, b->qh, 0); }

static inline codes32 codes_q8_0(const block_q8_0 *b) {
    codes32 c = {vld1q_s8(b->qs), vld1q_s8(b->qs + 16)};
    return c;
}

/* ---- dot products ------------------------------------------------------------------ */

/* x86's per-block step: lane t of the codes' products with the activations
 * (elements 4t..4t+3) to float, acc = fma(dw * da, lanes, acc), the 8
 * lanes in [acc[0] | acc[1]] */
static inline void block_step(float32x4_t acc[2], codes32 w, const int8_t *a, float32x4_t sc, int second) {
    const float32x4_t lo = vcvtq_f32_s32(dot16(vdupq_n_s32(0), w.lo, vld1q_s8(a)));
    const float32x4_t hi = vcvtq_f32_s32(dot16(vdupq_n_s32(0), w.hi, vld1q_s8(a + 16)));
    acc[0] = second ? vfmaq_laneq_f32(acc[0], lo, sc, 2) : vfmaq_laneq_f32(acc[0], lo, sc, 0);
    acc[1] = second ? vfmaq_laneq_f32(acc[1], hi, sc, 2) : vfmaq_laneq_f32(acc[1], hi, sc, 0);
}

/* The _1 types' min terms run as one float chain, mins + mw * sa, each
 * product and sum rounded; the result is x86_sum_ps8 of the lanes + mins
 * (+ 0.0f for the _0 types, as x86 adds it). */
#define DEFINE_VEC_DOT(NAME, WBLOCK, ABLOCK, CODES, WITH_MIN)                                 \
    static void NAME(int64_t n, float *s, const void *vw, const void *va) {                   \
        const WBLOCK *w = vw;                                                                  \
        const ABLOCK *a = va;                                                                  \
        const int64_t nb = n / 32;                                                             \
        float32x4_t acc[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};                           \
        float mins = 0.0f;                                                                     \
        int64_t ib = 0;                                                                        \
        for (; ib + 2 <= nb; ib += 2) {                                                        \
            const float32x4_t sc = scale_pairs(&w[ib], &w[ib + 1], &a[ib], &a[ib + 1]);       \
            block_step(acc, CODES(&w[ib]), a[ib].qs, sc, 0);                                   \
            if (WITH_MIN) mins += vgetq_lane_f32(sc, 1);                                       \
            block_step(acc, CODES(&w[ib + 1]), a[ib + 1].qs, sc, 1);                           \
            if (WITH_MIN) mins += vgetq_lane_f32(sc, 3);                                       \
        }                                                                                      \
        if (ib < nb) {                                                                         \
            const float32x4_t sc = scale_pairs(&w[ib], &w[ib], &a[ib], &a[ib]);               \
            block_step(acc, CODES(&w[ib]), a[ib].qs, sc, 0);                                   \
            if (WITH_MIN) mins += vgetq_lane_f32(sc, 1);                                       \
        }                                                                                      \
        *s = neon_sum8(acc[0], acc[1]) + mins;                                                 \
    }

DEFINE_VEC_DOT(vec_dot_q4_0_q8_0, block_q4_0, block_q8_0, codes_q4_0, 0)
DEFINE_VEC_DOT(vec_dot_q4_1_q8_1, block_q4_1, block_q8_1, codes_q4_1, 1)
DEFINE_VEC_DOT(vec_dot_q5_0_q8_0, block_q5_0, block_q8_0, codes_q5_0, 0)
DEFINE_VEC_DOT(vec_dot_q5_1_q8_1, block_q5_1, block_q8_1, codes_q5_1, 1)
DEFINE_VEC_DOT(vec_dot_q8_0_q8_0, block_q8_0, block_q8_0, codes_q8_0, 0)

/* ---- dequantize ---------------------------------------------------------------------- */

/* 16 codes -> q * d (+ m); q * d is exact, so this equals the reference. */
static inline void store16(float *y, int8x16_t q, float d, const float *m) {
    const int16x8_t h[2] = {vmovl_s8(vget_low_s8(q)), vmovl_high_s8(q)};
    for (int k = 0; k < 4; k++) {
        const int32x4_t i = k & 1 ? vmovl_high_s16(h[k >> 1]) : vmovl_s16(vget_low_s16(h[k >> 1]));
        float32x4_t v = vmulq_n_f32(vcvtq_f32_s32(i), d);
        if (m) v = vaddq_f32(v, vdupq_n_f32(*m));
        vst1q_f32(y + 4 * k, v);
    }
}

/* WITH_MIN adds m, the second half of the _1 blocks. */
#define DEFINE_TO_FLOAT(NAME, WBLOCK, CODES, WITH_MIN)                                        \
    static void NAME(const void *vx, float *y, int64_t n) {                                   \
        const WBLOCK *x = vx;                                                                 \
        for (int64_t ib = 0; ib < n / 32; ib++, y += 32) {                                    \
            const codes32 c = CODES(&x[ib]);                                                   \
            const float d = f16_to_f32(x[ib].d);                                              \
            const float m = f16_to_f32((pe_f16)(load_u32(&x[ib]) >> 16));                     \
            store16(y, c.lo, d, WITH_MIN ? &m : NULL);                                        \
            store16(y + 16, c.hi, d, WITH_MIN ? &m : NULL);                                   \
        }                                                                                     \
    }

DEFINE_TO_FLOAT(dequantize_q4_0, block_q4_0, codes_q4_0, 0)
DEFINE_TO_FLOAT(dequantize_q4_1, block_q4_1, codes_q4_1, 1)
DEFINE_TO_FLOAT(dequantize_q5_0, block_q5_0, codes_q5_0, 0)
DEFINE_TO_FLOAT(dequantize_q5_1, block_q5_1, codes_q5_1, 1)
DEFINE_TO_FLOAT(dequantize_q8_0, block_q8_0, codes_q8_0, 0)

/* ---- activation quantizers ---------------------------------------------------------- */

/* x86's max_ps: a where a > b, else b (b when either is NaN) */
static inline float32x4_t x86_max(float32x4_t a, float32x4_t b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }

/* x86's cvtps: round half to even (the FPCR default), INT_MIN for NaN */
static inline int32x4_t x86_cvt(float32x4_t v) {
    return vbslq_s32(vceqq_f32(v, v), vcvtnq_s32_f32(v), vdupq_n_s32(INT32_MIN));
}

/* One block of 32 floats as x86 quantizes it: amax by x86's max order (NaNs
 * land where its max_ps puts them), codes = x * (127 / amax) rounded half to
 * even, saturated to bytes, to q; *sum adds the int32 codes before the
 * saturation, as x86 does; returns d = amax / 127. */
static inline float quantize_block_q8(const float *x, int8_t *q, int *sum) {
    float32x4_t v[8], amax[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (int k = 0; k < 8; k++) {
        v[k] = vld1q_f32(x + 4 * k);
        amax[k & 1] = x86_max(amax[k & 1], vabsq_f32(v[k]));
    }
    const float32x4_t m4 = x86_max(amax[0], amax[1]);
    const float32x2_t m2 = vget_low_f32(x86_max(m4, vcombine_f32(vget_high_f32(m4), vget_high_f32(m4))));
    const float max_abs = vgetq_lane_f32(x86_max(vdupq_n_f32(vget_lane_f32(m2, 0)), vdupq_n_f32(vget_lane_f32(m2, 1))), 0);
    const float mul = max_abs != 0.0f ? 127.0f / max_abs : 0.0f;
    int32x4_t total = vdupq_n_s32(0);
    for (int k = 0; k < 8; k += 2) {
        const int32x4_t q0 = x86_cvt(vmulq_n_f32(v[k], mul));
        const int32x4_t q1 = x86_cvt(vmulq_n_f32(v[k + 1], mul));
        total = vaddq_s32(total, vaddq_s32(q0, q1));
        vst1_s8(q + 4 * k, vqmovn_s16(vcombine_s16(vqmovn_s32(q0), vqmovn_s32(q1))));
    }
    *sum = vaddvq_s32(total);
    return max_abs / 127.0f;
}

static void quantize_q8_0(const float *x, void *vy, int64_t n) {
    block_q8_0 *y = vy;
    for (int64_t ib = 0; ib < n / 32; ib++, x += 32) {
        int sum;
        const float d = quantize_block_q8(x, y[ib].qs, &sum);
        y[ib].d = pe_f32_to_f16(d);
    }
}

static void quantize_q8_1(const float *x, void *vy, int64_t n) {
    block_q8_1 *y = vy;
    for (int64_t ib = 0; ib < n / 32; ib++, x += 32) {
        int sum;
        const float d = quantize_block_q8(x, y[ib].qs, &sum);
        y[ib].d = pe_f32_to_f16(d);
        y[ib].s = pe_f32_to_f16((float)sum * d);
    }
}

/* ---- float types ------------------------------------------------------------------- */

static inline float32x4_t load_f32x4(const float *p) { return vld1q_f32(p); }

static inline float32x4_t load_f16x4(const pe_f16 *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

static inline float32x4_t load_bf16x4(const pe_bf16 *p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}

static inline float f32_id(float v) { return v; }

static void f16_to_float(const void *vx, float *y, int64_t n) {
    const pe_f16 *x = vx;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, load_f16x4(x + i));
    for (; i < n; i++) y[i] = pe_f16_to_f32(x[i]);
}

/* Round to nearest even (the FPCR default) like the reference. */
static void f16_from_float(const float *x, void *vy, int64_t n) {
    pe_f16 *y = vy;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) y[i] = pe_f32_to_f16(x[i]);
}

static void bf16_to_float(const void *vx, float *y, int64_t n) {
    const pe_bf16 *x = vx;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, load_bf16x4(x + i));
    for (; i < n; i++) y[i] = pe_bf16_to_f32(x[i]);
}

/* Round to nearest even on the bits; NaN keeps its top bits and turns quiet. */
static inline uint16x4_t bf16_round4(float32x4_t v) {
    const uint32x4_t u = vreinterpretq_u32_f32(v);
    const uint32x4_t odd = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    const uint32x4_t rounded = vaddq_u32(u, vaddq_u32(odd, vdupq_n_u32(0x7fff)));
    const uint32x4_t quiet = vorrq_u32(u, vdupq_n_u32(64u << 16));
    const uint32x4_t is_num = vceqq_f32(v, v);
    return vshrn_n_u32(vbslq_u32(is_num, rounded, quiet), 16);
}

static void bf16_from_float(const float *x, void *vy, int64_t n) {
    pe_bf16 *y = vy;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(y + i, bf16_round4(vld1q_f32(x + i)));
    for (; i < n; i++) y[i] = pe_f32_to_bf16(x[i]);
}

/* Float dot products as x86's: four 8-lane accumulators over 32 elements
 * (here a[2j], a[2j + 1] for x86's acc_j), acc_j = fma(x, y, acc_j),
 * folded (acc0 + acc2) + (acc1 + acc3) and reduced by REDUCE8 (F32 F16:
 * hadd8's order, BF16: x86_sum_ps8's); elements past the last 32 add in
 * double, each product rounded to float first. */
#define DEFINE_FLOAT_DOT(NAME, ELEM, LOAD4, SCALAR, REDUCE8)                                    \
    static void NAME(int64_t n, float *s, const void *vw, const void *va) {                     \
        const ELEM *x = vw, *y = va;                                                             \
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0; \
        int64_t i = 0;                                                                           \
        for (; i + 32 <= n; i += 32) {   /* spelt out: kept in registers at any -O */           \
            a0 = vfmaq_f32(a0, LOAD4(x + i), LOAD4(y + i));                                      \
            a1 = vfmaq_f32(a1, LOAD4(x + i + 4), LOAD4(y + i + 4));                              \
            a2 = vfmaq_f32(a2, LOAD4(x + i + 8), LOAD4(y + i + 8));                              \
            a3 = vfmaq_f32(a3, LOAD4(x + i + 12), LOAD4(y + i + 12));                            \
            a4 = vfmaq_f32(a4, LOAD4(x + i + 16), LOAD4(y + i + 16));                            \
            a5 = vfmaq_f32(a5, LOAD4(x + i + 20), LOAD4(y + i + 20));                            \
            a6 = vfmaq_f32(a6, LOAD4(x + i + 24), LOAD4(y + i + 24));                            \
            a7 = vfmaq_f32(a7, LOAD4(x + i + 28), LOAD4(y + i + 28));                            \
        }                                                                                        \
        const float32x4_t lo = vaddq_f32(vaddq_f32(a0, a4), vaddq_f32(a2, a6));                  \
        const float32x4_t hi = vaddq_f32(vaddq_f32(a1, a5), vaddq_f32(a3, a7));                  \
        double sum = REDUCE8(lo, hi);                                                            \
        for (; i < n; i++) sum += (double)(SCALAR(x[i]) * SCALAR(y[i]));                         \
        *s = (float)sum;                                                                         \
    }

DEFINE_FLOAT_DOT(f32_vec_dot, float, load_f32x4, f32_id, neon_hadd8)
DEFINE_FLOAT_DOT(f16_vec_dot, pe_f16, load_f16x4, pe_f16_to_f32, neon_hadd8)
DEFINE_FLOAT_DOT(bf16_vec_dot, pe_bf16, load_bf16x4, pe_bf16_to_f32, neon_sum8)

void PE_NEON_NAME(pe_fill_neon_legacy)(pe_kernels *k) {
    k->type[PE_TYPE_F32].vec_dot = f32_vec_dot;
    k->type[PE_TYPE_F16] = (pe_type_kernels){f16_to_float, f16_from_float, f16_vec_dot};
    k->type[PE_TYPE_BF16] = (pe_type_kernels){bf16_to_float, bf16_from_float, bf16_vec_dot};

    k->type[PE_TYPE_Q4_0].to_float = dequantize_q4_0;
    k->type[PE_TYPE_Q4_0].vec_dot = vec_dot_q4_0_q8_0;
    k->type[PE_TYPE_Q4_1].to_float = dequantize_q4_1;
    k->type[PE_TYPE_Q4_1].vec_dot = vec_dot_q4_1_q8_1;
    k->type[PE_TYPE_Q5_0].to_float = dequantize_q5_0;
    k->type[PE_TYPE_Q5_0].vec_dot = vec_dot_q5_0_q8_0;
    k->type[PE_TYPE_Q5_1].to_float = dequantize_q5_1;
    k->type[PE_TYPE_Q5_1].vec_dot = vec_dot_q5_1_q8_1;
    k->type[PE_TYPE_Q8_0] = (pe_type_kernels){dequantize_q8_0, quantize_q8_0, vec_dot_q8_0_q8_0};
    k->type[PE_TYPE_Q8_1].from_float = quantize_q8_1;
}

#else /* no NEON: keep the reference kernels */

void PE_NEON_NAME(pe_fill_neon_legacy)(pe_kernels *k) { (void)k; }

#endif
