/* vec_ssm.c compiled with AVX2 flags. */
#define PE_VEC_SUFFIX avx2
#include "../vec_ssm.c"
