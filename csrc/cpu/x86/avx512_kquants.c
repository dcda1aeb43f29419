/* avx512_kquants.c - AVX-512 (BW, VL, VNNI) dot products of Q2_K, Q3_K and
 * IQ4_XS (Q4_K, Q5_K and Q6_K are in avx512_gemm.c); everything else stays
 * with the AVX2 kernels this table starts from.
 *
 * 64 weight levels (unsigned bytes) meet 64 activations in one dpbusd, which
 * leaves sums of 4 products per 32-bit lane.  Those fit in 16 bits (at most
 * 4 * 63 * 128), so two such vectors pack into one of 16-bit lanes and a
 * single dpwssd applies the sub-block scales to both: no 16-bit pair sums
 * that could saturate, and no scale shuffles per 32 elements. */
#include <immintrin.h>

#include "internal.h"
#include "x86_kquants.h"

static inline __m512i load512(const void *p) { return _mm512_loadu_si512(p); }

/* the same 32 bytes in both halves */
static inline __m512i dup256(const void *p) { return _mm512_broadcast_i64x4(load256(p)); }

/* 16-bit lanes: a in the low half of the vector, b in the high half */
static inline __m512i halves16(short a, short b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(a)), _mm256_set1_epi16(b), 1);
}

/* per 32-bit lane: the sum of 4 products of unsigned levels and activations */
static inline __m512i dot4(__m512i levels, const int8_t *q8) {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), levels, load512(q8));
}

/* A vpermw index giving 128-bit lane k the 16-bit entries a(k) x4, b(k) x4:
 * the scales that match packs_epi32 of two dot4 results. */
static inline __m512i scale_index(int a0, int a_step, int b0, int b_step, int lane_div) {
    int16_t idx[32];
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < 4; l++) {
            idx[8 * k + l] = (int16_t)(a0 + a_step * (k / lane_div));
            idx[8 * k + 4 + l] = (int16_t)(b0 + b_step * (k / lane_div));
        }
    return _mm512_loadu_si512(idx);
}

/* ---- 16-element sub-blocks (Q2_K, Q3_K) -------------------------------------
 * A half of 128 elements gives two dot4 vectors: elements 0..63 (sub-blocks
 * 0..3 of the half) and 64..127 (sub-blocks 4..7).  packs_epi32 of the two
 * puts sub-blocks k and 4 + k in 128-bit lane k; the halves' packs take
 * scales 0..7 and 8..15. */
typedef struct { __m512i lo, hi; } scale_pair;

static inline scale_pair sub16_index(void) {
    return (scale_pair){scale_index(0, 1, 4, 1, 1), scale_index(8, 1, 12, 1, 1)};
}

/* sum over the super-block of scale * (levels . activations), 16 lanes */
static inline __m512i sub16_sum(const __m512i t[4], __m256i sc16, scale_pair idx) {
    const __m512i sc = _mm512_castsi256_si512(sc16);
    __m512i sum = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_packs_epi32(t[0], t[1]),
                                      _mm512_permutexvar_epi16(idx.lo, sc));
    return _mm512_dpwssd_epi32(sum, _mm512_packs_epi32(t[2], t[3]), _mm512_permutexvar_epi16(idx.hi, sc));
}

/* the 16 int32 lanes folded to 8 */
static inline __m256i fold16(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

static void vec_dot_q2_K(int64_t n, float *s, const void *vw, const void *va) {
    const block_q2_K *x = vw;
    const block_q8_K *a = va;
    const scale_pair idx = sub16_index();
    const __m512i m3 = _mm512_set1_epi8(3), shift_a = halves16(0, 2), shift_b = halves16(4, 6);
    const __m128i m4 = _mm_set1_epi8(0xF);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float dall = a[i].d * f16(x[i].d), dmin = -a[i].d * f16(x[i].dmin);
        const __m128i sc8 = load128(x[i].scales);
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4));
        const __m256i msum = _mm256_madd_epi16(mins, load256(a[i].bsums));
        __m512i t[4];
        for (int h = 0; h < 2; h++) {
            const __m512i bits = dup256(x[i].qs + 32 * h);
            t[2 * h] = dot4(_mm512_and_si512(_mm512_srlv_epi16(bits, shift_a), m3), a[i].qs + 128 * h);
            t[2 * h + 1] = dot4(_mm512_and_si512(_mm512_srlv_epi16(bits, shift_b), m3), a[i].qs + 128 * h + 64);
        }
        const __m256i isum = fold16(sub16_sum(t, _mm256_cvtepu8_epi16(_mm_and_si128(sc8, m4)), idx));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dall), _mm256_cvtepi32_ps(isum), acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(msum), acc);
    }
    *s = hsum_f32x8(acc);
}

/* levels stored as lo | hbit << 2 (0..7) stand for lo + 4 hbit - 4 */
static void vec_dot_q3_K(int64_t n, float *s, const void *vw, const void *va) {
    const block_q3_K *x = vw;
    const block_q8_K *a = va;
    const scale_pair idx = sub16_index();
    const __m512i m3 = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    const __m512i shift_a = halves16(0, 2), shift_b = halves16(4, 6);
    /* hmask bit m (element block m = 4h + k) to bit 2: left by 2 - m, right by m - 2 */
    const __m512i hl0 = halves16(2, 1), hr0 = halves16(0, 1), hr1a = halves16(2, 3), hr1b = halves16(4, 5);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = a[i].d * f16(x[i].d);
        const __m256i sc16 = q3k_scales(x[i].scales);
        const __m256i bias = _mm256_madd_epi16(sc16, load256(a[i].bsums));
        const __m512i hm = dup256(x[i].hmask);
        const __m512i hb[4] = {
            _mm512_and_si512(_mm512_sllv_epi16(hm, hl0), four), _mm512_and_si512(_mm512_srlv_epi16(hm, hr0), four),
            _mm512_and_si512(_mm512_srlv_epi16(hm, hr1a), four), _mm512_and_si512(_mm512_srlv_epi16(hm, hr1b), four),
        };
        __m512i t[4];
        for (int h = 0; h < 2; h++) {
            const __m512i bits = dup256(x[i].qs + 32 * h);
            const __m512i qa = _mm512_or_si512(_mm512_and_si512(_mm512_srlv_epi16(bits, shift_a), m3), hb[2 * h]);
            const __m512i qb = _mm512_or_si512(_mm512_and_si512(_mm512_srlv_epi16(bits, shift_b), m3), hb[2 * h + 1]);
            t[2 * h] = dot4(qa, a[i].qs + 128 * h);
            t[2 * h + 1] = dot4(qb, a[i].qs + 128 * h + 64);
        }
        __m256i isum = fold16(sub16_sum(t, sc16, idx));
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(bias, 2));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
    }
    *s = hsum_f32x8(acc);
}

/* ---- IQ4_XS -------------------------------------------------------------------
 * Grid values + 128 are unsigned bytes (1..241) for dpbusd; the 128 * sum(q8)
 * they add comes back out through the bsums.  Sums of 8 such products need
 * 32 bits, so the scales are applied with a 32-bit multiply. */
static void vec_dot_iq4_xs(int64_t n, float *s, const void *vw, const void *va) {
    const block_iq4_xs *x = vw;
    const block_q8_K *a = va;
    const __m512i grid = _mm512_broadcast_i32x4(_mm_xor_si128(load128(pe_iq4nl_values), _mm_set1_epi8((char)0x80)));
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const __m256i lo_shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i hi_shift = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m512i quad0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i quad1 = _mm512_add_epi32(quad0, _mm512_set1_epi32(4));
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = a[i].d * f16(x[i].d);
        /* the eight 6-bit scales minus 32, as int32 lanes */
        uint32_t low;
        memcpy(&low, x[i].scales_l, 4);
        const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)low), lo_shift), _mm256_set1_epi32(0xF));
        const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(x[i].scales_h), hi_shift), _mm256_set1_epi32(3));
        const __m256i sc32 = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
        /* bias: sum_ib scale_ib * (bsum_2ib + bsum_2ib+1), with 16-bit scales doubled up */
        const __m256i sc_pairs = _mm256_or_si256(_mm256_and_si256(sc32, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(sc32, 16));
        const __m256i bias = _mm256_madd_epi16(sc_pairs, load256(a[i].bsums));
        __m512i isum = _mm512_setzero_si512();
        for (int g = 0; g < 2; g++) {
            /* 4 sub-blocks of 16 bytes: low nibbles are their elements 0..15,
             * high nibbles 16..31; the activations are regrouped to match */
            const __m512i v = load512(x[i].qs + 64 * g);
            const __m512i q0 = load512(a[i].qs + 128 * g), q1 = load512(a[i].qs + 128 * g + 64);
            const __m512i alo = _mm512_shuffle_i64x2(q0, q1, _MM_SHUFFLE(2, 0, 2, 0));
            const __m512i ahi = _mm512_shuffle_i64x2(q0, q1, _MM_SHUFFLE(3, 1, 3, 1));
            const __m512i wlo = _mm512_shuffle_epi8(grid, _mm512_and_si512(v, m4));
            const __m512i whi = _mm512_shuffle_epi8(grid, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
            const __m512i t = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wlo, alo), whi, ahi);
            const __m512i sc = _mm512_permutexvar_epi32(g ? quad1 : quad0, _mm512_castsi256_si512(sc32));
            isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(t, sc));
        }
        const __m256i tot = _mm256_sub_epi32(fold16(isum), _mm256_slli_epi32(bias, 7));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(tot), acc);
    }
    *s = hsum_f32x8(acc);
}

void pe_fill_avx512_kquants(pe_kernels *k) {
    k->type[PE_TYPE_Q2_K].vec_dot = vec_dot_q2_K;
    k->type[PE_TYPE_Q3_K].vec_dot = vec_dot_q3_K;
    k->type[PE_TYPE_IQ4_XS].vec_dot = vec_dot_iq4_xs;
}
