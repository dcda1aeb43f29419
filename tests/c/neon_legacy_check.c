/* neon_legacy_check.c - the NEON kernels of the float and legacy block
 * types against the scalar reference, for a cross build run under qemu:
 *
 *   aarch64-linux-gnu-gcc -O2 -march=armv8.2-a+dotprod+fp16 -static \
 *       -Icsrc/include -Icsrc/core -Icsrc/quant -DPE_ARCH_ARM=1 \
 *       tests/c/neon_legacy_check.c csrc/quant/ref_float.c csrc/quant/ref_legacy.c \
 *       csrc/cpu/arm/neon_legacy.c -lm -o neon_legacy_check
 *   qemu-aarch64 ./neon_legacy_check          (exit status 0 when all pass)
 *
 * Checks, as tests/test_kernels_legacy.py does for x86: activation
 * quantizers (Q8_0 Q8_1 F16 BF16) and dequantizers bit-exact; dot products
 * within 1e-5 of the sum of |terms| of the reference's result. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "internal.h"

static int failures, checks;

static void check(int ok, const char *what, const char *type, int64_t n, int seed) {
    checks++;
    if (!ok) {
        failures++;
        if (failures <= 20) printf("FAIL %s %s n=%lld seed=%d\n", what, type, (long long)n, seed);
    }
}

/* ---- data ---------------------------------------------------------------------- */

static uint64_t rng_state;

static uint32_t next_u32(void) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng_state >> 32);
}

static float next_uniform(void) { return (float)next_u32() / 4294967296.0f; }

/* roughly normal: the sum of four uniforms, centred */
static float next_normal(void) {
    return (next_uniform() + next_uniform() + next_uniform() + next_uniform() - 2.0f) * 1.7f;
}

enum { KIND_RANDOM, KIND_ZEROS, KIND_EQUAL, KIND_LARGE, KIND_HALVES, KIND_EDGES, KIND_COUNT };

/* Values next to rounding boundaries in blocks of scale 1 (amax 127). */
static float edge_value(int64_t i) {
    static const float edges[] = {0.5f, 1.5f, 2.5f, 126.5f, 0.25f};
    const int64_t j = i % 32;
    if (j == 0) return 127.0f;
    const float e = edges[j % 5];
    const float v = j < 11 ? e : j < 22 ? nextafterf(e, 0.0f) : nextafterf(e, 200.0f);
    return (i / 32) % 2 ? -v : v;
}

static void fill_row(float *x, int64_t n, int kind, int seed) {
    rng_state = 0x9E3779B97F4A7C15ULL * (uint64_t)(seed + 1) + (uint64_t)n;
    for (int64_t i = 0; i < n; i++) {
        switch (kind) {
        case KIND_ZEROS: x[i] = 0.0f; break;
        case KIND_EQUAL: x[i] = i < 32 ? 0.75f : next_normal(); break;
        case KIND_LARGE: x[i] = (next_uniform() * 2.0f - 1.0f) * 1500.0f; break;
        case KIND_EDGES: x[i] = edge_value(i); break;
        case KIND_HALVES: /* x/d lands on k + 0.5: rounding ties */
            x[i] = i % 32 == 0 ? 127.0f : (float)((int)(next_u32() % 252) - 126) + 0.5f;
            break;
        default: {
            float v = next_normal() * (0.05f + 3.0f * (float)((i / 32) % 7) / 7.0f);
            if (next_u32() % 50 == 0) v *= 6.0f;
            x[i] = v;
        }
        }
    }
}

/* ---- the tables ------------------------------------------------------------------ */

static pe_kernels ref_table, neon_table;

static void build_tables(void) {
    memset(&ref_table, 0, sizeof ref_table);
    pe_fill_ref_float(&ref_table);
    pe_fill_ref_legacy(&ref_table);
    neon_table = ref_table;
    PE_NEON_NAME(pe_fill_neon_legacy)(&neon_table);
}

typedef struct { int type; const char *name; int block; size_t bytes; int partner; int has_min; } type_info;

static const type_info types[] = {
    {PE_TYPE_F32, "F32", 1, 4, PE_TYPE_F32, 0},
    {PE_TYPE_F16, "F16", 1, 2, PE_TYPE_F16, 0},
    {PE_TYPE_BF16, "BF16", 1, 2, PE_TYPE_BF16, 0},
    {PE_TYPE_Q4_0, "Q4_0", 32, sizeof(block_q4_0), PE_TYPE_Q8_0, 0},
    {PE_TYPE_Q4_1, "Q4_1", 32, sizeof(block_q4_1), PE_TYPE_Q8_1, 1},
    {PE_TYPE_Q5_0, "Q5_0", 32, sizeof(block_q5_0), PE_TYPE_Q8_0, 0},
    {PE_TYPE_Q5_1, "Q5_1", 32, sizeof(block_q5_1), PE_TYPE_Q8_1, 1},
    {PE_TYPE_Q8_0, "Q8_0", 32, sizeof(block_q8_0), PE_TYPE_Q8_0, 0},
};
enum { N_TYPES = sizeof types / sizeof types[0] };

static const type_info *info_of(int type) {
    for (int i = 0; i < N_TYPES; i++)
        if (types[i].type == type) return &types[i];
    return NULL;
}

static size_t row_bytes(int type, int64_t n) {
    if (type == PE_TYPE_Q8_1) return (size_t)(n / 32) * sizeof(block_q8_1);
    const type_info *t = info_of(type);
    return (size_t)(n / t->block) * t->bytes;
}

/* ---- checks -------------------------------------------------------------------- */

static void check_quantizer(int type, const char *name, const float *x, int64_t n, int seed) {
    const size_t bytes = row_bytes(type, n);
    uint8_t *a = malloc(bytes), *b = malloc(bytes);
    ref_table.type[type].from_float(x, a, n);
    neon_table.type[type].from_float(x, b, n);
    check(memcmp(a, b, bytes) == 0, "quantize", name, n, seed);
    free(a);
    free(b);
}

static void check_dequantizer(const type_info *t, const float *x, int64_t n, int seed) {
    const size_t bytes = row_bytes(t->type, n);
    uint8_t *q = malloc(bytes);
    float *y0 = malloc((size_t)n * 4), *y1 = malloc((size_t)n * 4);
    ref_table.type[t->type].from_float(x, q, n);
    ref_table.type[t->type].to_float(q, y0, n);
    neon_table.type[t->type].to_float(q, y1, n);
    check(memcmp(y0, y1, (size_t)n * 4) == 0, "dequantize", t->name, n, seed);
    free(q);
    free(y0);
    free(y1);
}

/* Sum of |terms| of the dot: |w_j| + 2|m| bounds |d q_j| + |m| for the types
 * with a zero point. */
static double dot_scale(const type_info *t, const uint8_t *w, const float *wd, const float *x, int64_t n) {
    double sum = 0.0;
    for (int64_t j = 0; j < n; j++) {
        double term = fabs((double)wd[j]);
        if (t->has_min) {
            pe_f16 m;
            memcpy(&m, w + (size_t)(j / 32) * t->bytes + 2, 2);
            term += 2.0 * fabs((double)pe_f16_to_f32(m));
        }
        sum += term * fabs((double)x[j]);
    }
    return sum;
}

static void check_dot(const type_info *t, const float *wf, const float *x, int64_t n, int seed) {
    uint8_t *w = malloc(row_bytes(t->type, n));
    uint8_t *a_ref = malloc(row_bytes(t->partner, n)), *a_neon = malloc(row_bytes(t->partner, n));
    float *wd = malloc((size_t)n * 4);
    ref_table.type[t->type].from_float(wf, w, n);
    ref_table.type[t->type].to_float(w, wd, n);
    ref_table.type[t->partner].from_float(x, a_ref, n);
    neon_table.type[t->partner].from_float(x, a_neon, n);
    float s_ref = 0.0f, s_neon = 0.0f;
    ref_table.type[t->type].vec_dot(n, &s_ref, w, a_ref);
    neon_table.type[t->type].vec_dot(n, &s_neon, w, a_neon);
    const double tol = 1e-5 * dot_scale(t, w, wd, x, n) + 1e-30;
    const int ok = fabs((double)s_ref - (double)s_neon) <= tol;
    if (!ok) printf("  dot %s n=%lld: ref %.9g neon %.9g tol %.3g\n", t->name, (long long)n, s_ref, s_neon, tol);
    check(ok, "vec_dot", t->name, n, seed);
    free(w);
    free(a_ref);
    free(a_neon);
    free(wd);
}

int main(void) {
    build_tables();
    static const int64_t lengths[] = {32, 64, 96, 160, 576, 1536, 4096};
    static const int64_t float_lengths[] = {1, 3, 5, 15, 17, 33, 100};
    float *x = malloc(4096 * 4), *y = malloc(4096 * 4);
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
        const int64_t n = lengths[li];
        for (int kind = 0; kind < KIND_COUNT; kind++) {
            for (int seed = 0; seed < (kind == KIND_RANDOM ? 3 : 1); seed++) {
                fill_row(x, n, kind, seed);
                fill_row(y, n, KIND_RANDOM, seed + 100);
                check_quantizer(PE_TYPE_Q8_0, "Q8_0", x, n, seed);
                check_quantizer(PE_TYPE_Q8_1, "Q8_1", x, n, seed);
                check_quantizer(PE_TYPE_F16, "F16", x, n, seed);
                check_quantizer(PE_TYPE_BF16, "BF16", x, n, seed);
                for (int t = 0; t < N_TYPES; t++) {
                    check_dequantizer(&types[t], x, n, seed);
                    check_dot(&types[t], x, y, n, seed);
                    if (kind != KIND_RANDOM) check_dot(&types[t], y, x, n, seed);
                }
            }
        }
    }
    for (size_t li = 0; li < sizeof float_lengths / sizeof float_lengths[0]; li++) {
        const int64_t n = float_lengths[li];
        fill_row(x, n, KIND_RANDOM, 7);
        fill_row(y, n, KIND_RANDOM, 8);
        for (int t = 0; t < 3; t++) {
            check_dequantizer(&types[t], x, n, 7);
            check_dot(&types[t], x, y, n, 7);
        }
        check_quantizer(PE_TYPE_F16, "F16", x, n, 7);
        check_quantizer(PE_TYPE_BF16, "BF16", x, n, 7);
    }
    free(x);
    free(y);
    printf("%d checks, %d failures\n", checks, failures);
    return failures != 0;
}
