/* avx512_kquants.c - AVX-512 k-quant kernels beyond the AVX2 ones this table
 * starts from (Q4_K, Q5_K and Q6_K are in avx512_gemm.c).
 *
 * Only Q2_K's repacked-batch paths: llama.cpp's AVX-512 build runs its AVX2 dot products for
 * Q2_K, Q3_K and IQ4_XS, and a dot product's eight float lanes must hold the
 * same integer sums as llama's for the result to match it bit for bit; the
 * AVX2 kernels (avx2_kquants.c) do exactly that.  Wider integer kernels that
 * fold into the same eight lanes may come back here. */
#include "internal.h"

/* avx2_kquants.c: Q2_K's repacked-batch paths, which only the AVX-512 build has */
void pe_q2k_vec_dot_path_avx512(int64_t n, float *s, const void *vw, const void *va, unsigned path);

void pe_fill_avx512_kquants(pe_kernels *k) {
    k->type[PE_TYPE_Q2_K].vec_dot_path = pe_q2k_vec_dot_path_avx512;
}
