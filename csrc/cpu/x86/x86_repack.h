/* x86_repack.h - Q4_0 and IQ4_NL as llama.cpp multiplies them from its
 * repacked copies (include x86_gemm.h first).
 *
 * On x86 llama.cpp repacks Q4_0 and IQ4_NL weights with a multiple of 8 rows
 * into 8-row interleaved blocks (q4_0_8x8, iq4_nl_8x8) and multiplies those
 * with its own GEMV (one activation row) and GEMM (4 rows).  Both take, per
 * 32-element block, the whole integer dot product S and multiply-add it into
 * one float per pair: acc = fma((float)S, dw * da, acc), dw * da one rounded
 * product; the result is acc.  GEMV and GEMM agree, so a row's result does
 * not depend on its batch; what decides the arithmetic is the weight's row
 * count, which reaches the kernels as PE_PATH_ROWS8 (ops_matmul.c).  Weights
 * with other row counts keep the legacy lane arithmetic (x86_gemm.h). */
#ifndef PE_X86_REPACK_H
#define PE_X86_REPACK_H

#include <math.h>

#include "kquants.h"

/* IQ4_NL's 32 grid values of a block in element order */
static inline __m256i gmr_row_iq4_nl(const block_iq4_nl *b) {
    const __m256i grid = _mm256_broadcastsi128_si256(gm_load128(pe_iq4nl_values));
    return _mm256_shuffle_epi8(grid, gm_nibbles_row(b->qs));
}

/* one block of one pair: the repacked kernels' step */
GM_INLINE float gmr_step(__m256i codes, float dw, const block_q8_0 *a, float acc) {
    const int sum = x86_sum_epi32x8(gm_dot_row(codes, a->qs, GM_SIGNED8));
    return fmaf((float)sum, dw * gm_f16(&a->d), acc);
}

/* ROW(block) gives a block's signed codes.  The kernels the table held
 * before (the lane arithmetic, for weights llama.cpp does not repack) are
 * kept at install time and called for those. */
#define GMR_DEFINE_REPACK(NAME, WB, ROW)                                                                  \
    static pe_vec_dot_fn gmr_legacy_dot_##NAME;                                                           \
    static pe_gemm_fn gmr_legacy_gemm_##NAME;                                                             \
    static void vec_dot_path_##NAME(int64_t n, float *s, const void *vw, const void *va, unsigned path) { \
        if (!(path & PE_PATH_ROWS8)) { gmr_legacy_dot_##NAME(n, s, vw, va); return; }                                \
        const WB *w = vw;                                                                                 \
        const block_q8_0 *a = va;                                                                         \
        float acc = 0.0f;                                                                                 \
        for (int64_t ib = 0; ib < n / 32; ib++) acc = gmr_step(ROW(&w[ib]), gm_f16(&w[ib].d), &a[ib], acc); \
        *s = acc;                                                                                         \
    }                                                                                                     \
    static void gemm_rep_##NAME(int64_t n, float *s, size_t bs, const void *w, size_t bw, const void *a,  \
                                size_t ba, int nr, int nc, unsigned paths) {                              \
        const pe_gemm_fn legacy = gmr_legacy_gemm_##NAME;                                                            \
        if (!(paths & PE_PATH_ROWS8)) { /* a weight property: every row carries it or none */            \
            if (legacy) { legacy(n, s, bs, w, bw, a, ba, nr, nc, paths); return; }                       \
            for (int j = 0; j < nc; j++)                                                                  \
                for (int i = 0; i < nr; i++)                                                              \
                    gmr_legacy_dot_##NAME(n, s + (size_t)j * bs + i, (const uint8_t *)w + (size_t)i * bw,            \
                               (const uint8_t *)a + (size_t)j * ba);                                      \
            return;                                                                                       \
        }                                                                                                 \
        float acc[PE_GEMM_ROWS][PE_GEMM_COLS] = {{0}};                                                      \
        for (int64_t ib = 0; ib < n / 32; ib++)                                                           \
            for (int i = 0; i < nr; i++) {                                                                \
                const WB *b = (const WB *)((const uint8_t *)w + (size_t)i * bw) + ib;                     \
                const __m256i codes = ROW(b);                                                             \
                const float dw = gm_f16(&b->d);                                                           \
                for (int j = 0; j < nc; j++)                                                              \
                    acc[i][j] = gmr_step(codes, dw, (const block_q8_0 *)((const uint8_t *)a + (size_t)j * ba) + ib, acc[i][j]); \
            }                                                                                             \
        for (int j = 0; j < nc; j++)                                                                      \
            for (int i = 0; i < nr; i++) s[(size_t)j * bs + i] = acc[i][j];                               \
    }

/* Installs over what the table holds: Q4_0's legacy kernels (x86_gemm.h)
 * and IQ4_NL's row product (avx2_kquants.c) stay the non-repacked path. */
#define GMR_INSTALL(k, TYPE, NAME, with_gemm)                                  \
    do {                                                                       \
        gmr_legacy_dot_##NAME = (k)->type[TYPE].vec_dot;                       \
        gmr_legacy_gemm_##NAME = (k)->type[TYPE].gemm;                         \
        (k)->type[TYPE].vec_dot_path = vec_dot_path_##NAME;                    \
        if (with_gemm) (k)->type[TYPE].gemm = gemm_rep_##NAME;                 \
    } while (0)

/* Decoding, Q4_0 on 8-row weights: 8 rows against nc <= 4 activation rows,
 * each pair's S from the codes' integer products (unsigned nibbles, the 8
 * coming off as -8 x the activations' sum), the 8 rows' sums side by side
 * for one convert, one scale multiply and one fma per column. */
#if defined(PE_GEMM_VNNI)
/* the totals of 8 rows from their 8-lane sums (v[p]: rows 2p, 2p + 1) */
static inline __m256i gmr_row_totals(const __m512i v[4]) {
    /* 128-bit block k: row k's (w01) and row 4 + k's (w23) four partial sums */
    const __m512i w01 = _mm512_add_epi32(_mm512_shuffle_i32x4(v[0], v[1], 0x88), _mm512_shuffle_i32x4(v[0], v[1], 0xDD));
    const __m512i w23 = _mm512_add_epi32(_mm512_shuffle_i32x4(v[2], v[3], 0x88), _mm512_shuffle_i32x4(v[2], v[3], 0xDD));
    __m512i x = _mm512_add_epi32(_mm512_unpacklo_epi32(w01, w23), _mm512_unpackhi_epi32(w01, w23));
    x = _mm512_add_epi32(x, _mm512_shuffle_epi32(x, (_MM_PERM_ENUM)0x4E));   /* [row k, row 4 + k, ...] */
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castsi512_si256(_mm512_permutexvar_epi32(idx, x));
}

static inline __m256i gmr_q4_0_totals(const __m512i codes[4], const int8_t *qs) {
    const __m256i qa = gm_load256(qs);
    const __m512i av = _mm512_broadcast_i64x4(qa);
    __m512i lanes[4];
    for (int p = 0; p < 4; p++) lanes[p] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes[p], av);
    return _mm256_add_epi32(gmr_row_totals(lanes), _mm256_set1_epi32(-8 * gm_sum_codes32(qs)));
}

static inline void gmr_q4_0_codes(const uint8_t *const rows[8], int64_t ib, __m512i codes[4]) {
    for (int p = 0; p < 4; p++)
        codes[p] = gm_pair(gm_nibbles_row(((const block_q4_0 *)rows[2 * p] + ib)->qs),
                           gm_nibbles_row(((const block_q4_0 *)rows[2 * p + 1] + ib)->qs));
}
#define GMR_Q4_0_CODES __m512i codes[4]
#else
/* the totals of 8 rows from their 8-lane sums v[r] */
static inline __m256i gmr_row_totals(const __m256i v[8]) {
    const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    /* h0: rows 0..3 in each half (low lanes, high lanes), h1: rows 4..7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
}

static inline __m256i gmr_q4_0_totals(const __m256i codes[8], const int8_t *qs) {
    __m256i lanes[8];
    for (int r = 0; r < 8; r++) lanes[r] = gm_dot_row(codes[r], qs, GM_UNSIGNED);
    return _mm256_add_epi32(gmr_row_totals(lanes), _mm256_set1_epi32(-8 * gm_sum_codes32(qs)));
}

static inline void gmr_q4_0_codes(const uint8_t *const rows[8], int64_t ib, __m256i codes[8]) {
    for (int r = 0; r < 8; r++) codes[r] = gm_nibbles_row(((const block_q4_0 *)rows[r] + ib)->qs);
}
#define GMR_Q4_0_CODES __m256i codes[8]
#endif

GM_INLINE void gmr_gemm8_q4_0_n(int64_t n, float *s, size_t bs, const uint8_t *w, size_t bw, const uint8_t *a,
                                size_t ba, const int nc) {
    const uint8_t *rows[8];
    for (int r = 0; r < 8; r++) rows[r] = w + (size_t)r * bw;
    __m256 acc[4];
    for (int j = 0; j < 4; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / 32; ib++) {
        const size_t off = (size_t)ib * sizeof(block_q4_0);
        gm_prefetch_ahead(rows, bw, off, sizeof(block_q4_0));
        gm_prefetch_ahead(rows + 4, bw, off, sizeof(block_q4_0));
        uint16_t d[8];
        for (int r = 0; r < 8; r++) memcpy(&d[r], rows[r] + off, sizeof d[r]);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d));
        GMR_Q4_0_CODES;
        gmr_q4_0_codes(rows, ib, codes);
        for (int j = 0; j < nc; j++) {
            const block_q8_0 *y = (const block_q8_0 *)(a + (size_t)j * ba) + ib;
            const __m256i total = gmr_q4_0_totals(codes, y->qs);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(dw, _mm256_set1_ps(gm_f16(&y->d))), acc[j]);
        }
    }
    for (int j = 0; j < nc; j++) _mm256_storeu_ps(s + (size_t)j * bs, acc[j]);
}

static void gemm8_rows8_q4_0(int64_t n, float *s, size_t bs, const void *w, size_t bw, const void *a, size_t ba,
                             int nc) {
    switch (nc) {
    case 1: gmr_gemm8_q4_0_n(n, s, bs, w, bw, a, ba, 1); break;
    case 2: gmr_gemm8_q4_0_n(n, s, bs, w, bw, a, ba, 2); break;
    case 3: gmr_gemm8_q4_0_n(n, s, bs, w, bw, a, ba, 3); break;
    default: gmr_gemm8_q4_0_n(n, s, bs, w, bw, a, ba, 4); break;
    }
}

#define GMR_DEFINE_ALL_REPACK()                                                \
    GMR_DEFINE_REPACK(q4_0, block_q4_0, gm_row_q4_0)                           \
    GMR_DEFINE_REPACK(iq4_nl, block_iq4_nl, gmr_row_iq4_nl)

#define GMR_INSTALL_ALL(k, with_gemm)                                          \
    do {                                                                       \
        GMR_INSTALL(k, PE_TYPE_Q4_0, q4_0, with_gemm);                         \
        if (with_gemm) (k)->type[PE_TYPE_Q4_0].gemm8_rows8 = gemm8_rows8_q4_0; \
        GMR_INSTALL(k, PE_TYPE_IQ4_NL, iq4_nl, with_gemm);                     \
    } while (0)

#endif /* PE_X86_REPACK_H */
