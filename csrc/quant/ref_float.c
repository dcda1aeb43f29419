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

/* The dot product of n elements of one float type (elem bytes each, widened by
 * to_float): the 32-element steps, the fold, then the tail's products in double. */
static float float_dot(int64_t n, const void *w, const void *a, size_t elem, pe_to_float_fn to_float, int by_halves) {
    const uint8_t *x = w, *y = a;
    float acc[4][REF_LANES] = {{0}};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        float xf[32], yf[32];
        to_float(x + (size_t)i * elem, xf, 32);
        to_float(y + (size_t)i * elem, yf, 32);
        dot_step32(xf, yf, acc);
    }
    double sum = dot_fold(acc, by_halves);
    for (; i < n; i++) {
        float xi, yi;
        to_float(x + (size_t)i * elem, &xi, 1);
        to_float(y + (size_t)i * elem, &yi, 1);
        sum += (double)(xi * yi);
    }
    return (float)sum;
}

/* ---- F32 ------------------------------------------------------------------ */

static void f32_copy_to_float(const void *x, float *y, int64_t n) {
    memcpy(y, x, (size_t)n * sizeof(float));
}

static void f32_copy_from_float(const float *x, void *y, int64_t n) {
    memcpy(y, x, (size_t)n * sizeof(float));
}

static void f32_vec_dot(int64_t n, float *s, const void *w, const void *a) {
    *s = float_dot(n, w, a, sizeof(float), f32_copy_to_float, 0);
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
    *s = float_dot(n, w, a, sizeof(pe_f16), f16_to_float, 0);
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
    *s = float_dot(n, w, a, sizeof(pe_bf16), bf16_to_float, 1);
}

void pe_fill_ref_float(pe_kernels *k) {
    k->type[PE_TYPE_F32]  = (pe_type_kernels){f32_copy_to_float, f32_copy_from_float, f32_vec_dot};
    k->type[PE_TYPE_F16]  = (pe_type_kernels){f16_to_float, f16_from_float, f16_vec_dot};
    k->type[PE_TYPE_BF16] = (pe_type_kernels){bf16_to_float, bf16_from_float, bf16_vec_dot};
}
