/* neon_kquants.c - NEON kernels of the k-quants and IQ4 types, giving the
 * x86 AVX2 table's bits (issue #25).
 *
 * Each 16 weight levels meet 16 activations in one sdot (vdotq_s32, or
 * widening multiplies where the dot-product extension is missing): lane t
 * gets the products of elements 4t..4t+3, the integer lanes x86's kernels
 * form, so the two int32x4 of a 32-element run are x86's 8 lanes; a
 * multiply-accumulate by the sub-block's scale (a vector lane) adds them to
 * the super-block's lanes.  The float steps are x86's, per type (see
 * avx2_kquants.c and x86_gemm_kquants.h): the same products, fused
 * multiply-adds and reductions, on the 8 lanes held as two float32x4.
 * IQ4_NL shares neon_legacy.c's one edge off x86's bits: Q8_0 activations
 * of -128 (a NaN quantized by x86's rule). */
#include <math.h>

#include "internal.h"
#include "kquants.h"

#if defined(__ARM_NEON)
#include <arm_neon.h>

#include "neon_common.h"

/* only the explicit fused multiply-adds (vfmaq, fmaf) may fuse */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* ---- helpers ------------------------------------------------------------------ */

/* levels of one sub-block of 16 (or the first / second 16 of one of 32) */
static inline int32x4_t dot_sub16(uint8x16_t q, const int8_t *y) { return dot16(vdupq_n_s32(0), s8(q), vld1q_s8(y)); }

static inline float f16(pe_f16 h) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

/* sum_j s_j * p_j over 8 runs of 16, the scales in lanes of s0 (0..3), s1
 * (4..7), added to out: the even runs (the first 16 of a 32) to out[0],
 * x86's lanes 0..3, the odd ones to out[1], lanes 4..7 */
static inline void scale8(const int32x4_t p[8], int32x4_t s0, int32x4_t s1, int32x4_t out[2]) {
    int32x4_t even = vmlaq_laneq_s32(out[0], p[0], s0, 0), odd = vmlaq_laneq_s32(out[1], p[1], s0, 1);
    even = vmlaq_laneq_s32(even, p[2], s0, 2);
    odd = vmlaq_laneq_s32(odd, p[3], s0, 3);
    even = vmlaq_laneq_s32(even, p[4], s1, 0);
    odd = vmlaq_laneq_s32(odd, p[5], s1, 1);
    even = vmlaq_laneq_s32(even, p[6], s1, 2);
    odd = vmlaq_laneq_s32(odd, p[7], s1, 3);
    out[0] = even;
    out[1] = odd;
}

/* sum_j s_j * p_j over 8 runs of 32 (p[2j]: its first 16, p[2j + 1]: the
 * second), the scales in lanes of s0 (0..3), s1 (4..7): x86's 8 lanes as
 * out[0], out[1] (multiplies by lane, no broadcasts) */
static inline void scale8x32(const int32x4_t p[16], int32x4_t s0, int32x4_t s1, int32x4_t out[2]) {
#define PE_SCALE_RUN(J, S, L)                                  \
    out[0] = vmlaq_laneq_s32(out[0], p[2 * (J)], S, L);        \
    out[1] = vmlaq_laneq_s32(out[1], p[2 * (J) + 1], S, L);
    out[0] = vmulq_laneq_s32(p[0], s0, 0);
    out[1] = vmulq_laneq_s32(p[1], s0, 0);
    PE_SCALE_RUN(1, s0, 1) PE_SCALE_RUN(2, s0, 2) PE_SCALE_RUN(3, s0, 3)
    PE_SCALE_RUN(4, s1, 0) PE_SCALE_RUN(5, s1, 1) PE_SCALE_RUN(6, s1, 2) PE_SCALE_RUN(7, s1, 3)
#undef PE_SCALE_RUN
}

/* x86's float step acc = fma(d, lanes, acc) on the 8 lanes */
static inline void fma8(float32x4_t acc[2], const int32x4_t lanes[2], float d) {
    acc[0] = vfmaq_f32(acc[0], vcvtq_f32_s32(lanes[0]), vdupq_n_f32(d));
    acc[1] = vfmaq_f32(acc[1], vcvtq_f32_s32(lanes[1]), vdupq_n_f32(d));
}

/* 8 signed 16-bit values as two int32 vectors */
static inline void widen8(int16x8_t v, int32x4_t *lo, int32x4_t *hi) {
    *lo = vmovl_s16(vget_low_s16(v));
    *hi = vmovl_high_s16(v);
}

/* ---- Q8_K: quantize the activations (x86's bits, NaN and infinity included) -- */

static float absmax_256(const float *x) {
    float32x4_t m = vdupq_n_f32(0);
    /* |x| > m is false for NaN: NaNs, signaling ones too (where maxnm would
     * give NaN), are skipped as x86's max_ps(|x|, m) skips them */
    for (int v = 0; v < QK_K / 4; v++) {
        const float32x4_t ax = vabsq_f32(vld1q_f32(x + 4 * v));
        m = vbslq_f32(vcgtq_f32(ax, m), ax, m);
    }
    return vmaxvq_f32(m);
}

static int first_absmax(const float *x, float amax) {
    const float32x4_t vam = vdupq_n_f32(amax);
    for (int v = 0; v < QK_K / 4; v++)
        if (vmaxvq_u32(vceqq_f32(vabsq_f32(vld1q_f32(x + 4 * v)), vam)))
            for (int l = 0; l < 4; l++)
                if (fabsf(x[4 * v + l]) == amax) return 4 * v + l;
    return 0;
}

/* pe_nearest_int on 4 lanes then min(v, 127); the product stays a rounded
 * float; NaN gives 0, as x86's cvtps (INT_MIN, whose low byte is 0) */
static inline int32x4_t round_lanes(float32x4_t x, float32x4_t scale) {
    float32x4_t v = vmulq_f32(x, scale);
    PE_NO_FUSE(v);
    const int32x4_t bits = vreinterpretq_s32_f32(vaddq_f32(v, vdupq_n_f32(12582912.f)));
    const int32x4_t i = vsubq_s32(vandq_s32(bits, vdupq_n_s32(0x007fffff)), vdupq_n_s32(0x00400000));
    return vandq_s32(vminq_s32(i, vdupq_n_s32(127)), vreinterpretq_s32_u32(vceqq_f32(v, v)));
}

static void quantize_q8_K(const float *x, void *vy, int64_t n) {
    block_q8_K *y = vy;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        const float amax = absmax_256(x);
        if (amax == 0) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / x[first_absmax(x, amax)];
        const float32x4_t vis = vdupq_n_f32(iscale);
        for (int g = 0; g < QK_K / 16; g++) {
            const float *xg = x + 16 * g;
            /* the narrowing moves keep the low byte, as the reference's cast does */
            const int16x8_t h0 = vmovn_high_s32(vmovn_s32(round_lanes(vld1q_f32(xg), vis)), round_lanes(vld1q_f32(xg + 4), vis));
            const int16x8_t h1 = vmovn_high_s32(vmovn_s32(round_lanes(vld1q_f32(xg + 8), vis)), round_lanes(vld1q_f32(xg + 12), vis));
            const int8x16_t q = vmovn_high_s16(vmovn_s16(h0), h1);
            vst1q_s8(y[i].qs + 16 * g, q);
            y[i].bsums[g] = (int16_t)vaddlvq_s8(q);
        }
        y[i].d = 1 / iscale;
    }
}

static void dequantize_q8_K(const void *vx, float *y, int64_t n) {
    const block_q8_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        for (int j = 0; j < QK_K; j += 8, y += 8) {
            const int16x8_t q = vmovl_s8(vld1_s8(x[i].qs + j));
            vst1q_f32(y, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(q))), x[i].d));
            vst1q_f32(y + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(q)), x[i].d));
        }
    }
}

/* ---- Q2_K ------------------------------------------------------------------------ */

/* x86's lanes: per 128-element half h and chunk k of 32, scale 8h + 2k on
 * the chunk's first 16 products, 8h + 2k + 1 on the second; the min term's
 * lanes mins[2t] * bsum[2t] + mins[2t + 1] * bsum[2t + 1].  Per
 * super-block acc = fma(-da * dmin, min lanes, acc), then
 * acc = fma(da * d, lanes, acc); x86_sum_ps8 at the end. */
static void vec_dot_q2_K(int64_t n, float *s, const void *vw, const void *va) {
    const block_q2_K *x = vw;
    const block_q8_K *a = va;
    const uint8x16_t m3 = vdupq_n_u8(3), m4 = vdupq_n_u8(0xF);
    float32x4_t acc[2] = {vdupq_n_f32(0), vdupq_n_f32(0)};
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float dall = a[i].d * f16(x[i].d), dmin = -a[i].d * f16(x[i].dmin);
        const uint8x16_t sc = vld1q_u8(x[i].scales);
        const uint8x16_t mins = vshrq_n_u8(sc, 4), scl = vandq_u8(sc, m4);
        int32x4_t msum[2], isum[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
        madd16(vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins))), vreinterpretq_s16_u16(vmovl_high_u8(mins)),
               a[i].bsums, &msum[0], &msum[1]);
        const int8_t *q8 = a[i].qs;
        for (int h = 0; h < 2; h++) {
            uint8x16_t q0 = vld1q_u8(x[i].qs + 32 * h), q1 = vld1q_u8(x[i].qs + 32 * h + 16);
            int32x4_t p[8];
            for (int k = 0; k < 4; k++, q8 += 32) {
                p[2 * k] = dot_sub16(vandq_u8(q0, m3), q8);
                p[2 * k + 1] = dot_sub16(vandq_u8(q1, m3), q8 + 16);
                q0 = vshrq_n_u8(q0, 2);
                q1 = vshrq_n_u8(q1, 2);
            }
            const int16x8_t s16 = vreinterpretq_s16_u16(h ? vmovl_high_u8(scl) : vmovl_u8(vget_low_u8(scl)));
            int32x4_t s0, s1;
            widen8(s16, &s0, &s1);
            scale8(p, s0, s1, isum);
        }
        fma8(acc, msum, dmin);
        fma8(acc, isum, dall);
    }
    *s = neon_sum8(acc[0], acc[1]);
}

/* ---- Q3_K ------------------------------------------------------------------------ */

/* x86's lanes: the signed levels lo + 4 hbit - 4 times the activations,
 * scales as Q2_K's; acc = fma(da * d, lanes, acc), x86_sum_ps8. */
static void vec_dot_q3_K(int64_t n, float *s, const void *vw, const void *va) {
    const block_q3_K *x = vw;
    const block_q8_K *a = va;
    const uint8x16_t one = vdupq_n_u8(1), four = vdupq_n_u8(4);
    float32x4_t acc[2] = {vdupq_n_f32(0), vdupq_n_f32(0)};
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = a[i].d * f16(x[i].d);
        uint32_t words[4];
        pe_q3k_unpack_words(x[i].scales, words);
        const int8x16_t sc = vsubq_s8(vreinterpretq_s8_u32(vld1q_u32(words)), vdupq_n_s8(32));
        const int16x8_t slo = vmovl_s8(vget_low_s8(sc)), shi = vmovl_high_s8(sc);
        uint8x16_t hm0 = vld1q_u8(x[i].hmask), hm1 = vld1q_u8(x[i].hmask + 16);
        const int8_t *q8 = a[i].qs;
        int32x4_t isum[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
        for (int h = 0; h < 2; h++) {
            uint8x16_t q0 = vld1q_u8(x[i].qs + 32 * h), q1 = vld1q_u8(x[i].qs + 32 * h + 16);
            int32x4_t p[8];
            for (int k = 0; k < 4; k++, q8 += 32) {
                /* insert keeps the low 2 bits of the levels, puts hmask bit 4h + k above */
                p[2 * k] = dot_sub16(vsubq_u8(vsliq_n_u8(q0, vandq_u8(hm0, one), 2), four), q8);
                p[2 * k + 1] = dot_sub16(vsubq_u8(vsliq_n_u8(q1, vandq_u8(hm1, one), 2), four), q8 + 16);
                q0 = vshrq_n_u8(q0, 2);
                q1 = vshrq_n_u8(q1, 2);
                hm0 = vshrq_n_u8(hm0, 1);
                hm1 = vshrq_n_u8(hm1, 1);
            }
            int32x4_t s0, s1;
            widen8(h ? shi : slo, &s0, &s1);
            scale8(p, s0, s1, isum);
        }
        fma8(acc, isum, d);
    }
    *s = neon_sum8(acc[0], acc[1]);
}

/* ---- Q4_K / Q5_K ----------------------------------------------------------------- */

/* one sub-block of 32: two runs of 16 levels, their lanes added (where only
 * the whole sum counts) */
static inline int32x4_t dot_sub32(uint8x16_t q0, uint8x16_t q1, const int8_t *y) {
    return dot16(dot16(vdupq_n_s32(0), s8(q0), vld1q_s8(y)), s8(q1), vld1q_s8(y + 16));
}

/* The eight scales as int32 lanes and sum_j min_j * (bsum_2j + bsum_2j+1) in lanes. */
static inline int32x4_t k4_scales(const uint8_t *packed, const int16_t *bsums, int32x4_t *s0, int32x4_t *s1) {
    uint32_t sc[2], mn[2];
    pe_k4_unpack_words(packed, sc, mn);
    const uint8x8_t scv = vcreate_u8((uint64_t)sc[0] | ((uint64_t)sc[1] << 32));
    const uint8x8_t mnv = vcreate_u8((uint64_t)mn[0] | ((uint64_t)mn[1] << 32));
    widen8(vreinterpretq_s16_u16(vmovl_u8(scv)), s0, s1);
    const int16x8_t pairs = vpaddq_s16(vld1q_s16(bsums), vld1q_s16(bsums + 8));
    const int16x8_t m16 = vreinterpretq_s16_u16(vmovl_u8(mnv));
    return vmlal_high_s16(vmull_s16(vget_low_s16(m16), vget_low_s16(pairs)), m16, pairs);
}

/* Q4_K as x86 computes it (llama.cpp's repacked product): the super-block's
 * whole integer sum and min term multiply-added into one float each,
 * whole = fma(sum, dw * da, whole), whole_mins likewise with dmin; the
 * result 0 + (whole - whole_mins) (x86 adds its empty lane sums first). */
static void vec_dot_q4_K(int64_t n, float *s, const void *vw, const void *va) {
    const block_q4_K *x = vw;
    const block_q8_K *a = va;
    const uint8x16_t m4 = vdupq_n_u8(0xF);
    float whole = 0.0f, whole_mins = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16(x[i].d) * a[i].d, dmin = f16(x[i].dmin) * a[i].d;
        int32x4_t s0, s1;
        const int32x4_t msum = k4_scales(x[i].scales, a[i].bsums, &s0, &s1);
        /* only the whole sum counts: each sub-block's 32 products in one vector */
        int32x4_t p[8], total[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
        for (int j = 0; j < 4; j++) {
            const uint8x16_t q0 = vld1q_u8(x[i].qs + 32 * j), q1 = vld1q_u8(x[i].qs + 32 * j + 16);
            p[2 * j] = dot_sub32(vandq_u8(q0, m4), vandq_u8(q1, m4), a[i].qs + 64 * j);
            p[2 * j + 1] = dot_sub32(vshrq_n_u8(q0, 4), vshrq_n_u8(q1, 4), a[i].qs + 64 * j + 32);
        }
        scale8(p, s0, s1, total);
        whole = fmaf((float)vaddvq_s32(vaddq_s32(total[0], total[1])), d, whole);
        whole_mins = fmaf((float)vaddvq_s32(msum), dmin, whole_mins);
    }
    *s = 0.0f + (whole - whole_mins);
}

/* Q5_K as x86's row product: lanes (sub-block scale times the products of
 * elements 4t..4t+3), acc = fma(da * d, lanes, acc); the min term as one
 * float chain, chain + (-da * dmin) * mins; x86_sum_ps8(acc) + 0 + chain + 0
 * (x86's empty accumulators of the other paths). */
static void vec_dot_q5_K(int64_t n, float *s, const void *vw, const void *va) {
    const block_q5_K *x = vw;
    const block_q8_K *a = va;
    const uint8x16_t one = vdupq_n_u8(1);
    float32x4_t acc[2] = {vdupq_n_f32(0), vdupq_n_f32(0)};
    float chain = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = a[i].d * f16(x[i].d), dmin = -a[i].d * f16(x[i].dmin);
        int32x4_t s0, s1;
        const int32x4_t msum = k4_scales(x[i].scales, a[i].bsums, &s0, &s1);
        uint8x16_t h0 = vld1q_u8(x[i].qh), h1 = vld1q_u8(x[i].qh + 16);
        int32x4_t p[16], lanes[2];
        for (int j = 0; j < 4; j++) {
            const uint8x16_t q0 = vld1q_u8(x[i].qs + 32 * j), q1 = vld1q_u8(x[i].qs + 32 * j + 16);
            const int8_t *y = a[i].qs + 64 * j;
            /* insert keeps a nibble and puts qh bit 2j (low nibbles) or 2j + 1 above it */
            p[4 * j] = dot_sub16(vsliq_n_u8(q0, vandq_u8(h0, one), 4), y);
            p[4 * j + 1] = dot_sub16(vsliq_n_u8(q1, vandq_u8(h1, one), 4), y + 16);
            p[4 * j + 2] = dot_sub16(vsliq_n_u8(vshrq_n_u8(q0, 4), vandq_u8(vshrq_n_u8(h0, 1), one), 4), y + 32);
            p[4 * j + 3] = dot_sub16(vsliq_n_u8(vshrq_n_u8(q1, 4), vandq_u8(vshrq_n_u8(h1, 1), one), 4), y + 48);
            h0 = vshrq_n_u8(h0, 2);
            h1 = vshrq_n_u8(h1, 2);
        }
        scale8x32(p, s0, s1, lanes);
        fma8(acc, lanes, d);
        chain += dmin * (float)vaddvq_s32(msum);
    }
    *s = neon_sum8(acc[0], acc[1]) + 0.0f + chain + (0.0f - 0.0f);
}

/* ---- Q6_K ------------------------------------------------------------------------ */

/* x86's lanes: the stored levels 0..63 times the activations, scale per 16,
 * less the levels' offset of 32 as 32 * (sc[2t] bsum[2t] + sc[2t + 1]
 * bsum[2t + 1]); the lanes summed into one exact integer, whole = fma(total,
 * d * da, whole) per super-block; 0 + 0 + 0 + (whole - 0) as x86's result. */
static void vec_dot_q6_K(int64_t n, float *s, const void *vw, const void *va) {
    const block_q6_K *x = vw;
    const block_q8_K *a = va;
    const uint8x16_t m3 = vdupq_n_u8(3);
    float whole = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16(x[i].d) * a[i].d;
        const int8x16_t sc = vld1q_s8(x[i].scales);
        const int16x8_t slo = vmovl_s8(vget_low_s8(sc)), shi = vmovl_high_s8(sc);
        int32x4_t bias[2], isum[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
        madd16(slo, shi, a[i].bsums, &bias[0], &bias[1]);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
            const int8_t *q8 = a[i].qs + 128 * h;
            /* ql bytes r*16.. : r = 0, 1 hold quarters 0 / 2 (low / high nibble), r = 2, 3
             * quarters 1 / 3; qh bits 2k hold the top of quarter k */
            const uint8x16_t l[4] = {vld1q_u8(ql), vld1q_u8(ql + 16), vld1q_u8(ql + 32), vld1q_u8(ql + 48)};
            const uint8x16_t hb[2] = {vld1q_u8(qh), vld1q_u8(qh + 16)};
            int32x4_t p[8];
            for (int r = 0; r < 2; r++) {
                p[r] = dot_sub16(vsliq_n_u8(l[r], vandq_u8(hb[r], m3), 4), q8 + 16 * r);
                p[2 + r] = dot_sub16(vsliq_n_u8(l[2 + r], vandq_u8(vshrq_n_u8(hb[r], 2), m3), 4), q8 + 32 + 16 * r);
                p[4 + r] = dot_sub16(vsliq_n_u8(vshrq_n_u8(l[r], 4), vandq_u8(vshrq_n_u8(hb[r], 4), m3), 4), q8 + 64 + 16 * r);
                p[6 + r] = dot_sub16(vsliq_n_u8(vshrq_n_u8(l[2 + r], 4), vshrq_n_u8(hb[r], 6), 4), q8 + 96 + 16 * r);
            }
            int32x4_t s0, s1;
            widen8(h ? shi : slo, &s0, &s1);
            scale8(p, s0, s1, isum);
        }
        isum[0] = vsubq_s32(isum[0], vshlq_n_s32(bias[0], 5));
        isum[1] = vsubq_s32(isum[1], vshlq_n_s32(bias[1], 5));
        whole = fmaf((float)vaddvq_s32(vaddq_s32(isum[0], isum[1])), d, whole);
    }
    *s = 0.0f + 0.0f + 0.0f + (whole - 0.0f);
}

/* ---- IQ4_NL / IQ4_XS -------------------------------------------------------------- */

/* one block of 32 grid indices (16 bytes) against 32 activations: x86's
 * lanes (elements 4t..4t+3) as p[0], p[1] */
static inline void iq4_dot32(const uint8_t *qs, int8x16_t grid, const int8_t *y, int32x4_t p[2]) {
    const uint8x16_t q = vld1q_u8(qs);
    const int8x16_t lo = vqtbl1q_s8(grid, vandq_u8(q, vdupq_n_u8(0xF)));
    const int8x16_t hi = vqtbl1q_s8(grid, vshrq_n_u8(q, 4));
    p[0] = dot16(vdupq_n_s32(0), lo, vld1q_s8(y));
    p[1] = dot16(vdupq_n_s32(0), hi, vld1q_s8(y + 16));
}

/* as x86: two accumulators, blocks 2j and 2j + 1 (a last odd block to the
 * first), x86_sum_ps8 of their sum */
static void vec_dot_iq4_nl(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq4_nl *x = vw;
    const block_q8_0 *a = va;
    const int8x16_t grid = vld1q_s8(pe_iq4nl_values);
    float32x4_t acc0[2] = {vdupq_n_f32(0), vdupq_n_f32(0)}, acc1[2] = {vdupq_n_f32(0), vdupq_n_f32(0)};
    const int64_t nb = n / QK4_NL;
    int64_t i = 0;
    int32x4_t p[2];
    for (; i + 1 < nb; i += 2) {
        iq4_dot32(x[i].qs, grid, a[i].qs, p);
        fma8(acc0, p, f16(a[i].d) * f16(x[i].d));
        iq4_dot32(x[i + 1].qs, grid, a[i + 1].qs, p);
        fma8(acc1, p, f16(a[i + 1].d) * f16(x[i + 1].d));
    }
    for (; i < nb; i++) {
        iq4_dot32(x[i].qs, grid, a[i].qs, p);
        fma8(acc0, p, f16(a[i].d) * f16(x[i].d));
    }
    *s = neon_sum8(vaddq_f32(acc0[0], acc1[0]), vaddq_f32(acc0[1], acc1[1]));
}

/* lanes: sub-block scale times the 4-element products; acc = fma(da * d,
 * lanes, acc), x86_sum_ps8 */
static void vec_dot_iq4_xs(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq4_xs *x = vw;
    const block_q8_K *a = va;
    const int8x16_t grid = vld1q_s8(pe_iq4nl_values);
    float32x4_t acc[2] = {vdupq_n_f32(0), vdupq_n_f32(0)};
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t sc[8];
        for (int ib = 0; ib < 8; ib++) sc[ib] = pe_iq4xs_scale(&x[i], ib);
        int32x4_t p[16], lanes[2];
        for (int ib = 0; ib < 8; ib++) iq4_dot32(x[i].qs + 16 * ib, grid, a[i].qs + 32 * ib, p + 2 * ib);
        scale8x32(p, vld1q_s32(sc), vld1q_s32(sc + 4), lanes);
        fma8(acc, lanes, a[i].d * f16(x[i].d));
    }
    *s = neon_sum8(acc[0], acc[1]);
}

/* ---- to_float (embedding rows) ---------------------------------------------------- */

/* 16 levels (0..63) -> floats: d * level - m (exact products, see avx2_kquants.c) */
static inline void store16(float *y, uint8x16_t q, float d, float m) {
    const uint16x8_t lo = vmovl_u8(vget_low_u8(q)), hi = vmovl_high_u8(q);
    const float32x4_t vm = vdupq_n_f32(m);
    vst1q_f32(y, vsubq_f32(vmulq_n_f32(vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))), d), vm));
    vst1q_f32(y + 4, vsubq_f32(vmulq_n_f32(vcvtq_f32_u32(vmovl_high_u16(lo)), d), vm));
    vst1q_f32(y + 8, vsubq_f32(vmulq_n_f32(vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))), d), vm));
    vst1q_f32(y + 12, vsubq_f32(vmulq_n_f32(vcvtq_f32_u32(vmovl_high_u16(hi)), d), vm));
}

static void dequantize_k4(const uint8_t *qs, const uint8_t *qh, const uint8_t *packed, float d, float dmin, float *y) {
    const uint8x16_t m4 = vdupq_n_u8(0xF), one = vdupq_n_u8(1);
    uint8x16_t h[2] = {vdupq_n_u8(0), vdupq_n_u8(0)};
    if (qh) { h[0] = vld1q_u8(qh); h[1] = vld1q_u8(qh + 16); }
    for (int j = 0; j < 4; j++) {
        uint8_t sc0, mn0, sc1, mn1;
        pe_k4_scale_min(2 * j, packed, &sc0, &mn0);
        pe_k4_scale_min(2 * j + 1, packed, &sc1, &mn1);
        for (int r = 0; r < 2; r++) {
            const uint8x16_t q = vld1q_u8(qs + 32 * j + 16 * r);
            const uint8x16_t lo = vsliq_n_u8(vandq_u8(q, m4), vandq_u8(h[r], one), 4);
            const uint8x16_t hi = vsliq_n_u8(vshrq_n_u8(q, 4), vandq_u8(vshrq_n_u8(h[r], 1), one), 4);
            store16(y + 64 * j + 16 * r, lo, d * sc0, dmin * mn0);
            store16(y + 64 * j + 32 + 16 * r, hi, d * sc1, dmin * mn1);
            h[r] = vshrq_n_u8(h[r], 2);
        }
    }
}

static void dequantize_q4_K(const void *vx, float *y, int64_t n) {
    const block_q4_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K)
        dequantize_k4(x[i].qs, NULL, x[i].scales, f16(x[i].d), f16(x[i].dmin), y);
}

static void dequantize_q5_K(const void *vx, float *y, int64_t n) {
    const block_q5_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K)
        dequantize_k4(x[i].qs, x[i].qh, x[i].scales, f16(x[i].d), f16(x[i].dmin), y);
}

/* 16 levels stored + 32 -> d * scale * (level - 32) */
static inline void store16_signed(float *y, uint8x16_t q, float dl) {
    const int8x16_t v = vsubq_s8(s8(q), vdupq_n_s8(32));
    const int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_high_s8(v);
    vst1q_f32(y, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), dl));
    vst1q_f32(y + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(lo)), dl));
    vst1q_f32(y + 8, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), dl));
    vst1q_f32(y + 12, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(hi)), dl));
}

static void dequantize_q6_K(const void *vx, float *y, int64_t n) {
    const block_q6_K *x = vx;
    const uint8x16_t m3 = vdupq_n_u8(3);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16(x[i].d);
        for (int h = 0; h < 2; h++, y += 128) {
            const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
            const int8_t *sc = x[i].scales + 8 * h;
            for (int r = 0; r < 2; r++) {
                const uint8x16_t l0 = vld1q_u8(ql + 16 * r), l2 = vld1q_u8(ql + 32 + 16 * r);
                const uint8x16_t hb = vld1q_u8(qh + 16 * r);
                store16_signed(y + 16 * r, vsliq_n_u8(l0, vandq_u8(hb, m3), 4), d * sc[r]);
                store16_signed(y + 32 + 16 * r, vsliq_n_u8(l2, vandq_u8(vshrq_n_u8(hb, 2), m3), 4), d * sc[2 + r]);
                store16_signed(y + 64 + 16 * r, vsliq_n_u8(vshrq_n_u8(l0, 4), vandq_u8(vshrq_n_u8(hb, 4), m3), 4), d * sc[4 + r]);
                store16_signed(y + 96 + 16 * r, vsliq_n_u8(vshrq_n_u8(l2, 4), vshrq_n_u8(hb, 6), 4), d * sc[6 + r]);
            }
        }
    }
}

void PE_NEON_NAME(pe_fill_neon_kquants)(pe_kernels *k) {
    k->type[PE_TYPE_Q8_K].from_float = quantize_q8_K;
    k->type[PE_TYPE_Q8_K].to_float = dequantize_q8_K;
    k->type[PE_TYPE_Q2_K].vec_dot = vec_dot_q2_K;
    k->type[PE_TYPE_Q3_K].vec_dot = vec_dot_q3_K;
    k->type[PE_TYPE_Q4_K].vec_dot = vec_dot_q4_K;
    k->type[PE_TYPE_Q4_K].to_float = dequantize_q4_K;
    k->type[PE_TYPE_Q5_K].vec_dot = vec_dot_q5_K;
    k->type[PE_TYPE_Q5_K].to_float = dequantize_q5_K;
    k->type[PE_TYPE_Q6_K].vec_dot = vec_dot_q6_K;
    k->type[PE_TYPE_Q6_K].to_float = dequantize_q6_K;
    k->type[PE_TYPE_IQ4_NL].vec_dot = vec_dot_iq4_nl;
    k->type[PE_TYPE_IQ4_XS].vec_dot = vec_dot_iq4_xs;
}

#else /* no NEON: the reference kernels stay */

void PE_NEON_NAME(pe_fill_neon_kquants)(pe_kernels *k) { (void)k; }

#endif
