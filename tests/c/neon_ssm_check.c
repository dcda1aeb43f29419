/* neon_ssm_check.c - the NEON build of the recurrent layers' loops
 * (cpu/vec_ssm.c through cpu/arm/neon_vec_ssm.c) gives the bits of the scalar
 * build (cpu/vec_ssm.c compiled plain), on seeded random inputs whose sizes
 * leave tails past every vector width; built and run under qemu by
 * tests/test_neon_cross.py:
 *
 *   aarch64-linux-gnu-gcc -O2 -static -DPE_ARCH_ARM=1 -march=armv8.2-a+dotprod+fp16 \
 *       -Icsrc/include -Icsrc/core -Icsrc/quant -Icsrc/cpu tests/c/neon_ssm_check.c \
 *       csrc/cpu/vec_ssm.c csrc/cpu/arm/neon_vec_ssm.c csrc/cpu/vec.c csrc/cpu/gelu.c -lm -o neon_ssm_check
 *   qemu-aarch64 ./neon_ssm_check        (exit status 0 when every case agrees)
 *
 * (-DPE_NEON_NODOT=1 and -march=armv8-a for the second build). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static pe_kernels scalar, neon;
const pe_kernels *pe_kern = &scalar;   /* delta_chunk's exp: cpu/vec.c's (its NEON bits: neon_vec_check.c) */
static int failures, checks;
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

/* uniform in [lo, hi) */
static float uniform(float lo, float hi) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return lo + (hi - lo) * (float)(rng_state >> 40) / (float)(1 << 24);
}

static float *random_floats(size_t n, float lo, float hi) {
    float *x = malloc(n * sizeof *x);
    if (!x) exit(2);
    for (size_t i = 0; i < n; i++) x[i] = uniform(lo, hi);
    return x;
}

static float *copy_of(const float *x, size_t n) {
    float *y = malloc(n * sizeof *y);
    if (!y) exit(2);
    memcpy(y, x, n * sizeof *y);
    return y;
}

static void compare(const char *what, int64_t a, int64_t b, const float *got, const float *want, size_t n) {
    checks++;
    if (memcmp(got, want, n * sizeof *got) == 0) return;
    for (size_t i = 0; i < n; i++)
        if (memcmp(got + i, want + i, sizeof *got)) {
            printf("%s (%lld, %lld): element %zu is %.9g, the scalar build's %.9g\n", what, (long long)a,
                   (long long)b, i, got[i], want[i]);
            break;
        }
    failures++;
}

static void check_gemm_acc(int64_t M, int64_t N, int64_t K) {
    float *A = random_floats((size_t)(M * K), -1, 1), *B = random_floats((size_t)(K * N), -1, 1);
    float *C = random_floats((size_t)(M * N), -1, 1), *C2 = copy_of(C, (size_t)(M * N));
    scalar.ssm.gemm_acc(M, N, K, A, K, B, N, C, N);
    neon.ssm.gemm_acc(M, N, K, A, K, B, N, C2, N);
    compare("gemm_acc", M * 1000 + N, K, C2, C, (size_t)(M * N));
    free(A), free(B), free(C), free(C2);
}

static void check_axpy(int64_t n) {
    float *x = random_floats((size_t)n, -1, 1), *y = random_floats((size_t)n, -1, 1), *y2 = copy_of(y, (size_t)n);
    scalar.ssm.axpy(n, y, 0.37f, x);
    neon.ssm.axpy(n, y2, 0.37f, x);
    compare("axpy", n, 0, y2, y, (size_t)n);
    free(x), free(y), free(y2);
}

static void check_delta_token(int64_t dk, int64_t dv) {
    float *S = random_floats((size_t)(dk * dv), -0.5f, 0.5f), *S2 = copy_of(S, (size_t)(dk * dv));
    float *k = random_floats((size_t)dk, -0.3f, 0.3f), *q = random_floats((size_t)dk, -0.3f, 0.3f);
    float *v = random_floats((size_t)dv, -1, 1), *out = random_floats((size_t)dv, 0, 1);
    float *out2 = copy_of(out, (size_t)dv);
    scalar.ssm.delta_token(dk, dv, S, k, q, v, 0.93f, 0.61f, out);
    neon.ssm.delta_token(dk, dv, S2, k, q, v, 0.93f, 0.61f, out2);
    compare("delta_token state", dk, dv, S2, S, (size_t)(dk * dv));
    compare("delta_token out", dk, dv, out2, out, (size_t)dv);
    free(S), free(S2), free(k), free(q), free(v), free(out), free(out2);
}

static void check_delta_chunk(int64_t n, int64_t dk, int64_t dv) {
    float *S = random_floats((size_t)(dk * dv), -0.5f, 0.5f), *S2 = copy_of(S, (size_t)(dk * dv));
    float *q = random_floats((size_t)(n * dk), -0.3f, 0.3f), *k = random_floats((size_t)(n * dk), -0.3f, 0.3f);
    float *v = random_floats((size_t)(n * dv), -1, 1), *g = random_floats((size_t)n, -0.2f, 0.0f);
    float *beta = random_floats((size_t)n, 0.1f, 0.9f);
    float *out = calloc((size_t)(n * dv), sizeof(float)), *out2 = calloc((size_t)(n * dv), sizeof(float));
    float *sc = malloc(pe_delta_chunk_floats(n, dk, dv) * sizeof(float));
    if (!out || !out2 || !sc) exit(2);
    pe_delta_rows rows = {q, k, v, g, beta, out, dk, dk, dv, 1, 1, dv, 0.25f};
    scalar.ssm.delta_chunk(n, dk, dv, S, &rows, sc);
    rows.out = out2;
    neon.ssm.delta_chunk(n, dk, dv, S2, &rows, sc);
    compare("delta_chunk state", n, dk * 1000 + dv, S2, S, (size_t)(dk * dv));
    compare("delta_chunk out", n, dk * 1000 + dv, out2, out, (size_t)(n * dv));
    free(S), free(S2), free(q), free(k), free(v), free(g), free(beta), free(out), free(out2), free(sc);
}

static void check_scan_token(int64_t p, int64_t n) {
    float *S = random_floats((size_t)(n * p), -0.5f, 0.5f), *S2 = copy_of(S, (size_t)(n * p));
    float *xdt = random_floats((size_t)p, -1, 1), *B = random_floats((size_t)n, -1, 1);
    float *C = random_floats((size_t)n, -1, 1), *y = random_floats((size_t)p, 0, 1), *y2 = copy_of(y, (size_t)p);
    scalar.ssm.scan_token(p, n, S, xdt, B, C, 0.87f, y);
    neon.ssm.scan_token(p, n, S2, xdt, B, C, 0.87f, y2);
    compare("scan_token state", p, n, S2, S, (size_t)(n * p));
    compare("scan_token y", p, n, y2, y, (size_t)p);
    free(S), free(S2), free(xdt), free(B), free(C), free(y), free(y2);
}

static void check_conv_token(int64_t d, int K) {
    float *w = random_floats((size_t)(K * d), -1, 1), *x = random_floats((size_t)(K * d), -1, 1);
    const float *cols[8];
    for (int j = 0; j < K; j++) cols[j] = x + (size_t)j * d;
    float *y = calloc((size_t)d, sizeof(float)), *y2 = calloc((size_t)d, sizeof(float));
    if (!y || !y2) exit(2);
    scalar.ssm.conv_token(d, K, cols, w, y);
    neon.ssm.conv_token(d, K, cols, w, y2);
    compare("conv_token", d, K, y2, y, (size_t)d);
    free(w), free(x), free(y), free(y2);
}

int main(void) {
    pe_fill_vec_scalar(&scalar);
    pe_fill_ssm_scalar(&scalar);
    PE_NEON_NAME(pe_fill_ssm_neon)(&neon);
    static const int64_t gemm_shapes[][3] = {{1, 1, 1}, {5, 13, 7}, {7, 40, 33}, {13, 9, 64}, {6, 8, 3}};
    for (size_t i = 0; i < sizeof gemm_shapes / sizeof *gemm_shapes; i++)
        check_gemm_acc(gemm_shapes[i][0], gemm_shapes[i][1], gemm_shapes[i][2]);
    static const int64_t lengths[] = {1, 3, 4, 17, 64};
    for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++) check_axpy(lengths[i]);
    static const int64_t heads[][2] = {{16, 16}, {32, 20}, {64, 64}, {8, 5}, {128, 128}};
    for (size_t i = 0; i < sizeof heads / sizeof *heads; i++) {
        check_delta_token(heads[i][0], heads[i][1]);
        check_scan_token(heads[i][1], heads[i][0]);
    }
    static const int64_t pieces[][3] = {{2, 16, 16}, {7, 32, 20}, {16, 64, 64}, {33, 8, 5}};
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++)
        check_delta_chunk(pieces[i][0], pieces[i][1], pieces[i][2]);
    static const int64_t widths[] = {4, 13, 64, 1};
    for (size_t i = 0; i < sizeof widths / sizeof *widths; i++) check_conv_token(widths[i], 4);
    printf("%d of %d checks differ from the scalar build\n", failures, checks);
    return failures != 0;
}
