/* avx2_mxfp4.c - AVX2 kernels of MXFP4 against Q8_0: vec_dot and the prompt
 * tile over pe_mxfp4_pack16's expanded rows, both in ref_iq4.c's arithmetic
 * (IQ4_NL's): per block the 8 exact integer lanes (elements 4t..4t+3: one
 * maddubs, the weights' signs moved onto the activations, then a madd by
 * ones), converted and multiply-added with da * dw into the even blocks' or
 * the odd blocks' accumulator, the two added and folded by halves.  The
 * levels are at most 12 in magnitude: no 16-bit pair can saturate. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include "internal.h"
#include "x86_kquants.h"

/* the products of a block's 32 levels w with its 32 activation codes, as
 * floats in the 8 lanes (lane t: elements 4t..4t+3); |w| is passed in, as
 * the prompt tile reuses it for every column */
static inline __m256 block_lanes(__m256i w, __m256i abs_w, const int8_t *a) {
    const __m256i pairs = _mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(load256(a), w));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

/* 16 bytes of codes -> the 32 levels in element order */
static inline __m256i block_levels(const uint8_t *qs, __m256i grid) {
    const __m128i v = load128(qs);
    const __m256i idx = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
    return _mm256_shuffle_epi8(grid, _mm256_and_si256(idx, _mm256_set1_epi8(0xF)));
}

static inline __m256 fma_block(__m256i w, const block_q8_0 *a, float dw, __m256 acc) {
    return _mm256_fmadd_ps(_mm256_set1_ps(f16(a->d) * dw), block_lanes(w, _mm256_sign_epi8(w, w), a->qs), acc);
}

/* pe_mxfp4_scale of every exponent: one load per block in the decoding loop
 * in place of the bit assembly (filled with the table) */
static float scale_of[256];

static void vec_dot_mxfp4(int64_t n, float *s, const void *vw, const void *va) {
    const block_mxfp4 *x = vw;
    const block_q8_0 *a = va;
    const __m256i grid = _mm256_broadcastsi128_si256(load128(pe_mxfp4_values));
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const int64_t nb = n / QK_MXFP4;
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        acc0 = fma_block(block_levels(x[i].qs, grid), &a[i], scale_of[x[i].e], acc0);
        acc1 = fma_block(block_levels(x[i + 1].qs, grid), &a[i + 1], scale_of[x[i + 1].e], acc1);
    }
    if (i < nb) acc0 = fma_block(block_levels(x[i].qs, grid), &a[i], scale_of[x[i].e], acc0);
    *s = x86_sum_ps8(_mm256_add_ps(acc0, acc1));
}

/* pe_mxfp4_pack16 (the reference's layout and values) with the lookups in registers */
static size_t pack16_mxfp4(int64_t n, const void *w, size_t bw, void *dst) {
    if (!dst) return pe_mxfp4_pack16(n, w, bw, dst);
    const __m256i grid = _mm256_broadcastsi128_si256(load128(pe_mxfp4_values));
    for (int r = 0; r < PE_PACK_ROWS; r++) {
        const block_mxfp4 *x = (const block_mxfp4 *)((const uint8_t *)w + (size_t)r * bw);
        int8_t *levels = (int8_t *)pe_mxfp4_levels(dst, n, r);
        float *scales = (float *)pe_mxfp4_scales(dst, n, r);
        for (int64_t i = 0; i < n / QK_MXFP4; i++) {
            _mm256_storeu_si256((__m256i *)(levels + QK_MXFP4 * i), block_levels(x[i].qs, grid));
            scales[i] = pe_mxfp4_scale(x[i].e);
        }
    }
    return pe_mxfp4_pack_bytes(n);
}

#define TILE_COLS 4   /* activation rows sharing a weight row's loads */
#define CHUNK 64      /* blocks whose activation scales are converted at a time (even: pairs stay whole) */

/* The activation rows' block scales i0..i1 as floats, once for all 16 rows
 * (da[c][i - i0]; a short group repeats its last row). */
static void activation_scales(const block_q8_0 *const col[TILE_COLS], int64_t i0, int64_t i1,
                              float da[TILE_COLS][CHUNK]) {
    for (int c = 0; c < TILE_COLS; c++)
        for (int64_t i = i0; i < i1; i++) da[c][i - i0] = f16(col[c][i].d);
}

/* one packed row's blocks i0..i1 against TILE_COLS activation rows, into the
 * even blocks' (acc[c][0]) and the odd blocks' (acc[c][1]) accumulators */
static void row_chunk(const int8_t *levels, const float *dw, const block_q8_0 *const col[TILE_COLS],
                      const float da[TILE_COLS][CHUNK], int64_t i0, int64_t i1, __m256 acc[TILE_COLS][2]) {
    __m256 acc0[TILE_COLS], acc1[TILE_COLS];
    for (int c = 0; c < TILE_COLS; c++) acc0[c] = acc[c][0], acc1[c] = acc[c][1];
    int64_t i = i0;
    for (; i + 1 < i1; i += 2) {
        const __m256i w0 = load256(levels + QK_MXFP4 * i), w1 = load256(levels + QK_MXFP4 * (i + 1));
        const __m256i abs0 = _mm256_sign_epi8(w0, w0), abs1 = _mm256_sign_epi8(w1, w1);
        for (int c = 0; c < TILE_COLS; c++) {
            acc0[c] = _mm256_fmadd_ps(_mm256_set1_ps(da[c][i - i0] * dw[i]), block_lanes(w0, abs0, col[c][i].qs),
                                      acc0[c]);
            acc1[c] = _mm256_fmadd_ps(_mm256_set1_ps(da[c][i + 1 - i0] * dw[i + 1]),
                                      block_lanes(w1, abs1, col[c][i + 1].qs), acc1[c]);
        }
    }
    if (i < i1) {   /* the row's last block, an odd one: the first set */
        const __m256i w0 = load256(levels + QK_MXFP4 * i), abs0 = _mm256_sign_epi8(w0, w0);
        for (int c = 0; c < TILE_COLS; c++)
            acc0[c] = _mm256_fmadd_ps(_mm256_set1_ps(da[c][i - i0] * dw[i]), block_lanes(w0, abs0, col[c][i].qs),
                                      acc0[c]);
    }
    for (int c = 0; c < TILE_COLS; c++) acc[c][0] = acc0[c], acc[c][1] = acc1[c];
}

/* 16 packed rows against up to TILE_COLS activation rows */
static void tile(int64_t n, float *s, size_t bs, const void *packed, const uint8_t *a, size_t ba, int nc) {
    const block_q8_0 *col[TILE_COLS];
    for (int c = 0; c < TILE_COLS; c++) col[c] = (const block_q8_0 *)(a + (size_t)(c < nc ? c : nc - 1) * ba);
    __m256 acc[PE_PACK_ROWS][TILE_COLS][2];
    for (int r = 0; r < PE_PACK_ROWS; r++)
        for (int c = 0; c < TILE_COLS; c++) acc[r][c][0] = acc[r][c][1] = _mm256_setzero_ps();
    float da[TILE_COLS][CHUNK];
    const int64_t nb = n / QK_MXFP4;
    for (int64_t i0 = 0; i0 < nb; i0 += CHUNK) {
        const int64_t i1 = i0 + CHUNK < nb ? i0 + CHUNK : nb;
        activation_scales(col, i0, i1, da);
        for (int r = 0; r < PE_PACK_ROWS; r++)
            row_chunk(pe_mxfp4_levels(packed, n, r), pe_mxfp4_scales(packed, n, r), col, da, i0, i1, acc[r]);
    }
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < PE_PACK_ROWS; r++)
            s[(size_t)c * bs + r] = x86_sum_ps8(_mm256_add_ps(acc[r][c][0], acc[r][c][1]));
}

static void gemm16_mxfp4(int64_t n, float *s, size_t bs, const void *packed, const void *a, size_t ba, int nc) {
    for (int j = 0; j < nc; j += TILE_COLS)
        tile(n, s + (size_t)j * bs, bs, packed, (const uint8_t *)a + (size_t)j * ba, ba,
             nc - j < TILE_COLS ? nc - j : TILE_COLS);
}

void pe_fill_avx2_mxfp4(pe_kernels *k) {
    for (int e = 0; e < 256; e++) scale_of[e] = pe_mxfp4_scale((uint8_t)e);
    k->type[PE_TYPE_MXFP4].vec_dot = vec_dot_mxfp4;
    k->type[PE_TYPE_MXFP4].packed.pack16 = pack16_mxfp4;
    k->type[PE_TYPE_MXFP4].packed.gemm16 = gemm16_mxfp4;
}
