/* vec_math.h - the one exp and tanh every instruction set computes.
 *
 * Results must not depend on the table in use (scalar, AVX2, AVX-512, NEON)
 * nor on the C library, so no expf/tanhf: the vector builds of cpu/vec.c
 * compute pe_expf lane by lane with the same operations, and tanh (GELU's
 * table, soft-capping) is built from double arithmetic alone. */
#ifndef PE_VEC_MATH_H
#define PE_VEC_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The constants of pe_expf (and of its vector twins in cpu/vec.c). */
#define PE_EXP_SHIFTER 0x1.8p23f      /* adding it rounds x / ln2 to an integer */
#define PE_EXP_LOG2E   0x1.715476p+0f
#define PE_EXP_LN2_HI  0x1.62e4p-1f   /* ln2 in two parts: n * hi is exact */
#define PE_EXP_LN2_LO  0x1.7f7d1cp-20f
#define PE_EXP_C1 0x1.ffffecp-1f
#define PE_EXP_C2 0x1.fffdb6p-2f
#define PE_EXP_C3 0x1.555e66p-3f
#define PE_EXP_C4 0x1.573e2ep-5f
#define PE_EXP_C5 0x1.0e4020p-7f
#define PE_EXP_LIMIT 192.0f           /* |n| beyond it: 0 or inf */

static inline float pe_exp_pow2(int n) {   /* 2^n, -126 <= n <= 127 */
    const uint32_t bits = (uint32_t)(n + 127) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* poly * 2^n rounded once (what AVX-512's scalef gives): one product where
 * 2^n is a normal float, else two whose first is exact. */
static inline float pe_exp_scale(float poly, float n) {
    const int k = (int)n;
    if (k >= -126 && k <= 127) return poly * pe_exp_pow2(k);
    const int k1 = k >> 1;
    return (poly * pe_exp_pow2(k1)) * pe_exp_pow2(k - k1);
}

/* exp(x): x = n ln2 + b, n = round(x / ln2), then a degree-5 polynomial in b
 * scaled by 2^n; 0 or inf once |n| > 192, NaN for NaN.  Fused multiply-adds
 * where the vector builds have them, so every build rounds alike. */
static inline float pe_expf(float x) {
    const float z = fmaf(x, PE_EXP_LOG2E, PE_EXP_SHIFTER);
    const float n = z - PE_EXP_SHIFTER;
    const float b = fmaf(-n, PE_EXP_LN2_LO, fmaf(-n, PE_EXP_LN2_HI, x));
    if (fabsf(n) > PE_EXP_LIMIT) return n <= 0.0f ? 0.0f : INFINITY;
    const float b2 = b * b;
    const float hi = fmaf(PE_EXP_C5, b, PE_EXP_C4);
    const float mid = fmaf(PE_EXP_C3, b, PE_EXP_C2);
    const float lo = fmaf(PE_EXP_C1, b, 1.0f);
    const float poly = fmaf(fmaf(hi, b2, mid), b2, lo);
    if (n != n) return poly;   /* NaN in, NaN out */
    return pe_exp_scale(poly, n);
}

/* softplus(x) = log(1 + exp(x)) as GGML takes it: x itself above 20, else
 * log1p in double of pe_expf's exp (the C library's log1p agrees across
 * systems far below a float's last bit), rounded once. */
static inline float pe_softplusf(float x) { return x > 20.0f ? x : (float)log1p((double)pe_expf(x)); }

/* exp(x) in double for x <= 0: x = k ln2 + r, |r| <= ln2 / 2, a Taylor
 * series to r^13 (the next term is below 2^-60 of the sum). */
static inline double pe_exp_neg_d(double x) {
    if (x < -700.0) return 0.0;
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    const double k = floor(x * 1.44269504088896338700 + 0.5);
    const double r = (x - k * ln2_hi) - k * ln2_lo;
    static const double inv_fact[14] = {1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040,
                                        1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800,
                                        1.0 / 479001600, 1.0 / 6227020800.0};
    double p = inv_fact[13];
    for (int i = 12; i >= 1; i--) p = p * r + inv_fact[i];
    return ldexp(p * r + 1.0, (int)k);
}

/* tanh(x) in double arithmetic, rounded once to float: the odd series near
 * 0, (1 - e) / (1 + e) with e = exp(-2|x|) elsewhere. */
static inline float pe_tanhf(float xf) {
    const double x = xf, ax = fabs(x);
    if (xf != xf) return xf;
    if (ax > 20.0) return x > 0 ? 1.0f : -1.0f;
    double t;
    if (ax < 0.0625) {
        const double x2 = x * x;
        t = x * (1.0 + x2 * (-1.0 / 3 + x2 * (2.0 / 15 + x2 * (-17.0 / 315 + x2 * (62.0 / 2835 + x2 * (-1382.0 / 155925))))));
    } else {
        const double e = pe_exp_neg_d(-2.0 * ax);
        t = (1.0 - e) / (1.0 + e);
        if (x < 0) t = -t;
    }
    return (float)t;
}

#endif /* PE_VEC_MATH_H */
