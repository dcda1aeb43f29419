/* gelu.c - GELU through a table indexed by the input's F16 bits, the way
 * GGML computes it, so GELU models (Gemma) match llama.cpp's numerics. */
#include <math.h>

#include "blocks.h"
#include "internal.h"

/* two spare entries: a vector gather reads 32 bits at the last one */
uint16_t pe_gelu_table[(1 << 16) + 2];

/* GGML's formula as GCC builds it for an FMA target: the inner 1 + a*x*x is
 * one fused multiply-add (the table must hold the same F16 values). */
static float gelu_tanh(float x) {
    const float inner = fmaf(0.044715f * x, x, 1.0f);
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * x * inner));
}

void pe_gelu_table_init(void) {
    for (uint32_t i = 0; i < (1u << 16); i++)
        pe_gelu_table[i] = pe_f32_to_f16(gelu_tanh(pe_f16_to_f32((pe_f16)i)));
}
