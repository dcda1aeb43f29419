/* avx2_gemm.c - AVX2 dot products of Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K
 * Q6_K: vec_dot and the matmul's GEMM micro-kernel, one accumulation scheme
 * for both (see x86_gemm.h).  avxvnni_gemm.c compiles this again with
 * AVX-VNNI's vpdpbusd (PE_GEMM_AVXVNNI) under its own fill function. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "x86_gemm.h"
#include "x86_gemm_kquants.h"
#include "x86_gemm_rows8.h"

GM_DEFINE_ALL_LEGACY()
GMK_DEFINE_ALL_KQUANTS()

#ifndef PE_AVX2_GEMM_FILL
#define PE_AVX2_GEMM_FILL pe_fill_avx2_gemm
#endif
void PE_AVX2_GEMM_FILL(pe_kernels *k) {
    GM_INSTALL_ALL(k);
    GR_INSTALL_ALL(k);
}
