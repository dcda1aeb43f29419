/* vec_ssm.c compiled with AVX-512 flags. */
#define PE_VEC_SUFFIX avx512
#include "../vec_ssm.c"
