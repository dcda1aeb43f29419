/* avx512_iq_gemm.c - AVX-512 VNNI products of the lattice types' prompt
 * tiles (avx2_iq_gemm.c's scheme in 512-bit vectors): per 64 weights,
 * maddubs(|q|, level * sign(q)) gives the 32 exact pair products (|level| <=
 * 62, |q| <= 128: at most 15872, no saturation; the sign goes onto the level,
 * so a code of -128 is exact), and vpdpwssd multiplies them by the pairs'
 * odd multipliers (<= 31) into the 32-bit lanes in one instruction (the
 * super-block's sum stays below 2^26).  IQ1's shifts pair the codes with
 * maddubs(1, q) the same way.  The float part is iquants.h's
 * pe_lattice_gemm16, so every result is the scalar kernel's bits. */
#include <immintrin.h>

#include "internal.h"
#include "iquants.h"

static inline __m512i load512(const void *p) { return _mm512_loadu_si512(p); }

/* one super-block of one row against one activation row: sumi and shifts */
static void block_sums(const pe_lattice_row *w, const int8_t *q, int has_shifts, int32_t *sumi, int32_t *shifts) {
    __m512i products = _mm512_setzero_si512(), shifted = _mm512_setzero_si512();
    const __m512i ones = _mm512_set1_epi8(1);
    for (int c = 0; c < QK_K / 64; c++) {
        const __m512i codes = load512(q + 64 * c), level = load512(w->level + 64 * c);
        const __m512i signed_level = _mm512_mask_sub_epi8(level, _mm512_movepi8_mask(codes), _mm512_setzero_si512(),
                                                          level);
        const __m512i pairs = _mm512_maddubs_epi16(_mm512_abs_epi8(codes), signed_level);
        products = _mm512_dpwssd_epi32(products, pairs, load512(w->mult + 32 * c));
        if (has_shifts)
            shifted = _mm512_dpwssd_epi32(shifted, _mm512_maddubs_epi16(ones, codes), load512(w->shift + 32 * c));
    }
    *sumi = _mm512_reduce_add_epi32(products);
    *shifts = has_shifts ? _mm512_reduce_add_epi32(shifted) : 0;
}

static void lattice_gemm16(int64_t n, float *s, size_t bs, const void *packed, const void *a, size_t ba, int nc) {
    pe_lattice_gemm16(n, s, bs, packed, a, ba, nc, block_sums);
}

void pe_fill_avx512_iq_gemm(pe_kernels *k) {
    const int types[] = {PE_TYPE_IQ2_XXS, PE_TYPE_IQ2_XS, PE_TYPE_IQ2_S, PE_TYPE_IQ3_XXS, PE_TYPE_IQ3_S,
                         PE_TYPE_IQ1_S, PE_TYPE_IQ1_M};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) k->type[types[i]].packed.gemm16 = lattice_gemm16;
}
