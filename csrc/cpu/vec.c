/* vec.c - float loops the ops share.  This file is compiled once per
 * instruction set (cpu/x86/avx2_vec.c etc. include it with other flags and a
 * different PE_VEC_SUFFIX); the plain build is the scalar reference, and the
 * NEON builds take it as it is.
 *
 * Every build gives the same bits: each kernel has one order of operations,
 * written out by the scalar code, that the vector code follows (LANES lanes
 * whatever the vector width, lanes and accumulators folded by halves, fused
 * multiply-adds, pe_expf's exp; see vec_math.h). */
#include <math.h>
#include <string.h>

#include "blocks.h"
#include "internal.h"
#include "vec_math.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#include "x86/x86_reduce.h"
#endif

/* The order must not depend on compile flags: a*b+c stays two roundings
 * (fmaf() and the fma intrinsics where the order fuses). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#ifndef PE_VEC_SUFFIX
#define PE_VEC_SUFFIX scalar
#endif
#define PE_CAT2(a, b) a##_##b
#define PE_CAT(a, b) PE_CAT2(a, b)
#define PE_VEC_FILL PE_CAT(pe_fill_vec, PE_VEC_SUFFIX)

/* The lanes of the products (attention's sums, exp_sum's chunks) on every
 * build: AVX-512 holds them in one register, AVX2 in two. */
#define LANES 16
/* floats per vector register of this build (the width of the loops over
 * output elements, which does not change any result) */
#if defined(__AVX512F__)
#define VW 16
#elif defined(__AVX2__)
#define VW 8
#endif

/* ---- half precision, as the F16C instructions convert ----------------------
 * (pe_f16_to_f32 and pe_f32_to_f16 but for NaN: the conversions keep the
 * payload's top bits and set the quiet bit) */

static inline float h2f(uint16_t h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
        return pe_bits_to_f32(((uint32_t)(h & 0x8000) << 16) | 0x7fc00000u | ((uint32_t)(h & 0x3ff) << 13));
    return pe_f16_to_f32(h);
}

static inline uint16_t f2h(float f) {
    const uint32_t x = pe_f32_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(((x >> 16) & 0x8000) | 0x7e00 | ((x >> 13) & 0x3ff));
    return pe_f32_to_f16(f);
}

static void f16_to_f32(int64_t n, const uint16_t *x, float *y) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))));
#elif defined(__AVX2__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
#endif
    for (; i < n; i++) y[i] = h2f(x[i]);
}

static void f32_to_f16(int64_t n, const float *x, uint16_t *y) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#elif defined(__AVX2__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) y[i] = f2h(x[i]);
}

/* ---- folds: lanes i and i + 8 first, then i + 4, i + 2, i + 1 --------------- */

static inline float fold_lanes(float v[LANES]) {
    for (int half = LANES / 2; half >= 1; half /= 2)
        for (int l = 0; l < half; l++) v[l] += v[l + half];
    return v[0];
}

#if defined(__AVX512F__)
static inline float fold(__m512 v) {
    return x86_sum_ps8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}
#elif defined(__AVX2__)
/* 16 lanes as two vectors: lo holds lanes 0-7, hi lanes 8-15 */
static inline float fold2(__m256 lo, __m256 hi) { return x86_sum_ps8(_mm256_add_ps(lo, hi)); }
#endif

/* ---- exp ---------------------------------------------------------------------
 * pe_expf (vec_math.h) on whole vectors, the same operations lane by lane. */
#if defined(__AVX512F__)
static inline __m512 exp16(__m512 x) {
    const __m512 shifter = _mm512_set1_ps(PE_EXP_SHIFTER);
    const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(PE_EXP_LOG2E), shifter);
    const __m512 n = _mm512_sub_ps(z, shifter);
    const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(PE_EXP_LN2_LO),
                                      _mm512_fnmadd_ps(n, _mm512_set1_ps(PE_EXP_LN2_HI), x));
    const __mmask16 out_of_range = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(PE_EXP_LIMIT), _CMP_GT_OQ);
    const __m512 b2 = _mm512_mul_ps(b, b);
    const __m512 hi = _mm512_fmadd_ps(_mm512_set1_ps(PE_EXP_C5), b, _mm512_set1_ps(PE_EXP_C4));
    const __m512 mid = _mm512_fmadd_ps(_mm512_set1_ps(PE_EXP_C3), b, _mm512_set1_ps(PE_EXP_C2));
    const __m512 lo = _mm512_fmadd_ps(_mm512_set1_ps(PE_EXP_C1), b, _mm512_set1_ps(1.0f));
    const __m512 poly = _mm512_fmadd_ps(_mm512_fmadd_ps(hi, b2, mid), b2, lo);
    const __m512 r = _mm512_scalef_ps(poly, n);   /* poly * 2^n rounded once */
    if (!out_of_range) return r;
    const __mmask16 negative = _mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ);
    const __m512 limit = _mm512_mask_blend_ps(negative, _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
    return _mm512_mask_blend_ps(out_of_range, r, limit);
}
#elif defined(__AVX2__)
/* 2^n for integers -126 <= n <= 127 held in k */
static inline __m256 pow2_8(__m256i k) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
}

static inline __m256 exp8(__m256 x) {
    const __m256 shifter = _mm256_set1_ps(PE_EXP_SHIFTER);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(PE_EXP_LOG2E), shifter);
    const __m256 n = _mm256_sub_ps(z, shifter);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(PE_EXP_LN2_LO),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(PE_EXP_LN2_HI), x));
    const __m256 b2 = _mm256_mul_ps(b, b);
    const __m256 hi = _mm256_fmadd_ps(_mm256_set1_ps(PE_EXP_C5), b, _mm256_set1_ps(PE_EXP_C4));
    const __m256 mid = _mm256_fmadd_ps(_mm256_set1_ps(PE_EXP_C3), b, _mm256_set1_ps(PE_EXP_C2));
    const __m256 lo = _mm256_fmadd_ps(_mm256_set1_ps(PE_EXP_C1), b, _mm256_set1_ps(1.0f));
    const __m256 poly = _mm256_fmadd_ps(_mm256_fmadd_ps(hi, b2, mid), b2, lo);
    /* z's low bits hold n: 2^n built in the exponent field */
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0f))));
    const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126), _CMP_GT_OQ);
    const __m256 r = _mm256_mul_ps(poly, k);
    if (!_mm256_movemask_ps(big)) return r;
    /* 2^n out of the normal floats: two factors, the first product exact */
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1);
    const __m256 two_step = _mm256_mul_ps(_mm256_mul_ps(poly, pow2_8(n1)), pow2_8(_mm256_sub_epi32(ni, n1)));
    const __m256 scaled = _mm256_blendv_ps(r, two_step, big);
    const __m256 huge = _mm256_cmp_ps(abs_n, _mm256_set1_ps(PE_EXP_LIMIT), _CMP_GT_OQ);
    const __m256 limit = _mm256_blendv_ps(_mm256_set1_ps(INFINITY), _mm256_setzero_ps(),
                                          _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ));
    return _mm256_blendv_ps(scaled, limit, huge);
}
#endif

/* ---- attention's score products ------------------------------------------ */

/* sum_i x[i] * f16(y[i]): chunk c of LANES elements goes to accumulator
 * c % nacc (one fma per lane), over whole steps of nacc * LANES; the
 * accumulators are folded by halves, then the lanes; the products no step
 * covers are added in double.  x holds F16-rounded values.  nacc = 1 is a
 * batch's tiled product, nacc = 4 a lone token's row product. */
static float dot_f32_f16(int64_t n, const float *x, const uint16_t *y, int nacc) {
    const int64_t step = (int64_t)LANES * nacc, whole = n / step * step;
    float sum;
#if defined(__AVX512F__)
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t i = 0; i < whole; i += step)
        for (int j = 0; j < nacc; j++) {
            const __m512 yf = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(y + i + 16 * j)));
            acc[j] = _mm512_fmadd_ps(yf, _mm512_loadu_ps(x + i + 16 * j), acc[j]);
        }
    for (int half = nacc / 2; half >= 1; half /= 2)
        for (int j = 0; j < half; j++) acc[j] = _mm512_add_ps(acc[j], acc[j + half]);
    sum = fold(acc[0]);
#elif defined(__AVX2__)
    __m256 lo[4], hi[4];
    for (int j = 0; j < 4; j++) lo[j] = hi[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < whole; i += step)
        for (int j = 0; j < nacc; j++) {
            const int64_t c = i + 16 * j;
            lo[j] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + c))), _mm256_loadu_ps(x + c), lo[j]);
            hi[j] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + c + 8))), _mm256_loadu_ps(x + c + 8),
                                    hi[j]);
        }
    for (int half = nacc / 2; half >= 1; half /= 2)
        for (int j = 0; j < half; j++) {
            lo[j] = _mm256_add_ps(lo[j], lo[j + half]);
            hi[j] = _mm256_add_ps(hi[j], hi[j + half]);
        }
    sum = fold2(lo[0], hi[0]);
#else
    float acc[4][LANES] = {{0}};
    for (int64_t i = 0; i < whole; i += step)
        for (int j = 0; j < nacc; j++)
            for (int l = 0; l < LANES; l++) {
                const int64_t e = i + LANES * j + l;
                acc[j][l] = fmaf(h2f(y[e]), x[e], acc[j][l]);
            }
    for (int half = nacc / 2; half >= 1; half /= 2)
        for (int j = 0; j < half; j++)
            for (int l = 0; l < LANES; l++) acc[j][l] += acc[j + half][l];
    sum = fold_lanes(acc[0]);
#endif
    double tail = 0.0;
    for (int64_t i = whole; i < n; i++) tail += (double)(x[i] * h2f(y[i]));
    return (float)((double)sum + tail);
}

#if defined(__AVX512F__)
/* The folds of four vectors at once, each summed by halves as fold() sums
 * it (lanes i and i + 8, then i and i + 4, ...): out[b] = fold(v[b]). */
static inline void fold4(const __m512 v[4], float out[4]) {
    const __m512 a01 = _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x44), _mm512_shuffle_f32x4(v[0], v[1], 0xEE));
    const __m512 a23 = _mm512_add_ps(_mm512_shuffle_f32x4(v[2], v[3], 0x44), _mm512_shuffle_f32x4(v[2], v[3], 0xEE));
    /* 128-bit block k now holds vector k's halves' sums (4 lanes each, i and i + 4 still apart) */
    __m512 w = _mm512_add_ps(_mm512_shuffle_f32x4(a01, a23, 0x88), _mm512_shuffle_f32x4(a01, a23, 0xDD));
    w = _mm512_add_ps(w, _mm512_permute_ps(w, 0x4E));   /* lanes i and i + 2 */
    w = _mm512_add_ps(w, _mm512_permute_ps(w, 0xB1));   /* the last two */
    float lanes[16];
    _mm512_storeu_ps(lanes, w);
    for (int b = 0; b < 4; b++) out[b] = lanes[4 * b];
}

/* The folds of sixteen vectors at once, each summed by halves as fold()
 * sums it, by a tree of shuffles that keeps every vector's pairs: lanes i
 * and i + 8 (pairs of vectors into one), i and i + 4 (four vectors' sums in
 * the four 128-bit blocks), i and i + 2, i and i + 1; out[k] = fold(v[k]).
 * A score costs ~3 operations here where a fold of its own costs ~8. */
static inline void fold16(const __m512 v[16], float out[16]) {
    __m512 w[8], x[4], y[2];
    for (int k = 0; k < 8; k++)
        w[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xEE));
    for (int k = 0; k < 4; k++)   /* block j of x[k]: vector 4k + j */
        x[k] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * k], w[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * k], w[2 * k + 1], 0xDD));
    for (int k = 0; k < 2; k++)   /* block j of y[k]: vectors 8k + j and 8k + 4 + j, two lanes each */
        y[k] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * k], x[2 * k + 1], 0x44), _mm512_shuffle_ps(x[2 * k], x[2 * k + 1], 0xEE));
    /* lane 4j + c: vector 4c + j */
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xDD));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, r));
}

/* dot_f32_f16 with nacc 4 for nx queries and ny F16 rows when whole
 * 64-element steps cover n, each row converted once for all the queries
 * (the heads of a GQA group). */
PE_ALWAYS_INLINE void dot_tile_nacc4_n(int64_t n, const float *const *x, const int nx, const uint16_t *const *y, int ny,
                                       float *out) {
    __m512 sums[4][4];   /* [query][row] */
    for (int b = 0; b < 4; b++) {
        const uint16_t *yb = y[b < ny ? b : ny - 1];   /* spare rows repeat the last */
        __m512 acc[4][4];
        for (int a = 0; a < nx; a++)
            for (int j = 0; j < 4; j++) acc[a][j] = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 64)
            for (int j = 0; j < 4; j++) {
                const __m512 yv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(yb + i + 16 * j)));
                for (int a = 0; a < nx; a++) acc[a][j] = _mm512_fmadd_ps(yv, _mm512_loadu_ps(x[a] + i + 16 * j), acc[a][j]);
            }
        for (int a = 0; a < nx; a++)
            sums[a][b] = _mm512_add_ps(_mm512_add_ps(acc[a][0], acc[a][2]), _mm512_add_ps(acc[a][1], acc[a][3]));
    }
    for (int a = 0; a < nx; a++) {
        float folded[4];
        fold4(sums[a], folded);
        for (int b = 0; b < ny; b++) out[4 * a + b] = folded[b];
    }
}

/* dot_f32_f16 with nacc 1 for nx queries and up to 4 F16 rows when whole
 * 16-element steps cover n: per pair one accumulator, each row's step
 * converted once for the queries (spare rows repeat the last). */
PE_ALWAYS_INLINE void dot_tile_nacc1_n(int64_t n, const float *const *x, const int nx, const uint16_t *const *y, int ny,
                                       float *out) {
    const uint16_t *ys[4];
    for (int b = 0; b < 4; b++) ys[b] = y[b < ny ? b : ny - 1];
    __m512 acc[4][4];
    for (int a = 0; a < nx; a++)
        for (int b = 0; b < 4; b++) acc[a][b] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __m512 yv[4];
        for (int b = 0; b < 4; b++) yv[b] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ys[b] + i)));
        for (int a = 0; a < nx; a++) {
            const __m512 xv = _mm512_loadu_ps(x[a] + i);
            for (int b = 0; b < 4; b++) acc[a][b] = _mm512_fmadd_ps(yv[b], xv, acc[a][b]);
        }
    }
    __m512 all[16];
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) all[4 * a + b] = a < nx ? acc[a][b] : _mm512_setzero_ps();
    float folded[16];
    fold16(all, folded);
    for (int a = 0; a < nx; a++)
        for (int b = 0; b < ny; b++) out[4 * a + b] = folded[4 * a + b];
}
#endif

#if defined(__AVX2__) && !defined(__AVX512F__)
/* dot_f32_f16 with nacc 1 when whole 16-element steps cover n, two queries
 * by two rows at a time (8 accumulators: each lane pair lo/hi), each row's
 * step converted once for both queries. */
static void dot_tile_nacc1_avx2(int64_t n, const float *const *x, int nx, const uint16_t *const *y, int ny, float *out) {
    for (int a0 = 0; a0 < nx; a0 += 2) {
        const float *xs[2] = {x[a0], x[a0 + 1 < nx ? a0 + 1 : a0]};
        for (int b0 = 0; b0 < ny; b0 += 2) {
            const uint16_t *ys[2] = {y[b0], y[b0 + 1 < ny ? b0 + 1 : b0]};
            __m256 lo[2][2], hi[2][2];
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 2; b++) lo[a][b] = hi[a][b] = _mm256_setzero_ps();
            for (int64_t i = 0; i < n; i += 16) {
                const __m256 xl[2] = {_mm256_loadu_ps(xs[0] + i), _mm256_loadu_ps(xs[1] + i)};
                const __m256 xh[2] = {_mm256_loadu_ps(xs[0] + i + 8), _mm256_loadu_ps(xs[1] + i + 8)};
                for (int b = 0; b < 2; b++) {
                    const __m256 yl = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ys[b] + i)));
                    const __m256 yh = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ys[b] + i + 8)));
                    for (int a = 0; a < 2; a++) {
                        lo[a][b] = _mm256_fmadd_ps(yl, xl[a], lo[a][b]);
                        hi[a][b] = _mm256_fmadd_ps(yh, xh[a], hi[a][b]);
                    }
                }
            }
            for (int a = 0; a < 2 && a0 + a < nx; a++)
                for (int b = 0; b < 2 && b0 + b < ny; b++) out[4 * (a0 + a) + b0 + b] = fold2(lo[a][b], hi[a][b]);
        }
    }
}
#endif

#if defined(__AVX2__) && !defined(__AVX512F__)
/* dot_f32_f16 with nacc 4 when whole 64-element steps cover n: the 8
 * accumulators of a pair fill the registers, so each row is converted once
 * into floats (L1) for all the queries instead of once per query. */
#define DOT4_ROW_MAX 512
static void dot_tile_nacc4_avx2(int64_t n, const float *const *x, int nx, const uint16_t *const *y, int ny, float *out) {
    float row[DOT4_ROW_MAX];
    for (int b = 0; b < ny; b++) {
        for (int64_t i = 0; i < n; i += 8)
            _mm256_storeu_ps(row + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y[b] + i))));
        for (int a = 0; a < nx; a++) {
            __m256 lo[4], hi[4];
            for (int j = 0; j < 4; j++) lo[j] = hi[j] = _mm256_setzero_ps();
            for (int64_t i = 0; i < n; i += 64)
                for (int j = 0; j < 4; j++) {
                    const int64_t c = i + 16 * j;
                    lo[j] = _mm256_fmadd_ps(_mm256_loadu_ps(row + c), _mm256_loadu_ps(x[a] + c), lo[j]);
                    hi[j] = _mm256_fmadd_ps(_mm256_loadu_ps(row + c + 8), _mm256_loadu_ps(x[a] + c + 8), hi[j]);
                }
            out[4 * a + b] = fold2(_mm256_add_ps(_mm256_add_ps(lo[0], lo[2]), _mm256_add_ps(lo[1], lo[3])),
                                   _mm256_add_ps(_mm256_add_ps(hi[0], hi[2]), _mm256_add_ps(hi[1], hi[3])));
        }
    }
}
#endif

/* Attention's score products: dot_f32_f16 with nacc accumulators for every
 * pair of up to 4 query rows x and up to 4 F16 rows y, out[4 * a + b] =
 * x[a] . y[b]; the tiles convert each y chunk once for several queries. */
static void dot_tile_f32_f16(int64_t n, const float *const *x, int nx, const uint16_t *const *y, int ny, int nacc,
                             float *out) {
#if defined(__AVX512F__)
    if (nacc == 4 && n % 64 == 0) {
        switch (nx) {
        case 1: dot_tile_nacc4_n(n, x, 1, y, ny, out); return;
        case 2: dot_tile_nacc4_n(n, x, 2, y, ny, out); return;
        case 3: dot_tile_nacc4_n(n, x, 3, y, ny, out); return;
        default: dot_tile_nacc4_n(n, x, 4, y, ny, out); return;
        }
    }
    if (nacc == 1 && n % 16 == 0) {
        switch (nx) {
        case 1: dot_tile_nacc1_n(n, x, 1, y, ny, out); return;
        case 2: dot_tile_nacc1_n(n, x, 2, y, ny, out); return;
        case 3: dot_tile_nacc1_n(n, x, 3, y, ny, out); return;
        default: dot_tile_nacc1_n(n, x, 4, y, ny, out); return;
        }
    }
#elif defined(__AVX2__)
    if (nacc == 1 && n % 16 == 0) {
        dot_tile_nacc1_avx2(n, x, nx, y, ny, out);
        return;
    }
    if (nacc == 4 && n % 64 == 0 && n <= DOT4_ROW_MAX) {
        dot_tile_nacc4_avx2(n, x, nx, y, ny, out);
        return;
    }
#endif
    for (int a = 0; a < nx; a++)
        for (int b = 0; b < ny; b++) out[4 * a + b] = dot_f32_f16(n, x[a], y[b], nacc);
}

/* ---- attention's products with V ------------------------------------------
 * Output element d of head h is the sum over slots i of p[h][i] * f16(V_i[d])
 * in W lanes (W = LANES for nacc 1, 4 * LANES for nacc 4): slot i goes to
 * lane i % W, one fma each, in slot order; a slot with no cell or a zero
 * probability is skipped; the lanes fold by halves.  The vector loops run
 * along output elements (or, with a transposed V, along slots) and keep
 * that order. */

/* One output element of the product with a transposed V (the order above
 * with W = LANES), for the ISAs without a vector loop. */
static float values_t_one(int64_t n, const float *p, const uint16_t *vt) {
    float lane[LANES] = {0};
    for (int64_t i = 0; i < n; i++)
        if (p[i] != 0.0f) lane[i % LANES] = fmaf(h2f(vt[i]), p[i], lane[i % LANES]);
    return fold_lanes(lane);
}

#if defined(__AVX512F__)
/* values_t_f16 for a compile-time head count: 4 output elements of each
 * head a pass, their 16 folds made together (fold16) */
PE_ALWAYS_INLINE void values_t_heads(int64_t n, const int nh, const float *const *p, const uint16_t *vt,
                                     size_t vt_stride, int64_t hd, float *const *out) {
    for (int64_t d0 = 0; d0 < hd; d0 += 4) {
        __m512 acc[16];   /* [head][element] */
        for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
        for (int64_t s = 0; s < n; s += 16) {
            __m512 pv[4];
            __mmask16 live[4];
            for (int h = 0; h < nh; h++) {
                pv[h] = _mm512_loadu_ps(p[h] + s);
                live[h] = _mm512_cmp_ps_mask(pv[h], _mm512_setzero_ps(), _CMP_NEQ_UQ);
            }
            for (int e = 0; e < 4; e++) {
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(vt + (size_t)(d0 + e) * vt_stride + s));
                const __m512 v = _mm512_cvtph_ps(raw);
                for (int h = 0; h < nh; h++) acc[4 * h + e] = _mm512_mask3_fmadd_ps(v, pv[h], acc[4 * h + e], live[h]);
            }
        }
        float folded[16];
        fold16(acc, folded);
        for (int h = 0; h < nh; h++)
            for (int e = 0; e < 4; e++) out[h][d0 + e] = folded[4 * h + e];
    }
}
#endif

#if defined(__AVX2__) && !defined(__AVX512F__)
/* values_t_f16 one head and 4 output elements a pass (8 accumulators: each
 * element's 16 lanes as lo/hi) */
static void values_t_avx2(int64_t n, int nh, const float *const *p, const uint16_t *vt, size_t vt_stride, int64_t hd,
                          float *const *out) {
    for (int h = 0; h < nh; h++)
        for (int64_t d0 = 0; d0 < hd; d0 += 4) {
            __m256 lo[4], hi[4];
            for (int e = 0; e < 4; e++) lo[e] = hi[e] = _mm256_setzero_ps();
            for (int64_t s = 0; s < n; s += 16) {
                const __m256 pl = _mm256_loadu_ps(p[h] + s), ph = _mm256_loadu_ps(p[h] + s + 8);
                const __m256 live_l = _mm256_cmp_ps(pl, _mm256_setzero_ps(), _CMP_NEQ_UQ);
                const __m256 live_h = _mm256_cmp_ps(ph, _mm256_setzero_ps(), _CMP_NEQ_UQ);
                for (int e = 0; e < 4; e++) {
                    const uint16_t *row = vt + (size_t)(d0 + e) * vt_stride + s;
                    const __m256 vl = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)row));
                    const __m256 vh = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 8)));
                    lo[e] = _mm256_blendv_ps(lo[e], _mm256_fmadd_ps(vl, pl, lo[e]), live_l);
                    hi[e] = _mm256_blendv_ps(hi[e], _mm256_fmadd_ps(vh, ph, hi[e]), live_h);
                }
            }
            for (int e = 0; e < 4; e++) out[h][d0 + e] = fold2(lo[e], hi[e]);
        }
}
#endif

/* The product of nh <= 4 heads' probabilities p[h] (n slots) with a
 * transposed F16 V: row d of vt (vt_stride elements apart) holds element d
 * of the slots' V rows; the sums of values_f16 with nacc 1, each V element
 * converted once for all heads and no per-slot branch. */
static void values_t_f16(int64_t n, int nh, const float *const *p, const uint16_t *vt, size_t vt_stride, int64_t hd,
                         float *const *out) {
#if defined(__AVX512F__)
    if (hd % 4 == 0 && n % LANES == 0) {
        switch (nh) {
        case 1: values_t_heads(n, 1, p, vt, vt_stride, hd, out); return;
        case 2: values_t_heads(n, 2, p, vt, vt_stride, hd, out); return;
        case 3: values_t_heads(n, 3, p, vt, vt_stride, hd, out); return;
        default: values_t_heads(n, 4, p, vt, vt_stride, hd, out); return;
        }
    }
#elif defined(__AVX2__)
    if (hd % 4 == 0 && n % LANES == 0) {
        values_t_avx2(n, nh, p, vt, vt_stride, hd, out);
        return;
    }
#endif
    for (int h = 0; h < nh; h++)
        for (int64_t d = 0; d < hd; d++) out[h][d] = values_t_one(n, p[h], vt + (size_t)d * vt_stride);
}

/* y[i] = f16(x[i] * scale): the rounding to F16 of queries and probabilities */
static void scale_round_f16(int64_t n, float *y, const float *x, float scale) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 vs = _mm512_set1_ps(scale);
    for (; i + 16 <= n; i += 16) {
        const __m256i h = _mm512_cvtps_ph(_mm512_mul_ps(_mm512_loadu_ps(x + i), vs), _MM_FROUND_TO_NEAREST_INT);
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(h));
    }
#elif defined(__AVX2__)
    const __m256 vs = _mm256_set1_ps(scale);
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(h));
    }
#endif
    for (; i < n; i++) y[i] = h2f(f2h(x[i] * scale));
}

/* y[i] = fma(f16(x[i]), p, y[i]): one lane's step of the product with V */
static void fma_f16(int64_t n, float *y, float p, const uint16_t *x) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 vp = _mm512_set1_ps(p);
    for (; i + 16 <= n; i += 16) {
        const __m512 xf = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i)));
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(xf, vp, _mm512_loadu_ps(y + i)));
    }
#elif defined(__AVX2__)
    const __m256 vp = _mm256_set1_ps(p);
    for (; i + 8 <= n; i += 8) {
        const __m256 xf = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(xf, vp, _mm256_loadu_ps(y + i)));
    }
#endif
    for (; i < n; i++) y[i] = fmaf(h2f(x[i]), p, y[i]);
}

#if defined(__AVX512F__) || defined(__AVX2__)
#if defined(__AVX512F__)
typedef __m512 vlane;
#define VL_ZERO() _mm512_setzero_ps()
#define VL_ADD(a, b) _mm512_add_ps(a, b)
#define VL_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VL_SET1(x) _mm512_set1_ps(x)
#define VL_STORE(p, v) _mm512_storeu_ps(p, v)
#define VL_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define VL_LOAD(p) _mm512_loadu_ps(p)
/* c + a * p, or c where p is 0 (a slot skipped without a branch) */
#define VL_FMA_LIVE(a, p, c) _mm512_mask3_fmadd_ps(a, _mm512_set1_ps(p), c, (__mmask16)-(int)((p) != 0.0f))
#else
typedef __m256 vlane;
#define VL_ZERO() _mm256_setzero_ps()
#define VL_ADD(a, b) _mm256_add_ps(a, b)
#define VL_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VL_SET1(x) _mm256_set1_ps(x)
#define VL_STORE(p, v) _mm256_storeu_ps(p, v)
#define VL_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define VL_LOAD(p) _mm256_loadu_ps(p)
/* a zeroed where p is 0: c + 0 * p is c (c is never -0) */
#define VL_FMA_LIVE(a, p, c) \
    _mm256_fmadd_ps(_mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(-(int)((p) != 0.0f)))), _mm256_set1_ps(p), c)
#endif

/* whether slot i has a nonzero probability for each of the nh heads (the
 * usual case: the fmas then need no mask) */
PE_ALWAYS_INLINE int slot_live(const float *const *p, const int nh, int64_t i) {
    int live = 1;
    for (int h = 0; h < nh; h++) live &= p[h][i] != 0.0f;
    return live;
}

/* LANES lane vectors (each VW output elements) folded by halves */
static inline vlane fold_vectors(vlane v[LANES]) {
    for (int half = LANES / 2; half >= 1; half /= 2)
        for (int l = 0; l < half; l++) v[l] = VL_ADD(v[l], v[l + half]);
    return v[0];
}

/* The product with nacc 1 for one head, LANES lanes of VW output elements
 * in registers.  Returns 0 where the shapes do not fit. */
static int values_f16_lanes(int64_t n, const int32_t *cell, const float *p, const uint8_t *v, size_t stride,
                            int64_t hd, float *out) {
    if (hd % VW || n % LANES) return 0;
    for (int64_t d0 = 0; d0 < hd; d0 += VW) {
        vlane acc[LANES];
        for (int l = 0; l < LANES; l++) acc[l] = VL_ZERO();
        for (int64_t s = 0; s < n; s += LANES)
            for (int l = 0; l < LANES; l++) {
                const int64_t i = s + l;
                if (cell[i] < 0 || p[i] == 0.0f) continue;
                acc[l] = VL_FMA(VL_F16((const uint16_t *)(v + (size_t)cell[i] * stride) + d0), VL_SET1(p[i]), acc[l]);
            }
        VL_STORE(out + d0, fold_vectors(acc));
    }
    return 1;
}

/* The lone token's product (nacc 4: 4 * LANES lanes) for up to 3 heads over
 * the same V rows, VW output elements at a time: lane L's chain (slots L +
 * 4 * LANES * i) is built where the fold takes it (lanes l, l + LANES,
 * l + 2 * LANES and l + 3 * LANES into (l + l+2W) + (l+W + l+3W), W =
 * LANES, the first two halvings), then the LANES sums fold by halves; each
 * V row segment is converted once for the heads. */
PE_ALWAYS_INLINE void values_lone_heads(int64_t n, const int nh, const int32_t *cell, const float *const *p,
                                        const uint8_t *v, size_t stride, int64_t hd, float *const *out) {
    for (int64_t d0 = 0; d0 < hd; d0 += VW) {
        vlane sum[3][LANES];
        for (int l = 0; l < LANES; l++) {
            vlane lane[3][4];   /* [head][k]: lane l + LANES * k */
            for (int h = 0; h < nh; h++)
                for (int k = 0; k < 4; k++) lane[h][k] = VL_ZERO();
            for (int64_t s = l; s < n; s += 4 * LANES)
                for (int k = 0; k < 4; k++) {
                    const int64_t i = s + LANES * k;
                    if (cell[i] < 0) continue;
                    const vlane vf = VL_F16((const uint16_t *)(v + (size_t)cell[i] * stride) + d0);
                    if (slot_live(p, nh, i))
                        for (int h = 0; h < nh; h++) lane[h][k] = VL_FMA(vf, VL_SET1(p[h][i]), lane[h][k]);
                    else
                        for (int h = 0; h < nh; h++) lane[h][k] = VL_FMA_LIVE(vf, p[h][i], lane[h][k]);
                }
            for (int h = 0; h < nh; h++)
                sum[h][l] = VL_ADD(VL_ADD(lane[h][0], lane[h][2]), VL_ADD(lane[h][1], lane[h][3]));
        }
        for (int h = 0; h < nh; h++) VL_STORE(out[h] + d0, fold_vectors(sum[h]));
    }
}

/* The product in w lanes (4 * LANES for nacc 4, LANES for nacc 1), lane by
 * lane: lane L's chain for 4 * VW output elements of up to 3 heads at once,
 * so each V row segment is read once, whole, and converted once for the
 * heads (values_lone_heads reads a row once per VW elements, in passes
 * 4 * LANES slots apart: from L2 or memory, not L1, once rows are long;
 * values_f16_lanes once per head and VW elements); the lanes go to `lanes`
 * ([nh][w][hd]) and are folded from there: nacc 4's as values_lone_heads
 * folds them, nacc 1's by halves. */
PE_ALWAYS_INLINE void values_by_lane(int64_t n, const int nh, const int32_t *cell, const float *const *p,
                                     const uint8_t *v, size_t stride, int64_t hd, float *const *out, float *lanes,
                                     const int64_t w) {
    for (int64_t d0 = 0; d0 < hd; d0 += 4 * VW)
        for (int64_t lane = 0; lane < w; lane++) {
            vlane acc[3][4];
            for (int h = 0; h < nh; h++)
                for (int c = 0; c < 4; c++) acc[h][c] = VL_ZERO();
            for (int64_t i = lane; i < n; i += w) {
                if (cell[i] < 0) continue;
                const uint16_t *row = (const uint16_t *)(v + (size_t)cell[i] * stride) + d0;
                const int live = slot_live(p, nh, i);
                for (int c = 0; c < 4; c++) {
                    const vlane vf = VL_F16(row + c * VW);
                    if (live)
                        for (int h = 0; h < nh; h++) acc[h][c] = VL_FMA(vf, VL_SET1(p[h][i]), acc[h][c]);
                    else
                        for (int h = 0; h < nh; h++) acc[h][c] = VL_FMA_LIVE(vf, p[h][i], acc[h][c]);
                }
            }
            for (int h = 0; h < nh; h++)
                for (int c = 0; c < 4; c++) VL_STORE(lanes + (h * w + lane) * hd + d0 + c * VW, acc[h][c]);
        }
    for (int h = 0; h < nh; h++)
        for (int64_t d0 = 0; d0 < hd; d0 += VW) {
            vlane sum[LANES];
            const float *lh = lanes + h * w * hd + d0;
            for (int l = 0; l < LANES; l++)
                sum[l] = w == LANES ? VL_LOAD(lh + l * hd)
                                    : VL_ADD(VL_ADD(VL_LOAD(lh + l * hd), VL_LOAD(lh + (l + 2 * LANES) * hd)),
                                             VL_ADD(VL_LOAD(lh + (l + LANES) * hd), VL_LOAD(lh + (l + 3 * LANES) * hd)));
            VL_STORE(out[h] + d0, fold_vectors(sum));
        }
}

/* how many of the heads h0.. the products with V take at once: 3 (4 as 2 + 2) */
static inline int heads_taken(int nh, int h0) { return nh - h0 == 4 ? 2 : nh - h0 < 3 ? nh - h0 : 3; }

/* values_by_lane over nh heads */
static void values_by_lane_heads(int64_t n, int nh, const int32_t *cell, const float *const *p, const uint8_t *v,
                                 size_t stride, int64_t hd, float *const *out, float *lanes, int64_t w) {
    for (int h0 = 0, take; h0 < nh; h0 += take) {
        take = heads_taken(nh, h0);
        switch (take) {
        case 1: values_by_lane(n, 1, cell, p + h0, v, stride, hd, out + h0, lanes, w); break;
        case 2: values_by_lane(n, 2, cell, p + h0, v, stride, hd, out + h0, lanes, w); break;
        default: values_by_lane(n, 3, cell, p + h0, v, stride, hd, out + h0, lanes, w); break;
        }
    }
}
#endif

/* Rows at least this many slots long take values_by_lane. */
#define LONE_LONG_SLOTS 512

static int values_f16_lone(int64_t n, int nh, const int32_t *cell, const float *const *p, const uint8_t *v,
                           size_t stride, int64_t hd, float *const *out, float *scratch) {
#if defined(__AVX512F__) || defined(__AVX2__)
    if (hd % VW || n % (4 * LANES)) return 0;
    if (n >= LONE_LONG_SLOTS && hd % (4 * VW) == 0) {
        values_by_lane_heads(n, nh, cell, p, v, stride, hd, out, scratch, 4 * LANES);
        return 1;
    }
    for (int h0 = 0, take; h0 < nh; h0 += take) {
        take = heads_taken(nh, h0);
        switch (take) {
        case 1: values_lone_heads(n, 1, cell, p + h0, v, stride, hd, out + h0); break;
        case 2: values_lone_heads(n, 2, cell, p + h0, v, stride, hd, out + h0); break;
        default: values_lone_heads(n, 3, cell, p + h0, v, stride, hd, out + h0); break;
        }
    }
    return 1;
#else
    (void)n; (void)nh; (void)cell; (void)p; (void)v; (void)stride; (void)hd; (void)out; (void)scratch;
    return 0;
#endif
}

/* y[i] += x[i] */
static void add_f32(int64_t n, float *y, const float *x) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_loadu_ps(x + i)));
#elif defined(__AVX2__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++) y[i] += x[i];
}

/* The same product with w lanes kept in memory (scratch: w * hd floats),
 * for any shape and ISA: one call per head, so no call per slot. */
static void values_f16_wide(int64_t n, const int32_t *cell, const float *p, const uint8_t *v, size_t stride,
                            int64_t hd, int64_t w, float *out, float *scratch) {
    memset(scratch, 0, (size_t)(w * hd) * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        if (cell[i] < 0 || p[i] == 0.0f) continue;
        fma_f16(hd, scratch + (i % w) * hd, p[i], (const uint16_t *)(v + (size_t)cell[i] * stride));
    }
    for (int64_t half = w / 2; half >= 1; half /= 2)
        for (int64_t l = 0; l < half; l++) add_f32(hd, scratch + l * hd, scratch + (l + half) * hd);
    memcpy(out, scratch, (size_t)hd * sizeof(float));
}

/* attention's product of nh heads' probabilities p[h] with the same F16 V
 * (the order above), nacc * LANES lanes, into out[h] */
static void values_f16(int64_t n, int nh, const int32_t *cell, const float *const *p, const uint8_t *v, size_t stride,
                       int64_t hd, int nacc, float *const *out, float *scratch) {
    if (nacc == 4 && values_f16_lone(n, nh, cell, p, v, stride, hd, out, scratch)) return;
#if defined(__AVX512F__) || defined(__AVX2__)
    if (nacc == 1 && hd % (4 * VW) == 0 && n % LANES == 0) {
        values_by_lane_heads(n, nh, cell, p, v, stride, hd, out, scratch, LANES);
        return;
    }
#endif
    for (int h = 0; h < nh; h++) {
#if defined(__AVX512F__) || defined(__AVX2__)
        if (nacc == 1 && values_f16_lanes(n, cell, p[h], v, stride, hd, out[h])) continue;
#endif
        values_f16_wide(n, cell, p[h], v, stride, hd, (int64_t)LANES * nacc, out[h], scratch);
    }
}

/* ---- maxima, softmax, norms, gated units ----------------------------------- */

/* The largest of x[i] * scale (a NaN is passed over, as a comparison
 * passes it over; +0 for a largest zero of either sign, -inf if none), each
 * stored into y unless y is NULL; with `nan` (not NULL), *nan set to 1 when
 * some x[i] * scale is NaN, left as it is otherwise. */
PE_ALWAYS_INLINE float scaled_max(int64_t n, const float *x, float scale, float *y, int *nan) {
    int64_t i = 0;
    float best = -INFINITY;
    int seen = 0;
#if defined(__AVX512F__)
    __m512 m = _mm512_set1_ps(-INFINITY);
    __mmask16 unordered = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(scale));
        if (y) _mm512_storeu_ps(y + i, v);
        if (nan) unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        m = _mm512_max_ps(v, m);   /* a NaN in v gives m's lane */
    }
    best = _mm512_reduce_max_ps(m);
    seen = unordered != 0;
#elif defined(__AVX2__)
    __m256 m = _mm256_set1_ps(-INFINITY), unordered = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(scale));
        if (y) _mm256_storeu_ps(y + i, v);
        if (nan) unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        m = _mm256_max_ps(v, m);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    for (int l = 0; l < 8; l++)
        if (lanes[l] > best) best = lanes[l];
    seen = _mm256_movemask_ps(unordered) != 0;
#endif
    for (; i < n; i++) {
        const float v = x[i] * scale;
        if (y) y[i] = v;
        if (v != v) seen = 1;
        else if (v > best) best = v;
    }
    if (nan && seen) *nan = 1;
    return best + 0.0f;   /* which zero a lane kept depends on the order: -0 + 0 is +0 */
}

/* x[i] *= scale, and the largest of them */
static float scale_max(int64_t n, float *x, float scale) { return scaled_max(n, x, scale, x, NULL); }

static float max_f32(int64_t n, const float *x) { return scaled_max(n, x, 1.0f, NULL, NULL); }

/* max_f32, noting in *nan whether any x[i] is NaN */
static float max_nan(int64_t n, const float *x, int *nan) { return scaled_max(n, x, 1.0f, NULL, nan); }

/* y[i] = exp(x[i] - max); returns their sum in double: each whole chunk of
 * LANES folded by halves in float and added, then the rest one by one */
static double exp_sum(int64_t n, float *y, const float *x, float max) {
    int64_t i = 0;
    double sum = 0.0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(max)));
        _mm512_storeu_ps(y + i, e);
        sum += (double)fold(e);
    }
#elif defined(__AVX2__)
    const __m256 vmax = _mm256_set1_ps(max);
    for (; i + 16 <= n; i += 16) {
        const __m256 lo = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
        const __m256 hi = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vmax));
        _mm256_storeu_ps(y + i, lo);
        _mm256_storeu_ps(y + i + 8, hi);
        sum += (double)fold2(lo, hi);
    }
#else
    for (; i + LANES <= n; i += LANES) {
        float e[LANES];
        for (int l = 0; l < LANES; l++) y[i + l] = e[l] = pe_expf(x[i + l] - max);
        sum += (double)fold_lanes(e);
    }
#endif
    for (; i < n; i++) {
        y[i] = pe_expf(x[i] - max);
        sum += (double)y[i];
    }
    return sum;
}

/* The float squares summed in double: element i of each whole chunk of 8
 * into lane i % 8, the lanes folded by halves, then the rest one by one. */
static double sum_sq(int64_t n, const float *x) {
    int64_t i = 0;
    double sum;
#if defined(__AVX512F__)
    __m512d acc = _mm512_setzero_pd();
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __m512 sq = _mm512_mul_ps(v, v);
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(sq)));
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_extractf32x8_ps(sq, 1)));
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_mul_ps(v, v)));
    }
    const __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(acc), _mm512_extractf64x4_pd(acc, 1));
    const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
    sum = _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
#elif defined(__AVX2__)
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 sq = _mm256_mul_ps(v, v);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
    }
    const __m256d s4 = _mm256_add_pd(lo, hi);
    const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
    sum = _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
#else
    double lane[8] = {0};
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) lane[l] += (double)(x[i + l] * x[i + l]);
    for (int half = 4; half >= 1; half /= 2)
        for (int l = 0; l < half; l++) lane[l] += lane[l + half];
    sum = lane[0];
#endif
    for (; i < n; i++) sum += (double)(x[i] * x[i]);
    return sum;
}

/* silu(g) * u = g / (1 + exp(0 - g)) * u */
static void silu_mul(int64_t n, float *y, const float *g, const float *u) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(g + i);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
        const __m512 silu = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(y + i, _mm512_mul_ps(silu, _mm512_loadu_ps(u + i)));
    }
#elif defined(__AVX2__)
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        const __m256 silu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) y[i] = g[i] / (1.0f + pe_expf(0.0f - g[i])) * u[i];
}

/* gelu(g) * u, GELU from the table (pe_gelu) */
static void gelu_mul(int64_t n, float *y, const float *g, const float *u) {
    int64_t i = 0;
#if defined(__AVX512F__)
    /* sixteen at a time: the table gathered by the inputs' F16 bits */
    const __m512 lo = _mm512_set1_ps(-10.0f), hi = _mm512_set1_ps(10.0f);
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(g + i);
        const __m512i h = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
        const __m512i t = _mm512_i32gather_epi32(h, (const void *)pe_gelu_table, 2);
        __m512 v = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_and_si512(t, _mm512_set1_epi32(0xFFFF))));
        v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, hi, _CMP_GE_OQ), v, x);
        v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, lo, _CMP_LE_OQ), v, _mm512_setzero_ps());
        _mm512_storeu_ps(y + i, _mm512_mul_ps(v, _mm512_loadu_ps(u + i)));
    }
#elif defined(__AVX2__)
    /* eight at a time, the same way */
    const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256i h = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
        const __m256i t = _mm256_and_si256(_mm256_i32gather_epi32((const int *)pe_gelu_table, h, 2),
                                           _mm256_set1_epi32(0xFFFF));
        const __m128i t16 = _mm_packus_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
        __m256 v = _mm256_cvtph_ps(t16);
        v = _mm256_blendv_ps(v, x, _mm256_cmp_ps(x, hi, _CMP_GE_OQ));
        v = _mm256_blendv_ps(v, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LE_OQ));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(v, _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) {
        const float x = g[i];
        const float v = x >= 10.0f ? x : x <= -10.0f ? 0.0f : h2f(pe_gelu_table[f2h(x)]);
        y[i] = v * u[i];
    }
}

void PE_VEC_FILL(pe_kernels *k) {
    k->vec.lanes = LANES;
    k->vec.values_f16 = values_f16;
    k->vec.dot_tile_f32_f16 = dot_tile_f32_f16;
    k->vec.values_t_f16 = values_t_f16;
    k->vec.scale_round_f16 = scale_round_f16;
    k->vec.scale_max = scale_max;
    k->vec.max = max_f32;
    k->vec.max_nan = max_nan;
    k->vec.exp_sum = exp_sum;
    k->vec.f32_to_f16 = f32_to_f16;
    k->vec.f16_to_f32 = f16_to_f32;
    k->vec.sum_sq = sum_sq;
    k->vec.silu_mul = silu_mul;
    k->vec.gelu_mul = gelu_mul;
}
