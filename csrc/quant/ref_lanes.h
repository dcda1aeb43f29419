/* ref_lanes.h - the canonical float arithmetic of the dot products, written
 * out lane by lane for the scalar reference.
 *
 * Every ISA computes the same bits (issue #25): the x86 kernels' order is the
 * canonical one.  Those kernels keep eight float accumulators (one 256-bit
 * vector), multiply-add into them with one rounding (fma), and fold the eight
 * lanes at the end by a fixed tree.  The reference does the same with plain
 * arrays: fmaf() where the SIMD code fuses, one rounding per operation
 * elsewhere (the ref files build with -ffp-contract=off), and the same trees.
 * The integer sums feeding the lanes are exact, so only which elements go to
 * which lane matters: each kernel says so where it forms them. */
#ifndef PE_REF_LANES_H
#define PE_REF_LANES_H

#include <math.h>
#include <stdint.h>

#define REF_LANES 8

/* acc[t] = fma(d, sums[t], acc[t]) for every lane */
static inline void lanes_fma(float acc[REF_LANES], float d, const int32_t sums[REF_LANES]) {
    for (int t = 0; t < REF_LANES; t++) acc[t] = fmaf(d, (float)sums[t], acc[t]);
}

/* The eight lanes folded by halves: lanes t and t + 4, then t and t + 2,
 * then the last two (x86_reduce.h's x86_sum_ps8). */
static inline float lanes_sum_halves(const float v[REF_LANES]) {
    float h[4];
    for (int t = 0; t < 4; t++) h[t] = v[t + 4] + v[t];
    return (h[0] + h[2]) + (h[1] + h[3]);
}

/* The eight lanes folded by halves once, then by adjacent pairs (two
 * horizontal adds: the float row products' reduction). */
static inline float lanes_sum_pairs(const float v[REF_LANES]) {
    float h[4];
    for (int t = 0; t < 4; t++) h[t] = v[t] + v[t + 4];
    return (h[0] + h[1]) + (h[2] + h[3]);
}

/* The SIMD max of two floats: a when a > b, else b (so a NaN in either
 * gives b, as maxps does). */
static inline float lanes_max(float a, float b) { return a > b ? a : b; }

/* The largest of eight lanes by halves (maxps, then maxss on the last two). */
static inline float lanes_max_halves(const float v[REF_LANES]) {
    float h[4];
    for (int t = 0; t < 4; t++) h[t] = lanes_max(v[t], v[t + 4]);
    return lanes_max(lanes_max(h[0], h[2]), lanes_max(h[1], h[3]));
}

/* Round to nearest even and convert to int32 as cvtps does: NaN and values
 * out of int32's range give INT32_MIN. */
static inline int32_t lanes_round_i32(float v) {
    const float r = nearbyintf(v);
    if (!(r >= -2147483648.0f && r < 2147483648.0f)) return INT32_MIN;
    return (int32_t)r;
}

/* int32 to int8 with saturation (packssdw then packsswb) */
static inline int8_t lanes_saturate_i8(int32_t v) {
    return (int8_t)(v < -128 ? -128 : v > 127 ? 127 : v);
}

#endif /* PE_REF_LANES_H */
