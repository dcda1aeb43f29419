/* neon_vectors_check.c - the NEON kernels against the bits the x86 AVX2
 * table gives (issue #25: one arithmetic per op on every ISA), for
 * cross-compiled runs under qemu-aarch64.
 *
 * tests/neon_vectors.py records, on x86, inputs and AVX2's outputs: the
 * activation quantizers' blocks, to_float's floats, vec_dot's float; this
 * reads that file (argv[1]), runs each record through the NEON table and
 * compares the bytes: blocks byte for byte, floats bit for bit (-0.0
 * included), except that any NaN matches any NaN: the hardware's default
 * NaN has the sign bit set on x86 and clear on arm64.  A record whose kernel
 * the NEON table lacks fails.
 * tests/test_neon_cross.py builds it (both NEON builds) and runs it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "iquants.h"

enum { QUANTIZE = 1, TO_FLOAT = 2, VEC_DOT = 3, GRID = 4 };

typedef struct { uint64_t len; uint8_t *bytes; } part;

static int read_part(FILE *f, part *p) {
    if (fread(&p->len, sizeof p->len, 1, f) != 1) return 0;
    p->bytes = malloc(p->len + 64);   /* kernels may read a vector past a row's end */
    if (!p->bytes) return 0;
    memset(p->bytes, 0, p->len + 64);
    return fread(p->bytes, 1, p->len, f) == p->len;
}

static const char *op_name(uint32_t op) {
    return op == QUANTIZE ? "from_float" : op == TO_FLOAT ? "to_float" : op == VEC_DOT ? "vec_dot" : "?";
}

static int is_nan_bits(const uint8_t *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    return (u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu);
}

/* 1 when got has want's bytes; floats (4-byte words) may differ in NaNs */
static int same(const uint8_t *want, const uint8_t *got, uint64_t len, int floats) {
    if (!floats) return memcmp(want, got, len) == 0;
    for (uint64_t i = 0; i + 4 <= len; i += 4)
        if (memcmp(want + i, got + i, 4) != 0 && !(is_nan_bits(want + i) && is_nan_bits(got + i))) return 0;
    return 1;
}

/* where the first 4-byte word differs, for the report */
static void report(uint32_t op, uint32_t type, int64_t n, const uint8_t *want, const uint8_t *got, uint64_t len) {
    uint64_t i = 0;
    while (i < len && want[i] == got[i]) i++;
    printf("FAIL %s type %u n=%lld: byte %llu of %llu differs", op_name(op), type, (long long)n,
           (unsigned long long)i, (unsigned long long)len);
    if (op != QUANTIZE && len % 4 == 0) {
        float w, g;
        memcpy(&w, want + i / 4 * 4, 4);
        memcpy(&g, got + i / 4 * 4, 4);
        printf(" (x86 %.9g, neon %.9g)", w, g);
    }
    printf("\n");
}

/* 1 when the NEON kernel gives the recorded bytes */
static int run_record(const pe_kernels *k, uint32_t op, uint32_t type, int64_t n, const part in[2], const part *want) {
    const pe_type_kernels *t = &k->type[type];
    uint8_t *got = malloc(want->len + 64);
    if (!got) return 0;
    memset(got, 0xA5, want->len + 64);
    int ran = 1;
    if (op == QUANTIZE && t->from_float) t->from_float((const float *)in[0].bytes, got, n);
    else if (op == TO_FLOAT && t->to_float) t->to_float(in[0].bytes, (float *)got, n);
    else if (op == VEC_DOT && t->vec_dot) t->vec_dot(n, (float *)got, in[0].bytes, in[1].bytes);
    else ran = 0;
    int ok = 0;
    if (!ran) printf("FAIL %s type %u: the NEON table has no such kernel\n", op_name(op), type);
    else if (!(ok = same(want->bytes, got, want->len, op != QUANTIZE))) report(op, type, n, want->bytes, got, want->len);
    free(got);
    return ok;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s VECTORS (from tests/neon_vectors.py)\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    char magic[8];
    if (!f || fread(magic, 1, 8, f) != 8 || memcmp(magic, "PEVEC01", 8) != 0) {
        fprintf(stderr, "%s: not a vectors file\n", argv[1]);
        return 2;
    }
    /* the reference's fill makes the sign tables the lattice kernels share,
     * as the engine's start-up does before the NEON fills; its kernels are
     * not used */
    static pe_kernels ref, neon;
    pe_fill_ref_iquants(&ref);
    PE_NEON_NAME(pe_fill_neon_legacy)(&neon);
    PE_NEON_NAME(pe_fill_neon_kquants)(&neon);
    PE_NEON_NAME(pe_fill_neon_iquants)(&neon);
    PE_NEON_NAME(pe_fill_neon_mxfp4)(&neon);

    int records = 0, failures = 0, per_type[PE_TYPE_COUNT][4] = {{0}};
    for (;;) {
        uint32_t head[2];
        int64_t n;
        if (fread(head, sizeof head, 1, f) != 1) break;
        part p[3];
        if (fread(&n, sizeof n, 1, f) != 1 || !read_part(f, &p[0]) || !read_part(f, &p[1]) || !read_part(f, &p[2]) ||
            head[1] >= PE_TYPE_COUNT || head[0] < QUANTIZE || head[0] > GRID) {
            fprintf(stderr, "%s: truncated or bad record %d\n", argv[1], records);
            return 2;
        }
        records++;
        if (head[0] == GRID) {   /* the lattice grids, before the records that use them */
            if (pe_iq_grid_set((int)head[1], p[0].bytes, p[0].len) != 0) {
                fprintf(stderr, "grid %u: %s\n", head[1], pe_last_error());
                return 2;
            }
        } else if (!run_record(&neon, head[0], head[1], n, p, &p[2])) {
            failures++;
            per_type[head[1]][head[0]]++;
        }
        for (int i = 0; i < 3; i++) free(p[i].bytes);
    }
    fclose(f);
    for (int t = 0; t < PE_TYPE_COUNT; t++)
        for (int op = QUANTIZE; op <= VEC_DOT; op++)
            if (per_type[t][op]) printf("type %d %s: %d record(s) differ\n", t, op_name(op), per_type[t][op]);
    printf("%s: %d record(s), %d differ from x86\n", failures || !records ? "FAILED" : "ok", records, failures);
    return failures != 0 || records == 0;
}
