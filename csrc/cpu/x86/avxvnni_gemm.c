/* avxvnni_gemm.c - the AVX2 dot products and GEMM kernels (avx2_gemm.c)
 * with AVX-VNNI's vpdpbusd in place of maddubs + madd: Intel's cores from
 * Alder Lake on and AMD's Zen 5 have it, many without AVX-512.  The integer
 * sums are the same, so every result equals the AVX2 table's bit for bit.
 * Built where the compiler knows the instruction (CMakeLists.txt), chosen
 * where the CPU has it (dispatch.c). */
#define PE_GEMM_AVXVNNI 1
#define PE_AVX2_GEMM_FILL pe_fill_avxvnni_gemm
#include "avx2_gemm.c"
