/* avx512_kquants.c - placeholder until the kernels land. */
#include "internal.h"

void pe_fill_avx512_kquants(pe_kernels *k) { (void)k; }
