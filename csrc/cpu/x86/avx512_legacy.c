/* avx512_legacy.c - AVX-512 (F BW VL DQ) + VNNI kernels of the float types
 * and the legacy block types.  The table starts as a copy of the AVX2 one;
 * this file overrides what masks, VNNI and wider vectors make faster.
 *
 * Block dot products take one block per 256-bit register and use vpdpbusd
 * (unsigned x signed bytes summed in 32-bit lanes): signed weight codes are
 * read unsigned with an offset c and c * sum(activations) is taken off with
 * a second vpdpbusd (Q8_0 moves the weight's sign onto the activation
 * instead).  256-bit registers beat two blocks per 512-bit register on Zen 4,
 * where a 512-bit operation costs two 256-bit ones and the packing is extra
 * work.  Results differ from the reference only in the order of the float
 * additions; quantizers and dequantizers are exact. */
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

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Scales of four consecutive blocks: the first two halves of each weight
 * block (d, and m for the _1 types) times those of its activation block (d,
 * and s for Q8_1): lanes 2k and 2k+1 hold dw*da and mw*sa of block k.  Past
 * the first `count` blocks the last one is repeated (never read past the row). */
static inline __m256 scales_4(const uint8_t *w, size_t w_stride, const uint8_t *a, size_t a_stride, int64_t count) {
    __m128i hw = _mm_cvtsi32_si128((int)load_u32(w));
    __m128i ha = _mm_cvtsi32_si128((int)load_u32(a));
    const size_t k1 = count > 1 ? 1 : 0, k2 = count > 2 ? 2 : k1, k3 = count > 3 ? 3 : k2;
    hw = _mm_insert_epi32(hw, (int)load_u32(w + k1 * w_stride), 1);
    ha = _mm_insert_epi32(ha, (int)load_u32(a + k1 * a_stride), 1);
    hw = _mm_insert_epi32(hw, (int)load_u32(w + k2 * w_stride), 2);
    ha = _mm_insert_epi32(ha, (int)load_u32(a + k2 * a_stride), 2);
    hw = _mm_insert_epi32(hw, (int)load_u32(w + k3 * w_stride), 3);
    ha = _mm_insert_epi32(ha, (int)load_u32(a + k3 * a_stride), 3);
    return _mm256_mul_ps(_mm256_cvtph_ps(hw), _mm256_cvtph_ps(ha));
}

static inline __m256 lane(__m256 v, int i) { return _mm256_permutexvar_ps(_mm256_set1_epi32(i), v); }

/* A block's 16 nibble bytes -> 32 codes 0..15: low nibbles (elements 0..15)
 * in the low half, high nibbles in the high half. */
static inline __m256i nibbles32(const uint8_t *qs) {
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    const __m256i shifted = _mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4));
    return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
}

static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* ---- weight codes per block, as unsigned bytes ------------------------------------ */

/* Each returns a block's 32 codes in element order; the signed types are
 * read with an offset (OFFSET below) taken off in the dot product. */
static inline __m256i codes_q4_0(const block_q4_0 *b) { return nibbles32(b->qs); }
static inline __m256i codes_q4_1(const block_q4_1 *b) { return nibbles32(b->qs); }

static inline __m256i codes_q5_0(const block_q5_0 *b) {
    const __m256i low = nibbles32(b->qs);
    return _mm256_mask_add_epi8(low, _cvtu32_mask32(load_u32(b->qh)), low, _mm256_set1_epi8(0x10));
}

static inline __m256i codes_q5_1(const block_q5_1 *b) {
    const __m256i low = nibbles32(b->qs);
    return _mm256_mask_add_epi8(low, _cvtu32_mask32(load_u32(b->qh)), low, _mm256_set1_epi8(0x10));
}

static inline __m256i codes_q8_0(const block_q8_0 *b) { return load32(b->qs); }

/* ---- dot products ------------------------------------------------------------------ */

/* Per 32-bit lane, the sum of 4 products (codes - offset) * a. */
static inline __m256 dot_codes(__m256i codes, __m256i a, int offset) {
    __m256i sums;
    if (offset == 128) { /* Q8_0: signed codes; move their sign onto a */
        sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(codes), _mm256_sign_epi8(a, codes));
    } else {
        sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), codes, a);
        if (offset)
            sums = _mm256_sub_epi32(sums, _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)offset), a));
    }
    return _mm256_cvtepi32_ps(sums);
}

/* Four blocks per iteration (their scales converted together) into two
 * accumulators; m*s terms gather in the odd lanes of `mins`.  The last 1-3
 * blocks take one more pass of the same code. */
#define DEFINE_VEC_DOT(NAME, WBLOCK, ABLOCK, CODES, OFFSET, WITH_MIN)                         \
    static void NAME(int64_t n, float *s, const void *vw, const void *va) {                   \
        const WBLOCK *w = vw;                                                                  \
        const ABLOCK *a = va;                                                                  \
        const int64_t nb = n / 32;                                                             \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), mins = _mm256_setzero_ps(); \
        int64_t ib = 0;                                                                        \
        for (; ib + 4 <= nb; ib += 4) {                                                        \
            const __m256 sc = scales_4((const uint8_t *)&w[ib], sizeof *w, (const uint8_t *)&a[ib], sizeof *a, 4); \
            if (WITH_MIN) mins = _mm256_add_ps(mins, sc);                                      \
            acc0 = _mm256_fmadd_ps(lane(sc, 0), dot_codes(CODES(&w[ib]), load32(a[ib].qs), OFFSET), acc0); \
            acc1 = _mm256_fmadd_ps(lane(sc, 2), dot_codes(CODES(&w[ib + 1]), load32(a[ib + 1].qs), OFFSET), acc1); \
            acc0 = _mm256_fmadd_ps(lane(sc, 4), dot_codes(CODES(&w[ib + 2]), load32(a[ib + 2].qs), OFFSET), acc0); \
            acc1 = _mm256_fmadd_ps(lane(sc, 6), dot_codes(CODES(&w[ib + 3]), load32(a[ib + 3].qs), OFFSET), acc1); \
        }                                                                                      \
        if (ib < nb) {                                                                         \
            const int64_t r = nb - ib;                                                         \
            const __m256 sc = scales_4((const uint8_t *)&w[ib], sizeof *w, (const uint8_t *)&a[ib], sizeof *a, r); \
            if (WITH_MIN) mins = _mm256_add_ps(mins, MASK_FIRST_BLOCKS);                       \
            acc0 = _mm256_fmadd_ps(lane(sc, 0), dot_codes(CODES(&w[ib]), load32(a[ib].qs), OFFSET), acc0); \
            if (r > 1)                                                                         \
                acc1 = _mm256_fmadd_ps(lane(sc, 2), dot_codes(CODES(&w[ib + 1]), load32(a[ib + 1].qs), OFFSET), acc1); \
            if (r > 2)                                                                         \
                acc0 = _mm256_fmadd_ps(lane(sc, 4), dot_codes(CODES(&w[ib + 2]), load32(a[ib + 2].qs), OFFSET), acc0); \
        }                                                                                      \
        __m256 total = _mm256_add_ps(acc0, acc1);                                              \
        if (WITH_MIN) /* the odd lanes of mins */                                              \
            total = _mm256_add_ps(total, _mm256_blend_ps(_mm256_setzero_ps(), mins, 0xAA));    \
        *s = hsum_ps(total);                                                                   \
    }

/* the lanes of sc that belong to the r blocks present */
#define MASK_FIRST_BLOCKS _mm256_maskz_mov_ps((__mmask8)((1u << (2 * r)) - 1), sc)

DEFINE_VEC_DOT(vec_dot_q4_0_q8_0, block_q4_0, block_q8_0, codes_q4_0, 8, 0)
DEFINE_VEC_DOT(vec_dot_q4_1_q8_1, block_q4_1, block_q8_1, codes_q4_1, 0, 1)
DEFINE_VEC_DOT(vec_dot_q5_0_q8_0, block_q5_0, block_q8_0, codes_q5_0, 16, 0)
DEFINE_VEC_DOT(vec_dot_q5_1_q8_1, block_q5_1, block_q8_1, codes_q5_1, 0, 1)
DEFINE_VEC_DOT(vec_dot_q8_0_q8_0, block_q8_0, block_q8_0, codes_q8_0, 128, 0)

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

static inline __m512 load_f32x16(const float *p, __mmask16 k) { return _mm512_maskz_loadu_ps(k, p); }

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

/* Float dot loops: 64 elements per iteration in four accumulators, then 16
 * at a time, the last partial vector masked. */
#define DEFINE_FLOAT_DOT(NAME, ELEM, LOAD16)                                                  \
    static void NAME(int64_t n, float *s, const void *vw, const void *va) {                   \
        const ELEM *x = vw, *y = va;                                                           \
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();                         \
        __m512 acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();                         \
        int64_t i = 0;                                                                         \
        for (; i + 64 <= n; i += 64) {                                                         \
            acc0 = _mm512_fmadd_ps(LOAD16(x + i, 0xFFFF), LOAD16(y + i, 0xFFFF), acc0);        \
            acc1 = _mm512_fmadd_ps(LOAD16(x + i + 16, 0xFFFF), LOAD16(y + i + 16, 0xFFFF), acc1); \
            acc2 = _mm512_fmadd_ps(LOAD16(x + i + 32, 0xFFFF), LOAD16(y + i + 32, 0xFFFF), acc2); \
            acc3 = _mm512_fmadd_ps(LOAD16(x + i + 48, 0xFFFF), LOAD16(y + i + 48, 0xFFFF), acc3); \
        }                                                                                      \
        for (; i < n; i += 16) {                                                               \
            const __mmask16 m = n - i >= 16 ? 0xFFFF : first(n - i);                           \
            acc0 = _mm512_fmadd_ps(LOAD16(x + i, m), LOAD16(y + i, m), acc0);                  \
        }                                                                                      \
        *s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3))); \
    }

DEFINE_FLOAT_DOT(f32_vec_dot, float, load_f32x16)
DEFINE_FLOAT_DOT(bf16_vec_dot, pe_bf16, load_bf16x16)
/* F16's dot stays AVX2's: 512-bit vcvtph2ps is half as fast on Zen 4, which
 * made this loop 1.5x slower than the 256-bit one. */

void pe_fill_avx512_legacy(pe_kernels *k) {
    k->type[PE_TYPE_F32].vec_dot = f32_vec_dot;
    k->type[PE_TYPE_F16].to_float = f16_to_float;
    k->type[PE_TYPE_F16].from_float = f16_from_float;
    k->type[PE_TYPE_BF16] = (pe_type_kernels){bf16_to_float, bf16_from_float, bf16_vec_dot};

    k->type[PE_TYPE_Q4_0].to_float = dequantize_q4_0;
    k->type[PE_TYPE_Q4_0].vec_dot = vec_dot_q4_0_q8_0;
    k->type[PE_TYPE_Q4_1].to_float = dequantize_q4_1;
    k->type[PE_TYPE_Q4_1].vec_dot = vec_dot_q4_1_q8_1;
    k->type[PE_TYPE_Q5_0].to_float = dequantize_q5_0;
    k->type[PE_TYPE_Q5_0].vec_dot = vec_dot_q5_0_q8_0;
    k->type[PE_TYPE_Q5_1].to_float = dequantize_q5_1;
    k->type[PE_TYPE_Q5_1].vec_dot = vec_dot_q5_1_q8_1;
    k->type[PE_TYPE_Q8_0] = (pe_type_kernels){dequantize_q8_0, quantize_q8_0, vec_dot_q8_0_q8_0};
    k->type[PE_TYPE_Q8_1].from_float = quantize_q8_1;
}
