/* neon_mxfp4_check.c - the NEON kernels of MXFP4 (vec_dot and the prompt
 * tile's gemm16 over pe_mxfp4_pack16's rows) against the scalar reference,
 * bit for bit, for cross-compiled runs under qemu-aarch64 (tests/
 * test_neon_cross.py builds and runs it; neon_vectors_check.c holds the
 * NEON vec_dot to x86's bits as well).
 *
 * Cases: rows of 1..40 blocks of random codes, exponents moderate (scales
 * 2^-10..2^2) or any (infinities and NaNs in the sums), against random Q8_0
 * activations (codes -127..127, moderate f16 scales); tiles of 16 such rows
 * packed by the NEON pack16 (byte for byte the reference's) against 1..8
 * activation rows, through the NEON gemm16 and the reference's, each element
 * also against the NEON vec_dot of its pair.  NaNs match any NaN (x86 and arm64 differ in the
 * default NaN's sign). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kquants.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static void weight_row(block_mxfp4 *x, int nb, int any_exponent) {
    for (int i = 0; i < nb; i++) {
        x[i].e = (uint8_t)(any_exponent ? rnd() & 0xFF : 118 + rnd() % 13);
        for (int j = 0; j < QK_MXFP4 / 2; j++) x[i].qs[j] = (uint8_t)rnd();
    }
}

static void activation_row(block_q8_0 *a, int nb) {
    for (int i = 0; i < nb; i++) {
        a[i].d = pe_f32_to_f16((float)(rnd() % 1000 + 1) * 5e-5f);
        for (int j = 0; j < QK8_0; j++) a[i].qs[j] = (int8_t)((int)(rnd() % 255) - 127);
    }
}

static int same(float a, float b) {
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y || (isnan(a) && isnan(b));
}

int main(void) {
    static pe_kernels ref, neon;
    pe_fill_ref_iq4(&ref);
    neon = ref;
    PE_NEON_NAME(pe_fill_neon_mxfp4)(&neon);
    const pe_type_kernels *r = &ref.type[PE_TYPE_MXFP4], *k = &neon.type[PE_TYPE_MXFP4];
    if (k->vec_dot == r->vec_dot || k->packed.gemm16 == r->packed.gemm16 || k->packed.pack16 == r->packed.pack16) {
        printf("FAILED: the NEON table has no MXFP4 kernels\n");
        return 1;
    }
    enum { MAX_BLOCKS = 40, COLS = 8 };
    static block_mxfp4 w[PE_PACK_ROWS][MAX_BLOCKS];
    static block_q8_0 a[COLS][MAX_BLOCKS];
    static float s_ref[COLS * PE_PACK_ROWS], s_neon[COLS * PE_PACK_ROWS];
    int checks = 0, failures = 0;
    for (int nb = 1; nb <= MAX_BLOCKS; nb++)
        for (int any = 0; any < 2; any++) {
            const int64_t n = (int64_t)nb * QK_MXFP4;
            for (int row = 0; row < PE_PACK_ROWS; row++) weight_row(w[row], nb, any);
            for (int c = 0; c < COLS; c++) activation_row(a[c], nb);
            for (int c = 0; c < COLS; c++) {   /* vec_dot */
                float want, got;
                r->vec_dot(n, &want, w[c], a[c]);
                k->vec_dot(n, &got, w[c], a[c]);
                checks++;
                if (!same(want, got)) {
                    if (failures++ < 10) printf("FAIL vec_dot nb=%d any=%d: %g != %g\n", nb, any, got, want);
                }
            }
            const size_t bytes = k->packed.pack16(n, NULL, 0, NULL);
            uint8_t *packed = malloc(bytes), *packed_ref = malloc(bytes);
            k->packed.pack16(n, w, sizeof w[0], packed);
            r->packed.pack16(n, w, sizeof w[0], packed_ref);
            checks++;
            if (bytes != r->packed.pack16(n, NULL, 0, NULL) || memcmp(packed, packed_ref, bytes) != 0) {
                if (failures++ < 10) printf("FAIL pack16 nb=%d any=%d\n", nb, any);
            }
            for (int nc = 1; nc <= COLS; nc++) {   /* gemm16 */
                r->packed.gemm16(n, s_ref, PE_PACK_ROWS, packed, a, sizeof a[0], nc);
                k->packed.gemm16(n, s_neon, PE_PACK_ROWS, packed, a, sizeof a[0], nc);
                for (int c = 0; c < nc; c++)
                    for (int row = 0; row < PE_PACK_ROWS; row++) {
                        float alone;
                        k->vec_dot(n, &alone, w[row], a[c]);
                        const float got = s_neon[c * PE_PACK_ROWS + row], want = s_ref[c * PE_PACK_ROWS + row];
                        checks++;
                        if (!same(want, got) || !same(alone, got)) {
                            if (failures++ < 10)
                                printf("FAIL gemm16 nb=%d any=%d nc=%d (%d, %d): %g, ref %g, vec_dot %g\n", nb, any,
                                       nc, row, c, got, want, alone);
                        }
                    }
            }
            free(packed);
            free(packed_ref);
        }
    printf("%s: %d check(s), %d differ\n", failures ? "FAILED" : "ok", checks, failures);
    return failures != 0;
}
