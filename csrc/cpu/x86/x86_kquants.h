/* x86_kquants.h - AVX2 helpers the AVX2 and AVX-512 k-quant kernels share
 * (both files are compiled with AVX2 enabled). */
#ifndef PE_X86_KQUANTS_H
#define PE_X86_KQUANTS_H

#include <immintrin.h>

#include "kquants.h"
#include "x86_reduce.h"

static inline float f16(pe_f16 h) { return _cvtsh_ss(h); }

static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline __m128i load128(const void *p) { return _mm_loadu_si128((const __m128i *)p); }

/* The sixteen 6-bit scales of Q3_K (see pe_q3k_unpack) as signed 16-bit
 * lanes, unpacked in registers: reading the 12 bytes as one 16-byte vector
 * could cross the end of the row. */
static inline __m256i q3k_scales(const uint8_t *packed) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)packed);
    const __m128i m4 = _mm_set1_epi8(0xF);
    /* low nibbles: scales 0..7 from the low halves of bytes 0..7, 8..15 from the high */
    const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(b, m4), _mm_and_si128(_mm_srli_epi16(b, 4), m4));
    /* top 2 bits: scale j at bits 2 (j / 4) of byte 8 + j % 4 */
    int32_t top;
    memcpy(&top, packed + 8, 4);
    const __m128i t = _mm_srlv_epi32(_mm_set1_epi32(top), _mm_setr_epi32(0, 2, 4, 6));
    const __m128i hi = _mm_slli_epi16(_mm_and_si128(t, _mm_set1_epi8(3)), 4);
    return _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_or_si128(lo, hi), _mm_set1_epi8(32)));
}

/* Q4_K / Q5_K: the 12 packed bytes unpacked in registers (see pe_k4_scale_min)
 * to bytes [scale 0..7, min 0..7]. */
static inline __m128i k4_unpack(const uint8_t *packed) {
    int32_t tail;
    memcpy(&tail, packed + 8, 4);
    const __m128i v = _mm_insert_epi32(_mm_loadl_epi64((const __m128i *)packed), tail, 2);
    /* [b0..3, b8..11, b4..7, b8..11]: low 6 bits of b0..7, low / high nibbles of b8..11 */
    const __m128i p = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    const __m128i low = _mm_and_si128(_mm_srlv_epi32(p, _mm_setr_epi32(0, 0, 0, 4)),
                                      _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    /* the top 2 bits of b0..3 / b4..7 become bits 4..5 of scales / mins 4..7 */
    const __m128i q = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    const __m128i high = _mm_srli_epi16(_mm_and_si128(q, _mm_set1_epi8((char)0xC0)), 2);
    return _mm_or_si128(low, high);
}

#endif /* PE_X86_KQUANTS_H */
