/* avx512_gemm.c - AVX-512 VNNI dot products of Q4_0 Q4_1 Q5_0 Q5_1 Q8_0
 * Q4_K Q5_K Q6_K: vec_dot and the matmul's GEMM micro-kernel (see
 * x86_gemm.h).  256-bit vectors: on Zen 4 a 512-bit operation costs two
 * 256-bit ones, and the tile layout fills a 256-bit vector exactly; AVX-512
 * brings vpdpbusd, byte masks and 32 registers.  The decoding kernels also
 * come in 512-bit vectors over two groups of 8 rows (x86_gemm_rows16.h):
 * where the weights are in cache, or several activation rows share them,
 * a product is bound by its instructions, and there they take half. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define PE_GEMM_VNNI 1
#include "x86_gemm.h"
#include "x86_gemm_kquants.h"
#include "x86_gemm_rows8.h"
#include "x86_gemm_rows16.h"

GM_DEFINE_ALL_LEGACY()
GMK_DEFINE_ALL_KQUANTS()

void pe_fill_avx512_gemm(pe_kernels *k) {
    GM_INSTALL_ALL(k);
    GR_INSTALL_ALL(k);
    if (!gm_gemm_switched("8")) GP_INSTALL_ALL(k);
}
