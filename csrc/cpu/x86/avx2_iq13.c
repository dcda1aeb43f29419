/* avx2_iq13.c - AVX2 dot products of the lattice types IQ3_XXS, IQ3_S, IQ1_S
 * and IQ1_M with Q8_K activations.
 *
 * A sub-block of 32 weights is one vector.  Its grid entries are fetched by
 * index with scalar loads (4 levels per IQ3 index, 8 per IQ1 index) and set
 * into the vector; IQ3's sign bits become a byte mask (IQ3_XXS through a
 * table, iquants.h's pe_iq2_sign_bytes, IQ3_S by testing its explicit bits).
 * maddubs multiplies weights and activations into 16-bit pair sums, madd
 * applies the sub-block's odd scale, and the 32-bit sums stay in a vector
 * until the end of the super-block.  There they are summed into the very
 * integers the reference forms (integer sums are exact in any order), and
 * the float part follows ref_iquants.c expression for expression (no FMA:
 * the project builds with -ffp-contract=off), so every result is
 * bit-identical to the scalar kernels.
 *
 * maddubs takes one unsigned and one signed operand.  Flipping the
 * activations' signs (as llama.cpp does) is wrong for a code of -128, so the
 * unsigned operand is |activation| (<= 128 fits a byte unsigned) and the
 * activation's sign moves onto the signed weight, whose negation cannot
 * overflow (|w| <= 62): exact for every int8 activation.  Bounds, none near
 * saturation or overflow:
 *   maddubs pair sum  <= 2 * 128 * 62 = 15872 (IQ3_XXS), 2 * 128 * 15 = 3840
 *                        (IQ3_S), 2 * 128 * 1 = 256 (IQ1) < 32767;
 *   madd by a scale   <= 2 * 15872 * 31 per 32-bit lane;
 *   a super-block sum <= 256 * 128 * 62 * 31 < 2^26.
 * IQ1's shifts multiply the activations' sums (IQ1_S: the Q8_K bsums, as the
 * reference; IQ1_M: sums of the codes, as the reference) by the signed
 * scales with madd, exact in 32 bits as well. */
#include <immintrin.h>
#include <string.h>

#include "internal.h"
#include "iquants.h"
#include "x86_reduce.h"

/* ---- shared pieces ------------------------------------------------------------- */

static inline __m256i load_codes(const int8_t *q8) { return _mm256_loadu_si256((const __m256i *)q8); }

/* the 4 levels of an IQ3 grid entry as one 32-bit lane */
static inline int iq3_entry(const uint8_t *grid, unsigned index) {
    int32_t v;
    memcpy(&v, grid + 4 * index, sizeof v);
    return v;
}

/* the 8 levels (-1, 0, 1) of an IQ1 grid entry as one 64-bit lane */
static inline long long iq1_entry(unsigned index) {
    int64_t v;
    memcpy(&v, pe_iq1s_grid + 8 * index, sizeof v);
    return v;
}

/* the levels of 32 weights: the IQ1 grid entries of 4 indices, in order */
static inline __m256i iq1_levels(unsigned i0, unsigned i1, unsigned i2, unsigned i3) {
    return _mm256_set_epi64x(iq1_entry(i3), iq1_entry(i2), iq1_entry(i1), iq1_entry(i0));
}

/* 16-bit pair sums of signed weights w (|w| <= 62) times activation codes a
 * (any int8): |a| is the unsigned operand, a's sign goes onto w. */
static inline __m256i mul_pairs(__m256i w, __m256i a) {
    return _mm256_maddubs_epi16(_mm256_abs_epi8(a), _mm256_sign_epi8(w, a));
}

/* the 32-bit sums of a sub-block's pair sums times its scale */
static inline __m256i scaled(__m256i pairs, int scale) { return _mm256_madd_epi16(pairs, _mm256_set1_epi16((short)scale)); }

/* ---- IQ3_XXS: a byte of grid index per 4 weights (the first 64 bytes), then
 * per sub-block a 32-bit word of 4 x 7 sign bits and a 4-bit scale --------------- */

static void vec_dot_iq3_xxs(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq3_xxs *x = vw;
    const block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *q3 = x[i].qs;
        const uint8_t *words = x[i].qs + QK_K / 4;
        __m256i acc = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ib++, q3 += 8) {
            uint32_t aux;
            memcpy(&aux, words + 4 * ib, sizeof aux);
            const __m256i level = _mm256_setr_epi32(
                iq3_entry(pe_iq3xxs_grid, q3[0]), iq3_entry(pe_iq3xxs_grid, q3[1]), iq3_entry(pe_iq3xxs_grid, q3[2]),
                iq3_entry(pe_iq3xxs_grid, q3[3]), iq3_entry(pe_iq3xxs_grid, q3[4]), iq3_entry(pe_iq3xxs_grid, q3[5]),
                iq3_entry(pe_iq3xxs_grid, q3[6]), iq3_entry(pe_iq3xxs_grid, q3[7]));
            const __m256i sign = _mm256_set_epi64x(
                (long long)pe_iq2_sign_bytes[aux >> 21 & 127], (long long)pe_iq2_sign_bytes[aux >> 14 & 127],
                (long long)pe_iq2_sign_bytes[aux >> 7 & 127], (long long)pe_iq2_sign_bytes[aux & 127]);
            const __m256i w = _mm256_sign_epi8(level, sign);
            acc = _mm256_add_epi32(acc, scaled(mul_pairs(w, load_codes(a[i].qs + 32 * ib)), (int)(2 * (aux >> 28) + 1)));
        }
        const int32_t bsum = x86_sum_epi32x8(acc);
        sum += pe_f16_to_f32(x[i].d) * a[i].d * (float)bsum;
    }
    *s = 0.25f * sum;
}

/* ---- IQ3_S: 9-bit grid indices per 4 weights (8 bits in qs, the ninth in
 * qh), 8 explicit sign bits per 8 weights, a 4-bit scale per sub-block ------------- */

/* grid index k (0..7) of a sub-block: its qs byte, bit k of its qh byte on top */
static inline unsigned iq3_s_index(const uint8_t *qs, unsigned high, int k) { return qs[k] | (high << (8 - k) & 256); }

/* 32 sign bits (bit j: weight j negative) as bytes -1 / +1 for sign_epi8 */
static inline __m256i sign_bytes(uint32_t bits) {
    /* byte j takes sign byte j / 8, then tests bit j % 8 of it */
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i negative = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_or_si256(negative, _mm256_set1_epi8(1));
}

static void vec_dot_iq3_s(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq3_s *x = vw;
    const block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m256i acc = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const uint8_t *qs = x[i].qs + 8 * ib;
            const unsigned high = x[i].qh[ib];
            const __m256i level = _mm256_setr_epi32(
                iq3_entry(pe_iq3s_grid, iq3_s_index(qs, high, 0)), iq3_entry(pe_iq3s_grid, iq3_s_index(qs, high, 1)),
                iq3_entry(pe_iq3s_grid, iq3_s_index(qs, high, 2)), iq3_entry(pe_iq3s_grid, iq3_s_index(qs, high, 3)),
                iq3_entry(pe_iq3s_grid, iq3_s_index(qs, high, 4)), iq3_entry(pe_iq3s_grid, iq3_s_index(qs, high, 5)),
                iq3_entry(pe_iq3s_grid, iq3_s_index(qs, high, 6)), iq3_entry(pe_iq3s_grid, iq3_s_index(qs, high, 7)));
            uint32_t signs;
            memcpy(&signs, x[i].signs + 4 * ib, sizeof signs);
            const __m256i w = _mm256_sign_epi8(level, sign_bytes(signs));
            const int scale = 2 * (x[i].scales[ib / 2] >> 4 * (ib % 2) & 15) + 1;
            acc = _mm256_add_epi32(acc, scaled(mul_pairs(w, load_codes(a[i].qs + 32 * ib)), scale));
        }
        const int32_t bsum = x86_sum_epi32x8(acc);
        sum += pe_f16_to_f32(x[i].d) * a[i].d * (float)bsum;
    }
    *s = sum;
}

/* ---- IQ1_S: 11-bit indices into a grid of -1 / 0 / 1 (8 bits in qs, 3 in
 * qh), per sub-block a 3-bit scale and the sign of a shift of 1/8 ------------------ */

/* sum over sub-blocks ib of scale * sign * (bsums[2 ib] + bsums[2 ib + 1]),
 * the reference's shifts: the signed scales, each twice, meet the bsums'
 * pairs in one madd (at most 2 * 15 * 32768 per lane, exact for any bsums) */
static inline int32_t iq1_s_shifts(const uint16_t *qh, const int16_t *bsums) {
    const __m128i words = _mm_loadu_si128((const __m128i *)qh);
    /* 2 * (bits 12..14) + 1 */
    const __m128i scale = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(words, 11), _mm_set1_epi16(14)), _mm_set1_epi16(1));
    const __m128i negative = _mm_srai_epi16(words, 15);   /* -1 where bit 15 is set */
    const __m128i signed_scale = _mm_sub_epi16(_mm_xor_si128(scale, negative), negative);
    const __m256i twice = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi16(signed_scale, signed_scale)),
                                                  _mm_unpackhi_epi16(signed_scale, signed_scale), 1);
    return x86_sum_epi32x8(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bsums), twice));
}

static void vec_dot_iq1_s(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq1_s *x = vw;
    const block_q8_K *a = va;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m256i acc = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const uint8_t *qs = x[i].qs + 4 * ib;
            const unsigned high = x[i].qh[ib];
            const __m256i level = iq1_levels(qs[0] | (high & 7) << 8, qs[1] | (high >> 3 & 7) << 8,
                                             qs[2] | (high >> 6 & 7) << 8, qs[3] | (high >> 9 & 7) << 8);
            const int scale = (int)(2 * (high >> 12 & 7) + 1);
            acc = _mm256_add_epi32(acc, scaled(mul_pairs(level, load_codes(a[i].qs + 32 * ib)), scale));
        }
        const int32_t sumi = x86_sum_epi32x8(acc);
        const int32_t shifts = iq1_s_shifts(x[i].qh, a[i].bsums);
        sum += pe_f16_to_f32(x[i].d) * a[i].d * ((float)sumi + PE_IQ1_DELTA * (float)shifts);
    }
    *s = sum;
}

/* ---- IQ1_M: IQ1_S's grid; a 3-bit scale per 16 weights and the shift's sign
 * per 8, the super-block scale spread over the scales' top nibbles ----------------- */

static void vec_dot_iq1_m(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq1_m *x = vw;
    const block_q8_K *a = va;
    /* 16-bit lanes 0..7 (weights 0..15) take the scale of half 0, lanes 8..15
     * the scale of half 1, from a 32-bit word holding both */
    const __m256i halves = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                            2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    /* 16-bit lanes 4l..4l+3 (weights 8l..8l+7) test group l's shift sign,
     * bit 3 of nibble l of the sub-block's two qh bytes */
    const __m256i sign_bit = _mm256_setr_epi16(0x0008, 0x0008, 0x0008, 0x0008, 0x0080, 0x0080, 0x0080, 0x0080,
                                               0x0800, 0x0800, 0x0800, 0x0800, (short)0x8000, (short)0x8000,
                                               (short)0x8000, (short)0x8000);
    const __m256i ones = _mm256_set1_epi8(1);
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint64_t packed;   /* the four 16-bit scale words */
        memcpy(&packed, x[i].scales, sizeof packed);
        __m256i acc = _mm256_setzero_si256(), acc_shifts = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const uint8_t *qs = x[i].qs + 4 * ib;
            const unsigned high = x[i].qh[2 * ib] | (unsigned)x[i].qh[2 * ib + 1] << 8;   /* nibble l: group l */
            const __m256i level = iq1_levels(qs[0] | (high & 7) << 8, qs[1] | (high >> 4 & 7) << 8,
                                             qs[2] | (high >> 8 & 7) << 8, qs[3] | (high >> 12 & 7) << 8);
            const unsigned bits = (unsigned)(packed >> (16 * (ib / 2) + 6 * (ib % 2)));
            const unsigned scale0 = 2 * (bits & 7) + 1, scale1 = 2 * (bits >> 3 & 7) + 1;
            const __m256i scale = _mm256_shuffle_epi8(_mm256_set1_epi32((int)(scale0 | scale1 << 16)), halves);
            const __m256i codes = load_codes(a[i].qs + 32 * ib);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(mul_pairs(level, codes), scale));
            /* the shifts: pair sums of the codes (|sum| <= 256) times the scale, negated for a minus sign */
            const __m256i negative =
                _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)high), sign_bit), sign_bit);
            const __m256i signed_scale = _mm256_sub_epi16(_mm256_xor_si256(scale, negative), negative);
            acc_shifts = _mm256_add_epi32(acc_shifts, _mm256_madd_epi16(_mm256_maddubs_epi16(ones, codes), signed_scale));
        }
        const int32_t sumi = x86_sum_epi32x8(acc), shifts = x86_sum_epi32x8(acc_shifts);
        sum += pe_f16_to_f32(pe_iq1m_scale(&x[i])) * a[i].d * ((float)sumi + PE_IQ1_DELTA * (float)shifts);
    }
    *s = sum;
}

void pe_fill_avx2_iq13(pe_kernels *k) {
    k->type[PE_TYPE_IQ3_XXS].vec_dot = vec_dot_iq3_xxs;
    k->type[PE_TYPE_IQ3_S].vec_dot = vec_dot_iq3_s;
    k->type[PE_TYPE_IQ1_S].vec_dot = vec_dot_iq1_s;
    k->type[PE_TYPE_IQ1_M].vec_dot = vec_dot_iq1_m;
}
