/* neon_common.h - small NEON helpers the NEON kernel files share.  Include
 * after <arm_neon.h>, inside the files' __ARM_NEON sections. */
#ifndef PE_NEON_COMMON_H
#define PE_NEON_COMMON_H

/* acc + the products of 16 int8 pairs, summed into four 32-bit lanes: sdot
 * where the CPU has the dot-product extension, else widening multiplies
 * (the same lane totals only as a whole: callers reduce or scale per vector) */
#if defined(__ARM_FEATURE_DOTPROD)
static inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) { return vdotq_s32(acc, a, b); }
#else
static inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
}
#endif

static inline int8x16_t s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

#endif /* PE_NEON_COMMON_H */
