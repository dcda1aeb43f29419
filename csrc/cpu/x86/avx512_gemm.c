/* avx512_gemm.c - AVX-512 VNNI dot products of Q4_0 Q4_1 Q5_0 Q5_1 Q8_0
 * Q4_K Q5_K Q6_K: vec_dot and the matmul's GEMM micro-kernel (see
 * x86_gemm.h).  256-bit vectors: on Zen 4 a 512-bit operation costs two
 * 256-bit ones, and the tile layout fills a 256-bit vector exactly; AVX-512
 * brings vpdpbusd, byte masks and 32 registers. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define PE_GEMM_VNNI 1
#include "x86_gemm.h"
#include "x86_gemm_kquants.h"

GM_DEFINE_ALL_LEGACY()
GMK_DEFINE_ALL_KQUANTS()

void pe_fill_avx512_gemm(pe_kernels *k) {
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
