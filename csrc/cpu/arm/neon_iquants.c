/* neon_iquants.c - NEON dot products of the lattice types IQ2_XXS, IQ2_XS,
 * IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M with Q8_K activations.
 *
 * The scheme, per super-block of 256:
 *  - gather: grid indices are pulled out of the packed bits with scalar
 *    code; the grid entries they name (8 levels, or 4 for IQ3's) are loaded
 *    as 64-bit (32-bit) pieces and combined into 16-lane vectors;
 *  - signs: a 16-lane byte mask (0xFF: negative) per 16 weights, from a
 *    table of masks built once by pe_fill_neon_iquants for the parity-coded
 *    7-bit signs (IQ2_XXS / IQ2_XS / IQ3_XXS), or by testing the bits of
 *    the explicit sign bytes (IQ2_S / IQ3_S); (v ^ m) - m negates the
 *    masked lanes.  Every level fits int8 with its sign (|level| <= 62);
 *  - products: sdot of 16 signed levels with 16 activation codes leaves four
 *    32-bit partial sums per run of 16; pairwise adds fold four such vectors
 *    into one vector of four run sums, which meets a vector of the runs'
 *    odd scales (2 s + 1) in a 32-bit multiply-accumulate; one horizontal
 *    add ends the super-block.  IQ1's shift of +-1/8 is a second integer:
 *    the activations' sums (Q8_K's bsums, or an sdot with +-1 for IQ1_M's
 *    per-8 signs) times the same scales.
 * All of this is exact integer arithmetic and gives the scalar reference's
 * integers (no sum comes near 2^31).  The float part then repeats the
 * reference's expression operation by operation, once per super-block and
 * in block order, with every product kept a rounded float (PE_NO_FUSE): the
 * results are bit-identical to ref_iquants.c. */
#include "internal.h"
#include "iquants.h"
#include "kquants.h"   /* PE_NO_FUSE */

#if defined(__ARM_NEON)
#include <arm_neon.h>

#include "neon_common.h"

/* byte j of iq2_sign_masks[k] is 0xFF when the parity-coded signs k
 * (pe_iq2_signs) make weight j negative */
static uint64_t iq2_sign_masks[128];

/* ---- helpers ------------------------------------------------------------------ */

/* one run of 16 levels against 16 activations: four partial sums */
static inline int32x4_t dot_run16(int8x16_t w, const int8_t *q8) { return dot16(vdupq_n_s32(0), w, vld1q_s8(q8)); }

/* one sub-block of 32 (two runs of 16) */
static inline int32x4_t dot_run32(int8x16_t w01, int8x16_t w23, const int8_t *q8) {
    return dot16(dot16(vdupq_n_s32(0), w01, vld1q_s8(q8)), w23, vld1q_s8(q8 + 16));
}

/* two grid entries of 8 levels side by side */
static inline uint8x16_t grid8x2(const uint8_t *grid, unsigned i0, unsigned i1) {
    return vcombine_u8(vld1_u8(grid + 8 * i0), vld1_u8(grid + 8 * i1));
}

static inline int8x16_t grid8x2_s8(const int8_t *grid, unsigned i0, unsigned i1) {
    return vcombine_s8(vld1_s8(grid + 8 * i0), vld1_s8(grid + 8 * i1));
}

/* four grid entries of 4 levels side by side (memcpy: the grids are byte
 * arrays, with no alignment promised) */
static inline uint8x16_t grid4x4(const uint8_t *grid, unsigned i0, unsigned i1, unsigned i2, unsigned i3) {
    uint32_t w[4];
    memcpy(&w[0], grid + 4 * i0, 4);
    memcpy(&w[1], grid + 4 * i1, 4);
    memcpy(&w[2], grid + 4 * i2, 4);
    memcpy(&w[3], grid + 4 * i3, 4);
    return vreinterpretq_u8_u32(vld1q_u32(w));
}

/* levels with signs: lanes whose mask is 0xFF negated, (v ^ -1) + 1 */
static inline int8x16_t apply_signs(uint8x16_t levels, uint8x16_t mask) {
    return vsubq_s8(s8(veorq_u8(levels, mask)), s8(mask));
}

/* the masks of two 8-weight groups' parity-coded signs (7 bits each) */
static inline uint8x16_t iq2_masks(unsigned k0, unsigned k1) {
    return vcombine_u8(vcreate_u8(iq2_sign_masks[k0]), vcreate_u8(iq2_sign_masks[k1]));
}

/* the masks of 32 weights' explicit sign bytes (bit j of byte g: weight
 * 8 g + j negative): bytes 0, 1 into *m01, bytes 2, 3 into *m23 */
static inline void explicit_masks(const uint8_t *signs, uint8x16_t *m01, uint8x16_t *m23) {
    static const uint8_t spread01[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    static const uint8_t spread23[16] = {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint32_t word;
    memcpy(&word, signs, sizeof word);
    const uint8x16_t bytes = vreinterpretq_u8_u32(vdupq_n_u32(word));
    *m01 = vtstq_u8(vqtbl1q_u8(bytes, vld1q_u8(spread01)), vld1q_u8(bit));
    *m23 = vtstq_u8(vqtbl1q_u8(bytes, vld1q_u8(spread23)), vld1q_u8(bit));
}

/* lane r: the sum of the four lanes of p[r] */
static inline int32x4_t fold4(const int32x4_t p[4]) {
    return vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
}

/* sum over runs r < 4 nvec of scale_r * (the sum of p[r]), the scales in
 * lanes of sc[0..nvec) */
static inline int32_t scaled_sum(const int32x4_t *p, const int32x4_t *sc, int nvec) {
    int32x4_t acc = vmulq_s32(fold4(p), sc[0]);
    for (int v = 1; v < nvec; v++) acc = vmlaq_s32(acc, fold4(p + 4 * v), sc[v]);
    return vaddvq_s32(acc);
}

/* 4-bit fields s -> 2 s + 1 (at most 31) */
static inline uint8x8_t odd8(uint8x8_t s) { return vorr_u8(vshl_n_u8(s, 1), vdup_n_u8(1)); }
static inline uint32x4_t odd32(uint32x4_t s) { return vorrq_u32(vshlq_n_u32(s, 1), vdupq_n_u32(1)); }

/* eight unsigned bytes as two int32 vectors */
static inline void widen_u8(uint8x8_t v, int32x4_t out[2]) {
    const uint16x8_t w = vmovl_u8(v);
    out[0] = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(w)));
    out[1] = vreinterpretq_s32_u32(vmovl_high_u16(w));
}

/* Scales of 4 bits, two to a byte, low nibble first (IQ2_XS, IQ2_S: per 16
 * weights; IQ3_S: per 32): the odd multipliers of the nibbles of the 8
 * bytes (little-endian) in `bytes`, in order, as int32 lanes of out[0..4). */
static inline void nibble_scales(uint64_t bytes, int32x4_t out[4]) {
    const uint8x8_t v = vcreate_u8(bytes);
    const uint8x8_t lo = odd8(vand_u8(v, vdup_n_u8(15))), hi = odd8(vshr_n_u8(v, 4));
    widen_u8(vzip1_u8(lo, hi), out);
    widen_u8(vzip2_u8(lo, hi), out + 2);
}

static inline uint64_t load8(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* the floats of one super-block, as the reference: sum + d * da * v, each
 * operation rounded on its own */
static inline float add_block(float sum, float d, float da, float v) {
    float t = d * da;
    t = t * v;
    PE_NO_FUSE(t);
    return sum + t;
}

/* ---- IQ2_XXS: per sub-block a word of 4 index bytes, then a word of
 * 4 x 7 sign bits and the scale in bits 28..31 ----------------------------------- */

static int32_t iq2_xxs_block(const block_iq2_xxs *b, const int8_t *q8) {
    const uint8_t *qs = (const uint8_t *)b->qs;
    int32x4_t p[8];
    for (int ib = 0; ib < 8; ib++, q8 += 32) {
        const uint8_t *idx = qs + 8 * ib;
        uint32_t aux;
        memcpy(&aux, idx + 4, sizeof aux);
        const uint8x16_t m01 = iq2_masks(aux & 127, aux >> 7 & 127), m23 = iq2_masks(aux >> 14 & 127, aux >> 21 & 127);
        p[ib] = dot_run32(apply_signs(grid8x2(pe_iq2xxs_grid, idx[0], idx[1]), m01),
                          apply_signs(grid8x2(pe_iq2xxs_grid, idx[2], idx[3]), m23), q8);
    }
    /* words 1 and 3 of every 16 bytes (the sign / scale words) of sub-blocks 0..3 and 4..7 */
    const uint32x4_t a0 = vuzp2q_u32(vreinterpretq_u32_u8(vld1q_u8(qs)), vreinterpretq_u32_u8(vld1q_u8(qs + 16)));
    const uint32x4_t a1 = vuzp2q_u32(vreinterpretq_u32_u8(vld1q_u8(qs + 32)), vreinterpretq_u32_u8(vld1q_u8(qs + 48)));
    const int32x4_t sc[2] = {vreinterpretq_s32_u32(odd32(vshrq_n_u32(a0, 28))),
                             vreinterpretq_s32_u32(odd32(vshrq_n_u32(a1, 28)))};
    return scaled_sum(p, sc, 2);
}

static void vec_dot_iq2_xxs(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq2_xxs *x = vw;
    const block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++)
        sum = add_block(sum, pe_f16_to_f32(x[i].d), a[i].d, (float)iq2_xxs_block(&x[i], a[i].qs));
    *s = 0.125f * sum;
}

/* ---- IQ2_XS: 16-bit words of a 9-bit index and 7 sign bits; a 4-bit scale
 * per 16 weights -------------------------------------------------------------------- */

static int32_t iq2_xs_block(const block_iq2_xs *b, const int8_t *q8) {
    int32x4_t p[16];
    for (int r = 0; r < 16; r++, q8 += 16) {
        const unsigned q0 = b->qs[2 * r], q1 = b->qs[2 * r + 1];
        const uint8x16_t levels = grid8x2(pe_iq2xs_grid, q0 & 511, q1 & 511);
        p[r] = dot_run16(apply_signs(levels, iq2_masks(q0 >> 9, q1 >> 9)), q8);
    }
    int32x4_t sc[4];
    nibble_scales(load8(b->scales), sc);
    return scaled_sum(p, sc, 4);
}

static void vec_dot_iq2_xs(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq2_xs *x = vw;
    const block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++)
        sum = add_block(sum, pe_f16_to_f32(x[i].d), a[i].d, (float)iq2_xs_block(&x[i], a[i].qs));
    *s = 0.125f * sum;
}

/* ---- IQ2_S: 10-bit indices (low 8 bits in qs, 2 per group in qh), explicit
 * sign bytes after the indices, a 4-bit scale per 16 weights ------------------------- */

static int32_t iq2_s_block(const block_iq2_s *b, const int8_t *q8) {
    const uint8_t *signs = b->qs + QK_K / 8;
    int32x4_t p[16];
    for (int ib = 0; ib < 8; ib++, q8 += 32) {
        const uint8_t *qs = b->qs + 4 * ib;
        const unsigned qh = b->qh[ib];
        unsigned idx[4];
        for (int l = 0; l < 4; l++) idx[l] = qs[l] | (qh << (8 - 2 * l) & 0x300);
        uint8x16_t m01, m23;
        explicit_masks(signs + 4 * ib, &m01, &m23);
        p[2 * ib] = dot_run16(apply_signs(grid8x2(pe_iq2s_grid, idx[0], idx[1]), m01), q8);
        p[2 * ib + 1] = dot_run16(apply_signs(grid8x2(pe_iq2s_grid, idx[2], idx[3]), m23), q8 + 16);
    }
    int32x4_t sc[4];
    nibble_scales(load8(b->scales), sc);
    return scaled_sum(p, sc, 4);
}

static void vec_dot_iq2_s(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq2_s *x = vw;
    const block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++)
        sum = add_block(sum, pe_f16_to_f32(x[i].d), a[i].d, (float)iq2_s_block(&x[i], a[i].qs));
    *s = 0.125f * sum;
}

/* ---- IQ3_XXS: an index byte per 4 weights (64 bytes), then per sub-block a
 * word of 4 x 7 sign bits and the scale in bits 28..31 ------------------------------ */

static int32_t iq3_xxs_block(const block_iq3_xxs *b, const int8_t *q8) {
    const uint8_t *words = b->qs + QK_K / 4;
    int32x4_t p[8];
    for (int ib = 0; ib < 8; ib++, q8 += 32) {
        const uint8_t *idx = b->qs + 8 * ib;
        uint32_t aux;
        memcpy(&aux, words + 4 * ib, sizeof aux);
        const uint8x16_t m01 = iq2_masks(aux & 127, aux >> 7 & 127), m23 = iq2_masks(aux >> 14 & 127, aux >> 21 & 127);
        p[ib] = dot_run32(apply_signs(grid4x4(pe_iq3xxs_grid, idx[0], idx[1], idx[2], idx[3]), m01),
                          apply_signs(grid4x4(pe_iq3xxs_grid, idx[4], idx[5], idx[6], idx[7]), m23), q8);
    }
    const int32x4_t sc[2] = {
        vreinterpretq_s32_u32(odd32(vshrq_n_u32(vreinterpretq_u32_u8(vld1q_u8(words)), 28))),
        vreinterpretq_s32_u32(odd32(vshrq_n_u32(vreinterpretq_u32_u8(vld1q_u8(words + 16)), 28)))};
    return scaled_sum(p, sc, 2);
}

static void vec_dot_iq3_xxs(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq3_xxs *x = vw;
    const block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++)
        sum = add_block(sum, pe_f16_to_f32(x[i].d), a[i].d, (float)iq3_xxs_block(&x[i], a[i].qs));
    *s = 0.25f * sum;
}

/* ---- IQ3_S: 9-bit indices per 4 weights (the ninth bit of index k of a
 * sub-block is bit k of its qh byte), explicit sign bytes, a 4-bit scale per
 * sub-block --------------------------------------------------------------------------- */

static int32_t iq3_s_block(const block_iq3_s *b, const int8_t *q8) {
    int32x4_t p[8];
    for (int ib = 0; ib < 8; ib++, q8 += 32) {
        const uint8_t *qs = b->qs + 8 * ib;
        const unsigned qh = b->qh[ib];
        unsigned idx[8];
        for (int k = 0; k < 8; k++) idx[k] = qs[k] | (qh << (8 - k) & 256);
        uint8x16_t m01, m23;
        explicit_masks(b->signs + 4 * ib, &m01, &m23);
        p[ib] = dot_run32(apply_signs(grid4x4(pe_iq3s_grid, idx[0], idx[1], idx[2], idx[3]), m01),
                          apply_signs(grid4x4(pe_iq3s_grid, idx[4], idx[5], idx[6], idx[7]), m23), q8);
    }
    /* the 4 scale bytes end the block: read as 32 bits (the upper half's
     * lanes, sc[2..3], go unused) */
    uint32_t scales;
    memcpy(&scales, b->scales, sizeof scales);
    int32x4_t sc[4];
    nibble_scales(scales, sc);
    return scaled_sum(p, sc, 2);
}

static void vec_dot_iq3_s(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq3_s *x = vw;
    const block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++)
        sum = add_block(sum, pe_f16_to_f32(x[i].d), a[i].d, (float)iq3_s_block(&x[i], a[i].qs));
    *s = sum;
}

/* ---- IQ1_S / IQ1_M: grid levels -1, 0, 1; the shift of +-1/8 is counted
 * apart in integers (shifts), as in the reference ----------------------------------- */

/* the reference's float part: d * da * (sumi + 1/8 shifts) */
static inline float add_block_iq1(float sum, float d, float da, int32_t sumi, int32_t shifts) {
    float t = PE_IQ1_DELTA * (float)shifts;
    PE_NO_FUSE(t);
    return add_block(sum, d, da, (float)sumi + t);
}

/* IQ1_S: 11-bit indices (8 bits in qs, 3 per group in qh bits 0..11); qh
 * bits 12..14 the sub-block's scale, bit 15 the sign of its shift */
static void iq1_s_block(const block_iq1_s *b, const block_q8_K *a, int32_t *sumi, int32_t *shifts) {
    const int8_t *q8 = a->qs;
    int32x4_t p[8];
    for (int ib = 0; ib < 8; ib++, q8 += 32) {
        const uint8_t *qs = b->qs + 4 * ib;
        const unsigned qh = b->qh[ib];
        p[ib] = dot_run32(grid8x2_s8(pe_iq1s_grid, qs[0] | (qh << 8 & 0x700), qs[1] | (qh << 5 & 0x700)),
                          grid8x2_s8(pe_iq1s_grid, qs[2] | (qh << 2 & 0x700), qs[3] | (qh >> 1 & 0x700)), q8);
    }
    const uint16x8_t qh = vld1q_u16(b->qh);
    const int16x8_t ls = vreinterpretq_s16_u16(vorrq_u16(vshlq_n_u16(vandq_u16(vshrq_n_u16(qh, 12), vdupq_n_u16(7)), 1),
                                                         vdupq_n_u16(1)));
    const int32x4_t sc[2] = {vmovl_s16(vget_low_s16(ls)), vmovl_high_s16(ls)};
    *sumi = scaled_sum(p, sc, 2);
    /* the shifts: +-ls times the sub-block's activation sum (two bsums) */
    const int16x8_t neg = vshrq_n_s16(vreinterpretq_s16_u16(qh), 15);   /* 0 or -1 */
    const int16x8_t sls = vsubq_s16(veorq_s16(ls, neg), neg);
    const int32x4_t pair_lo = vpaddlq_s16(vld1q_s16(a->bsums)), pair_hi = vpaddlq_s16(vld1q_s16(a->bsums + 8));
    *shifts = vaddvq_s32(vmlaq_s32(vmulq_s32(pair_lo, vmovl_s16(vget_low_s16(sls))), pair_hi, vmovl_high_s16(sls)));
}

static void vec_dot_iq1_s(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq1_s *x = vw;
    const block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t sumi, shifts;
        iq1_s_block(&x[i], &a[i], &sumi, &shifts);
        sum = add_block_iq1(sum, pe_f16_to_f32(x[i].d), a[i].d, sumi, shifts);
    }
    *s = sum;
}

/* IQ1_M: per 16 weights (run r) a qh byte (low nibble: group 2r, high: 2r + 1;
 * bits 0..2 the index's top bits, bit 3 the shift's sign) and a 3-bit scale,
 * field r % 4 of scale word r / 4.  The shift's sign changes every 8 weights,
 * finer than bsums: an sdot with +-1 sums the activations with it. */
static void iq1_m_block(const block_iq1_m *b, const int8_t *q8, int32_t *sumi, int32_t *shifts) {
    static const uint8_t sign_bit[16] = {8, 8, 8, 8, 8, 8, 8, 8, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80};
    const uint8x16_t sign_bits = vld1q_u8(sign_bit), one = vdupq_n_u8(1);
    int32x4_t p[16], t[16];
    for (int r = 0; r < 16; r++, q8 += 16) {
        const unsigned qh = b->qh[r];
        const int8x16_t levels = grid8x2_s8(pe_iq1s_grid, b->qs[2 * r] | (qh << 8 & 0x700), b->qs[2 * r + 1] | (qh << 4 & 0x700));
        /* 0xFF | 1 = -1 where the sign bit is set, else 1 */
        const int8x16_t sign = s8(vorrq_u8(vtstq_u8(vdupq_n_u8((uint8_t)qh), sign_bits), one));
        const int8x16_t y = vld1q_s8(q8);
        p[r] = dot16(vdupq_n_s32(0), levels, y);
        t[r] = dot16(vdupq_n_s32(0), sign, y);
    }
    uint16_t words[4];
    memcpy(words, b->scales, sizeof words);
    static const int32_t field_shift[4] = {0, -3, -6, -9};   /* field f: right by 3 f */
    const int32x4_t field = vld1q_s32(field_shift);
    int32x4_t sc[4];
    for (int w = 0; w < 4; w++)
        sc[w] = vreinterpretq_s32_u32(odd32(vandq_u32(vshlq_u32(vdupq_n_u32(words[w]), field), vdupq_n_u32(7))));
    *sumi = scaled_sum(p, sc, 4);
    *shifts = scaled_sum(t, sc, 4);
}

static void vec_dot_iq1_m(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq1_m *x = vw;
    const block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t sumi, shifts;
        iq1_m_block(&x[i], a[i].qs, &sumi, &shifts);
        sum = add_block_iq1(sum, pe_f16_to_f32(pe_iq1m_scale(&x[i])), a[i].d, sumi, shifts);
    }
    *s = sum;
}

/* pe_iq2_signs is filled by pe_fill_ref_iquants, which dispatch.c runs on
 * every table before the per-ISA fills */
void PE_NEON_NAME(pe_fill_neon_iquants)(pe_kernels *k) {
    for (int c = 0; c < 128; c++) {
        uint64_t m = 0;
        for (int j = 0; j < 8; j++)
            if (pe_iq2_signs[c] >> j & 1) m |= (uint64_t)0xFF << 8 * j;
        iq2_sign_masks[c] = m;
    }
    k->type[PE_TYPE_IQ2_XXS].vec_dot = vec_dot_iq2_xxs;
    k->type[PE_TYPE_IQ2_XS].vec_dot = vec_dot_iq2_xs;
    k->type[PE_TYPE_IQ2_S].vec_dot = vec_dot_iq2_s;
    k->type[PE_TYPE_IQ3_XXS].vec_dot = vec_dot_iq3_xxs;
    k->type[PE_TYPE_IQ3_S].vec_dot = vec_dot_iq3_s;
    k->type[PE_TYPE_IQ1_S].vec_dot = vec_dot_iq1_s;
    k->type[PE_TYPE_IQ1_M].vec_dot = vec_dot_iq1_m;
}

#else /* no NEON: the reference kernels stay */

void PE_NEON_NAME(pe_fill_neon_iquants)(pe_kernels *k) { (void)k; }

#endif
