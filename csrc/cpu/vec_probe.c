/* vec_probe.c - one float kernel of the table in use on the caller's arrays:
 * the tests run each on every instruction set and compare the bits. */
#include <string.h>

#include "internal.h"

/* Kernel `name` over n elements.  x: the input (F16 bits for f16_to_f32),
 * u: the second input (silu_mul, gelu_mul), s: the scalar argument (exp_sum's
 * max, scale_max's and scale_round_f16's scale); y: the output elements (F16
 * bits for f32_to_f16; scale_max's scaled x; max_nan's flag as y[0]),
 * *result: the value returned, if any. */
int pe_vec_probe(const char *name, int64_t n, const void *x, const float *u, float s, void *y, double *result) {
    pe_init();
    const pe_vec_kernels *k = &pe_kern->vec;
    const float *xf = x;
    float *yf = y;
    *result = 0.0;
    if (!strcmp(name, "exp_sum")) *result = k->exp_sum(n, yf, xf, s);
    else if (!strcmp(name, "max")) *result = k->max(n, xf);
    else if (!strcmp(name, "max_nan")) {
        int nan = 0;
        *result = k->max_nan(n, xf, &nan);
        yf[0] = (float)nan;
    } else if (!strcmp(name, "scale_max")) {
        memcpy(yf, xf, (size_t)n * sizeof(float));
        *result = k->scale_max(n, yf, s);
    } else if (!strcmp(name, "sum_sq")) *result = k->sum_sq(n, xf);
    else if (!strcmp(name, "silu_mul")) k->silu_mul(n, yf, xf, u);
    else if (!strcmp(name, "gelu_mul")) k->gelu_mul(n, yf, xf, u);
    else if (!strcmp(name, "scale_round_f16")) k->scale_round_f16(n, yf, xf, s);
    else if (!strcmp(name, "f32_to_f16")) k->f32_to_f16(n, xf, y);
    else if (!strcmp(name, "f16_to_f32")) k->f16_to_f32(n, x, yf);
    else return pe_fail("no vec kernel named '%s'", name);
    return 0;
}

/* values_t_f16 of nh <= 4 heads' probabilities p[nh][n] with the transposed
 * F16 V vt[hd][n], into out[nh][hd] */
int pe_vec_probe_values_t(const float *p, int nh, int64_t n, const uint16_t *vt, int64_t hd, float *out) {
    pe_init();
    if (nh < 1 || nh > 4) return pe_fail("values_t_f16: 1-4 heads");
    const float *ps[4];
    float *outs[4];
    for (int h = 0; h < nh; h++) {
        ps[h] = p + h * n;
        outs[h] = out + h * hd;
    }
    pe_kern->vec.values_t_f16(n, nh, ps, vt, (size_t)n, hd, outs);
    return 0;
}
