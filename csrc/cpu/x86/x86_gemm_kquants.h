/* x86_gemm_kquants.h - vec_dot and the GEMM micro-kernel of Q4_K, Q5_K and
 * Q6_K, following the scheme of x86_gemm.h (include that first).
 *
 * Per super-block of 256 elements, each sub-block's scale multiplies its
 * integer dot products before the parity split, so a pair again has two
 * exact sums E and O.  The other integer term is split in two halves the
 * same way, by the 32-bit lanes the 16-bit multiply-add leaves it in:
 *   Q4_K / Q5_K  mins: sum_s m_s * (bsum_2s + bsum_2s+1), lanes s in
 *                {0,1,4,5} and {2,3,6,7}, go to the even and odd float lane
 *                with their own scale: fnmadd(dmin * da, M, lane);
 *   Q6_K         level bias: 32 * sum_s sc_s * bsum_s, pairs of sub-blocks
 *                {0,1}, {4,5}, ... and {2,3}, {6,7}, ..., taken off E and O
 *                in integers.
 * Then even = fma(d * da, E, even) (and the mins), odd likewise, one
 * super-block after another, and the result is even + odd.
 *
 * AVX2 applies the sub-block scales with a 16-bit multiply-add on the pair
 * sums of maddubs; VNNI multiplies the 32-bit sums of vpdpbusd.  The scale
 * vectors have the lane width each one needs. */
#ifndef PE_X86_GEMM_KQUANTS_H
#define PE_X86_GEMM_KQUANTS_H

#include "x86_kquants.h"

/* ---- sub-block products ---------------------------------------------------------------- */

/* Shift each 16-bit lane left by s (right by -s). */
static inline __m256i gmk_shift16(__m256i x, int s) {
    return s >= 0 ? _mm256_slli_epi16(x, s) : _mm256_srli_epi16(x, -s);
}

/* Tile form: z holds 8 bytes per row (row r in 64-bit lane r); byte u of
 * each row, zero- or sign-extended, fills that row's scale lanes. */
static inline __m256i gmk_scale_tile(__m256i z, int u, int is_signed) {
    const long long lo = (long long)u * 0x0101010101010101LL, hi = (long long)(u + 8) * 0x0101010101010101LL;
    const __m256i x = _mm256_shuffle_epi8(z, _mm256_setr_epi64x(lo, hi, lo, hi));
#if defined(PE_GEMM_VNNI)
    return is_signed ? _mm256_srai_epi32(x, 24) : _mm256_srli_epi32(x, 24);
#else
    return is_signed ? _mm256_srai_epi16(x, 8) : _mm256_srli_epi16(x, 8);
#endif
}

/* Row form: 8 scale bytes as 32-bit lanes, zero- or sign-extended (AVX2:
 * the value in both 16-bit halves, for madd). */
static inline __m256i gmk_scales_row(__m128i bytes, int is_signed) {
    const __m256i v = is_signed ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
#if defined(PE_GEMM_VNNI)
    return v;
#else
    return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16));
#endif
}

/* scale lo for elements 0..15 of a 32-element vector, hi for 16..31 */
static inline __m256i gmk_pick(__m256i scales, int lo, int hi) {
    return _mm256_permutevar8x32_epi32(scales, _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi));
}

/* Tile form: codes t[0..count) (8 elements per vector, as in x86_gemm.h)
 * against activations a, times the scale lanes sc. */
GM_INLINE __m256i gmk_sub_tile(const __m256i *t, const int8_t *a, int count, __m256i sc) {
#if defined(PE_GEMM_VNNI)
    __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), t[0], gm_bcast8(a));
    for (int k = 1; k < count; k++) s = _mm256_dpbusd_epi32(s, t[k], gm_bcast8(a + 8 * k));
    return _mm256_mullo_epi32(s, sc);
#else
    /* pair sums <= 2 * 63 * 127; four 5-bit or two 6-bit ones fit 16 bits */
    __m256i p = _mm256_maddubs_epi16(t[0], gm_bcast8(a));
    for (int k = 1; k < count; k++) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(t[k], gm_bcast8(a + 8 * k)));
    return _mm256_madd_epi16(p, sc);
#endif
}

/* Row form: 32 codes against 32 activations, per 32-bit lane of 4, scaled. */
static inline __m256i gmk_sub_row(__m256i codes, const int8_t *a, __m256i sc) {
#if defined(PE_GEMM_VNNI)
    return _mm256_mullo_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), codes, gm_load256(a)), sc);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, gm_load256(a)), sc);
#endif
}

/* 16-bit lanes: bytes u..u+3 of each row of z (row r in 64-bit lane r),
 * zero- or sign-extended. */
static inline __m256i gmk_widen_tile(__m256i z, int u, int is_signed) {
    const __m256i lo = _mm256_setr_epi8(u, u, u + 1, u + 1, u + 2, u + 2, u + 3, u + 3, u + 8, u + 8, u + 9, u + 9,
                                        u + 10, u + 10, u + 11, u + 11, u, u, u + 1, u + 1, u + 2, u + 2, u + 3, u + 3,
                                        u + 8, u + 8, u + 9, u + 9, u + 10, u + 10, u + 11, u + 11);
    const __m256i x = _mm256_shuffle_epi8(z, lo);
    return is_signed ? _mm256_srai_epi16(x, 8) : _mm256_srli_epi16(x, 8);
}

/* ---- Q4_K / Q5_K: mins ----------------------------------------------------------------- */

/* [B0..B7]: the activations' sums per 32-element sub-block, 32-bit lanes */
static inline __m256i gmk_bsums32(const int16_t *bsums) {
    return _mm256_madd_epi16(gm_load256(bsums), _mm256_set1_epi16(1));
}

/* Row form: the two halves of sum_s m_s * B_s, from k4_unpack's bytes. */
static inline __m128i gmk_mins_row(__m128i unpacked, const int16_t *bsums) {
    const __m128i m16 = _mm_cvtepu8_epi16(_mm_srli_si128(unpacked, 8));
    const __m256i b = gmk_bsums32(bsums);
    const __m128i b16 = _mm_packs_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    const __m128i l = _mm_madd_epi16(m16, b16);
    return _mm_add_epi32(l, _mm_unpackhi_epi64(l, l));
}

/* Tile form: mins_lo / mins_hi hold m_0..3 / m_4..7 of row r in 64-bit lane r. */
static inline __m256i gmk_mins_tile(__m256i mins_lo, __m256i mins_hi, const int16_t *bsums) {
    const __m256i b = gmk_bsums32(bsums);
    const __m256i b16 = _mm256_packs_epi32(b, b); /* [B0..3 B0..3 | B4..7 B4..7] */
    const __m256i lo = _mm256_madd_epi16(mins_lo, _mm256_permute4x64_epi64(b16, 0x44));
    return _mm256_add_epi32(lo, _mm256_madd_epi16(mins_hi, _mm256_permute4x64_epi64(b16, 0xEE)));
}

/* ---- Q4_K / Q5_K ------------------------------------------------------------------------- */

/* Row form: chunk c (32 bytes of qs) gives sub-blocks 2c (low nibbles) and
 * 2c + 1 (high); Q5_K's qh bits 2c and 2c + 1 are their fifth bits. */
GM_INLINE __m256i gmk_k4_isum_row(const uint8_t *qs, const uint8_t *qh, __m256i sc, const int8_t *a) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    __m256i hbits = qh ? gm_load256(qh) : _mm256_setzero_si256();
    __m256i isum = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++, a += 64) {
        const __m256i bits = gm_load256(qs + 32 * c);
        __m256i lo = _mm256_and_si256(bits, m4), hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        if (qh) {
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hbits, 4), b4));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hbits, 3), b4));
            hbits = _mm256_srli_epi16(hbits, 2);
        }
        isum = _mm256_add_epi32(isum, gmk_sub_row(lo, a, gmk_pick(sc, 2 * c, 2 * c)));
        isum = _mm256_add_epi32(isum, gmk_sub_row(hi, a + 32, gmk_pick(sc, 2 * c + 1, 2 * c + 1)));
    }
    return isum;
}

#define GMK_DEFINE_K4_ROW(NAME, WB, QH)                                                             \
    static void vec_dot_##NAME(int64_t n, float *s, const void *vw, const void *va) {               \
        const WB *x = vw;                                                                           \
        const block_q8_K *a = va;                                                                   \
        __m128 acc = _mm_setzero_ps();                                                              \
        for (int64_t i = 0; i < n / QK_K; i++) {                                                    \
            const __m128i unpacked = k4_unpack(x[i].scales);                                        \
            const __m256i sc = gmk_scales_row(unpacked, 0);                                         \
            const __m256i isum = gmk_k4_isum_row(x[i].qs, QH, sc, a[i].qs);                         \
            const __m128 dd = f16_pair_scaled(&x[i].d, a[i].d); /* [d * da, dmin * da] */           \
            acc = _mm_fmadd_ps(_mm_broadcastss_ps(dd), _mm_cvtepi32_ps(gm_parity(isum)), acc);      \
            acc = _mm_fnmadd_ps(_mm_shuffle_ps(dd, dd, 0x55),                                       \
                                _mm_cvtepi32_ps(gmk_mins_row(unpacked, a[i].bsums)), acc);          \
        }                                                                                           \
        *s = gm_finish_row(acc, acc, 0);                                                            \
    }

/* Tile form: the four rows' chunk c (and, for Q5_K, their transposed qh
 * bits h[4]) as codes: lo[k] / hi[k] = elements 8k..8k+7 of sub-block 2c / 2c + 1. */
GM_INLINE void gmk_k4_codes_tile(const uint8_t *const qs[4], int c, const __m256i *h, __m256i lo[4], __m256i hi[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    __m256i r[4];
    gm_transpose16(qs[0] + 32 * c, qs[1] + 32 * c, qs[2] + 32 * c, qs[3] + 32 * c, &r[0], &r[1]);
    gm_transpose16(qs[0] + 32 * c + 16, qs[1] + 32 * c + 16, qs[2] + 32 * c + 16, qs[3] + 32 * c + 16, &r[2], &r[3]);
    for (int k = 0; k < 4; k++) {
        lo[k] = _mm256_and_si256(r[k], m4);
        hi[k] = _mm256_and_si256(_mm256_srli_epi16(r[k], 4), m4);
        if (h) { /* qh bit 2c (2c + 1) of each byte to bit 4 */
            lo[k] = _mm256_or_si256(lo[k], _mm256_and_si256(gmk_shift16(h[k], 4 - 2 * c), b4));
            hi[k] = _mm256_or_si256(hi[k], _mm256_and_si256(gmk_shift16(h[k], 3 - 2 * c), b4));
        }
    }
}

/* Q5_K: the four rows' qh transposed, h[k] = bytes 8k..8k+7 */
static inline void gmk_qh_tile(const uint8_t *q0, const uint8_t *q1, const uint8_t *q2, const uint8_t *q3,
                               __m256i h[4]) {
    gm_transpose16(q0, q1, q2, q3, &h[0], &h[1]);
    gm_transpose16(q0 + 16, q1 + 16, q2 + 16, q3 + 16, &h[2], &h[3]);
}
#define GMK_QH_NONE(b0, b1, b2, b3, h) ((void)0)
#define GMK_QH_TILE(b0, b1, b2, b3, h) gmk_qh_tile(b0->qh, b1->qh, b2->qh, b3->qh, h)

/* [U0 | U1 ; U2 | U3] halves: sc = the rows' scale bytes, mins likewise */
static inline void gmk_k4_scales_tile(const uint8_t *const sc[4], __m256i *scales, __m256i *mins) {
    const __m128i u0 = k4_unpack(sc[0]), u1 = k4_unpack(sc[1]), u2 = k4_unpack(sc[2]), u3 = k4_unpack(sc[3]);
    *scales = _mm256_setr_m128i(_mm_unpacklo_epi64(u0, u1), _mm_unpacklo_epi64(u2, u3));
    *mins = _mm256_setr_m128i(_mm_unpackhi_epi64(u0, u1), _mm_unpackhi_epi64(u2, u3));
}

#define GMK_DEFINE_K4_TILE(NAME, WB, QH_TILE, HAS_QH)                                                           \
    GM_INLINE void gemm_##NAME##_n(int64_t n, float *s, size_t bs, const uint8_t *const w[4],                   \
                                   const uint8_t *a, size_t ba, size_t bw, int nr, const int nc) {              \
        __m256 acc[4];                                                                                          \
        for (int j = 0; j < 4; j++) acc[j] = _mm256_setzero_ps();                                               \
        for (int64_t i = 0; i < n / QK_K; i++) {                                                                \
            GM_ROWS(WB, w, i);                                                                                  \
            gm_prefetch_ahead(w, bw, (size_t)i * sizeof(WB), sizeof(WB));                                       \
            const uint8_t *qs[4] = {b0->qs, b1->qs, b2->qs, b3->qs};                                            \
            const uint8_t *scp[4] = {b0->scales, b1->scales, b2->scales, b3->scales};                           \
            __m256i scz, mz, h[4];                                                                              \
            gmk_k4_scales_tile(scp, &scz, &mz);                                                                 \
            QH_TILE(b0, b1, b2, b3, h);                                                                         \
            __m256i isum[4];                                                                                    \
            for (int j = 0; j < 4; j++) isum[j] = _mm256_setzero_si256();                                       \
            for (int c = 0; c < 4; c++) {                                                                       \
                __m256i lo[4], hi[4];                                                                           \
                gmk_k4_codes_tile(qs, c, HAS_QH ? h : NULL, lo, hi);                                            \
                const __m256i sc_lo = gmk_scale_tile(scz, 2 * c, 0), sc_hi = gmk_scale_tile(scz, 2 * c + 1, 0); \
                for (int j = 0; j < nc; j++) {                                                                  \
                    const int8_t *q8 = ((const block_q8_K *)(a + (size_t)j * ba) + i)->qs + 64 * c;             \
                    isum[j] = _mm256_add_epi32(isum[j], gmk_sub_tile(lo, q8, 4, sc_lo));                        \
                    isum[j] = _mm256_add_epi32(isum[j], gmk_sub_tile(hi, q8 + 32, 4, sc_hi));                   \
                }                                                                                               \
            }                                                                                                   \
            const __m256 dd = gm_scales_tile(w, sizeof(WB), i); /* [d0 dmin0 d1 dmin1 ...] */                   \
            const __m256 dw = _mm256_moveldup_ps(dd), dmw = _mm256_movehdup_ps(dd);                             \
            const __m256i mins_lo = gmk_widen_tile(mz, 0, 0), mins_hi = gmk_widen_tile(mz, 4, 0);               \
            for (int j = 0; j < nc; j++) {                                                                      \
                const block_q8_K *aj = (const block_q8_K *)(a + (size_t)j * ba) + i;                            \
                const __m256 da = _mm256_set1_ps(aj->d);                                                        \
                const __m256i mi = gmk_mins_tile(mins_lo, mins_hi, aj->bsums);                                  \
                acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum[j]), acc[j]);           \
                acc[j] = _mm256_fnmadd_ps(_mm256_mul_ps(dmw, da), _mm256_cvtepi32_ps(mi), acc[j]);              \
            }                                                                                                   \
        }                                                                                                       \
        for (int j = 0; j < nc; j++) gm_finish_tile(s + (size_t)j * bs, acc[j], acc[j], 0, nr);                 \
    }

/* ---- Q6_K -------------------------------------------------------------------------------- */

/* Row form: codes of quarter q (32 elements) of half h, as in the AVX2 k-quants file. */
GM_INLINE __m256i gmk_q6_isum_row(const block_q6_K *x, const int8_t *a) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const __m128i sc8 = gm_load128(x->scales);
    const __m256i scales[2] = {gmk_scales_row(sc8, 1), gmk_scales_row(_mm_unpackhi_epi64(sc8, sc8), 1)};
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i ql0 = gm_load256(x->ql + 64 * h), ql1 = gm_load256(x->ql + 64 * h + 32);
        const __m256i qh = gm_load256(x->qh + 32 * h);
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
        q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
        for (int k = 0; k < 4; k++) {
            const __m256i sc = gmk_pick(scales[h], 2 * k, 2 * k + 1);
            isum = _mm256_add_epi32(isum, gmk_sub_row(q[k], a + 128 * h + 32 * k, sc));
        }
    }
    return isum;
}

static void vec_dot_q6_K(int64_t n, float *s, const void *vw, const void *va) {
    const block_q6_K *x = vw;
    const block_q8_K *a = va;
    __m128 acc = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m256i sc16 = _mm256_cvtepi8_epi16(gm_load128(x[i].scales));
        const __m128i bias = gm_parity(_mm256_madd_epi16(sc16, gm_load256(a[i].bsums)));
        const __m128i e_o = _mm_sub_epi32(gm_parity(gmk_q6_isum_row(&x[i], a[i].qs)), _mm_slli_epi32(bias, 5));
        const __m128 d = _mm_set1_ps(f16(x[i].d) * a[i].d);
        acc = _mm_fmadd_ps(d, _mm_cvtepi32_ps(e_o), acc);
    }
    *s = gm_finish_row(acc, acc, 0);
}

/* Tile form, one half h: the raw bytes of the four rows transposed (chunks
 * A = ql[0..32), B = ql[32..64), H = qh[0..32) of the half), then quarter q's
 * codes t[k] = elements 8k..8k+7; sub-block 2q is t[0..2), 2q + 1 is t[2..4). */
GM_INLINE void gmk_q6_transpose(const uint8_t *const p[4], __m256i v[4]) {
    gm_transpose16(p[0], p[1], p[2], p[3], &v[0], &v[1]);
    gm_transpose16(p[0] + 16, p[1] + 16, p[2] + 16, p[3] + 16, &v[2], &v[3]);
}

GM_INLINE void gmk_q6_quarter(const __m256i l[4], const __m256i h[4], int high_nibble, int h_shift, __m256i t[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    for (int k = 0; k < 4; k++) {
        const __m256i low = _mm256_and_si256(high_nibble ? _mm256_srli_epi16(l[k], 4) : l[k], m4);
        t[k] = _mm256_or_si256(low, _mm256_and_si256(gmk_shift16(h[k], h_shift), m30));
    }
}

GM_INLINE void gemm_q6_K_n(int64_t n, float *s, size_t bs, const uint8_t *const w[4], const uint8_t *a, size_t ba,
                           size_t bw, int nr, const int nc) {
    /* quarter q: chunk A (q even) or B, low or high nibbles, qh bits 2q..2q+1 to bits 4..5 */
    static const int chunk_of[4] = {0, 1, 0, 1}, high_of[4] = {0, 0, 1, 1}, shift_of[4] = {4, 2, 0, -2};
    __m256 acc[4];
    for (int j = 0; j < 4; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        GM_ROWS(block_q6_K, w, i);
        gm_prefetch_ahead(w, bw, (size_t)i * sizeof(block_q6_K), sizeof(block_q6_K));
        __m256i z[2]; /* scales 0..7 and 8..15 of each row */
        gm_transpose16((const uint8_t *)b0->scales, (const uint8_t *)b1->scales, (const uint8_t *)b2->scales,
                       (const uint8_t *)b3->scales, &z[0], &z[1]);
        __m256i isum[4];
        for (int j = 0; j < 4; j++) isum[j] = _mm256_setzero_si256();
        for (int hf = 0; hf < 2; hf++) {
            const uint8_t *pa[4] = {b0->ql + 64 * hf, b1->ql + 64 * hf, b2->ql + 64 * hf, b3->ql + 64 * hf};
            const uint8_t *pb[4] = {pa[0] + 32, pa[1] + 32, pa[2] + 32, pa[3] + 32};
            const uint8_t *ph[4] = {b0->qh + 32 * hf, b1->qh + 32 * hf, b2->qh + 32 * hf, b3->qh + 32 * hf};
            __m256i hb[4], chunk[2][4];
            gmk_q6_transpose(ph, hb);
            gmk_q6_transpose(pa, chunk[0]);
            gmk_q6_transpose(pb, chunk[1]);
            for (int q = 0; q < 4; q++) {
                __m256i t[4];
                gmk_q6_quarter(chunk[chunk_of[q]], hb, high_of[q], shift_of[q], t);
                const __m256i sc_lo = gmk_scale_tile(z[hf], 2 * q, 1), sc_hi = gmk_scale_tile(z[hf], 2 * q + 1, 1);
                for (int j = 0; j < nc; j++) {
                    const int8_t *q8 = ((const block_q8_K *)(a + (size_t)j * ba) + i)->qs + 128 * hf + 32 * q;
                    isum[j] = _mm256_add_epi32(isum[j], gmk_sub_tile(t, q8, 2, sc_lo));
                    isum[j] = _mm256_add_epi32(isum[j], gmk_sub_tile(t + 2, q8 + 16, 2, sc_hi));
                }
            }
        }
        /* d sits at the end of the block: read it with the last two scale bytes before it */
        const uint8_t *dp[4] = {(const uint8_t *)&b0->d - 2, (const uint8_t *)&b1->d - 2, (const uint8_t *)&b2->d - 2,
                                (const uint8_t *)&b3->d - 2};
        const __m256 dw = _mm256_movehdup_ps(_mm256_cvtph_ps(
            _mm_setr_epi32((int)gm_u32(dp[0]), (int)gm_u32(dp[1]), (int)gm_u32(dp[2]), (int)gm_u32(dp[3]))));
        __m256i scw[4]; /* 16-bit lanes: scales 4t..4t+3 of row r in 64-bit lane r */
        for (int t = 0; t < 4; t++) scw[t] = gmk_widen_tile(z[t / 2], 4 * (t % 2), 1);
        for (int j = 0; j < nc; j++) {
            const block_q8_K *aj = (const block_q8_K *)(a + (size_t)j * ba) + i;
            __m256i bias = _mm256_madd_epi16(scw[0], gm_bcast8(aj->bsums));
            for (int t = 1; t < 4; t++)
                bias = _mm256_add_epi32(bias, _mm256_madd_epi16(scw[t], gm_bcast8(aj->bsums + 4 * t)));
            const __m256i e_o = _mm256_sub_epi32(isum[j], _mm256_slli_epi32(bias, 5));
            acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(aj->d)), _mm256_cvtepi32_ps(e_o), acc[j]);
        }
    }
    for (int j = 0; j < nc; j++) gm_finish_tile(s + (size_t)j * bs, acc[j], acc[j], 0, nr);
}

/* ---- entry points ------------------------------------------------------------------------ */

/* ROWS_ALONE: one activation row goes through vec_dot row by row (Q6_K:
 * its transposed decode costs more than four rows of vec_dot save) */
#define GMK_DEFINE_GEMM_ENTRY(NAME, ROWS_ALONE)                                                      \
    static void gemm_##NAME(int64_t n, float *s, size_t bs, const void *w, size_t bw, const void *a, \
                            size_t ba, int nr, int nc) {                                             \
        const uint8_t *rows[4];                                                                      \
        gm_rows(w, bw, nr, rows);                                                                    \
        switch (nc) {                                                                                \
        case 1:                                                                                      \
            if (ROWS_ALONE) { /* same arithmetic by construction */                                  \
                for (int r = 0; r < nr; r++) vec_dot_##NAME(n, s + r, rows[r], a);                   \
                break;                                                                               \
            }                                                                                        \
            gemm_##NAME##_n(n, s, bs, rows, a, ba, bw, nr, 1);                                       \
            break;                                                                                   \
        case 2: gemm_##NAME##_n(n, s, bs, rows, a, ba, bw, nr, 2); break;                            \
        case 3: gemm_##NAME##_n(n, s, bs, rows, a, ba, bw, nr, 3); break;                            \
        default: gemm_##NAME##_n(n, s, bs, rows, a, ba, bw, nr, 4); break;                           \
        }                                                                                            \
    }

#define GMK_DEFINE_ALL_KQUANTS()                                                                    \
    GMK_DEFINE_K4_ROW(q4_K, block_q4_K, NULL)                                                       \
    GMK_DEFINE_K4_ROW(q5_K, block_q5_K, x[i].qh)                                                    \
    GMK_DEFINE_K4_TILE(q4_K, block_q4_K, GMK_QH_NONE, 0)                                            \
    GMK_DEFINE_K4_TILE(q5_K, block_q5_K, GMK_QH_TILE, 1)                                            \
    GMK_DEFINE_GEMM_ENTRY(q4_K, 0)                                                                  \
    GMK_DEFINE_GEMM_ENTRY(q5_K, 0)                                                                  \
    GMK_DEFINE_GEMM_ENTRY(q6_K, 1)

/* Both ISA files install the same types from the kernels the macros above
 * define in them. */
#define GM_INSTALL_ALL(k)                                \
    do {                                                 \
        const int with_gemm = gm_gemm_enabled();         \
        GM_INSTALL(k, PE_TYPE_Q4_0, q4_0, with_gemm);    \
        GM_INSTALL(k, PE_TYPE_Q4_1, q4_1, with_gemm);    \
        GM_INSTALL(k, PE_TYPE_Q5_0, q5_0, with_gemm);    \
        GM_INSTALL(k, PE_TYPE_Q5_1, q5_1, with_gemm);    \
        GM_INSTALL(k, PE_TYPE_Q8_0, q8_0, with_gemm);    \
        GM_INSTALL(k, PE_TYPE_Q4_K, q4_K, with_gemm);    \
        GM_INSTALL(k, PE_TYPE_Q5_K, q5_K, with_gemm);    \
        GM_INSTALL(k, PE_TYPE_Q6_K, q6_K, with_gemm);    \
    } while (0)

#endif /* PE_X86_GEMM_KQUANTS_H */
