/* rows.c - single-row entry points over the kernel tables (tests, the KV
 * cache, tools), and what the tables say of a type.  The graph's ops call the
 * tables directly. */
#include <stdlib.h>

#include "internal.h"
#include "iquants.h"

int pe_type_supported(int type) {
    if (!pe_type_is_weight(type)) return 0;
    /* a weight type is usable once its kernels exist in the reference table
     * (and its grid, for the lattice types, has been handed over) */
    const pe_type_kernels *k = &pe_kernels_ref()->type[type];
    return k->to_float != NULL && k->vec_dot != NULL && pe_iq_type_ready(type);
}

/* Interleaving pays where the ISA has a decoding kernel for the layout;
 * elsewhere the weight stays as the file has it. */
int pe_type_rows8(int type) {
    pe_init();   /* the answer is the chosen table's */
    for (int t = 0; t < PE_TYPE_COUNT; t++)
        if (pe_type_rows8_base(t) == type && type > 0 && pe_kern->type[t].rows8.gemm8)
            return t;
    return -1;
}

static const pe_type_kernels *kernels_for(const pe_kernels *table, int type, int64_t n) {
    if (type < 0 || type >= PE_TYPE_COUNT || pe_type_block_size(type) == 0) {
        pe_fail("unknown type id %d", type);
        return NULL;
    }
    if (n < 0 || n % pe_type_block_size(type) != 0) {
        pe_fail("row length %lld is not a multiple of %s's block size %lld",
                (long long)n, pe_type_name(type), (long long)pe_type_block_size(type));
        return NULL;
    }
    return &table->type[type];
}

static int quantize_with(const pe_kernels *table, int type, const float *x, void *y, int64_t n) {
    const pe_type_kernels *k = kernels_for(table, type, n);
    if (!k) return -1;
    if (!k->from_float) return pe_fail("no quantizer for type %s", pe_type_name(type));
    k->from_float(x, y, n);
    return 0;
}

int pe_quantize_row_ref(int type, const float *x, void *y, int64_t n) {
    return quantize_with(pe_kernels_ref(), type, x, y, n);
}

int pe_quantize_row(int type, const float *x, void *y, int64_t n) {
    pe_init();
    return quantize_with(pe_kern, type, x, y, n);
}

static int dequantize_with(const pe_kernels *table, int type, const void *x, float *y, int64_t n) {
    const pe_type_kernels *k = kernels_for(table, type, n);
    if (!k) return -1;
    if (!k->to_float) return pe_fail("no dequantizer for type %s", pe_type_name(type));
    k->to_float(x, y, n);
    return 0;
}

int pe_dequantize_row_ref(int type, const void *x, float *y, int64_t n) {
    return dequantize_with(pe_kernels_ref(), type, x, y, n);
}

int pe_dequantize_row(int type, const void *x, float *y, int64_t n) {
    pe_init();
    return dequantize_with(pe_kern, type, x, y, n);
}

static int vec_dot_with(const pe_kernels *table, int type, const void *w, const float *x,
                        int64_t n, float *out) {
    const pe_type_kernels *k = kernels_for(table, type, n);
    if (!k) return -1;
    const int dot_type = pe_type_vec_dot_type(type);
    if (!k->vec_dot || dot_type < 0) return pe_fail("type %s has no dot product", pe_type_name(type));
    const pe_type_kernels *kq = kernels_for(table, dot_type, n);
    if (!kq) return -1;
    if (!kq->from_float) return pe_fail("no quantizer for type %s", pe_type_name(dot_type));
    void *a = malloc(pe_row_bytes(dot_type, n) + 64);
    if (!a) return pe_fail("out of memory");
    kq->from_float(x, a, n);
    k->vec_dot(n, out, w, a);
    free(a);
    return 0;
}

int pe_vec_dot(int type, const void *w, const float *x, int64_t n, float *out) {
    pe_init();
    return vec_dot_with(pe_kern, type, w, x, n, out);
}

int pe_vec_dot_ref(int type, const void *w, const float *x, int64_t n, float *out) {
    return vec_dot_with(pe_kernels_ref(), type, w, x, n, out);
}

int pe_vec_dot_blocks(int type, const void *w, const void *a, int64_t n, float *out, int reference) {
    pe_init();
    const pe_type_kernels *k = kernels_for(reference ? pe_kernels_ref() : pe_kern, type, n);
    if (!k) return -1;
    if (!k->vec_dot || pe_type_vec_dot_type(type) < 0) return pe_fail("type %s has no dot product", pe_type_name(type));
    k->vec_dot(n, out, w, a);
    return 0;
}

int pe_attn_lanes(void) {
    pe_init();
    return pe_kern->vec.lanes;
}

int pe_attn_values_f16(const float *p, int nh, int64_t n, const uint16_t *v, const int32_t *cell, int64_t hd, int nacc,
                       float *out) {
    pe_init();
    if (nh < 1 || nh > 4 || n < 1 || hd < 1 || (nacc != 1 && nacc != 4))
        return pe_fail("attention values: 1-4 heads, nacc 1 or 4");
    for (int64_t i = 0; i < n; i++)
        if (cell[i] >= n) return pe_fail("attention values: cell %d of %lld out of range", cell[i], (long long)n);
    float *scratch = malloc((size_t)(nh * 4 * pe_kern->vec.lanes * hd) * sizeof(float));
    if (!scratch) return pe_fail("out of memory");
    const float *ps[4];
    float *outs[4];
    for (int h = 0; h < nh; h++) {
        ps[h] = p + h * n;
        outs[h] = out + h * hd;
    }
    pe_kern->vec.values_f16(n, nh, cell, ps, (const uint8_t *)v, (size_t)hd * sizeof(uint16_t), hd, nacc, outs, scratch);
    free(scratch);
    return 0;
}

int pe_attn_scores_f16(const float *x, int nx, const uint16_t *y, int ny, int64_t n, int nacc, float *out) {
    pe_init();
    if (nx < 1 || nx > 4 || ny < 1 || ny > 4 || n < 1 || (nacc != 1 && nacc != 4))
        return pe_fail("attention scores: 1-4 queries and rows, nacc 1 or 4");
    const float *xs[4];
    const uint16_t *ys[4];
    for (int a = 0; a < nx; a++) xs[a] = x + a * n;
    for (int b = 0; b < ny; b++) ys[b] = y + b * n;
    float s[16];
    pe_kern->vec.dot_tile_f32_f16(n, xs, nx, ys, ny, nacc, s);
    for (int a = 0; a < nx; a++)
        for (int b = 0; b < ny; b++) out[a * ny + b] = s[4 * a + b];
    return 0;
}
