/* neon_legacy.c - placeholder until the kernels land. */
#include "internal.h"

void pe_fill_neon_legacy(pe_kernels *k) { (void)k; }
