/* neon_vec_check.c - the NEON builds of the float kernels (cpu/vec.c) give
 * the bits the x86 tables give, for a cross build run under qemu.
 * tests/test_vec_bits.py records cases on x86 (inputs, results) into a file
 * and runs this on it:
 *
 *   aarch64-linux-gnu-gcc -O2 -static -DPE_ARCH_ARM=1 \
 *       -march=armv8.2-a+dotprod+fp16 -Icsrc/include -Icsrc/core -Icsrc/quant -Icsrc/cpu \
 *       tests/c/neon_vec_check.c csrc/cpu/arm/neon_vec.c csrc/cpu/gelu.c -lm -o neon_vec_check
 *   qemu-aarch64 ./neon_vec_check cases.bin       (exit status 0 when all pass)
 *
 * (add -DPE_NEON_NODOT=1 and -march=armv8-a for the second build).  A case:
 * a name (16 bytes), 4 int32 dims, a float scalar, the inputs' bytes (u32
 * count, then the bytes), the expected outputs' bytes (the same), the
 * expected returned value (a double). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static pe_kernels table;
static int failures, checks;

/* Bits equal, or both NaN: a NaN an operation makes (inf - inf, 0 * inf)
 * is negative on x86 and positive on Arm, so NaN bits are not compared
 * across them; NaN inputs' payloads pass through alike. */
static int same_f32(uint32_t a, uint32_t b) {
    return a == b || ((a & 0x7fffffffu) > 0x7f800000u && (b & 0x7fffffffu) > 0x7f800000u);
}

static int same_f16(uint16_t a, uint16_t b) { return a == b || ((a & 0x7fff) > 0x7c00 && (b & 0x7fff) > 0x7c00); }

/* the first element of out that differs from want, or -1 */
static int64_t first_difference(const char *name, const uint8_t *out, const uint8_t *want, uint32_t bytes) {
    const int halves = !strcmp(name, "f32_to_f16");
    for (uint32_t at = 0; at < bytes; at += halves ? 2 : 4) {
        if (halves) {
            uint16_t a, b;
            memcpy(&a, out + at, 2);
            memcpy(&b, want + at, 2);
            if (!same_f16(a, b)) return at / 2;
        } else {
            uint32_t a, b;
            memcpy(&a, out + at, 4);
            memcpy(&b, want + at, 4);
            if (!same_f32(a, b)) return at / 4;
        }
    }
    return -1;
}

static int same_result(double a, double b) { return !memcmp(&a, &b, 8) || (a != a && b != b); }

static void *read_bytes(FILE *f, uint32_t *n) {
    if (fread(n, 4, 1, f) != 1) return NULL;
    void *p = malloc(*n ? *n : 1);
    if (*n && fread(p, 1, *n, f) != *n) { free(p); return NULL; }
    return p;
}

/* Runs case `name` on the inputs; writes its outputs to out (room for want_n
 * bytes) and its returned value to *result.  0: an unknown case. */
static int run_case(const char *name, const int32_t d[4], float s, const uint8_t *in, uint8_t *out, double *result) {
    const pe_vec_kernels *k = &table.vec;
    const int64_t n = d[0];
    const float *x = (const float *)in, *u = x + n;
    float *y = (float *)out;
    *result = 0.0;
    if (!strcmp(name, "exp_sum")) *result = k->exp_sum(n, y, x, s);
    else if (!strcmp(name, "max")) *result = k->max(n, x);
    else if (!strcmp(name, "max_nan")) {
        int nan = 0;
        *result = k->max_nan(n, x, &nan);
        y[0] = (float)nan;
    } else if (!strcmp(name, "scale_max")) {
        memcpy(y, x, (size_t)n * sizeof(float));
        *result = k->scale_max(n, y, s);
    } else if (!strcmp(name, "sum_sq")) *result = k->sum_sq(n, x);
    else if (!strcmp(name, "silu_mul")) k->silu_mul(n, y, x, u);
    else if (!strcmp(name, "gelu_mul")) k->gelu_mul(n, y, x, u);
    else if (!strcmp(name, "scale_round_f16")) k->scale_round_f16(n, y, x, s);
    else if (!strcmp(name, "f32_to_f16")) k->f32_to_f16(n, x, (uint16_t *)out);
    else if (!strcmp(name, "f16_to_f32")) k->f16_to_f32(n, (const uint16_t *)in, y);
    else if (!strcmp(name, "dot_tile")) {
        const int nx = d[1], ny = d[2], nacc = d[3];
        const uint16_t *rows = (const uint16_t *)(x + nx * n);
        const float *xs[4];
        const uint16_t *ys[4];
        float tile[16];
        for (int a = 0; a < nx; a++) xs[a] = x + a * n;
        for (int b = 0; b < ny; b++) ys[b] = rows + b * n;
        k->dot_tile_f32_f16(n, xs, nx, ys, ny, nacc, tile);
        for (int a = 0; a < nx; a++)
            for (int b = 0; b < ny; b++) y[a * ny + b] = tile[4 * a + b];
    } else if (!strcmp(name, "values_f16")) {
        const int nh = d[1], hd = d[2], nacc = d[3];
        const uint16_t *v = (const uint16_t *)(x + nh * n);
        const int32_t *cell = (const int32_t *)(v + n * hd);
        const float *ps[4];
        float *outs[4];
        for (int h = 0; h < nh; h++) {
            ps[h] = x + h * n;
            outs[h] = y + h * hd;
        }
        float *scratch = malloc((size_t)(nh * 4 * k->lanes * hd) * sizeof(float));
        k->values_f16(n, nh, cell, ps, (const uint8_t *)v, (size_t)hd * sizeof(uint16_t), hd, nacc, outs, scratch);
        free(scratch);
    } else if (!strcmp(name, "values_t_f16")) {
        const int nh = d[1], hd = d[2];
        const uint16_t *vt = (const uint16_t *)(x + nh * n);
        const float *ps[4];
        float *outs[4];
        for (int h = 0; h < nh; h++) {
            ps[h] = x + h * n;
            outs[h] = y + h * hd;
        }
        k->values_t_f16(n, nh, ps, vt, (size_t)n, hd, outs);
    } else {
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s cases.bin\n", argv[0]); return 2; }
    FILE *f = fopen(argv[1], "rb");
    if (!f) { perror(argv[1]); return 2; }
    pe_gelu_table_init();
#if defined(PE_NEON_NODOT)
    pe_fill_vec_neon_nodot(&table);
#else
    pe_fill_vec_neon(&table);
#endif
    if (table.vec.lanes != 16) { printf("FAIL lanes %d, not 16\n", table.vec.lanes); return 1; }
    uint32_t count;
    if (fread(&count, 4, 1, f) != 1) return 2;
    for (uint32_t c = 0; c < count; c++) {
        char name[17] = {0};
        int32_t d[4];
        float s;
        uint32_t in_n, want_n;
        double want_result, result;
        if (fread(name, 1, 16, f) != 16 || fread(d, 4, 4, f) != 4 || fread(&s, 4, 1, f) != 1) return 2;
        uint8_t *in = read_bytes(f, &in_n), *want = read_bytes(f, &want_n);
        if (!in || !want || fread(&want_result, 8, 1, f) != 1) { printf("truncated case %u\n", c); return 2; }
        uint8_t *out = calloc(want_n + 64, 1);
        if (!run_case(name, d, s, in, out, &result)) { printf("unknown case %s\n", name); return 2; }
        checks++;
        const int64_t at = first_difference(name, out, want, want_n);
        if (at >= 0 || !same_result(result, want_result)) {
            failures++;
            if (failures <= 20) {
                uint32_t got_w = 0, want_w = 0;
                const int size = strcmp(name, "f32_to_f16") ? 4 : 2;
                if (at >= 0) {
                    memcpy(&got_w, out + at * size, (size_t)size);
                    memcpy(&want_w, want + at * size, (size_t)size);
                }
                printf("FAIL %s n=%d dims %d %d %d: element %lld %08x, x86 %08x; returned %.17g, x86 %.17g\n", name,
                       d[0], d[1], d[2], d[3], (long long)at, got_w, want_w, result, want_result);
            }
        }
        free(in);
        free(want);
        free(out);
    }
    fclose(f);
    printf("%d of %d cases passed\n", checks - failures, checks);
    return failures != 0;
}
