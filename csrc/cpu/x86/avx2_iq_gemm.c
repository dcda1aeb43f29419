/* avx2_iq_gemm.c - AVX2 products of the lattice types' prompt tiles: the
 * PE_PACK_ROWS weight rows ref_iquants.c's pack16 expanded into signed int8
 * levels with their 16-bit pair multipliers (pe_lattice_row), against up to
 * PE_GEMM_COLS Q8_K activation rows.
 *
 * Per 32 weights: maddubs(|q|, level * sign(q)) gives the 16 exact pair
 * products (|level| <= 62, |q| <= 128: at most 15872, no saturation; the
 * sign moves onto the level so that a code of -128 is exact too), madd
 * applies the pairs' odd multipliers (<= 31), and the 32-bit lanes add up
 * over the super-block (below 2^26).  IQ1's shifts pair the codes with
 * maddubs(1, q) and take their signed multipliers the same way.  The float
 * part is iquants.h's pe_lattice_gemm16, shared with the scalar kernel, so
 * every result is its bits (and vec_dot's). */
#include <immintrin.h>

#include "internal.h"
#include "iquants.h"
#include "x86_reduce.h"

static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* one super-block of one row against one activation row: sumi and shifts */
static void block_sums(const pe_lattice_row *w, const int8_t *q, int has_shifts, int32_t *sumi,
                              int32_t *shifts) {
    __m256i products = _mm256_setzero_si256(), shifted = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi8(1);
    for (int c = 0; c < QK_K / 32; c++) {
        const __m256i codes = load256(q + 32 * c);
        const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(codes, codes),
                                                   _mm256_sign_epi8(load256(w->level + 32 * c), codes));
        products = _mm256_add_epi32(products, _mm256_madd_epi16(pairs, load256(w->mult + 16 * c)));
        if (has_shifts) {
            const __m256i code_pairs = _mm256_maddubs_epi16(ones, codes);
            shifted = _mm256_add_epi32(shifted, _mm256_madd_epi16(code_pairs, load256(w->shift + 16 * c)));
        }
    }
    *sumi = x86_sum_epi32x8(products);
    *shifts = has_shifts ? x86_sum_epi32x8(shifted) : 0;
}

static void lattice_gemm16(int64_t n, float *s, size_t bs, const void *packed, const void *a, size_t ba, int nc) {
    pe_lattice_gemm16(n, s, bs, packed, a, ba, nc, block_sums);
}

void pe_fill_avx2_iq_gemm(pe_kernels *k) {
    const int types[] = {PE_TYPE_IQ2_XXS, PE_TYPE_IQ2_XS, PE_TYPE_IQ2_S, PE_TYPE_IQ3_XXS, PE_TYPE_IQ3_S,
                         PE_TYPE_IQ1_S, PE_TYPE_IQ1_M};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) k->type[types[i]].packed.gemm16 = lattice_gemm16;
}
