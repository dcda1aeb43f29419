/* avx2_gemm.c - AVX2 dot products of Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K
 * Q6_K: vec_dot and the matmul's GEMM micro-kernel, one accumulation scheme
 * for both (see x86_gemm.h). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "x86_gemm.h"
#include "x86_gemm_kquants.h"

GM_DEFINE_ALL_LEGACY()
GMK_DEFINE_ALL_KQUANTS()

void pe_fill_avx2_gemm(pe_kernels *k) {
    const int with_gemm = gm_gemm_enabled();
    GM_INSTALL(k, PE_TYPE_Q4_0, q4_0, with_gemm);
    GM_INSTALL(k, PE_TYPE_Q4_1, q4_1, with_gemm);
    GM_INSTALL(k, PE_TYPE_Q5_0, q5_0, with_gemm);
    GM_INSTALL(k, PE_TYPE_Q5_1, q5_1, with_gemm);
    GM_INSTALL(k, PE_TYPE_Q8_0, q8_0, with_gemm);
    GM_INSTALL(k, PE_TYPE_Q4_K, q4_K, with_gemm);
    GM_INSTALL(k, PE_TYPE_Q5_K, q5_K, with_gemm);
    GM_INSTALL(k, PE_TYPE_Q6_K, q6_K, with_gemm);
}
