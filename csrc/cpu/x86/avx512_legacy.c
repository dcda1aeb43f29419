/* avx512_legacy.c - AVX-512 (F BW VL DQ) + VNNI kernels of the float types
 * and the legacy block types.  The table starts as a copy of the AVX2 one;
 * this file overrides what masks, VNNI and wider vectors make faster.  The
 * block types' dot products (vec_dot and gemm) are in avx512_gemm.c.
 * Quantizers and dequantizers are exact. */
#include <immintrin.h>
#include <string.h>
#if defined(__GNUC__) || defined(__clang__)
#include <cpuid.h>
#endif

#include "blocks.h"
#include "internal.h"
#include "x86_float_gemm.h"

/* Intrinsics are plain vector arithmetic to GCC, which would fuse a separate
 * multiply and add into an FMA; the quantizers need the two roundings. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* ---- helpers ------------------------------------------------------------------ */

static inline uint32_t load_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float f16_to_f32(pe_f16 h) { return _cvtsh_ss(h); }

/* ---- dequantize ---------------------------------------------------------------------- */

/* 16 signed codes -> floats q * d (+ m); q * d is exact, as in the reference. */
static inline void store16(float *y, __m128i codes, __m512 d, const __m512 *m) {
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes)), d);
    if (m) v = _mm512_add_ps(v, *m);
    _mm512_storeu_ps(y, v);
}

/* The two nibble halves of a block's 16 bytes: elements 0..15 and 16..31. */
static inline void split_nibbles(const uint8_t *qs, __m128i *lo, __m128i *hi) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs), mask = _mm_set1_epi8(0x0F);
    *lo = _mm_and_si128(raw, mask);
    *hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
}

static inline void add_fifth_bits(const uint8_t *qh, __m128i *lo, __m128i *hi) {
    const uint32_t bits = load_u32(qh);
    const __m128i b4 = _mm_set1_epi8(0x10);
    *lo = _mm_mask_add_epi8(*lo, _cvtu32_mask16(bits & 0xFFFF), *lo, b4);
    *hi = _mm_mask_add_epi8(*hi, _cvtu32_mask16(bits >> 16), *hi, b4);
}

/* FIFTH: the type has 5-bit codes; OFFSET is taken off the codes; WITH_MIN
 * adds m (the block's second half). */
#define DEFINE_TO_FLOAT(NAME, WBLOCK, FIFTH, OFFSET, WITH_MIN)                               \
    static void NAME(const void *vx, float *y, int64_t n) {                                   \
        const WBLOCK *x = vx;                                                                 \
        const __m128i offset = _mm_set1_epi8(OFFSET);                                         \
        for (int64_t ib = 0; ib < n / 32; ib++, y += 32) {                                    \
            __m128i lo, hi;                                                                   \
            split_nibbles(x[ib].qs, &lo, &hi);                                                \
            if (FIFTH) add_fifth_bits((const uint8_t *)&x[ib] + (WITH_MIN ? 4 : 2), &lo, &hi); \
            const __m512 d = _mm512_set1_ps(f16_to_f32(x[ib].d));                             \
            const __m512 m = _mm512_set1_ps(f16_to_f32((pe_f16)(load_u32(&x[ib]) >> 16)));    \
            store16(y, _mm_sub_epi8(lo, offset), d, WITH_MIN ? &m : NULL);                    \
            store16(y + 16, _mm_sub_epi8(hi, offset), d, WITH_MIN ? &m : NULL);               \
        }                                                                                     \
    }

DEFINE_TO_FLOAT(dequantize_q4_0, block_q4_0, 0, 8, 0)
DEFINE_TO_FLOAT(dequantize_q4_1, block_q4_1, 0, 0, 1)
DEFINE_TO_FLOAT(dequantize_q5_0, block_q5_0, 1, 16, 0)
DEFINE_TO_FLOAT(dequantize_q5_1, block_q5_1, 1, 0, 1)

static void dequantize_q8_0(const void *vx, float *y, int64_t n) {
    const block_q8_0 *x = vx;
    for (int64_t ib = 0; ib < n / 32; ib++, y += 32) {
        const __m512 d = _mm512_set1_ps(f16_to_f32(x[ib].d));
        store16(y, _mm_loadu_si128((const __m128i *)x[ib].qs), d, NULL);
        store16(y + 16, _mm_loadu_si128((const __m128i *)(x[ib].qs + 16)), d, NULL);
    }
}

/* ---- activation quantizers ---------------------------------------------------------- */

/* Activations are quantized the way llama.cpp's x86 build does it (not its
 * scalar reference): multiply by 127/amax and round half to even.  Matching
 * it keeps our logits within float noise of llama.cpp's on the same CPU. */
static inline float quantize_block_q8(const float *x, __m512i q[2]) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const float max_abs = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const __m512 mul = _mm512_set1_ps(max_abs != 0.0f ? 127.0f / max_abs : 0.0f);
    q[0] = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v0, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q[1] = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v1, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return max_abs / 127.0f;
}

static inline void store_codes_q8(int8_t *out, const __m512i q[2]) {
    _mm_storeu_si128((__m128i *)out, _mm512_cvtepi32_epi8(q[0]));
    _mm_storeu_si128((__m128i *)(out + 16), _mm512_cvtepi32_epi8(q[1]));
}

static void quantize_q8_0(const float *x, void *vy, int64_t n) {
    block_q8_0 *y = vy;
    for (int64_t ib = 0; ib < n / 32; ib++, x += 32) {
        __m512i q[2];
        const float d = quantize_block_q8(x, q);
        y[ib].d = pe_f32_to_f16(d);
        store_codes_q8(y[ib].qs, q);
    }
}

static void quantize_q8_1(const float *x, void *vy, int64_t n) {
    block_q8_1 *y = vy;
    for (int64_t ib = 0; ib < n / 32; ib++, x += 32) {
        __m512i q[2];
        const float d = quantize_block_q8(x, q);
        const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]));
        y[ib].d = pe_f32_to_f16(d);
        y[ib].s = pe_f32_to_f16((float)sum * d);
        store_codes_q8(y[ib].qs, q);
    }
}

/* ---- float types ------------------------------------------------------------------- */

/* Loads of 16 elements; the masked forms read only the first `count`. */
static inline __mmask16 first(int64_t count) { return (__mmask16)((1u << count) - 1); }

static inline __m512 load_f16x16(const pe_f16 *p, __mmask16 k) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p));
}

static inline __m512 load_bf16x16(const pe_bf16 *p, __mmask16 k) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

static void f16_to_float(const void *vx, float *y, int64_t n) {
    const pe_f16 *x = vx;
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? 0xFFFF : first(n - i);
        _mm512_mask_storeu_ps(y + i, k, load_f16x16(x + i, k));
    }
}

static void f16_from_float(const float *x, void *vy, int64_t n) {
    pe_f16 *y = vy;
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? 0xFFFF : first(n - i);
        const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_mask_storeu_epi16(y + i, k, h);
    }
}

static void bf16_to_float(const void *vx, float *y, int64_t n) {
    const pe_bf16 *x = vx;
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? 0xFFFF : first(n - i);
        _mm512_mask_storeu_ps(y + i, k, load_bf16x16(x + i, k));
    }
}

/* Round to nearest even on the bits; NaN keeps its top bits and turns quiet. */
static inline __m256i bf16_round16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 is_nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(64));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, is_nan, quiet));
}

static void bf16_from_float(const float *x, void *vy, int64_t n) {
    pe_bf16 *y = vy;
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? 0xFFFF : first(n - i);
        _mm256_mask_storeu_epi16(y + i, k, bf16_round16(_mm512_maskz_loadu_ps(k, x + i)));
    }
}

/* ---- float dot products, as llama.cpp's AVX-512 build computes a row alone -----------
 *
 * F32 and F16 in four 16-lane accumulators over 64 elements,
 * acc_j = fma(x, y, acc_j), folded (acc0 + acc2) + (acc1 + acc3); BF16 in two
 * accumulators of vdpbf16ps over 64 elements, their sums added.  A sum of 16
 * lanes is _mm512_reduce_add_ps in GCC's order (the 256-bit halves, then a
 * tree); the elements past the last full step add in double.  Every batch
 * takes this arithmetic, row by row. */
static inline float reduce16(__m512 v) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m512 load_f16(const pe_f16 *p) { return load_f16x16(p, 0xFFFF); }
static inline __m512 load_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline float f32_of(float v) { return v; }
static inline float f16_of(pe_f16 v) { return f16_to_f32(v); }

#define DEFINE_FLOAT_DOT(NAME, ELEM, LOAD16, SCALAR)                                              \
    static void NAME(int64_t n, float *s, const void *vw, const void *va) {                      \
        const ELEM *x = vw, *y = va;                                                             \
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()}; \
        int64_t i = 0;                                                                           \
        for (; i + 64 <= n; i += 64)                                                             \
            for (int j = 0; j < 4; j++)                                                          \
                acc[j] = _mm512_fmadd_ps(LOAD16(x + i + 16 * j), LOAD16(y + i + 16 * j), acc[j]); \
        double sum = reduce16(_mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]))); \
        for (; i < n; i++) sum += (double)(SCALAR(x[i]) * SCALAR(y[i]));                          \
        *s = (float)sum;                                                                         \
    }

DEFINE_FLOAT_DOT(f32_vec_dot, float, load_f32, f32_of)
DEFINE_FLOAT_DOT(f16_vec_dot, pe_f16, load_f16, f16_of)

/* F16's tile: each weight row against up to 4 activation rows at a time,
 * every pair in f16_vec_dot's four accumulators, the weight's 16 elements
 * converted once for the 4.  Rows whose length is no multiple of 64 go pair
 * by pair (their tail adds in double). */
#define F16_TILE_COLS 4
static void f16_gemm(int64_t n, float *s, size_t bs, const void *w, size_t bw, const void *a, size_t ba, int nr,
                     int nc) {
    if (n % 64) {
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
            __m512 acc[F16_TILE_COLS][4];
            for (int c = 0; c < F16_TILE_COLS; c++)
                for (int j = 0; j < 4; j++) acc[c][j] = _mm512_setzero_ps();
            for (int64_t i = 0; i < n; i += 64)
                for (int j = 0; j < 4; j++) {
                    const __m512 wv = load_f16(wr + i + 16 * j);
                    for (int c = 0; c < F16_TILE_COLS; c++)
                        acc[c][j] = _mm512_fmadd_ps(wv, load_f16(ac[c] + i + 16 * j), acc[c][j]);
                }
            for (int c = 0; c < mc; c++) {
                const double sum = reduce16(_mm512_add_ps(_mm512_add_ps(acc[c][0], acc[c][2]),
                                                          _mm512_add_ps(acc[c][1], acc[c][3])));
                s[(size_t)(j0 + c) * bs + r] = (float)sum;
            }
        }
    }
}

/* vdpbf16ps: per 32-bit lane, the odd pair's product then the even pair's,
 * each exact and added with one rounding.  Without AVX512-BF16 two FMAs do
 * the same (bar denormals, which the instruction flushes). */
static inline __m512 dpbf16_fma(__m512 acc, __m512i x, __m512i y) {
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000);
    acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(x, hi)), _mm512_castsi512_ps(_mm512_and_si512(y, hi)), acc);
    return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(x, 16)), _mm512_castsi512_ps(_mm512_slli_epi32(y, 16)), acc);
}

#if defined(__GNUC__) || defined(__clang__)
__attribute__((target("avx512bf16")))
static inline __m512 dpbf16_native(__m512 acc, __m512i x, __m512i y) {
    return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)y);
}
#define PE_HAVE_DPBF16 1
#endif

#define DEFINE_BF16_DOT(NAME, DP, ATTR)                                                           \
    ATTR static void NAME(int64_t n, float *s, const void *vw, const void *va) {                 \
        const pe_bf16 *x = vw, *y = va;                                                          \
        int64_t i = 0;                                                                           \
        double sum;                                                                              \
        __m512 c1 = _mm512_setzero_ps(), c2 = _mm512_setzero_ps();                               \
        for (; i + 64 <= n; i += 64) {                                                           \
            c1 = DP(c1, _mm512_loadu_si512(x + i), _mm512_loadu_si512(y + i));                   \
            c2 = DP(c2, _mm512_loadu_si512(x + i + 32), _mm512_loadu_si512(y + i + 32));         \
        }                                                                                        \
        sum = (double)reduce16(c1) + (double)reduce16(c2);                                       \
        for (; i < n; i++) sum += (double)(pe_bf16_to_f32(x[i]) * pe_bf16_to_f32(y[i]));         \
        *s = (float)sum;                                                                         \
    }

DEFINE_BF16_DOT(bf16_vec_dot_fma, dpbf16_fma, )
#if defined(PE_HAVE_DPBF16)
DEFINE_BF16_DOT(bf16_vec_dot_native, dpbf16_native, __attribute__((target("avx512bf16"))))
#endif

/* AVX512-BF16: CPUID leaf 7 sub-leaf 1, EAX bit 5 */
static int have_avx512_bf16(void) {
#if defined(PE_HAVE_DPBF16) && defined(__GNUC__)
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a >> 5) & 1;
#else
    return 0;
#endif
}

void pe_fill_avx512_legacy(pe_kernels *k) {
    k->type[PE_TYPE_F32].vec_dot = f32_vec_dot;
    k->type[PE_TYPE_F16].to_float = f16_to_float;
    k->type[PE_TYPE_F16].from_float = f16_from_float;
    k->type[PE_TYPE_F16].vec_dot = f16_vec_dot;
    k->type[PE_TYPE_F16].gemm = f16_gemm;
    k->type[PE_TYPE_BF16] = (pe_type_kernels){bf16_to_float, bf16_from_float, bf16_vec_dot_fma, NULL};
#if defined(PE_HAVE_DPBF16)
    if (have_avx512_bf16()) k->type[PE_TYPE_BF16].vec_dot = bf16_vec_dot_native;
#endif

    /* the block types' dot products (vec_dot and gemm) are in *_gemm.c */
    k->type[PE_TYPE_Q4_0].to_float = dequantize_q4_0;
    k->type[PE_TYPE_Q4_1].to_float = dequantize_q4_1;
    k->type[PE_TYPE_Q5_0].to_float = dequantize_q5_0;
    k->type[PE_TYPE_Q5_1].to_float = dequantize_q5_1;
    k->type[PE_TYPE_Q8_0].to_float = dequantize_q8_0;
    k->type[PE_TYPE_Q8_0].from_float = quantize_q8_0;
    k->type[PE_TYPE_Q8_1].from_float = quantize_q8_1;
}
