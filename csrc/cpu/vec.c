/* vec.c - float loops the ops share.  This file is compiled once per
 * instruction set (cpu/x86/avx2_vec.c etc. include it with other flags and a
 * different PE_VEC_SUFFIX); the plain build is the scalar reference. */
#include <math.h>

#include "blocks.h"
#include "internal.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#ifndef PE_VEC_SUFFIX
#define PE_VEC_SUFFIX scalar
#endif
#define PE_CAT2(a, b) a##_##b
#define PE_CAT(a, b) PE_CAT2(a, b)
#define PE_VEC_FILL PE_CAT(pe_fill_vec, PE_VEC_SUFFIX)

static void f16_to_f32(int64_t n, const uint16_t *x, float *y) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))));
#elif defined(__AVX2__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
#endif
    for (; i < n; i++) y[i] = pe_f16_to_f32(x[i]);
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
    for (; i < n; i++) y[i] = pe_f32_to_f16(x[i]);
}

/* ---- llama.cpp's float loops, bit for bit --------------------------------------
 *
 * Attention and the gated MLP follow what llama.cpp's CPU build for the same
 * instruction set computes, so that logits match its recorded ones exactly:
 * its products with the F16 cache run LANES-wide accumulators (one fma per
 * lane and step, lanes folded by adding halves), and its softmax and SiLU use
 * a vector exp of its own.  The scalar build keeps plain loops. */
#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX2__)
#define LANES 8
#else
#define LANES 8
#endif

#if defined(__AVX512F__)
/* exp(x): x = n ln2 + b (n rounded by the 1.5 * 2^23 shifter, ln2 split in
 * two), then a degree-5 polynomial in b scaled by 2^n; beyond |n| > 192 the
 * result is 0 or inf. */
static inline __m512 exp16(__m512 x) {
    const __m512 shifter = _mm512_set1_ps(0x1.8p23f);
    const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), shifter);
    const __m512 n = _mm512_sub_ps(z, shifter);
    const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                      _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __mmask16 out_of_range = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192), _CMP_GT_OQ);
    const __m512 b2 = _mm512_mul_ps(b, b);
    const __m512 hi = _mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f));
    const __m512 mid = _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f));
    const __m512 lo = _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f));
    const __m512 poly = _mm512_fmadd_ps(_mm512_fmadd_ps(hi, b2, mid), b2, lo);
    const __m512 r = _mm512_scalef_ps(poly, n);
    if (!out_of_range) return r;
    const __mmask16 negative = _mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ);
    const __m512 limit = _mm512_mask_blend_ps(negative, _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
    return _mm512_mask_blend_ps(out_of_range, r, limit);
}
#define VEXP exp16
#elif defined(__AVX2__)
/* The AVX2 build's exp: the same reduction; 2^n is built in the exponent
 * bits (scaled in two steps beyond |n| > 126). */
static inline __m256 exp8(__m256 x) {
    const __m256 shifter = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shifter);
    const __m256 n = _mm256_sub_ps(z, shifter);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1))));
    const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126), _CMP_GT_OQ);
    const __m256 b2 = _mm256_mul_ps(b, b);
    const __m256 hi = _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f));
    const __m256 mid = _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f));
    const __m256 j = _mm256_fmadd_ps(_mm256_fmadd_ps(hi, b2, mid), b2,
                                     _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    if (!_mm256_movemask_ps(big)) return _mm256_fmadd_ps(j, k, k);
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 huge = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192), _CMP_GT_OQ);
    const __m256 scaled = _mm256_blendv_ps(_mm256_fmadd_ps(k, j, k), _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1), big);
    return _mm256_blendv_ps(scaled, _mm256_mul_ps(s1, s1), huge);
}
#define VEXP exp8
#endif

/* the lanes of a vector summed by halves (lanes i and i + W/2, ...) */
#if defined(__AVX512F__)
static inline float fold(__m512 v) { return _mm512_reduce_add_ps(v); }
#elif defined(__AVX2__)
#include "x86/x86_reduce.h"
static inline float fold(__m256 v) { return x86_sum_ps8(v); }
#endif

/* sum_i x[i] * f16(y[i]) over nacc * LANES lanes: chunk i of LANES elements
 * goes to accumulator i % nacc, the accumulators and then the lanes are
 * folded by halves.  x holds F16-rounded values.  nacc = 1 is llama.cpp's
 * tiled product (tinyBLAS), nacc = 4 its row dot product (ggml_vec_dot_f16);
 * what no vector covers is added in double, as the latter does. */
static float dot_f32_f16(int64_t n, const float *x, const uint16_t *y, int nacc) {
    int64_t i = 0;
    double tail = 0.0;
    float sum = 0.0f;
#if defined(__AVX512F__)
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (; i + 16 * nacc <= n; i += 16 * nacc)
        for (int j = 0; j < nacc; j++) {
            const __m512 yf = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(y + i + 16 * j)));
            acc[j] = _mm512_fmadd_ps(yf, _mm512_loadu_ps(x + i + 16 * j), acc[j]);
        }
    for (int half = nacc / 2; half >= 1; half /= 2)
        for (int j = 0; j < half; j++) acc[j] = _mm512_add_ps(acc[j], acc[j + half]);
    sum = fold(acc[0]);
#elif defined(__AVX2__)
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (; i + 8 * nacc <= n; i += 8 * nacc)
        for (int j = 0; j < nacc; j++) {
            const __m256 yf = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i + 8 * j)));
            acc[j] = _mm256_fmadd_ps(yf, _mm256_loadu_ps(x + i + 8 * j), acc[j]);
        }
    for (int half = nacc / 2; half >= 1; half /= 2)
        for (int j = 0; j < half; j++) acc[j] = _mm256_add_ps(acc[j], acc[j + half]);
    sum = fold(acc[0]);
#else
    (void)nacc;
#endif
    for (; i < n; i++) tail += (double)(x[i] * pe_f16_to_f32(y[i]));
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

/* The row dot product (nacc 4) of nx queries with ny F16 rows when whole
 * 64-element steps cover n, each row converted once for all the queries
 * (the heads of a GQA group): per pair dot_f32_f16's steps, chunk i to
 * accumulator i % 4, then (0 + 2) + (1 + 3) and the fold (no tail: nothing
 * is added in double). */
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

/* A batch's tiled product (nacc 1) of nx queries with up to 4 F16 rows when
 * whole 16-element steps cover n: per pair one accumulator, each row's step
 * converted once for the queries (spare rows repeat the last), then the
 * fold. */
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
/* The row dot product (nacc 4) of nx <= 3 queries with ny F16 rows when
 * whole 32-element steps cover n, each row's chunks converted once for the
 * queries: per pair dot_f32_f16's steps, chunk i to accumulator i % 4, then
 * (0 + 2) + (1 + 3) and the fold (no tail). */
PE_ALWAYS_INLINE void dot_tile_nacc4_n(int64_t n, const float *const *x, const int nx, const uint16_t *const *y, int ny,
                                       float *out) {
    for (int b = 0; b < ny; b++) {
        __m256 acc[3][4];
        for (int a = 0; a < nx; a++)
            for (int j = 0; j < 4; j++) acc[a][j] = _mm256_setzero_ps();
        for (int64_t i = 0; i < n; i += 32)
            for (int j = 0; j < 4; j++) {
                const __m256 yv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y[b] + i + 8 * j)));
                for (int a = 0; a < nx; a++) acc[a][j] = _mm256_fmadd_ps(yv, _mm256_loadu_ps(x[a] + i + 8 * j), acc[a][j]);
            }
        for (int a = 0; a < nx; a++)
            out[4 * a + b] = fold(_mm256_add_ps(_mm256_add_ps(acc[a][0], acc[a][2]), _mm256_add_ps(acc[a][1], acc[a][3])));
    }
}
#endif

/* Attention's score products: dot_f32_f16 with nacc accumulators (1: a
 * batch's tiles, 4: a lone token's row dot product) for every pair of up to
 * 4 query rows x and up to 4 F16 rows y, out[4 * a + b] = x[a] . y[b].
 * Each y chunk is converted once for all queries; each pair's arithmetic is
 * the row product's. */
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
    if (nacc == 4 && n % 32 == 0) {   /* 3 queries at a time: 12 accumulators fit the 16 registers */
        for (int a0 = 0; a0 < nx; a0 += 3) {
            switch (nx - a0 < 3 ? nx - a0 : 3) {
            case 1: dot_tile_nacc4_n(n, x + a0, 1, y, ny, out + 4 * a0); break;
            case 2: dot_tile_nacc4_n(n, x + a0, 2, y, ny, out + 4 * a0); break;
            default: dot_tile_nacc4_n(n, x + a0, 3, y, ny, out + 4 * a0); break;
            }
        }
        return;
    }
    if (nacc == 1 && n % 8 == 0) {   /* two queries at a time: 8 accumulators fit the 16 registers */
        const uint16_t *ys[4];
        for (int b = 0; b < 4; b++) ys[b] = y[b < ny ? b : ny - 1];
        for (int a0 = 0; a0 < nx; a0 += 2) {
            const float *xs[2] = {x[a0], x[a0 + 1 < nx ? a0 + 1 : a0]};
            __m256 acc[2][4];
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 4; b++) acc[a][b] = _mm256_setzero_ps();
            for (int64_t i = 0; i < n; i += 8) {
                __m256 yv[4];
                for (int b = 0; b < 4; b++) yv[b] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ys[b] + i)));
                for (int a = 0; a < 2; a++) {
                    const __m256 xv = _mm256_loadu_ps(xs[a] + i);
                    for (int b = 0; b < 4; b++) acc[a][b] = _mm256_fmadd_ps(yv[b], xv, acc[a][b]);
                }
            }
            for (int a = 0; a < 2 && a0 + a < nx; a++)
                for (int b = 0; b < ny; b++) out[4 * (a0 + a) + b] = fold(acc[a][b]);
        }
        return;
    }
#endif
    for (int a = 0; a < nx; a++)
        for (int b = 0; b < ny; b++) out[4 * a + b] = dot_f32_f16(n, x[a], y[b], nacc);
}

/* One output element of the product with a transposed V for the ISAs
 * without a vector loop: values_f16_wide's lanes for one column. */
static float values_t_one(int64_t n, const float *p, const uint16_t *vt) {
    float lane[LANES] = {0};
    for (int64_t i = 0; i < n; i++)
        if (p[i] != 0.0f) lane[i % LANES] = fmaf(pe_f16_to_f32(vt[i]), p[i], lane[i % LANES]);
    for (int half = LANES / 2; half >= 1; half /= 2)
        for (int l = 0; l < half; l++) lane[l] += lane[l + half];
    return lane[0];
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

/* The product of nh <= 4 heads' probabilities p[h] (n slots, a multiple of
 * LANES) with a transposed F16 V: row d of vt (vt_stride elements apart)
 * holds element d of the slots' V rows.  Slot i goes to lane i % LANES, a
 * slot whose probability is 0 is skipped, and the lanes fold by halves:
 * the sums of values_f16 with nacc 1, with each V element converted once
 * for all heads and no per-slot branch. */
static void values_t_f16(int64_t n, int nh, const float *const *p, const uint16_t *vt, size_t vt_stride, int64_t hd,
                         float *const *out) {
#if defined(__AVX512F__)
    if (hd % 4 == 0) {
        switch (nh) {
        case 1: values_t_heads(n, 1, p, vt, vt_stride, hd, out); return;
        case 2: values_t_heads(n, 2, p, vt, vt_stride, hd, out); return;
        case 3: values_t_heads(n, 3, p, vt, vt_stride, hd, out); return;
        default: values_t_heads(n, 4, p, vt, vt_stride, hd, out); return;
        }
    }
#elif defined(__AVX2__)
    if (hd % 4 == 0) {
        for (int h0 = 0; h0 < nh; h0 += 2) {
            const int h1 = h0 + 1 < nh ? h0 + 1 : h0;
            for (int64_t d0 = 0; d0 < hd; d0 += 4) {
                __m256 acc[2][4];
                for (int h = 0; h < 2; h++)
                    for (int e = 0; e < 4; e++) acc[h][e] = _mm256_setzero_ps();
                for (int64_t s = 0; s < n; s += 8) {
                    const __m256 pv[2] = {_mm256_loadu_ps(p[h0] + s), _mm256_loadu_ps(p[h1] + s)};
                    const __m256 live[2] = {_mm256_cmp_ps(pv[0], _mm256_setzero_ps(), _CMP_NEQ_UQ),
                                            _mm256_cmp_ps(pv[1], _mm256_setzero_ps(), _CMP_NEQ_UQ)};
                    for (int e = 0; e < 4; e++) {
                        const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vt + (size_t)(d0 + e) * vt_stride + s)));
                        for (int h = 0; h < 2; h++)
                            acc[h][e] = _mm256_blendv_ps(acc[h][e], _mm256_fmadd_ps(v, pv[h], acc[h][e]), live[h]);
                    }
                }
                for (int e = 0; e < 4; e++) {
                    out[h0][d0 + e] = fold(acc[0][e]);
                    if (h1 != h0) out[h1][d0 + e] = fold(acc[1][e]);
                }
            }
        }
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
    for (; i < n; i++) y[i] = pe_f16_to_f32(pe_f32_to_f16(x[i] * scale));
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
    for (; i < n; i++) y[i] = fmaf(pe_f16_to_f32(x[i]), p, y[i]);
}

/* The product of probabilities p[i] (slot i of n, a multiple of LANES) with
 * the F16 V rows of cells cell[i] (rows `stride` bytes apart, -1: none), as
 * LANES accumulators per output element: slot i goes to lane i % LANES, one
 * fma each, then the lanes fold by halves.  The lanes of one block of output
 * elements stay in registers.  Returns 0 where the ISA has no such loop. */
static int values_f16_lanes(int64_t n, const int32_t *cell, const float *p, const uint8_t *v, size_t stride,
                            int64_t hd, float *out) {
#if defined(__AVX512F__)
    if (hd % 16) return 0;
    for (int64_t d0 = 0; d0 < hd; d0 += 16) {
        __m512 acc[16];
        for (int l = 0; l < 16; l++) acc[l] = _mm512_setzero_ps();
        for (int64_t s = 0; s < n; s += 16)
            for (int l = 0; l < 16; l++) {
                const int64_t i = s + l;
                if (cell[i] < 0 || p[i] == 0.0f) continue;
                const __m256i h = _mm256_loadu_si256((const __m256i *)(v + (size_t)cell[i] * stride) + d0 / 16);
                acc[l] = _mm512_fmadd_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(p[i]), acc[l]);
            }
        for (int half = 8; half >= 1; half /= 2)
            for (int l = 0; l < half; l++) acc[l] = _mm512_add_ps(acc[l], acc[l + half]);
        _mm512_storeu_ps(out + d0, acc[0]);
    }
    return 1;
#elif defined(__AVX2__)
    if (hd % 8) return 0;
    for (int64_t d0 = 0; d0 < hd; d0 += 8) {
        __m256 acc[8];
        for (int l = 0; l < 8; l++) acc[l] = _mm256_setzero_ps();
        for (int64_t s = 0; s < n; s += 8)
            for (int l = 0; l < 8; l++) {
                const int64_t i = s + l;
                if (cell[i] < 0 || p[i] == 0.0f) continue;
                const __m128i h = _mm_loadu_si128((const __m128i *)(v + (size_t)cell[i] * stride) + d0 / 8);
                acc[l] = _mm256_fmadd_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(p[i]), acc[l]);
            }
        for (int half = 4; half >= 1; half /= 2)
            for (int l = 0; l < half; l++) acc[l] = _mm256_add_ps(acc[l], acc[l + half]);
        _mm256_storeu_ps(out + d0, acc[0]);
    }
    return 1;
#else
    (void)n; (void)cell; (void)p; (void)v; (void)stride; (void)hd; (void)out;
    return 0;
#endif
}

/* The lone token's product with an F16 V (4 * LANES lanes: slot i to lane
 * i % (4 * LANES), folded by halves, as values_f16_wide) for up to 3 heads
 * over the same V rows, LANES output elements at a time: lane L is the fma
 * chain over its slots (L + 4 * LANES * i), built where the fold takes it
 * (lanes l, l + LANES, l + 2 * LANES and l + 3 * LANES together, into
 * (L l + L l+2W) + (L l+W + L l+3W), W = LANES), then the LANES sums are
 * folded by halves; each V row segment is converted once for the heads.  A
 * zero probability is multiplied as llama.cpp does (the lanes start at +0
 * and adding a zero product leaves them as they are), not tested for.
 * Returns 0 where the ISA has no such loop. */
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
#else
typedef __m256 vlane;
#define VL_ZERO() _mm256_setzero_ps()
#define VL_ADD(a, b) _mm256_add_ps(a, b)
#define VL_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VL_SET1(x) _mm256_set1_ps(x)
#define VL_STORE(p, v) _mm256_storeu_ps(p, v)
#define VL_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define VL_LOAD(p) _mm256_loadu_ps(p)
#endif

static inline vlane fold_vectors(vlane v[LANES]) {
    for (int half = LANES / 2; half >= 1; half /= 2)
        for (int l = 0; l < half; l++) v[l] = VL_ADD(v[l], v[l + half]);
    return v[0];
}

PE_ALWAYS_INLINE void values_lone_heads(int64_t n, const int nh, const int32_t *cell, const float *const *p,
                                        const uint8_t *v, size_t stride, int64_t hd, float *const *out) {
    for (int64_t d0 = 0; d0 < hd; d0 += LANES) {
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
                    for (int h = 0; h < nh; h++) lane[h][k] = VL_FMA(vf, VL_SET1(p[h][i]), lane[h][k]);
                }
            for (int h = 0; h < nh; h++)
                sum[h][l] = VL_ADD(VL_ADD(lane[h][0], lane[h][2]), VL_ADD(lane[h][1], lane[h][3]));
        }
        for (int h = 0; h < nh; h++) VL_STORE(out[h] + d0, fold_vectors(sum[h]));
    }
}
#endif

#if defined(__AVX512F__) || defined(__AVX2__)
/* The same product for long rows, lane by lane: lane L's chain (slots L +
 * 4 * LANES * i) for 4 * LANES dimensions of up to 3 heads at once, so each
 * V row segment is read once, whole (values_lone_heads reads a row once per
 * LANES dimensions, in passes 4 * LANES slots apart: from L2 or memory, not
 * L1, once rows are long); the lanes go to `lanes` ([nh][4 * LANES][hd])
 * and are folded from there as values_lone_heads folds them. */
PE_ALWAYS_INLINE void values_lone_long(int64_t n, const int nh, const int32_t *cell, const float *const *p,
                                       const uint8_t *v, size_t stride, int64_t hd, float *const *out, float *lanes) {
    const int64_t w = 4 * LANES;   /* lanes, and dimensions per pass */
    for (int64_t d0 = 0; d0 < hd; d0 += w)
        for (int64_t lane = 0; lane < w; lane++) {
            vlane acc[3][4];
            for (int h = 0; h < nh; h++)
                for (int c = 0; c < 4; c++) acc[h][c] = VL_ZERO();
            for (int64_t i = lane; i < n; i += w) {
                if (cell[i] < 0) continue;
                const uint16_t *row = (const uint16_t *)(v + (size_t)cell[i] * stride) + d0;
                for (int c = 0; c < 4; c++) {
                    const vlane vf = VL_F16(row + c * LANES);
                    for (int h = 0; h < nh; h++) acc[h][c] = VL_FMA(vf, VL_SET1(p[h][i]), acc[h][c]);
                }
            }
            for (int h = 0; h < nh; h++)
                for (int c = 0; c < 4; c++) VL_STORE(lanes + (h * w + lane) * hd + d0 + c * LANES, acc[h][c]);
        }
    for (int h = 0; h < nh; h++)
        for (int64_t d0 = 0; d0 < hd; d0 += LANES) {
            vlane sum[LANES];
            const float *lh = lanes + h * w * hd + d0;
            for (int l = 0; l < LANES; l++)
                sum[l] = VL_ADD(VL_ADD(VL_LOAD(lh + l * hd), VL_LOAD(lh + (l + 2 * LANES) * hd)),
                                VL_ADD(VL_LOAD(lh + (l + LANES) * hd), VL_LOAD(lh + (l + 3 * LANES) * hd)));
            VL_STORE(out[h] + d0, fold_vectors(sum));
        }
}
#endif

/* Rows at least this many slots long take values_lone_long. */
#define LONE_LONG_SLOTS 512

static int values_f16_lone(int64_t n, int nh, const int32_t *cell, const float *const *p, const uint8_t *v,
                           size_t stride, int64_t hd, float *const *out, float *scratch) {
#if defined(__AVX512F__) || defined(__AVX2__)
    if (hd % LANES || n % (4 * LANES)) return 0;
    const int long_rows = n >= LONE_LONG_SLOTS && hd % (4 * LANES) == 0;
    for (int h0 = 0, take; h0 < nh; h0 += take) {   /* 3 heads at a time (4 as 2 + 2) */
        take = nh - h0 == 4 ? 2 : nh - h0 < 3 ? nh - h0 : 3;
        if (long_rows) {
            switch (take) {
            case 1: values_lone_long(n, 1, cell, p + h0, v, stride, hd, out + h0, scratch); break;
            case 2: values_lone_long(n, 2, cell, p + h0, v, stride, hd, out + h0, scratch); break;
            default: values_lone_long(n, 3, cell, p + h0, v, stride, hd, out + h0, scratch); break;
            }
            continue;
        }
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
 * for the lone-token path's 4 * LANES lanes and for ISAs without the
 * register loop: one call per head, so no call per slot. */
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
 * (see values_f16_lanes), nacc accumulators of LANES lanes, into out[h] */
static void values_f16(int64_t n, int nh, const int32_t *cell, const float *const *p, const uint8_t *v, size_t stride,
                       int64_t hd, int nacc, float *const *out, float *scratch) {
    if (nacc == 4 && values_f16_lone(n, nh, cell, p, v, stride, hd, out, scratch)) return;
    for (int h = 0; h < nh; h++) {
        if (nacc == 1 && values_f16_lanes(n, cell, p[h], v, stride, hd, out[h])) continue;
        values_f16_wide(n, cell, p[h], v, stride, hd, (int64_t)LANES * nacc, out[h], scratch);
    }
}

/* The largest of x[i] * scale (a NaN is passed over, as a comparison
 * passes it over), each stored into y unless y is NULL; with `nan` (not
 * NULL), *nan set to 1 when some x[i] * scale is NaN (an unordered compare
 * of each vector with itself, in the same pass), left as it is otherwise. */
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
    return best;
}

/* x[i] *= scale, and the largest of them */
static float scale_max(int64_t n, float *x, float scale) { return scaled_max(n, x, scale, x, NULL); }

static float max_f32(int64_t n, const float *x) { return scaled_max(n, x, 1.0f, NULL, NULL); }

/* max_f32, noting in *nan whether any x[i] is NaN */
static float max_nan(int64_t n, const float *x, int *nan) { return scaled_max(n, x, 1.0f, NULL, nan); }

/* y[i] = exp(x[i] - max) for i < n (n a multiple of LANES on the SIMD
 * builds); returns their sum in double, added LANES at a time */
static double exp_sum(int64_t n, float *y, const float *x, float max) {
    int64_t i = 0;
    double sum = 0.0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
        const __m512 e = VEXP(_mm512_sub_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(max)));
        _mm512_storeu_ps(y + i, e);
        sum += (double)fold(e);
    }
#elif defined(__AVX2__)
    for (; i + 8 <= n; i += 8) {
        const __m256 e = VEXP(_mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(max)));
        _mm256_storeu_ps(y + i, e);
        sum += (double)fold(e);
    }
#endif
    for (; i < n; i++) {
        y[i] = expf(x[i] - max);
        sum += (double)y[i];
    }
    return sum;
}

static double sum_sq(int64_t n, const float *x) {
    /* float squares summed in double, as GGML's RMS norm does */
    double sum = 0.0;
    int64_t i = 0;
#if defined(__AVX512F__)
    __m512d acc = _mm512_setzero_pd();
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __m512 sq = _mm512_mul_ps(v, v);
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(sq)));
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sq), 1))));
    }
    sum = _mm512_reduce_add_pd(acc);
#elif defined(__AVX2__)
    __m256d acc = _mm256_setzero_pd();
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 sq = _mm256_mul_ps(v, v);
        acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
    }
    double tmp[4];
    _mm256_storeu_pd(tmp, acc);
    sum = tmp[0] + tmp[1] + tmp[2] + tmp[3];
#endif
    for (; i < n; i++) sum += (double)(x[i] * x[i]);
    return sum;
}

static inline float silu1(float x) { return x / (1.0f + expf(-x)); }

static void silu_mul(int64_t n, float *y, const float *g, const float *u) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(g + i);
        const __m512 e = VEXP(_mm512_sub_ps(_mm512_setzero_ps(), x));
        const __m512 silu = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(y + i, _mm512_mul_ps(silu, _mm512_loadu_ps(u + i)));
    }
#elif defined(__AVX2__)
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 e = VEXP(_mm256_sub_ps(_mm256_setzero_ps(), x));
        const __m256 silu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) y[i] = silu1(g[i]) * u[i];
}

static void gelu_mul(int64_t n, float *y, const float *g, const float *u) {
    int64_t i = 0;
#if defined(__AVX512F__)
    /* pe_gelu sixteen at a time: the table gathered by the inputs' F16 bits */
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
    for (; i < n; i++) y[i] = pe_gelu(g[i]) * u[i];
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
