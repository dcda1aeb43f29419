/* avx512_kquants.c - AVX-512 k-quant kernels beyond the AVX2 ones this table
 * starts from (Q4_K, Q5_K and Q6_K are in avx512_gemm.c).
 *
 * None at present: llama.cpp's AVX-512 build runs its AVX2 dot products for
 * Q2_K, Q3_K and IQ4_XS, and a dot product's eight float lanes must hold the
 * same integer sums as llama's for the result to match it bit for bit; the
 * AVX2 kernels (avx2_kquants.c) do exactly that.  Wider integer kernels that
 * fold into the same eight lanes may come back here. */
#include "internal.h"

void pe_fill_avx512_kquants(pe_kernels *k) { (void)k; }
