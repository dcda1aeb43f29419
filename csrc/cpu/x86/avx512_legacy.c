/* avx512_legacy.c - AVX-512 (F BW VL DQ) + VNNI kernels of the legacy block
 * types (the float types keep AVX2's).  The table starts as a copy of the AVX2 one;
 * this file overrides what masks, VNNI and wider vectors make faster.  The
 * block types' dot products (vec_dot and gemm) are in avx512_gemm.c.
 * Quantizers and dequantizers are exact. */
#include <immintrin.h>
#include <string.h>

#include "blocks.h"
#include "internal.h"

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

/* The float types (F32 F16 BF16) keep the AVX2 table's kernels: their products
 * are the canonical arithmetic (four 8-lane accumulators over 32 elements), which
 * 16-lane accumulators or vdpbf16ps would not give. */

void pe_fill_avx512_legacy(pe_kernels *k) {
    /* the block types' dot products (vec_dot and gemm) are in *_gemm.c */
    k->type[PE_TYPE_Q4_0].to_float = dequantize_q4_0;
    k->type[PE_TYPE_Q4_1].to_float = dequantize_q4_1;
    k->type[PE_TYPE_Q5_0].to_float = dequantize_q5_0;
    k->type[PE_TYPE_Q5_1].to_float = dequantize_q5_1;
    k->type[PE_TYPE_Q8_0].to_float = dequantize_q8_0;
    k->type[PE_TYPE_Q8_0].from_float = quantize_q8_0;
    k->type[PE_TYPE_Q8_1].from_float = quantize_q8_1;
}
