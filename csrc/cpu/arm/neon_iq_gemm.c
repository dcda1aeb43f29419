/* neon_iq_gemm.c - NEON products of the lattice types' prompt tiles
 * (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M): the PE_PACK_ROWS
 * weight rows ref_iquants.c's pack16 expanded into signed int8 levels with
 * 16-bit pair multipliers and shifts (pe_lattice_row), against up to
 * PE_GEMM_COLS Q8_K activation rows.
 *
 * The scheme, per super-block of 256 weights, in 4 steps of 64:
 *  - products: sdot of 16 levels with 16 activation codes gives four 32-bit
 *    lanes, lane k the sum of weights 4k..4k+3 (without dotprod: widening
 *    multiplies, their pairs added in 16 bits, then pairwise into 32 bits,
 *    the same lanes); a pairwise add of two such vectors leaves the sums of
 *    four runs of 8 weights;
 *  - multipliers: pack16 writes one multiplier per pair, constant over each
 *    run of 8 weights (4 pairs) - every type's scale covers 16 or 32
 *    weights; so every fourth of them (vld4's first vector) is the run's,
 *    widened to 32 bits and met with the run sums in a multiply-accumulate;
 *  - shifts (IQ1 only, when the pack says so): the activation codes summed
 *    per run of 8 the same way (sdot with ones), times every fourth shift;
 *  - one horizontal add per integer ends the super-block.
 * Bounds: |level| <= 62, |code| <= 128, |mult| <= 31, |shift| <= 15.  A
 * pair of products is at most 15872 (fits the fallback's 16-bit adds), a run
 * of 8 at most 63488, times its multiplier under 2^21; a lane adds 8 of
 * those (under 2^24), the super-block under 2^26: no overflow anywhere.  The
 * shifts stay under 2^19.  Integer addition is exact in any order, so sumi
 * and shifts are the scalar lattice_sums' integers, and the float part
 * (iquants.h's pe_lattice_gemm16, shared with the scalar kernel) gives its
 * bits, and vec_dot's. */
#include "internal.h"
#include "iquants.h"

#if defined(__ARM_NEON)
#include <arm_neon.h>

/* four lanes, lane k += the sum of a[j] * b[j] over j = 4k..4k+3; needs
 * |a[j] * b[j] + a[j+1] * b[j+1]| < 2^15 (levels or ones against codes) */
#if defined(__ARM_FEATURE_DOTPROD)
static inline int32x4_t dot4(int32x4_t acc, int8x16_t a, int8x16_t b) { return vdotq_s32(acc, a, b); }
#else
static inline int32x4_t dot4(int32x4_t acc, int8x16_t a, int8x16_t b) {
    const int16x8_t pairs = vpaddq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)), vmull_high_s8(a, b));
    return vpadalq_s16(acc, pairs);
}
#endif

/* lane r: the sum of a[j] * b[j] over the run of 8 j = 8r..8r+7 (32 bytes) */
static inline int32x4_t runs8(const int8_t *a, const int8_t *b) {
    const int32x4_t zero = vdupq_n_s32(0);
    const int32x4_t lo = dot4(zero, vld1q_s8(a), vld1q_s8(b));
    const int32x4_t hi = dot4(zero, vld1q_s8(a + 16), vld1q_s8(b + 16));
    return vpaddq_s32(lo, hi);
}

/* lane r: the sum of the codes of the run of 8 j = 8r..8r+7 (32 codes) */
static inline int32x4_t code_runs8(const int8_t *q) {
    const int8x16_t ones = vdupq_n_s8(1);
    const int32x4_t zero = vdupq_n_s32(0);
    return vpaddq_s32(dot4(zero, ones, vld1q_s8(q)), dot4(zero, ones, vld1q_s8(q + 16)));
}

/* the per-run values of 8 runs of 8 weights (32 pairs from p, constant
 * over each 4): pairs 0, 4, ..., 28, as 32-bit lanes out[0] (runs 0..3)
 * and out[1] (runs 4..7) */
static inline void run_values(const int16_t *p, int32x4_t out[2]) {
    const int16x8_t every4th = vld4q_s16(p).val[0];
    out[0] = vmovl_s16(vget_low_s16(every4th));
    out[1] = vmovl_high_s16(every4th);
}

/* acc + the 8 runs of 64 weights from k0, each times its pair multiplier */
static inline int32x4_t products64(int32x4_t acc, const pe_lattice_row *w, const int8_t *q, int k0) {
    int32x4_t mult[2];
    run_values(w->mult + k0 / 2, mult);
    acc = vmlaq_s32(acc, runs8(w->level + k0, q + k0), mult[0]);
    return vmlaq_s32(acc, runs8(w->level + k0 + 32, q + k0 + 32), mult[1]);
}

/* acc + the code sums of the 8 runs of 64 weights from k0, each times its shift */
static inline int32x4_t shifts64(int32x4_t acc, const pe_lattice_row *w, const int8_t *q, int k0) {
    int32x4_t shift[2];
    run_values(w->shift + k0 / 2, shift);
    acc = vmlaq_s32(acc, code_runs8(q + k0), shift[0]);
    return vmlaq_s32(acc, code_runs8(q + k0 + 32), shift[1]);
}

/* one super-block of one row against one activation row (iquants.h) */
static void sums(const pe_lattice_row *w, const int8_t *q, int has_shifts, int32_t *sumi, int32_t *shifts) {
    int32x4_t products = vdupq_n_s32(0);
    for (int k0 = 0; k0 < QK_K; k0 += 64) products = products64(products, w, q, k0);
    *sumi = vaddvq_s32(products);
    *shifts = 0;
    if (!has_shifts) return;
    int32x4_t shifted = vdupq_n_s32(0);
    for (int k0 = 0; k0 < QK_K; k0 += 64) shifted = shifts64(shifted, w, q, k0);
    *shifts = vaddvq_s32(shifted);
}

static void lattice_gemm16(int64_t n, float *s, size_t bs, const void *packed, const void *a, size_t ba, int nc) {
    pe_lattice_gemm16(n, s, bs, packed, a, ba, nc, sums);
}

/* gemm16 of the 7 lattice types; their pack16 stays the reference's */
void PE_NEON_NAME(pe_fill_neon_iq_gemm)(pe_kernels *k) {
    static const int types[] = {PE_TYPE_IQ2_XXS, PE_TYPE_IQ2_XS, PE_TYPE_IQ2_S, PE_TYPE_IQ3_XXS, PE_TYPE_IQ3_S,
                                PE_TYPE_IQ1_S,   PE_TYPE_IQ1_M};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) k->type[types[i]].packed.gemm16 = lattice_gemm16;
}

#else /* no NEON: the reference gemm16 stays */

void PE_NEON_NAME(pe_fill_neon_iq_gemm)(pe_kernels *k) { (void)k; }

#endif
