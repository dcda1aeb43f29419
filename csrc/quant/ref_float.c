/* ref_float.c - placeholder until the kernels land. */
#include "internal.h"

void pe_fill_ref_float(pe_kernels *k) { (void)k; }
