/* avx512_legacy.c - placeholder until the kernels land. */
#include "internal.h"

void pe_fill_avx512_legacy(pe_kernels *k) { (void)k; }
