/* avx2_legacy.c - AVX2 + FMA + F16C kernels of the float types (F32 F16
 * BF16) and the legacy block types (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0, Q8_1 as the
 * activation format).
 *
 * Quantizers and dequantizers give the reference's bits exactly.  The block
 * types' dot products (vec_dot and gemm) are in avx2_gemm.c. */
#include <immintrin.h>
#include <string.h>

#include "blocks.h"
#include "internal.h"
#include "x86_float_gemm.h"
#include "x86_reduce.h"

/* Intrinsics are plain vector arithmetic to GCC, which would fuse a separate
 * multiply and add into an FMA; the quantizers need the two roundings. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* ---- helpers ------------------------------------------------------------------ */

static inline float hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static inline float f16_to_f32(pe_f16 h) { return _cvtsh_ss(h); }

static inline uint32_t load_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* A block's 16 nibble bytes -> 32 codes 0..15: low nibbles (elements 0..15)
 * in the low half, high nibbles in the high half. */
static inline __m256i nibbles32(const uint8_t *qs) {
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    const __m256i shifted = _mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4));
    return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
}

/* 0xFF in byte i where bit i of the 32 bits is set. */
static inline __m256i bits_to_bytes(uint32_t bits) {
    const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL);
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
}

static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* ---- weight codes per block, as unsigned bytes ------------------------------------ */

/* Each returns a block's 32 codes in element order; the signed types are
 * read with an offset that the dequantizer takes off. */
static inline __m256i codes_q4_0(const block_q4_0 *b) { return nibbles32(b->qs); }
static inline __m256i codes_q4_1(const block_q4_1 *b) { return nibbles32(b->qs); }

static inline __m256i codes_q5_0(const block_q5_0 *b) {
    const __m256i high = _mm256_and_si256(bits_to_bytes(load_u32(b->qh)), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(nibbles32(b->qs), high);
}

static inline __m256i codes_q5_1(const block_q5_1 *b) {
    const __m256i high = _mm256_and_si256(bits_to_bytes(load_u32(b->qh)), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(nibbles32(b->qs), high);
}

static inline __m256i codes_q8_0(const block_q8_0 *b) { return load32(b->qs); }

/* ---- dequantize ---------------------------------------------------------------------- */

/* y[0..32) = codes * d (+ m).  codes * d is exact, so this equals the
 * reference; the _0 types add nothing, keeping the sign of -0.0. */
static inline void store_block(float *y, __m256i codes, __m256 d, const __m256 *m) {
    const __m128i lo = _mm256_castsi256_si128(codes), hi = _mm256_extracti128_si256(codes, 1);
    const __m128i parts[4] = {lo, _mm_unpackhi_epi64(lo, lo), hi, _mm_unpackhi_epi64(hi, hi)};
    for (int k = 0; k < 4; k++) {
        __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])), d);
        if (m) v = _mm256_add_ps(v, *m);
        _mm256_storeu_ps(y + 8 * k, v);
    }
}

/* OFFSET is taken off the codes; WITH_MIN adds m, the second half of the
 * _1 blocks. */
#define DEFINE_TO_FLOAT(NAME, WBLOCK, CODES, OFFSET, WITH_MIN)                            \
    static void NAME(const void *vx, float *y, int64_t n) {                                \
        const WBLOCK *x = vx;                                                              \
        for (int64_t ib = 0; ib < n / 32; ib++, y += 32) {                                 \
            const __m256 d = _mm256_set1_ps(f16_to_f32(x[ib].d));                          \
            const __m256 m = _mm256_set1_ps(f16_to_f32((pe_f16)(load_u32(&x[ib]) >> 16))); \
            const __m256i codes = _mm256_sub_epi8(CODES(&x[ib]), _mm256_set1_epi8(OFFSET)); \
            store_block(y, codes, d, WITH_MIN ? &m : NULL);                                \
        }                                                                                  \
    }

DEFINE_TO_FLOAT(dequantize_q4_0, block_q4_0, codes_q4_0, 8, 0)
DEFINE_TO_FLOAT(dequantize_q4_1, block_q4_1, codes_q4_1, 0, 1)
DEFINE_TO_FLOAT(dequantize_q5_0, block_q5_0, codes_q5_0, 16, 0)
DEFINE_TO_FLOAT(dequantize_q5_1, block_q5_1, codes_q5_1, 0, 1)
DEFINE_TO_FLOAT(dequantize_q8_0, block_q8_0, codes_q8_0, 0, 0)

/* ---- activation quantizers ---------------------------------------------------------- */

/* Activations are quantized the way llama.cpp's x86 build does it (not its
 * scalar reference): multiply by 127/amax and round half to even.  Matching
 * it keeps our logits within float noise of llama.cpp's on the same CPU. */
static inline float quantize_block_q8(const float *x, __m256i q[4]) {
    __m256 v[4], amax = _mm256_setzero_ps();
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        amax = _mm256_max_ps(amax, _mm256_and_ps(v[k], abs_mask));
    }
    const float max_abs = hmax_ps(amax);
    const __m256 mul = _mm256_set1_ps(max_abs != 0.0f ? 127.0f / max_abs : 0.0f);
    for (int k = 0; k < 4; k++)
        q[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    return max_abs / 127.0f;
}

static inline void store_codes_q8(int8_t *out, const __m256i q[4]) {
    const __m256i w01 = _mm256_packs_epi32(q[0], q[1]), w23 = _mm256_packs_epi32(q[2], q[3]);
    const __m256i b = _mm256_packs_epi16(w01, w23);
    /* the packs work per 128-bit lane: restore element order */
    _mm256_storeu_si256((__m256i *)out, _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

static void quantize_q8_0(const float *x, void *vy, int64_t n) {
    block_q8_0 *y = vy;
    for (int64_t ib = 0; ib < n / 32; ib++, x += 32) {
        __m256i q[4];
        const float d = quantize_block_q8(x, q);
        y[ib].d = pe_f32_to_f16(d);
        store_codes_q8(y[ib].qs, q);
    }
}

static void quantize_q8_1(const float *x, void *vy, int64_t n) {
    block_q8_1 *y = vy;
    for (int64_t ib = 0; ib < n / 32; ib++, x += 32) {
        __m256i q[4];
        const float d = quantize_block_q8(x, q);
        const int sum = x86_sum_epi32x8(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        y[ib].d = pe_f32_to_f16(d);
        y[ib].s = pe_f32_to_f16((float)sum * d);
        store_codes_q8(y[ib].qs, q);
    }
}

/* ---- float types ------------------------------------------------------------------- */

static inline __m256 load_f16x8(const pe_f16 *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

static inline __m256 load_bf16x8(const pe_bf16 *p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

static void f16_to_float(const void *vx, float *y, int64_t n) {
    const pe_f16 *x = vx;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_f16x8(x + i));
    for (; i < n; i++) y[i] = f16_to_f32(x[i]);
}

static void f16_from_float(const float *x, void *vy, int64_t n) {
    pe_f16 *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = pe_f32_to_f16(x[i]);
}

static void bf16_to_float(const void *vx, float *y, int64_t n) {
    const pe_bf16 *x = vx;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_bf16x8(x + i));
    for (; i < n; i++) y[i] = pe_bf16_to_f32(x[i]);
}

/* Round to nearest even on the bits; NaN keeps its top bits and turns quiet. */
static inline __m128i bf16_round8(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i h = _mm256_blendv_epi8(rounded, quiet, is_nan);
    const __m256i packed = _mm256_packus_epi32(h, h);  /* per lane: [h0..3 h0..3 | h4..7 h4..7] */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

static void bf16_from_float(const float *x, void *vy, int64_t n) {
    pe_bf16 *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(y + i), bf16_round8(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] = pe_f32_to_bf16(x[i]);
}

/* ---- float dot products, as llama.cpp's AVX2 build computes a row alone --------------
 *
 * F32 and F16 in four 8-lane accumulators over 32 elements,
 * acc_j = fma(x, y, acc_j), folded (acc0 + acc2) + (acc1 + acc3), the 8 lanes
 * summed with two horizontal adds; BF16 in four accumulators whose sum
 * (c0 + c2) + (c1 + c3) is reduced as a tree.  Elements past the last full
 * step add in double.  Every batch takes this arithmetic, row by row. */
static inline float hadd8(__m256 v) {
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
}

static inline float f32_id(float v) { return v; }

/* REDUCE4 folds the four accumulators to one float */
#define DEFINE_FLOAT_DOT(NAME, ELEM, LOAD8, SCALAR, REDUCE4)                                       \
    static void NAME(int64_t n, float *s, const void *vw, const void *va) {                       \
        const ELEM *x = vw, *y = va;                                                              \
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()}; \
        int64_t i = 0;                                                                            \
        for (; i + 32 <= n; i += 32)                                                              \
            for (int j = 0; j < 4; j++)                                                           \
                acc[j] = _mm256_fmadd_ps(LOAD8(x + i + 8 * j), LOAD8(y + i + 8 * j), acc[j]);     \
        double sum = REDUCE4(_mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]))); \
        for (; i < n; i++) sum += (double)(SCALAR(x[i]) * SCALAR(y[i]));                           \
        *s = (float)sum;                                                                          \
    }

DEFINE_FLOAT_DOT(f32_vec_dot, float, _mm256_loadu_ps, f32_id, hadd8)
DEFINE_FLOAT_DOT(f16_vec_dot, pe_f16, load_f16x8, f16_to_f32, hadd8)
DEFINE_FLOAT_DOT(bf16_vec_dot, pe_bf16, load_bf16x8, pe_bf16_to_f32, x86_sum_ps8)

/* F16's tile: each weight row against up to 3 activation rows at a time,
 * every pair in f16_vec_dot's four accumulators (12 of the 16 registers),
 * the weight's 8 elements converted once for the 3.  Rows whose length is
 * no multiple of 32 go pair by pair (their tail adds in double). */
#define F16_TILE_COLS 3
static void f16_gemm(int64_t n, float *s, size_t bs, const void *w, size_t bw, const void *a, size_t ba, int nr,
                     int nc) {
    if (n % 32) {
        fg_pairs(f16_vec_dot, n, s, bs, w, bw, a, ba, nr, nc);
        return;
    }
    for (int r = 0; r < nr; r++) {
        const pe_f16 *wr = (const pe_f16 *)((const uint8_t *)w + (size_t)r * bw);
        for (int j0 = 0; j0 < nc; j0 += F16_TILE_COLS) {
            const int mc = nc - j0 < F16_TILE_COLS ? nc - j0 : F16_TILE_COLS;
            const pe_f16 *ac[F16_TILE_COLS];
            for (int c = 0; c < F16_TILE_COLS; c++)
                ac[c] = (const pe_f16 *)((const uint8_t *)a + (size_t)(j0 + (c < mc ? c : 0)) * ba);
            __m256 acc[F16_TILE_COLS][4];
            for (int c = 0; c < F16_TILE_COLS; c++)
                for (int j = 0; j < 4; j++) acc[c][j] = _mm256_setzero_ps();
            for (int64_t i = 0; i < n; i += 32)
                for (int j = 0; j < 4; j++) {
                    const __m256 wv = load_f16x8(wr + i + 8 * j);
                    for (int c = 0; c < F16_TILE_COLS; c++)
                        acc[c][j] = _mm256_fmadd_ps(wv, load_f16x8(ac[c] + i + 8 * j), acc[c][j]);
                }
            for (int c = 0; c < mc; c++) {
                const double sum = hadd8(_mm256_add_ps(_mm256_add_ps(acc[c][0], acc[c][2]),
                                                       _mm256_add_ps(acc[c][1], acc[c][3])));
                s[(size_t)(j0 + c) * bs + r] = (float)sum;
            }
        }
    }
}

void pe_fill_avx2_legacy(pe_kernels *k) {
    k->type[PE_TYPE_F32].vec_dot = f32_vec_dot;
    k->type[PE_TYPE_F16] = (pe_type_kernels){f16_to_float, f16_from_float, f16_vec_dot, f16_gemm};
    k->type[PE_TYPE_BF16] = (pe_type_kernels){bf16_to_float, bf16_from_float, bf16_vec_dot, NULL};

    /* the block types' dot products (vec_dot and gemm) are in *_gemm.c */
    k->type[PE_TYPE_Q4_0].to_float = dequantize_q4_0;
    k->type[PE_TYPE_Q4_1].to_float = dequantize_q4_1;
    k->type[PE_TYPE_Q5_0].to_float = dequantize_q5_0;
    k->type[PE_TYPE_Q5_1].to_float = dequantize_q5_1;
    k->type[PE_TYPE_Q8_0].to_float = dequantize_q8_0;
    k->type[PE_TYPE_Q8_0].from_float = quantize_q8_0;
    k->type[PE_TYPE_Q8_1].from_float = quantize_q8_1;
}
