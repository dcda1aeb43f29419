/* vec_ssm.c compiled for NEON (twice: see PE_NEON_NAME in kernels.h), its
 * vectors NEON's four floats. */
#if defined(PE_NEON_NODOT)
#define PE_VEC_SUFFIX neon_nodot
#else
#define PE_VEC_SUFFIX neon
#endif
#define PE_SSM_NEON 1
#include "../vec_ssm.c"
