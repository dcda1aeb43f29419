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

#define GMR_DEFINE_ALL_REPACK()                                                \
    GMR_DEFINE_REPACK(q4_0, block_q4_0, gm_row_q4_0)                           \
    GMR_DEFINE_REPACK(iq4_nl, block_iq4_nl, gmr_row_iq4_nl)

#define GMR_INSTALL_ALL(k, with_gemm)                                          \
    do {                                                                       \
        GMR_INSTALL(k, PE_TYPE_Q4_0, q4_0, with_gemm);                         \
        GMR_INSTALL(k, PE_TYPE_IQ4_NL, iq4_nl, with_gemm);                     \
    } while (0)

#endif /* PE_X86_REPACK_H */
