/* gelu.c - GELU through a table indexed by the input's F16 bits, the way
 * GGML computes it.  The table is built from pe_tanhf (double arithmetic,
 * no C library tanh), so it holds the same values on every CPU and system. */
#include <math.h>

#include "blocks.h"
#include "internal.h"
#include "vec_math.h"

/* no a*b+c fused by the compiler: the same bits whatever the flags */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* two spare entries: a vector gather reads 32 bits at the last one */
uint16_t pe_gelu_table[(1 << 16) + 2];

/* GGML's formula, the inner 1 + a*x*x one fused multiply-add */
static float gelu_tanh(float x) {
    const float inner = fmaf(0.044715f * x, x, 1.0f);
    return 0.5f * x * (1.0f + pe_tanhf(0.7978845608028654f * x * inner));
}

void pe_gelu_table_init(void) {
    for (uint32_t i = 0; i < (1u << 16); i++)
        pe_gelu_table[i] = pe_f32_to_f16(gelu_tanh(pe_f16_to_f32((pe_f16)i)));
}
