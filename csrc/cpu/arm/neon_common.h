/* neon_common.h - small NEON helpers the NEON kernel files share.  Include
 * after <arm_neon.h>, inside the files' __ARM_NEON sections.
 *
 * The NEON kernels compute x86's bits (issue #25: one arithmetic per op on
 * every ISA).  x86 keeps 8 float lanes where NEON has 4, so a kernel holds
 * each of x86's 8-lane vectors as two float32x4 (lanes 0..3, 4..7) and
 * forms the same integer lanes in them; these reduce such pairs in x86's
 * order. */
#ifndef PE_NEON_COMMON_H
#define PE_NEON_COMMON_H

/* acc + the products of 16 int8 pairs: lane t gets the products of bytes
 * 4t..4t+3, as sdot (and x86's maddubs + madd) sums them.  Without the
 * dot-product extension, widening multiplies, their neighbours added in 16
 * bits (two products of codes in [-128, 127] with activations in [-127, 127]
 * stay inside 16 bits), then pairs of those into the lanes. */
#if defined(__ARM_FEATURE_DOTPROD)
static inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) { return vdotq_s32(acc, a, b); }
#else
static inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
    const int16x8_t pairs = vpaddq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)), vmull_high_s8(a, b));
    return vpadalq_s16(acc, pairs);
}
#endif

static inline int8x16_t s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

/* x86_sum_ps8 of the 8 lanes [lo | hi]: lanes i and i + 4, then i and
 * i + 2, then the last two */
static inline float neon_sum8(float32x4_t lo, float32x4_t hi) {
    const float32x4_t v = vaddq_f32(hi, lo);
    const float32x2_t h = vadd_f32(vget_low_f32(v), vget_high_f32(v));
    return vget_lane_f32(h, 0) + vget_lane_f32(h, 1);
}

/* lanes i and i + 4, then two horizontal adds: neighbours, then the two
 * pair sums (the x86 float dot products' hadd8) */
static inline float neon_hadd8(float32x4_t lo, float32x4_t hi) {
    const float32x4_t v = vaddq_f32(lo, hi);
    const float32x2_t h = vpadd_f32(vget_low_f32(v), vget_high_f32(v));
    return vget_lane_f32(h, 0) + vget_lane_f32(h, 1);
}

/* The 8 int32 lanes m[2t] * b[2t] + m[2t + 1] * b[2t + 1] of 16 int16
 * pairs, m = [m0 | m1] (x86's madd_epi16), as [lanes 0..3], [4..7]. */
static inline void madd16(int16x8_t m0, int16x8_t m1, const int16_t *b, int32x4_t *lo, int32x4_t *hi) {
    const int16x8_t b0 = vld1q_s16(b), b1 = vld1q_s16(b + 8);
    *lo = vpaddq_s32(vmull_s16(vget_low_s16(m0), vget_low_s16(b0)), vmull_high_s16(m0, b0));
    *hi = vpaddq_s32(vmull_s16(vget_low_s16(m1), vget_low_s16(b1)), vmull_high_s16(m1, b1));
}

#endif /* PE_NEON_COMMON_H */
