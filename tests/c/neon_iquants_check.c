/* neon_iquants_check.c - the NEON dot products of the lattice types (IQ2_XXS,
 * IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) against the scalar reference,
 * bit for bit, for cross-compiled runs under qemu-aarch64.
 *
 * The grids come from the gguf package: tests/test_neon_cross.py writes them
 * into a header, iq_grids_data.h (the array iq_grid_data of {PE_IQ_GRID_* id,
 * bytes, size}), in a folder passed with -I.  Build from the repository root:
 *
 *   aarch64-linux-gnu-gcc -O2 -march=armv8.2-a+dotprod+fp16 -DPE_ARCH_ARM=1 \
 *       -ffp-contract=off -static -Icsrc/include -Icsrc/core -Icsrc/quant -I<dir> \
 *       tests/c/neon_iquants_check.c csrc/cpu/arm/neon_iquants.c \
 *       csrc/quant/ref_iquants.c csrc/core/error.c -lm -o neon_iq_check
 *   qemu-aarch64 -L /usr/aarch64-linux-gnu ./neon_iq_check
 *
 * -ffp-contract=off as in CMakeLists.txt: the reference's float expression
 * is meant unfused (the NEON file keeps its own unfused either way).
 *
 * Cases: rows of 256..4096 of random blocks (every bit pattern), all-ones
 * and all-zero blocks, with moderate, large (any finite f16) or mixed
 * super-block scales; against random Q8_K activations (every code), rounded
 * gaussians and the extremes +127 / -127 everywhere, bsums consistent with
 * the codes.  Every result must have the reference's bits. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "iquants.h"
#include "iq_grids_data.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float uniform(void) { return rnd() / 4294967296.0f; }
static float gauss(void) {
    const float u = (rnd() + 1.0f) / 4294967296.0f, v = uniform();
    return sqrtf(-2 * logf(u)) * cosf(6.2831853f * v);
}

static int failures, cases, informative;   /* informative: the cases with a finite nonzero result */
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL: " __VA_ARGS__); printf("\n"); } } while (0)

typedef struct { int type; const char *name; size_t bytes; } layout;
static const layout layouts[] = {
    {PE_TYPE_IQ2_XXS, "IQ2_XXS", sizeof(block_iq2_xxs)}, {PE_TYPE_IQ2_XS, "IQ2_XS", sizeof(block_iq2_xs)},
    {PE_TYPE_IQ2_S, "IQ2_S", sizeof(block_iq2_s)},       {PE_TYPE_IQ3_XXS, "IQ3_XXS", sizeof(block_iq3_xxs)},
    {PE_TYPE_IQ3_S, "IQ3_S", sizeof(block_iq3_s)},       {PE_TYPE_IQ1_S, "IQ1_S", sizeof(block_iq1_s)},
    {PE_TYPE_IQ1_M, "IQ1_M", sizeof(block_iq1_m)},
};

/* ---- weights ------------------------------------------------------------------------ */

enum { W_RANDOM, W_ONES, W_ZEROS, W_KINDS };
enum { S_MODERATE, S_LARGE, S_MIXED, S_KINDS };
static const char *const w_names[] = {"random", "ones", "zeros"};
static const char *const s_names[] = {"moderate", "large", "mixed"};

static pe_f16 moderate_f16(void) { return pe_f32_to_f16((uniform() - 0.5f) * 0.1f); }

/* any finite half: huge, tiny and subnormal ones included */
static pe_f16 finite_f16(void) {
    pe_f16 h = (pe_f16)rnd();
    if ((h & 0x7c00) == 0x7c00) h &= 0xfbff;
    return h;
}

/* the super-block scale: the leading f16 d, or IQ1_M's top nibbles of its
 * four scale words */
static void set_scale(const layout *l, uint8_t *block, pe_f16 h) {
    if (l->type != PE_TYPE_IQ1_M) {
        memcpy(block, &h, sizeof h);
        return;
    }
    uint16_t sc[4];
    memcpy(sc, block + offsetof(block_iq1_m, scales), sizeof sc);
    for (int w = 0; w < 4; w++) sc[w] = (uint16_t)((sc[w] & 0x0FFF) | (h >> 4 * w & 0xF) << 12);
    memcpy(block + offsetof(block_iq1_m, scales), sc, sizeof sc);
}

static void make_weights(const layout *l, uint8_t *w, int64_t nb, int kind, int scales) {
    for (size_t i = 0; i < (size_t)nb * l->bytes; i++)
        w[i] = kind == W_RANDOM ? (uint8_t)rnd() : kind == W_ONES ? 0xFF : 0;
    for (int64_t b = 0; b < nb; b++) {
        const int large = scales == S_LARGE || (scales == S_MIXED && rnd() % 2);
        set_scale(l, w + b * l->bytes, large ? finite_f16() : moderate_f16());
    }
}

/* ---- activations -------------------------------------------------------------------- */

enum { A_RANDOM, A_GAUSS, A_PLUS, A_MINUS, A_KINDS };
static const char *const a_names[] = {"random", "gaussian", "+127", "-127"};

static int8_t code(int kind) {
    switch (kind) {
    case A_RANDOM: return (int8_t)rnd();
    case A_GAUSS: {
        const float v = rintf(gauss() * 40);
        return (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
    case A_PLUS: return 127;
    default: return -127;
    }
}

static void make_activations(block_q8_K *a, int64_t nb, int kind) {
    for (int64_t b = 0; b < nb; b++) {
        /* moderate scales, rarely a huge one (the sum overflows to inf) */
        a[b].d = rnd() % 128 ? gauss() * 0.01f : 1e30f * (rnd() % 2 ? 1 : -1);
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) sum += a[b].qs[16 * g + j] = code(kind);
            a[b].bsums[g] = (int16_t)sum;
        }
    }
}

/* ---- the comparison ----------------------------------------------------------------- */

static void check_dot(const pe_kernels *ref, const pe_kernels *neon, const layout *l, const uint8_t *w,
                      const block_q8_K *a, int64_t n, const char *what) {
    float s_ref, s_neon;
    ref->type[l->type].vec_dot(n, &s_ref, w, a);
    neon->type[l->type].vec_dot(n, &s_neon, w, a);
    cases++;
    informative += isfinite(s_ref) && s_ref != 0;
    CHECK(memcmp(&s_ref, &s_neon, sizeof s_ref) == 0, "%s vec_dot %s n=%lld: ref %.9g (%08x) neon %.9g (%08x)",
          l->name, what, (long long)n, s_ref, pe_f32_to_bits(s_ref), s_neon, pe_f32_to_bits(s_neon));
}

static void check_type(const pe_kernels *ref, const pe_kernels *neon, const layout *l) {
    static const int64_t lengths[] = {256, 512, 768, 1024, 2048, 4096};
    CHECK(neon->type[l->type].vec_dot != ref->type[l->type].vec_dot, "%s: no NEON vec_dot installed", l->name);
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
        const int64_t n = lengths[li], nb = n / QK_K;
        uint8_t *w = malloc((size_t)nb * l->bytes);
        block_q8_K *a = malloc(sizeof *a * (size_t)nb);
        for (int wk = 0; wk < W_KINDS; wk++)
            for (int sk = 0; sk < S_KINDS; sk++)
                for (int ak = 0; ak < A_KINDS; ak++)
                    for (int rep = 0; rep < (wk == W_RANDOM ? 4 : 1); rep++) {
                        char what[96];
                        snprintf(what, sizeof what, "weights %s, scales %s, activations %s", w_names[wk],
                                 s_names[sk], a_names[ak]);
                        make_weights(l, w, nb, wk, sk);
                        make_activations(a, nb, ak);
                        check_dot(ref, neon, l, w, a, n, what);
                    }
        free(w);
        free(a);
    }
}

/* IQ1_M's scale written by set_scale reads back through pe_iq1m_scale */
static void check_iq1m_scale(void) {
    block_iq1_m b;
    memset(&b, 0xA5, sizeof b);
    const pe_f16 h = 0x3C01;
    set_scale(&layouts[6], (uint8_t *)&b, h);
    CHECK(pe_iq1m_scale(&b) == h, "IQ1_M scale nibbles");
}

int main(void) {
    for (size_t g = 0; g < sizeof iq_grid_data / sizeof iq_grid_data[0]; g++)
        if (pe_iq_grid_set(iq_grid_data[g].id, iq_grid_data[g].bytes, iq_grid_data[g].n) != 0) {
            printf("FAILED: grid %d: %s\n", iq_grid_data[g].id, pe_last_error());
            return 1;
        }
    pe_kernels ref, neon;
    memset(&ref, 0, sizeof ref);
    pe_fill_ref_iquants(&ref);
    neon = ref;
    pe_fill_neon_iquants(&neon);

    check_iq1m_scale();
    for (size_t t = 0; t < sizeof layouts / sizeof layouts[0]; t++) {
        CHECK(pe_iq_type_ready(layouts[t].type), "%s: grid not set", layouts[t].name);
        check_type(&ref, &neon, &layouts[t]);
    }
    printf("%s: %d case(s) (%d with a finite nonzero result), %d failure(s)\n", failures ? "FAILED" : "ok", cases,
           informative, failures);
    return failures != 0;
}
