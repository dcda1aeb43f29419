/* ref_kquants.c - placeholder until the kernels land. */
#include "internal.h"

void pe_fill_ref_kquants(pe_kernels *k) { (void)k; }
