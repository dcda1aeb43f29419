/* avx512_mxfp4.c - AVX-512 VNNI kernels of MXFP4 against Q8_0 (vec_dot and
 * the prompt tile), in ref_iq4.c's arithmetic: one 512-bit vector holds a
 * pair of blocks, its low half the even block and its high half the odd one,
 * so that one accumulator is the reference's two sets side by side (a last
 * odd block goes into the low half).  vpdpbusd sums each 4 products of |w|
 * with the activations carrying w's sign into a 32-bit lane: elements
 * 4t..4t+3, the reference's integer lanes. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include "internal.h"
#include "x86_kquants.h"

static inline __m512i pair512(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

/* 16 bytes of codes of two blocks -> their 64 levels in element order */
static inline __m512i pair_levels(const uint8_t *qs0, const uint8_t *qs1, __m512i grid) {
    const __m128i v0 = load128(qs0), v1 = load128(qs1);
    const __m512i idx = pair512(_mm256_set_m128i(_mm_srli_epi16(v0, 4), v0), _mm256_set_m128i(_mm_srli_epi16(v1, 4), v1));
    return _mm512_shuffle_epi8(grid, _mm512_and_si512(idx, _mm512_set1_epi8(0xF)));
}

/* the 16 lanes of a pair of blocks: levels w (|w| and w's signs passed in)
 * with activation codes q, as floats */
static inline __m512 pair_lanes(__m512i abs_w, __mmask64 negative, __m512i q) {
    const __m512i signed_q = _mm512_mask_sub_epi8(q, negative, _mm512_setzero_si512(), q);
    return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), abs_w, signed_q));
}

static inline __m512 pair_scales(float d0, float d1) {
    return _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1);
}

/* the low half's 8 lanes of one block (the last odd one) */
static inline __m256 block_lanes(__m256i w, const int8_t *a) {
    const __m256i q = load256(a);
    const __m256i signed_q = _mm256_mask_sub_epi8(q, _mm256_movepi8_mask(w), _mm256_setzero_si256(), q);
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(w), signed_q));
}

/* both sets added, folded by halves */
static inline float pair_result(__m512 acc) {
    return x86_sum_ps8(_mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1)));
}

static void vec_dot_mxfp4(int64_t n, float *s, const void *vw, const void *va) {
    const block_mxfp4 *x = vw;
    const block_q8_0 *a = va;
    const __m512i grid = _mm512_broadcast_i32x4(load128(pe_mxfp4_values));
    __m512 acc = _mm512_setzero_ps();
    const int64_t nb = n / QK_MXFP4;
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        const __m512i w = pair_levels(x[i].qs, x[i + 1].qs, grid);
        const __m512i q = pair512(load256(a[i].qs), load256(a[i + 1].qs));
        const __m512 d = pair_scales(f16(a[i].d) * pe_mxfp4_scale(x[i].e), f16(a[i + 1].d) * pe_mxfp4_scale(x[i + 1].e));
        acc = _mm512_fmadd_ps(d, pair_lanes(_mm512_abs_epi8(w), _mm512_movepi8_mask(w), q), acc);
    }
    if (i < nb) {
        const __m256i w = _mm512_castsi512_si256(pair_levels(x[i].qs, x[i].qs, grid));
        const __m256 lo = _mm256_fmadd_ps(_mm256_set1_ps(f16(a[i].d) * pe_mxfp4_scale(x[i].e)), block_lanes(w, a[i].qs),
                                          _mm512_castps512_ps256(acc));
        acc = _mm512_insertf32x8(acc, lo, 0);
    }
    *s = pair_result(acc);
}

#define TILE_COLS 8   /* activation rows sharing a weight row's loads */

/* one packed row against up to TILE_COLS activation rows (a short group
 * repeats its last row and keeps only the valid results) */
static void row_tile(int64_t n, const int8_t *levels, const float *dw, const uint8_t *a, size_t ba, int nc,
                     float *s, size_t bs) {
    const block_q8_0 *col[TILE_COLS];
    for (int c = 0; c < TILE_COLS; c++) col[c] = (const block_q8_0 *)(a + (size_t)(c < nc ? c : nc - 1) * ba);
    __m512 acc[TILE_COLS];
    for (int c = 0; c < TILE_COLS; c++) acc[c] = _mm512_setzero_ps();
    const int64_t nb = n / QK_MXFP4;
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        const __m512i w = _mm512_loadu_si512(levels + QK_MXFP4 * i);
        const __m512i abs_w = _mm512_abs_epi8(w);
        const __mmask64 negative = _mm512_movepi8_mask(w);
        for (int c = 0; c < TILE_COLS; c++) {
            const __m512i q = pair512(load256(col[c][i].qs), load256(col[c][i + 1].qs));
            const __m512 d = pair_scales(f16(col[c][i].d) * dw[i], f16(col[c][i + 1].d) * dw[i + 1]);
            acc[c] = _mm512_fmadd_ps(d, pair_lanes(abs_w, negative, q), acc[c]);
        }
    }
    if (i < nb) {
        const __m256i w = load256(levels + QK_MXFP4 * i);
        for (int c = 0; c < TILE_COLS; c++) {
            const __m256 lo = _mm256_fmadd_ps(_mm256_set1_ps(f16(col[c][i].d) * dw[i]), block_lanes(w, col[c][i].qs),
                                              _mm512_castps512_ps256(acc[c]));
            acc[c] = _mm512_insertf32x8(acc[c], lo, 0);
        }
    }
    for (int c = 0; c < nc; c++) s[(size_t)c * bs] = pair_result(acc[c]);
}

static void gemm16_mxfp4(int64_t n, float *s, size_t bs, const void *packed, const void *a, size_t ba, int nc) {
    for (int r = 0; r < PE_PACK_ROWS; r++)
        for (int j = 0; j < nc; j += TILE_COLS)
            row_tile(n, pe_mxfp4_levels(packed, n, r), pe_mxfp4_scales(packed, n, r), (const uint8_t *)a + (size_t)j * ba,
                     ba, nc - j < TILE_COLS ? nc - j : TILE_COLS, s + (size_t)j * bs + r, bs);
}

void pe_fill_avx512_mxfp4(pe_kernels *k) {
    k->type[PE_TYPE_MXFP4].vec_dot = vec_dot_mxfp4;
    k->type[PE_TYPE_MXFP4].gemm16 = gemm16_mxfp4;
}
