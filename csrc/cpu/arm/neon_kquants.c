/* neon_kquants.c - placeholder until the kernels land. */
#include "internal.h"

void pe_fill_neon_kquants(pe_kernels *k) { (void)k; }
