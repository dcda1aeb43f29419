/* x86_reduce.h - horizontal sums of AVX2 vectors, shared by the x86 kernels.
 *
 * The float sums fold by halves (lanes i and i + 4, then i and i + 2, then
 * the last two), the order llama.cpp's x86 code adds its lanes in; parity
 * with it depends on that order, so every kernel uses these. */
#ifndef PE_X86_REDUCE_H
#define PE_X86_REDUCE_H

#include <immintrin.h>

static inline float x86_sum_ps4(__m128 v) {
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

static inline float x86_sum_ps8(__m256 v) {
    return x86_sum_ps4(_mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v)));
}

static inline int x86_sum_epi32x4(__m128i v) {
    v = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
    return _mm_cvtsi128_si32(_mm_add_epi32(v, _mm_shuffle_epi32(v, 1)));
}

static inline int x86_sum_epi32x8(__m256i v) {
    return x86_sum_epi32x4(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

#endif /* PE_X86_REDUCE_H */
