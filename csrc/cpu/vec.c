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

static float dot_f32(int64_t n, const float *x, const float *y) {
    int64_t i = 0;
    float sum = 0.0f;
#if defined(__AVX512F__)
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(y + i + 16), acc1);
    }
    sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#elif defined(__AVX2__)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), acc1);
    }
    __m256 acc = _mm256_add_ps(acc0, acc1);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    sum = _mm_cvtss_f32(s4);
#elif defined(__ARM_NEON) && defined(__aarch64__)
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    for (; i + 8 <= n; i += 8) {
        acc0 = vfmaq_f32(acc0, vld1q_f32(x + i), vld1q_f32(y + i));
        acc1 = vfmaq_f32(acc1, vld1q_f32(x + i + 4), vld1q_f32(y + i + 4));
    }
    sum = vaddvq_f32(vaddq_f32(acc0, acc1));
#endif
    for (; i < n; i++) sum += x[i] * y[i];
    return sum;
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

static float dot_f32_f16(int64_t n, const float *x, const uint16_t *y) {
    int64_t i = 0;
    float sum = 0.0f;
#if defined(__AVX512F__)
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        __m512 y0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(y + i)));
        __m512 y1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(y + i + 16)));
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), y0, acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), y1, acc1);
    }
    sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#elif defined(__AVX2__)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        __m256 y0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i)));
        __m256 y1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i + 8)));
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), y0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), y1, acc1);
    }
    __m256 acc = _mm256_add_ps(acc0, acc1);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    sum = _mm_cvtss_f32(s4);
#elif defined(__ARM_NEON) && defined(__aarch64__) && defined(__ARM_FEATURE_FP16_VECTOR_ARITHMETIC)
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    for (; i + 8 <= n; i += 8) {
        float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(y + i));
        acc0 = vfmaq_f32(acc0, vld1q_f32(x + i), vcvt_f32_f16(vget_low_f16(h)));
        acc1 = vfmaq_f32(acc1, vld1q_f32(x + i + 4), vcvt_high_f32_f16(h));
    }
    sum = vaddvq_f32(vaddq_f32(acc0, acc1));
#endif
    for (; i < n; i++) sum += x[i] * pe_f16_to_f32(y[i]);
    return sum;
}

static void scale_mad_f16(int64_t n, float *y, float s, const uint16_t *x, float v) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 vs = _mm512_set1_ps(s), vv = _mm512_set1_ps(v);
    for (; i + 16 <= n; i += 16) {
        __m512 xf = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i)));
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(xf, vv, _mm512_mul_ps(_mm512_loadu_ps(y + i), vs)));
    }
#elif defined(__AVX2__)
    const __m256 vs = _mm256_set1_ps(s), vv = _mm256_set1_ps(v);
    for (; i + 8 <= n; i += 8) {
        __m256 xf = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(xf, vv, _mm256_mul_ps(_mm256_loadu_ps(y + i), vs)));
    }
#endif
    for (; i < n; i++) y[i] = y[i] * s + pe_f16_to_f32(x[i]) * v;
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
    for (int64_t i = 0; i < n; i++) y[i] = silu1(g[i]) * u[i];
}

static void gelu_mul(int64_t n, float *y, const float *g, const float *u) {
    for (int64_t i = 0; i < n; i++) y[i] = pe_gelu(g[i]) * u[i];
}

void PE_VEC_FILL(pe_kernels *k) {
    k->vec.dot_f32 = dot_f32;
    k->vec.dot_f32_f16 = dot_f32_f16;
    k->vec.scale_mad_f16 = scale_mad_f16;
    k->vec.f32_to_f16 = f32_to_f16;
    k->vec.f16_to_f32 = f16_to_f32;
    k->vec.sum_sq = sum_sq;
    k->vec.silu_mul = silu_mul;
    k->vec.gelu_mul = gelu_mul;
}
