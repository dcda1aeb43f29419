/* x86_float_gemm.h - what the F16 gemms of avx2_legacy.c and avx512_legacy.c
 * share: which tiles take llamafile's GEMM, and the row product for the rest. */
#ifndef PE_X86_FLOAT_GEMM_H
#define PE_X86_FLOAT_GEMM_H

#include "internal.h"

/* whether activation rows j0 .. j0 + mc - 1 are all on llamafile's GEMM (PE_PATH_MULTI) */
static inline int fg_all_multi(unsigned paths, int j0, int mc) {
    int multi = 1;
    for (int j = j0; j < j0 + mc; j++) multi &= (paths >> (PE_PATH_BITS * j) & PE_PATH_MULTI) != 0;
    return multi;
}

/* weight rows 0 .. nr - 1 against activation rows j0 .. j0 + mc - 1, pair by
 * pair through the row product on each row's path */
static inline void fg_pairs(pe_vec_dot_path_fn dot, int64_t n, float *s, size_t bs, const void *w, size_t bw,
                            const void *a, size_t ba, int nr, int j0, int mc, unsigned paths) {
    for (int j = j0; j < j0 + mc; j++)
        for (int i = 0; i < nr; i++)
            dot(n, s + (size_t)j * bs + i, (const uint8_t *)w + (size_t)i * bw, (const uint8_t *)a + (size_t)j * ba,
                (paths >> (PE_PATH_BITS * j)) & PE_PATH_MASK);
}

#endif /* PE_X86_FLOAT_GEMM_H */
