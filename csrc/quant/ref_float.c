/* ref_float.c - scalar reference kernels of the float types F32, F16, BF16.
 *
 * Conversions round to nearest even (what F16C and GGML's reference do).  The
 * dot products are the canonical arithmetic (ref_lanes.h): four accumulators
 * of eight lanes over each 32 elements, acc = fma(x, y, acc), folded lane by
 * lane as (acc0 + acc2) + (acc1 + acc3) and then across the lanes (F32, F16
 * by halves then pairs, BF16 by halves); the elements past the last full 32
 * add their float products in double. */
#include <string.h>

#include "blocks.h"
#include "internal.h"
#include "ref_lanes.h"

/* The reference must not depend on compile flags: keep a*b+c two roundings. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* ---- the dot products ------------------------------------------------------ */

/* One step of 32 elements: acc[j][t] = fma(x[8j + t], y[8j + t], acc[j][t]). */
static void dot_step32(const float x[32], const float y[32], float acc[4][REF_LANES]) {
    for (int j = 0; j < 4; j++)
        for (int t = 0; t < REF_LANES; t++) acc[j][t] = fmaf(x[REF_LANES * j + t], y[REF_LANES * j + t], acc[j][t]);
}

/* The accumulators folded lane by lane, (acc0 + acc2) + (acc1 + acc3), then
 * across the lanes by halves (BF16) or by halves then pairs (F32, F16). */
static float dot_fold(float acc[4][REF_LANES], int by_halves) {
    float v[REF_LANES];
    for (int t = 0; t < REF_LANES; t++) v[t] = (acc[0][t] + acc[2][t]) + (acc[1][t] + acc[3][t]);
    return by_halves ? lanes_sum_halves(v) : lanes_sum_pairs(v);
}

/* ---- F32 ------------------------------------------------------------------ */

static void f32_copy_to_float(const void *x, float *y, int64_t n) {
    memcpy(y, x, (size_t)n * sizeof(float));
}

static void f32_copy_from_float(const float *x, void *y, int64_t n) {
    memcpy(y, x, (size_t)n * sizeof(float));
}

static void f32_vec_dot(int64_t n, float *s, const void *w, const void *a) {
    const float *x = w, *y = a;
    float acc[4][REF_LANES] = {{0}};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) dot_step32(x + i, y + i, acc);
    double sum = dot_fold(acc, 0);
    for (; i < n; i++) sum += (double)(x[i] * y[i]);
    *s = (float)sum;
}

/* ---- F16 ------------------------------------------------------------------ */

static void f16_to_float(const void *x, float *y, int64_t n) {
    const pe_f16 *h = x;
    for (int64_t i = 0; i < n; i++) y[i] = pe_f16_to_f32(h[i]);
}

static void f16_from_float(const float *x, void *y, int64_t n) {
    pe_f16 *h = y;
    for (int64_t i = 0; i < n; i++) h[i] = pe_f32_to_f16(x[i]);
}

static void f16_vec_dot(int64_t n, float *s, const void *w, const void *a) {
    const pe_f16 *x = w, *y = a;
    float acc[4][REF_LANES] = {{0}};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        float xf[32], yf[32];
        f16_to_float(x + i, xf, 32);
        f16_to_float(y + i, yf, 32);
        dot_step32(xf, yf, acc);
    }
    double sum = dot_fold(acc, 0);
    for (; i < n; i++) sum += (double)(pe_f16_to_f32(x[i]) * pe_f16_to_f32(y[i]));
    *s = (float)sum;
}

/* ---- BF16 ----------------------------------------------------------------- */

static void bf16_to_float(const void *x, float *y, int64_t n) {
    const pe_bf16 *h = x;
    for (int64_t i = 0; i < n; i++) y[i] = pe_bf16_to_f32(h[i]);
}

static void bf16_from_float(const float *x, void *y, int64_t n) {
    pe_bf16 *h = y;
    for (int64_t i = 0; i < n; i++) h[i] = pe_f32_to_bf16(x[i]);
}

static void bf16_vec_dot(int64_t n, float *s, const void *w, const void *a) {
    const pe_bf16 *x = w, *y = a;
    float acc[4][REF_LANES] = {{0}};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        float xf[32], yf[32];
        bf16_to_float(x + i, xf, 32);
        bf16_to_float(y + i, yf, 32);
        dot_step32(xf, yf, acc);
    }
    double sum = dot_fold(acc, 1);
    for (; i < n; i++) sum += (double)(pe_bf16_to_f32(x[i]) * pe_bf16_to_f32(y[i]));
    *s = (float)sum;
}

void pe_fill_ref_float(pe_kernels *k) {
    k->type[PE_TYPE_F32]  = (pe_type_kernels){f32_copy_to_float, f32_copy_from_float, f32_vec_dot};
    k->type[PE_TYPE_F16]  = (pe_type_kernels){f16_to_float, f16_from_float, f16_vec_dot};
    k->type[PE_TYPE_BF16] = (pe_type_kernels){bf16_to_float, bf16_from_float, bf16_vec_dot};
}
