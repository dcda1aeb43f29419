/* neon_kquants_check.c - the NEON k-quant / IQ4 kernels against the scalar
 * reference, for cross-compiled runs under qemu-aarch64 (CI without an ARM
 * machine).  Build from the repository root:
 *
 *   aarch64-linux-gnu-gcc -O2 -march=armv8.2-a+dotprod+fp16 -DPE_ARCH_ARM=1 \
 *       -Icsrc/include -Icsrc/core -Icsrc/quant tests/c/neon_kquants_check.c \
 *       csrc/cpu/arm/neon_kquants.c csrc/quant/ref_kquants.c csrc/quant/ref_iq4.c \
 *       csrc/quant/ref_kquants_quantize.c csrc/quant/ref_legacy.c -lm -o neon_check
 *   qemu-aarch64 -L /usr/aarch64-linux-gnu ./neon_check
 *
 * Checks: Q8_K quantization bit-exact (ties, spikes, values where a fused
 * multiply-add would round differently), to_float exact, vec_dot within
 * 1e-5 of sum |w * x| of the reference, on quantized rows and on random
 * blocks (every bit pattern, finite f16 scales). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kquants.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float gauss(void) {
    const float u = (rnd() + 1.0f) / 4294967296.0f, v = rnd() / 4294967296.0f;
    return sqrtf(-2 * logf(u)) * cosf(6.2831853f * v);
}

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL: " __VA_ARGS__); printf("\n"); } } while (0)

typedef struct { int type; size_t bytes; int f16_off[2]; int n_f16; } layout;
static const layout layouts[] = {
    {PE_TYPE_Q2_K, sizeof(block_q2_K), {80, 82}, 2},   {PE_TYPE_Q3_K, sizeof(block_q3_K), {108, 0}, 1},
    {PE_TYPE_Q4_K, sizeof(block_q4_K), {0, 2}, 2},     {PE_TYPE_Q5_K, sizeof(block_q5_K), {0, 2}, 2},
    {PE_TYPE_Q6_K, sizeof(block_q6_K), {208, 0}, 1},   {PE_TYPE_IQ4_NL, sizeof(block_iq4_nl), {0, 0}, 1},
    {PE_TYPE_IQ4_XS, sizeof(block_iq4_xs), {0, 0}, 1},
};

static const char *type_name(int type) {
    switch (type) {
    case PE_TYPE_Q2_K: return "Q2_K";
    case PE_TYPE_Q3_K: return "Q3_K";
    case PE_TYPE_Q4_K: return "Q4_K";
    case PE_TYPE_Q5_K: return "Q5_K";
    case PE_TYPE_Q6_K: return "Q6_K";
    case PE_TYPE_Q8_K: return "Q8_K";
    case PE_TYPE_IQ4_NL: return "IQ4_NL";
    case PE_TYPE_IQ4_XS: return "IQ4_XS";
    default: return "?";
    }
}

static int64_t block_len(int type) { return type == PE_TYPE_IQ4_NL ? QK4_NL : QK_K; }
static int dot_type(int type) { return type == PE_TYPE_IQ4_NL ? PE_TYPE_Q8_0 : PE_TYPE_Q8_K; }
static size_t row_bytes(int type, int64_t n) {
    if (type == PE_TYPE_Q8_0) return (size_t)(n / QK8_0) * sizeof(block_q8_0);
    if (type == PE_TYPE_Q8_K) return (size_t)(n / QK_K) * sizeof(block_q8_K);
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        if (layouts[i].type == type) return (size_t)(n / block_len(type)) * layouts[i].bytes;
    return 0;
}

/* random blocks: every bit pattern, f16 scales finite (moderate when asked) */
static void random_blocks(const layout *l, uint8_t *w, int64_t n, int moderate) {
    const size_t nb = (size_t)(n / block_len(l->type));
    for (size_t i = 0; i < nb * l->bytes; i++) w[i] = (uint8_t)rnd();
    for (size_t b = 0; b < nb; b++)
        for (int f = 0; f < l->n_f16; f++) {
            pe_f16 h = moderate ? pe_f32_to_f16((rnd() / 4294967296.0f - 0.5f) * 0.1f) : (pe_f16)rnd();
            if ((h & 0x7c00) == 0x7c00) h &= 0xfbff;
            memcpy(w + b * l->bytes + l->f16_off[f], &h, 2);
        }
}

static void check_dot(const pe_kernels *ref, const pe_kernels *neon, const layout *l, const uint8_t *w,
                      const float *x, int64_t n, const char *what) {
    const int dt = dot_type(l->type);
    uint8_t *aq_ref = malloc(row_bytes(dt, n)), *aq_neon = malloc(row_bytes(dt, n));
    float *wd = malloc(sizeof(float) * (size_t)n);
    ref->type[dt].from_float(x, aq_ref, n);
    neon->type[dt].from_float(x, aq_neon, n);
    float s_ref, s_neon;
    ref->type[l->type].vec_dot(n, &s_ref, w, aq_ref);
    neon->type[l->type].vec_dot(n, &s_neon, w, aq_neon);
    ref->type[l->type].to_float(w, wd, n);
    double scale = 0;
    for (int64_t i = 0; i < n; i++) scale += fabs((double)wd[i] * x[i]);
    CHECK(fabs((double)s_ref - s_neon) <= 1e-5 * scale + 1e-30, "%s vec_dot %s n=%lld: ref %g neon %g",
          type_name(l->type), what, (long long)n, s_ref, s_neon);
    free(aq_ref); free(aq_neon); free(wd);
}

static void check_to_float(const pe_kernels *ref, const pe_kernels *neon, int type, const uint8_t *w, int64_t n) {
    float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
    ref->type[type].to_float(w, a, n);
    neon->type[type].to_float(w, b, n);
    int same = 1;
    for (int64_t i = 0; i < n; i++) same &= (a[i] == b[i]) || (isnan(a[i]) && isnan(b[i]));
    CHECK(same, "%s to_float n=%lld", type_name(type), (long long)n);
    free(a); free(b);
}

static void check_q8_K(const pe_kernels *ref, const pe_kernels *neon, const float *x, int64_t n, const char *what) {
    const size_t bytes = row_bytes(PE_TYPE_Q8_K, n);
    uint8_t *a = malloc(bytes), *b = malloc(bytes);
    ref->type[PE_TYPE_Q8_K].from_float(x, a, n);
    neon->type[PE_TYPE_Q8_K].from_float(x, b, n);
    CHECK(memcmp(a, b, bytes) == 0, "Q8_K quantize %s", what);
    check_to_float(ref, neon, PE_TYPE_Q8_K, a, n);
    free(a); free(b);
}

static void q8_K_cases(const pe_kernels *ref, const pe_kernels *neon) {
    float x[1024];
    for (int i = 0; i < 1024; i++) x[i] = gauss();
    check_q8_K(ref, neon, x, 1024, "gaussian");
    for (int i = 0; i < 512; i++) x[i] = (float)((int)(rnd() % 7) - 3);
    check_q8_K(ref, neon, x, 512, "ties");
    for (int i = 0; i < 256; i++) x[i] = (float)((int)(rnd() % 509) - 254) / 2;
    x[9] = -127;
    check_q8_K(ref, neon, x, 256, "halves");
    memset(x, 0, sizeof x);
    check_q8_K(ref, neon, x, 512, "zeros");
    x[300] = 42;
    check_q8_K(ref, neon, x, 512, "spike");
    /* products that round (as floats) to k + 0.5 while the exact product does not */
    const float vmax = -3.3f, scale = -127.0f / vmax;
    int m = 1;
    x[0] = vmax;
    for (int k = -126; k < 127 && m < 256; k++) {
        float x0 = (float)((k + 0.5) / (double)scale);
        int32_t bits;
        memcpy(&bits, &x0, 4);
        for (int dlt = -4; dlt <= 4 && m < 256; dlt++) {
            int32_t b2 = bits + dlt;
            float c;
            memcpy(&c, &b2, 4);
            volatile float p = c * scale;
            if (fabsf(c) < 3.3f && rint((double)p) != rint((double)c * scale)) x[m++] = c;
        }
    }
    for (; m < 256; m++) x[m] = 0.5f;
    check_q8_K(ref, neon, x, 256, "fused-rounding");
}

int main(void) {
    pe_kernels ref, neon;
    memset(&ref, 0, sizeof ref);
    pe_fill_ref_legacy(&ref);
    pe_fill_ref_kquants(&ref);
    neon = ref;
    PE_NEON_NAME(pe_fill_neon_kquants)(&neon);

    q8_K_cases(&ref, &neon);
    static const int64_t k_lengths[] = {256, 512, 1536, 2048, 4096};
    static const int64_t nl_lengths[] = {32, 64, 96, 160, 2048};
    for (size_t t = 0; t < sizeof layouts / sizeof layouts[0]; t++) {
        const layout *l = &layouts[t];
        const int64_t *lengths = l->type == PE_TYPE_IQ4_NL ? nl_lengths : k_lengths;
        for (int li = 0; li < 5; li++) {
            const int64_t n = lengths[li];
            float *x = malloc(sizeof(float) * (size_t)n), *src = malloc(sizeof(float) * (size_t)n);
            uint8_t *w = malloc(row_bytes(l->type, n));
            for (int64_t i = 0; i < n; i++) { x[i] = gauss(); src[i] = gauss(); }
            ref.type[l->type].from_float(src, w, n);
            check_dot(&ref, &neon, l, w, x, n, "quantized");
            check_to_float(&ref, &neon, l->type, w, n);
            random_blocks(l, w, n, 1);
            check_dot(&ref, &neon, l, w, x, n, "random");
            random_blocks(l, w, n, 0);
            check_to_float(&ref, &neon, l->type, w, n);
            free(x); free(src); free(w);
        }
    }
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "ok", failures);
    return failures != 0;
}
