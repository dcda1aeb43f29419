/* vec.c compiled with AVX2 flags. */
#define PE_VEC_SUFFIX avx2
#include "../vec.c"
