/* vec.c compiled for NEON. */
#define PE_VEC_SUFFIX neon
#include "../vec.c"
