/* avx2_iq2.c - AVX2 dot products of the IQ2 lattice types IQ2_XXS, IQ2_XS
 * and IQ2_S with Q8_K activations.
 *
 * Each group of 8 weights is an 8-byte grid entry of unsigned levels (8, 25,
 * 43) and 8 sign bits.  Per 32 weights (one sub-block) the kernels fetch the
 * four grid entries and the four groups' sign masks (tables of +-1 bytes,
 * made once by the fill function) by scalar index into one vector each,
 * multiply levels, signs and activations into 16-bit pair sums (maddubs),
 * apply the odd scales as 16-bit multipliers (madd; IQ2_XXS has one scale
 * per sub-block, IQ2_XS and IQ2_S one per 16 weights, that is per 128-bit
 * lane) and add the 32-bit results up over the super-block.  One
 * horizontal sum then gives the same exact int32 the scalar reference forms
 * (integer sums do not depend on their order), and the float part follows
 * the reference expression for expression (no FMA: the project compiles
 * with -ffp-contract=off), so the results are its bits.
 *
 * Bounds: levels <= 43, activations in [-128, 127], so a maddubs pair is at
 * most 2 * 43 * 128 = 11008 in magnitude (no 16-bit saturation); a madd
 * lane adds two pairs times a scale <= 31 (682496), and 8 sub-blocks of
 * those stay far inside int32, as does the whole super-block's sum
 * (256 * 43 * 128 * 31 < 2^26).
 *
 * The signs go on the levels, never on the activations: negating an int8
 * activation would turn -128 into itself.  maddubs takes the activations'
 * magnitudes as its unsigned operand (|-128| = 128 fits an unsigned byte)
 * and the signed weights carrying each activation's sign as its signed one,
 * so every byte value is exact, -128 included. */
#include <immintrin.h>
#include <string.h>

#include "internal.h"
#include "iquants.h"
#include "x86_reduce.h"

/* Byte j of sign_mask[b] is -1 when bit j of b is set, else +1: the control
 * operand of _mm256_sign_epi8, for IQ2_S's explicit sign bytes (the 7 stored
 * bits of IQ2_XXS / IQ2_XS take iquants.h's pe_iq2_sign_bytes). */
static uint64_t sign_mask[256];

static void build_sign_masks(void) {
    for (unsigned b = 0; b < 256; b++) {
        uint64_t m = 0;
        for (unsigned j = 0; j < 8; j++) m |= (uint64_t)(b >> j & 1 ? 0xFF : 0x01) << 8 * j;
        sign_mask[b] = m;
    }
}

/* grid entries i0..i3 (8 level bytes each) as one vector, i0 lowest; the
 * indices are size_t so that the address is one scaled-index operand */
static inline __m256i grid4(const uint8_t *grid, size_t i0, size_t i1, size_t i2, size_t i3) {
    long long e[4];
    memcpy(&e[0], grid + 8 * i0, 8);
    memcpy(&e[1], grid + 8 * i1, 8);
    memcpy(&e[2], grid + 8 * i2, 8);
    memcpy(&e[3], grid + 8 * i3, 8);
    return _mm256_set_epi64x(e[3], e[2], e[1], e[0]);
}

/* the sign masks of four groups as one vector, the first lowest */
static inline __m256i masks4(const uint64_t *mask, size_t i0, size_t i1, size_t i2, size_t i3) {
    return _mm256_set_epi64x((long long)mask[i3], (long long)mask[i2], (long long)mask[i1], (long long)mask[i0]);
}

/* 32 products level * sign * activation summed in adjacent pairs (16 x int16).
 * The weights w = +-level carry each activation's sign (sign_epi8 zeroes w
 * where the activation is 0, whose product is 0 anyway); |activation| is the
 * unsigned operand. */
static inline __m256i signed_pairs(__m256i levels, __m256i signs, __m256i q8) {
    const __m256i w = _mm256_sign_epi8(levels, signs);
    return _mm256_maddubs_epi16(_mm256_abs_epi8(q8), _mm256_sign_epi8(w, q8));
}

/* ---- IQ2_XXS: per sub-block 4 index bytes, then a word of 4 x 7 sign bits
 * and the 4-bit scale ---------------------------------------------------------- */

static int32_t iq2_xxs_bsum(const block_iq2_xxs *x, const int8_t *q8) {
    const uint8_t *qs = (const uint8_t *)x->qs;
    __m256i acc = _mm256_setzero_si256();
    for (int ib = 0; ib < QK_K / 32; ib++, qs += 8, q8 += 32) {
        uint32_t aux;
        memcpy(&aux, qs + 4, sizeof aux);
        const __m256i levels = grid4(pe_iq2xxs_grid, qs[0], qs[1], qs[2], qs[3]);
        const __m256i signs = masks4(pe_iq2_sign_bytes, aux & 127, aux >> 7 & 127, aux >> 14 & 127, aux >> 21 & 127);
        const __m256i pairs = signed_pairs(levels, signs, _mm256_loadu_si256((const __m256i *)q8));
        const __m256i scale = _mm256_set1_epi16((short)(2 * (aux >> 28) + 1));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, scale));
    }
    return x86_sum_epi32x8(acc);
}

static void vec_dot_iq2_xxs(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq2_xxs *x = vw;
    const block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const int32_t bsum = iq2_xxs_bsum(&x[i], a[i].qs);
        sum += pe_f16_to_f32(x[i].d) * a[i].d * (float)bsum;
    }
    *s = 0.125f * sum;
}

/* ---- IQ2_XS and IQ2_S: a 4-bit scale per 16 weights ------------------------------ */

/* The odd scales 2 s + 1 of a super-block's 16 halves of sub-blocks as bytes
 * (byte 2 ib + h: half h of sub-block ib), in both 128-bit lanes. */
static inline __m256i odd_scales_by16(const uint8_t *scales) {
    const __m128i packed = _mm_loadl_epi64((const __m128i *)scales);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m128i nibbles = _mm_unpacklo_epi8(_mm_and_si128(packed, m4), _mm_and_si128(_mm_srli_epi16(packed, 4), m4));
    return _mm256_broadcastsi128_si256(_mm_or_si128(_mm_add_epi8(nibbles, nibbles), _mm_set1_epi8(1)));
}

/* The shuffle that turns odd_scales_by16's bytes into sub-block 0's madd
 * multipliers: the low lane's 16-bit lanes all take byte 0 (half 0, weights
 * 0..15), the high lane's byte 1.  The 0x80 bytes zero the high halves and
 * stay above 0x7F while the index advances by 2 per sub-block. */
static inline __m256i scale_shuffle_first(void) {
    const char z = (char)0x80;
    return _mm256_setr_epi8(0, z, 0, z, 0, z, 0, z, 0, z, 0, z, 0, z, 0, z,
                            1, z, 1, z, 1, z, 1, z, 1, z, 1, z, 1, z, 1, z);
}

/* ---- IQ2_XS: 16-bit words, 9 bits of grid index and 7 of signs ---------------- */

static int32_t iq2_xs_bsum(const block_iq2_xs *x, const int8_t *q8) {
    const __m256i scales = odd_scales_by16(x->scales);
    const __m256i step = _mm256_set1_epi8(2);
    __m256i pick = scale_shuffle_first();
    __m256i acc = _mm256_setzero_si256();
    const uint16_t *qs = x->qs;
    for (int ib = 0; ib < QK_K / 32; ib++, qs += 4, q8 += 32) {
        const __m256i levels = grid4(pe_iq2xs_grid, qs[0] & 511, qs[1] & 511, qs[2] & 511, qs[3] & 511);
        const __m256i signs = masks4(pe_iq2_sign_bytes, qs[0] >> 9, qs[1] >> 9, qs[2] >> 9, qs[3] >> 9);
        const __m256i pairs = signed_pairs(levels, signs, _mm256_loadu_si256((const __m256i *)q8));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_shuffle_epi8(scales, pick)));
        pick = _mm256_add_epi8(pick, step);
    }
    return x86_sum_epi32x8(acc);
}

static void vec_dot_iq2_xs(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq2_xs *x = vw;
    const block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const int32_t bsum = iq2_xs_bsum(&x[i], a[i].qs);
        sum += pe_f16_to_f32(x[i].d) * a[i].d * (float)bsum;
    }
    *s = 0.125f * sum;
}

/* ---- IQ2_S: 10-bit grid indices (8 bits in qs, 2 in qh), 8 explicit sign
 * bits per 8 weights in the second half of qs -------------------------------------- */

static int32_t iq2_s_bsum(const block_iq2_s *x, const int8_t *q8) {
    const __m256i scales = odd_scales_by16(x->scales);
    const __m256i step = _mm256_set1_epi8(2);
    __m256i pick = scale_shuffle_first();
    __m256i acc = _mm256_setzero_si256();
    const uint8_t *qs = x->qs, *sign_bytes = x->qs + QK_K / 8;
    for (int ib = 0; ib < QK_K / 32; ib++, qs += 4, sign_bytes += 4, q8 += 32) {
        const unsigned high = x->qh[ib];   /* bits 2l, 2l + 1: index bits 8, 9 of group l */
        const __m256i levels = grid4(pe_iq2s_grid, qs[0] | (high << 8 & 0x300), qs[1] | (high << 6 & 0x300),
                                     qs[2] | (high << 4 & 0x300), qs[3] | (high << 2 & 0x300));
        const __m256i signs = masks4(sign_mask, sign_bytes[0], sign_bytes[1], sign_bytes[2], sign_bytes[3]);
        const __m256i pairs = signed_pairs(levels, signs, _mm256_loadu_si256((const __m256i *)q8));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_shuffle_epi8(scales, pick)));
        pick = _mm256_add_epi8(pick, step);
    }
    return x86_sum_epi32x8(acc);
}

static void vec_dot_iq2_s(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq2_s *x = vw;
    const block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const int32_t bsum = iq2_s_bsum(&x[i], a[i].qs);
        sum += pe_f16_to_f32(x[i].d) * a[i].d * (float)bsum;
    }
    *s = 0.125f * sum;
}

void pe_fill_avx2_iq2(pe_kernels *k) {
    build_sign_masks();
    k->type[PE_TYPE_IQ2_XXS].vec_dot = vec_dot_iq2_xxs;
    k->type[PE_TYPE_IQ2_XS].vec_dot = vec_dot_iq2_xs;
    k->type[PE_TYPE_IQ2_S].vec_dot = vec_dot_iq2_s;
}
