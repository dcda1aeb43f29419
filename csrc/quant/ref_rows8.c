/* ref_rows8.c - Q4_1, Q4_0 and Q4_K weights interleaved by 8 rows
 * (block_q4_1x8, block_q4_0x8, block_q4_Kx8): the repacking done at load
 * and its inverse.
 *
 * Why a second layout: decoding reads every weight row once per token, and
 * the products as the file lays rows out take a row at a time: a scale per
 * row and block to gather, codes to unpack per row, 8 rows as 8 short
 * streams through memory.  Interleaved, block b of 8 rows is one run of
 * bytes: their scales convert in one instruction, and group t of their codes
 * is one 256-bit load whose integer product with the activation's group t
 * gives the 8 rows' sums in their own lanes; the float steps (llama.cpp's:
 * per lane for Q4_1, per block for Q4_0 and per super-block for Q4_K, the
 * arithmetic of llama.cpp's own repacked copies) then run for 8 rows at once
 * (x86_gemm_rows8.h).
 * Products of more activation rows than decoding's unpack the rows back and
 * use the base type's kernels, so every result keeps its bits. */
#include "blocks.h"
#include "internal.h"

/* Group of 8 rows: row r (stride bw) block b -> out[b] lane r. */
static void repack8_q4_1(int64_t n, const void *rows, size_t bw, void *group) {
    block_q4_1x8 *out = group;
    for (int64_t b = 0; b < n / QK4_1; b++)
        for (int r = 0; r < 8; r++) {
            const block_q4_1 *x = (const block_q4_1 *)((const uint8_t *)rows + (size_t)r * bw) + b;
            out[b].d[r] = x->d;
            out[b].m[r] = x->m;
            for (int t = 0; t < 4; t++) memcpy(out[b].qs[t][r], x->qs + 4 * t, 4);
        }
}

static void unpack8_q4_1(int64_t n, const void *group, void *rows, size_t bw) {
    const block_q4_1x8 *in = group;
    for (int64_t b = 0; b < n / QK4_1; b++)
        for (int r = 0; r < 8; r++) {
            block_q4_1 *x = (block_q4_1 *)((uint8_t *)rows + (size_t)r * bw) + b;
            x->d = in[b].d[r];
            x->m = in[b].m[r];
            for (int t = 0; t < 4; t++) memcpy(x->qs + 4 * t, in[b].qs[t][r], 4);
        }
}

static void repack8_q4_0(int64_t n, const void *rows, size_t bw, void *group) {
    block_q4_0x8 *out = group;
    for (int64_t b = 0; b < n / QK4_0; b++)
        for (int r = 0; r < 8; r++) {
            const block_q4_0 *x = (const block_q4_0 *)((const uint8_t *)rows + (size_t)r * bw) + b;
            out[b].d[r] = x->d;
            for (int t = 0; t < 4; t++) memcpy(out[b].qs[t][r], x->qs + 4 * t, 4);
        }
}

static void unpack8_q4_0(int64_t n, const void *group, void *rows, size_t bw) {
    const block_q4_0x8 *in = group;
    for (int64_t b = 0; b < n / QK4_0; b++)
        for (int r = 0; r < 8; r++) {
            block_q4_0 *x = (block_q4_0 *)((uint8_t *)rows + (size_t)r * bw) + b;
            x->d = in[b].d[r];
            for (int t = 0; t < 4; t++) memcpy(x->qs + 4 * t, in[b].qs[t][r], 4);
        }
}

static void repack8_q4_k(int64_t n, const void *rows, size_t bw, void *group) {
    block_q4_Kx8 *out = group;
    for (int64_t b = 0; b < n / QK_K; b++)
        for (int r = 0; r < 8; r++) {
            const block_q4_K *x = (const block_q4_K *)((const uint8_t *)rows + (size_t)r * bw) + b;
            out[b].d[r] = x->d;
            out[b].dmin[r] = x->dmin;
            memcpy(out[b].scales[r], x->scales, K_SCALE_SIZE);
            for (int c = 0; c < 4; c++)
                for (int g = 0; g < 8; g++) memcpy(out[b].qs[c][g][r], x->qs + 32 * c + 4 * g, 4);
        }
}

static void unpack8_q4_k(int64_t n, const void *group, void *rows, size_t bw) {
    const block_q4_Kx8 *in = group;
    for (int64_t b = 0; b < n / QK_K; b++)
        for (int r = 0; r < 8; r++) {
            block_q4_K *x = (block_q4_K *)((uint8_t *)rows + (size_t)r * bw) + b;
            x->d = in[b].d[r];
            x->dmin = in[b].dmin[r];
            memcpy(x->scales, in[b].scales[r], K_SCALE_SIZE);
            for (int c = 0; c < 4; c++)
                for (int g = 0; g < 8; g++) memcpy(x->qs + 32 * c + 4 * g, in[b].qs[c][g][r], 4);
        }
}

typedef void (*repack8_fn)(int64_t n, const void *rows, size_t bw, void *group);

static repack8_fn repack8_of(int base) {
    switch (base) {
    case PE_TYPE_Q4_1: return repack8_q4_1;
    case PE_TYPE_Q4_0: return repack8_q4_0;
    case PE_TYPE_Q4_K: return repack8_q4_k;
    default: return NULL;
    }
}

int pe_repack_rows8(int type, const void *src, void *dst, int64_t n, int64_t nrows) {
    const int base = pe_type_rows8_base(type);
    const repack8_fn repack = repack8_of(base);
    if (!repack) return pe_fail("repack: %s is no interleaved type", pe_type_name(type));
    const size_t group = 8 * pe_row_bytes(base, n);
    if (n <= 0 || group == 0 || nrows <= 0 || nrows % 8)
        return pe_fail("repack: %lld x %lld is not whole blocks of 8 rows", (long long)nrows, (long long)n);
    for (int64_t g = 0; g < nrows / 8; g++)
        repack(n, (const uint8_t *)src + (size_t)g * group, group / 8, (uint8_t *)dst + (size_t)g * group);
    return 0;
}

/* Every table can read the layout back; the decoding kernels (gemm8) come
 * with the ISAs that have them, and only those interleave (pe_type_rows8). */
void pe_fill_ref_rows8(pe_kernels *k) {
    k->type[PE_TYPE_Q4_1_X8].unpack8 = unpack8_q4_1;
    k->type[PE_TYPE_Q4_0_X8].unpack8 = unpack8_q4_0;
    k->type[PE_TYPE_Q4_K_X8].unpack8 = unpack8_q4_k;
}
