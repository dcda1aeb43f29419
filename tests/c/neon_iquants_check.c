/* neon_iquants_check.c - the NEON dot products of the lattice types (IQ2_XXS,
 * IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and their prompt tiles'
 * pack16 + gemm16 against the scalar reference, bit for bit, for
 * cross-compiled runs under qemu-aarch64.
 *
 * The grids come from the gguf package: tests/test_neon_cross.py writes them
 * into a header, iq_grids_data.h (the array iq_grid_data of {PE_IQ_GRID_* id,
 * bytes, size}), in a folder passed with -I.  Build from the repository root:
 *
 *   aarch64-linux-gnu-gcc -O2 -march=armv8.2-a+dotprod+fp16 -DPE_ARCH_ARM=1 \
 *       -ffp-contract=off -static -Icsrc/include -Icsrc/core -Icsrc/cpu -Icsrc/quant -I<dir> \
 *       tests/c/neon_iquants_check.c csrc/cpu/arm/neon_iquants.c \
 *       csrc/cpu/arm/neon_iq_gemm.c \
 *       csrc/quant/ref_iquants.c csrc/core/error.c -lm -o neon_iq_check
 *   qemu-aarch64 -L /usr/aarch64-linux-gnu ./neon_iq_check
 *
 * -ffp-contract=off as in CMakeLists.txt: the reference's float expression
 * is meant unfused (the NEON file keeps its own unfused either way).
 *
 * Cases: rows of 256..4096 of random blocks (every bit pattern), all-ones
 * and all-zero blocks, with moderate, large (any finite f16) or mixed
 * super-block scales; against random Q8_K activations (every code), rounded
 * gaussians and the extremes +127 / -127 / -128 everywhere, bsums consistent
 * with the codes.  The tiles: 16 rows of 256..2048 (random, all-ones or
 * all-zero blocks) packed by pack16, against 1..8 activation rows (mixed
 * kinds, or all -128, or all +127), through the NEON table's gemm16 and the
 * reference's, and each element against the NEON vec_dot of its pair (a
 * row's result may not depend on its batch).  Every result must have the
 * reference's bits; neon_vectors_check.c holds the NEON vec_dot to x86's. */
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

enum { A_RANDOM, A_GAUSS, A_PLUS, A_MINUS, A_MIN, A_KINDS };
static const char *const a_names[] = {"random", "gaussian", "+127", "-127", "-128"};

static int8_t code(int kind) {
    switch (kind) {
    case A_RANDOM: return (int8_t)rnd();
    case A_GAUSS: {
        const float v = rintf(gauss() * 40);
        return (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
    case A_PLUS: return 127;
    case A_MINUS: return -127;
    default: return -128;
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

/* ---- prompt tiles: pack16 + gemm16 ----------------------------------------------------- */

enum { P_MIXED, P_ALL_MIN, P_ALL_MAX, P_RANDOM, P_KINDS };
static const char *const p_names[] = {"mixed", "all -128", "all +127", "all random"};
#define TILE_BS (PE_PACK_ROWS + 3)   /* an output stride wider than the tile */

static int gemm_elements, gemm_informative;

/* the activation kind of row j of a tile under pattern p */
static int row_kind(int p, int j, int rep) {
    switch (p) {
    case P_ALL_MIN: return A_MIN;
    case P_ALL_MAX: return A_PLUS;
    case P_RANDOM: return A_RANDOM;
    default: return (j + rep) % A_KINDS;
    }
}

/* one gemm16 call: the NEON table's against the reference's, every element
 * also against the NEON vec_dot of its pair (which neon_vectors_check.c
 * holds to x86's bits) */
static void check_gemm_call(const pe_kernels *ref, const pe_kernels *neon, const layout *l, const uint8_t *w,
                            size_t bw, const void *packed, const block_q8_K *a, size_t ba, int64_t n, int nc,
                            const char *what) {
    float s_ref[PE_GEMM_COLS * TILE_BS], s_neon[PE_GEMM_COLS * TILE_BS];
    memset(s_ref, 0xA5, sizeof s_ref);
    memset(s_neon, 0x5A, sizeof s_neon);
    ref->type[l->type].packed.gemm16(n, s_ref, TILE_BS, packed, a, ba, nc);
    neon->type[l->type].packed.gemm16(n, s_neon, TILE_BS, packed, a, ba, nc);
    cases++;
    for (int j = 0; j < nc; j++)
        for (int r = 0; r < PE_PACK_ROWS; r++) {
            const float g_ref = s_ref[j * TILE_BS + r], g_neon = s_neon[j * TILE_BS + r];
            float dot;
            neon->type[l->type].vec_dot(n, &dot, w + (size_t)r * bw, (const uint8_t *)a + (size_t)j * ba);
            gemm_elements++;
            gemm_informative += isfinite(g_ref) && g_ref != 0;
            CHECK(memcmp(&g_ref, &g_neon, sizeof g_ref) == 0,
                  "%s gemm16 %s n=%lld nc=%d row %d col %d: ref %.9g (%08x) neon %.9g (%08x)", l->name, what,
                  (long long)n, nc, r, j, g_ref, pe_f32_to_bits(g_ref), g_neon, pe_f32_to_bits(g_neon));
            CHECK(memcmp(&dot, &g_neon, sizeof dot) == 0,
                  "%s gemm16 %s n=%lld nc=%d row %d col %d: vec_dot %.9g (%08x) neon %.9g (%08x)", l->name, what,
                  (long long)n, nc, r, j, dot, pe_f32_to_bits(dot), g_neon, pe_f32_to_bits(g_neon));
        }
}

/* one tile: 16 weight rows of kind wk (scales sk) packed once, against
 * PE_GEMM_COLS activation rows of pattern p, for every nc of 1..8 */
static void check_tile(const pe_kernels *ref, const pe_kernels *neon, const layout *l, int64_t n, int wk, int sk,
                       int p, int rep) {
    const int64_t nb = n / QK_K;
    const size_t bw = (size_t)nb * l->bytes, ba = sizeof(block_q8_K) * (size_t)nb;
    uint8_t *w = malloc(PE_PACK_ROWS * bw);
    block_q8_K *a = malloc(PE_GEMM_COLS * ba);
    for (int r = 0; r < PE_PACK_ROWS; r++) make_weights(l, w + r * bw, nb, wk, sk);
    for (int j = 0; j < PE_GEMM_COLS; j++) make_activations(a + j * nb, nb, row_kind(p, j, rep));
    const size_t bytes = ref->type[l->type].packed.pack16(n, w, bw, NULL);
    CHECK(bytes >= PE_LATTICE_HEADER + (size_t)nb * PE_PACK_ROWS * sizeof(pe_lattice_row), "%s pack16 size %zu",
          l->name, bytes);
    void *packed = aligned_alloc(64, (bytes + 63) / 64 * 64);
    CHECK(neon->type[l->type].packed.pack16(n, w, bw, packed) == bytes, "%s pack16 bytes", l->name);
    char what[96];
    snprintf(what, sizeof what, "weights %s, scales %s, activations %s", w_names[wk], s_names[sk], p_names[p]);
    for (int nc = 1; nc <= PE_GEMM_COLS; nc++) check_gemm_call(ref, neon, l, w, bw, packed, a, ba, n, nc, what);
    free(packed);
    free(w);
    free(a);
}

static void check_gemm(const pe_kernels *ref, const pe_kernels *neon, const layout *l) {
    static const int64_t lengths[] = {256, 512, 1024, 2048};
    CHECK(ref->type[l->type].packed.pack16 && neon->type[l->type].packed.pack16, "%s: no pack16", l->name);
    CHECK(neon->type[l->type].packed.gemm16 && neon->type[l->type].packed.gemm16 != ref->type[l->type].packed.gemm16,
          "%s: no NEON gemm16 installed", l->name);
    if (!neon->type[l->type].packed.pack16 || !neon->type[l->type].packed.gemm16) return;
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++)
        for (int wk = 0; wk < W_KINDS; wk++)
            for (int rep = 0; rep < (wk == W_RANDOM ? 3 : 1); rep++)
                for (int p = 0; p < P_KINDS; p++)
                    check_tile(ref, neon, l, lengths[li], wk, (rep + p) % S_KINDS, p, rep);
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
    PE_NEON_NAME(pe_fill_neon_iquants)(&neon);
    PE_NEON_NAME(pe_fill_neon_iq_gemm)(&neon);

    check_iq1m_scale();
    for (size_t t = 0; t < sizeof layouts / sizeof layouts[0]; t++) {
        CHECK(pe_iq_type_ready(layouts[t].type), "%s: grid not set", layouts[t].name);
        check_type(&ref, &neon, &layouts[t]);
        check_gemm(&ref, &neon, &layouts[t]);
    }
    printf("%s: %d case(s) (%d vec_dot with a finite nonzero result; %d gemm16 element(s), %d finite nonzero), "
           "%d failure(s)\n", failures ? "FAILED" : "ok", cases, informative, gemm_elements, gemm_informative,
           failures);
    return failures != 0;
}
