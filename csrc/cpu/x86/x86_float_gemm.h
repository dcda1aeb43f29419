/* x86_float_gemm.h - what the F16 gemms of avx2_legacy.c and avx512_legacy.c
 * share: the row product pair by pair, for the tiles they do not take. */
#ifndef PE_X86_FLOAT_GEMM_H
#define PE_X86_FLOAT_GEMM_H

#include "internal.h"

/* weight rows 0 .. nr - 1 against activation rows 0 .. nc - 1, pair by pair */
static inline void fg_pairs(pe_vec_dot_fn dot, int64_t n, float *s, size_t bs, const void *w, size_t bw,
                            const void *a, size_t ba, int nr, int nc) {
    for (int j = 0; j < nc; j++)
        for (int i = 0; i < nr; i++)
            dot(n, s + (size_t)j * bs + i, (const uint8_t *)w + (size_t)i * bw, (const uint8_t *)a + (size_t)j * ba);
}

#endif /* PE_X86_FLOAT_GEMM_H */
