/* vec.c compiled for NEON (twice: see PE_NEON_NAME in kernels.h). */
#if defined(PE_NEON_NODOT)
#define PE_VEC_SUFFIX neon_nodot
#else
#define PE_VEC_SUFFIX neon
#endif
#include "../vec.c"
