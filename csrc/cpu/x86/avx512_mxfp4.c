/* avx512_mxfp4.c - AVX-512 VNNI kernels of MXFP4 against Q8_0 (vec_dot and
 * the prompt tile), in ref_iq4.c's arithmetic.  vpdpbusd sums each 4
 * products of |w| with the activations carrying w's sign into a 32-bit lane:
 * elements 4t..4t+3, the reference's integer lanes.  The prompt tile holds a
 * pair of blocks in one 512-bit vector, its low half the even block and its
 * high half the odd one, so that one accumulator is the reference's two sets
 * side by side (a last odd block goes into the low half); there the expanded
 * levels load as they are and each pair's work is shared by 8 columns. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include "internal.h"
#include "x86_kquants.h"

/* the 16 lanes of a pair of blocks: levels w (|w| and w's signs passed in)
 * with activation codes q, as floats */
static inline __m512 pair_lanes(__m512i abs_w, __mmask64 negative, __m512i q) {
    const __m512i signed_q = _mm512_mask_sub_epi8(q, negative, _mm512_setzero_si512(), q);
    return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), abs_w, signed_q));
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

/* 16 bytes of codes -> the 32 levels of a block in element order */
static inline __m256i block_levels(const uint8_t *qs, __m256i grid) {
    const __m128i v = load128(qs);
    const __m256i idx = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
    return _mm256_shuffle_epi8(grid, _mm256_and_si256(idx, _mm256_set1_epi8(0xF)));
}

static inline __m256 fma_block(__m256i w, const block_q8_0 *a, float dw, __m256 acc) {
    const __m256i lanes = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w),
                                              _mm256_sign_epi8(load256(a->qs), w));
    return _mm256_fmadd_ps(_mm256_set1_ps(f16(a->d) * dw), _mm256_cvtepi32_ps(lanes), acc);
}

/* decoding: AVX2's two 256-bit accumulators (a block's loads and lookups fill
 * a 256-bit vector; on Zen 4 pairing blocks in 512 bits costs more shuffles
 * than it saves), vpdpbusd in place of maddubs + madd */
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

#define TILE_COLS 8   /* activation rows sharing a weight row's loads */
#define CHUNK 32      /* blocks of the activation rows gathered at a time (even: pairs stay whole) */

/* A chunk of the activation rows as the tile reads them, once for all 16
 * weight rows: each row's codes contiguous (a pair of blocks in one load)
 * and its block scales as floats (16 more, so that a 16-float load from any
 * block stays inside). */
typedef struct {
    int8_t codes[TILE_COLS][CHUNK * QK8_0];
    float  d[TILE_COLS][CHUNK + 16];
} chunk_acts;

static void gather(const block_q8_0 *const col[TILE_COLS], int64_t i0, int64_t i1, chunk_acts *acts) {
    for (int c = 0; c < TILE_COLS; c++)
        for (int64_t i = i0; i < i1; i++) {
            memcpy(acts->codes[c] + QK8_0 * (i - i0), col[c][i].qs, QK8_0);
            acts->d[c][i - i0] = f16(col[c][i].d);
        }
}

/* lanes 0..7 from x[0], 8..15 from x[1] */
static inline __m512 spread_pair(__m512 x) {
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), x);
}

/* one packed row's blocks i0..i1 against TILE_COLS activation rows, into acc;
 * each pair's scale da * dw lane by lane (one float product, as vec_dot's) */
static void row_chunk(const int8_t *levels, const float *dw, const chunk_acts *acts, int64_t i0, int64_t i1,
                      __m512 acc[TILE_COLS]) {
    __m512 sum[TILE_COLS];
    for (int c = 0; c < TILE_COLS; c++) sum[c] = acc[c];
    int64_t i = i0;
    for (; i + 1 < i1; i += 2) {
        const __m512i w = _mm512_loadu_si512(levels + QK_MXFP4 * i);
        const __m512i abs_w = _mm512_abs_epi8(w);
        const __mmask64 negative = _mm512_movepi8_mask(w);
        /* the two scales: a 64-bit load that may be unaligned (a double load may not) */
        const __m128 dw2 = _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(dw + i)));
        const __m512 dw_pair = spread_pair(_mm512_castps128_ps512(dw2));
        for (int c = 0; c < TILE_COLS; c++) {
            const __m512i q = _mm512_loadu_si512(acts->codes[c] + QK8_0 * (i - i0));
            const __m512 d = _mm512_mul_ps(spread_pair(_mm512_loadu_ps(&acts->d[c][i - i0])), dw_pair);
            sum[c] = _mm512_fmadd_ps(d, pair_lanes(abs_w, negative, q), sum[c]);
        }
    }
    if (i < i1) {   /* the row's last block, an odd one: the low half */
        const __m256i w = load256(levels + QK_MXFP4 * i);
        for (int c = 0; c < TILE_COLS; c++) {
            const __m256 lo = _mm256_fmadd_ps(_mm256_set1_ps(acts->d[c][i - i0] * dw[i]),
                                              block_lanes(w, acts->codes[c] + QK8_0 * (i - i0)),
                                              _mm512_castps512_ps256(sum[c]));
            sum[c] = _mm512_insertf32x8(sum[c], lo, 0);
        }
    }
    for (int c = 0; c < TILE_COLS; c++) acc[c] = sum[c];
}

/* 16 packed rows against up to TILE_COLS activation rows */
static void tile(int64_t n, float *s, size_t bs, const void *packed, const uint8_t *a, size_t ba, int nc) {
    const block_q8_0 *col[TILE_COLS];
    for (int c = 0; c < TILE_COLS; c++) col[c] = (const block_q8_0 *)(a + (size_t)(c < nc ? c : nc - 1) * ba);
    __m512 acc[PE_PACK_ROWS][TILE_COLS];
    for (int r = 0; r < PE_PACK_ROWS; r++)
        for (int c = 0; c < TILE_COLS; c++) acc[r][c] = _mm512_setzero_ps();
    chunk_acts acts;
    memset(acts.d, 0, sizeof acts.d);
    const int64_t nb = n / QK_MXFP4;
    for (int64_t i0 = 0; i0 < nb; i0 += CHUNK) {
        const int64_t i1 = i0 + CHUNK < nb ? i0 + CHUNK : nb;
        gather(col, i0, i1, &acts);
        for (int r = 0; r < PE_PACK_ROWS; r++)
            row_chunk(pe_mxfp4_levels(packed, n, r), pe_mxfp4_scales(packed, n, r), &acts, i0, i1, acc[r]);
    }
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < PE_PACK_ROWS; r++) s[(size_t)c * bs + r] = pair_result(acc[r][c]);
}

static void gemm16_mxfp4(int64_t n, float *s, size_t bs, const void *packed, const void *a, size_t ba, int nc) {
    for (int j = 0; j < nc; j += TILE_COLS)
        tile(n, s + (size_t)j * bs, bs, packed, (const uint8_t *)a + (size_t)j * ba, ba,
             nc - j < TILE_COLS ? nc - j : TILE_COLS);
}

void pe_fill_avx512_mxfp4(pe_kernels *k) {
    for (int e = 0; e < 256; e++) scale_of[e] = pe_mxfp4_scale((uint8_t)e);
    k->type[PE_TYPE_MXFP4].vec_dot = vec_dot_mxfp4;
    k->type[PE_TYPE_MXFP4].packed.gemm16 = gemm16_mxfp4;
}
