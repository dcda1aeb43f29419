/* ref_legacy.c - placeholder until the kernels land. */
#include "internal.h"

void pe_fill_ref_legacy(pe_kernels *k) { (void)k; }
