/* ops_matmul.c - quantized matrix products and embedding lookups.
 *
 * A product first quantizes every activation row once to the weight type's
 * dot partner (q8_0, q8_1, q8_K, ...), then each thread takes tiles of
 * (weight rows x activation rows) and runs the integer dot kernels.  A tile
 * keeps a few weight rows hot in L1 while it walks the activations; a prompt
 * tile may pack its weight rows first (pack16), and a few activation rows
 * (decoding) go 8 weight rows at a time (gemm8) where the type has those. */
#include <string.h>

#include "internal.h"

#define TILE_ROWS 32   /* weight rows per prompt tile: two packs (PE_PACK_ROWS) */
#define DECODE_TASK_ROWS 16   /* weight rows per decoding task, at the least */
#define TILE_COLS 64   /* activation rows per tile (prompt batches) */
/* activation rows per tile of a weight interleaved by 8 rows, whose rows each
 * tile unpacks first: wide enough to pay for that, narrow enough that the
 * activations stay cached (pp512, 256 against all 512 columns: +0-14% on
 * AVX-512, +2-20% on AVX2 for Q4_1, Q8_0 and Q5_0 weights; 128 and 192 less) */
#define TILE_COLS_ROWS8 256
/* ... and of a weight whose tiles pack their rows (Q6_K's pack decodes every
 * code: at 64 columns a fifth of its product's time) */
static int64_t tile_cols(const pe_type_kernels *kern) {
    return kern->rows8.unpack8 || kern->packed.pack16 ? TILE_COLS_ROWS8 : TILE_COLS;
}
#define PACK_MIN_COLS 8 /* activation rows a tile needs to pay for packing its weight rows */
/* A weight interleaved by 8 rows takes its decoding kernel (PE_GEMM8_MAX_COLS
 * columns a pass, each group read once and kept cached for the passes) up to
 * this many activation rows, where its rows would otherwise be unpacked and
 * packed again for every tile.  SmolLM2 batches of 5, 8, 16, 24 and 32
 * tokens: 14, 19, 24, 30-34 and 37-44 ms before, 7, 10, 16, 26 and 32-35
 * after (AVX2 24 and 32: 42-75 and 52-82 -> 28 and 36); at 48 the two are
 * alike on AVX-512, at 64-96 the tiles catch up. */
#define ROWS8_DECODE_COLS 48

/* Activation rows a product of w takes through the decoding kernel (gemm8). */
static int64_t decode_cols(const pe_tensor *w) {
    if (pe_type_rows8_base(w->type) < 0) return PE_GEMM8_MAX_COLS;
    const int cols = pe_kern->type[w->type].rows8.cols;
    return cols ? cols : ROWS8_DECODE_COLS;
}

static inline const pe_tensor *src(const pe_exec *ex, const pe_tensor *t, int i) {
    return &ex->g->t[t->src[i]];
}

/* Next tile index for this thread: first its own, then shared ones. */
static inline int next_task(pe_exec *ex, int *first) {
    if (*first) { *first = 0; return ex->ith; }
    return atomic_fetch_add_explicit(ex->chunk, 1, memory_order_relaxed);
}

static inline const void *x_row(const pe_tensor *x, int64_t r) {
    const int64_t i1 = r % x->ne[1], i2 = (r / x->ne[1]) % x->ne[2], i3 = r / (x->ne[1] * x->ne[2]);
    return pe_row(x, i1, i2, i3);
}

/* Scratch: the quantized activations (a lone row: one copy per thread),
 * then per thread a packed copy of 16 weight rows for types with pack16 (two
 * for those with gemm32), then per thread a tile's rows unpacked from
 * weights interleaved by 8 (at 64-byte offsets). */
static size_t round64(size_t n) { return (n + 63) / 64 * 64; }

/* The kernels that see a weight's rows as the file has them: for weights
 * interleaved by 8 rows (ref_rows8.c), those of the type they hold. */
static const pe_type_kernels *plain_kernels(const pe_tensor *w) {
    const int base = pe_type_rows8_base(w->type);
    return &pe_kern->type[base >= 0 ? base : w->type];
}

static size_t unpacked_bytes(const pe_tensor *w) {
    return pe_kern->type[w->type].rows8.unpack8 ? round64((size_t)TILE_ROWS * w->nb[1]) : 0;
}

/* Whether the activation rows of w's product carry their block scales as
 * floats too (Q8_0 rows with the starts of pe_q8_0_scales): for a decoding
 * kernel that takes them (rows8.scales), which then needs no conversions or
 * sums per block, activation row and group of weight rows, where the product
 * hands it no more than `cols` activation rows at a time (a dense product
 * all of x's rows, one with experts a pair or an expert's group); and for a
 * prompt tile kernel that takes them (packed.scales, on any batch that may
 * reach it), which would otherwise sum each activation block's groups again
 * for every 16 weight rows. */
static int with_scales(const pe_tensor *w, const pe_tensor *x, int64_t cols) {
    const int vdt = pe_type_vec_dot_type(w->type);
    if (vdt != PE_TYPE_Q8_1 && vdt != PE_TYPE_Q8_0) return 0;
    if (pe_kern->type[w->type].rows8.scales && cols <= decode_cols(w)) return 1;
    return vdt == PE_TYPE_Q8_0 && plain_kernels(w)->packed.scales;
}

static size_t scales_bytes(int vdt, int64_t n) {
    return vdt == PE_TYPE_Q8_1 ? PE_Q8_1_SCALES_BYTES(n) : PE_Q8_0_SCALES_BYTES(n);
}

/* Bytes of one quantized activation row (with its scales, if it takes them). */
static size_t activation_row_bytes(const pe_tensor *w, const pe_tensor *x, int vdt, int64_t cols) {
    return pe_row_bytes(vdt, x->ne[0]) + (with_scales(w, x, cols) ? scales_bytes(vdt, x->ne[0]) : 0);
}

static size_t activations_bytes(const pe_tensor *w, const pe_tensor *x, int vdt, int nth, int64_t cols) {
    if (vdt == PE_TYPE_F32) return 0;
    const size_t rb = activation_row_bytes(w, x, vdt, cols);
    return pe_nrows(x) == 1 ? (size_t)nth * round64(rb) : round64((size_t)pe_nrows(x) * rb);
}

/* A dense product's: it hands the kernels all of x's rows. */
static size_t dense_activations_bytes(const pe_tensor *w, const pe_tensor *x, int nth) {
    return activations_bytes(w, x, pe_type_vec_dot_type(w->type), nth, pe_nrows(x));
}

/* One pack of PE_PACK_ROWS rows of k elements (0: the type does not pack). */
static size_t pack_one_bytes(const pe_packed_kernels *p, int64_t k) {
    return p->pack16 ? round64(p->pack16(k, NULL, 0, NULL)) : 0;
}

/* A thread's packs: two where the type multiplies them together (gemm32). */
static size_t packs_bytes(const pe_packed_kernels *p, int64_t k) {
    return pack_one_bytes(p, k) * (p->gemm32 ? 2 : 1);
}

static size_t pack_bytes(const pe_tensor *t, const pe_tensor *w, const pe_tensor *x) {
    if (t->op != PE_OP_MUL_MAT || pe_nrows(x) < PACK_MIN_COLS) return 0;
    return packs_bytes(&plain_kernels(w)->packed, x->ne[0]);
}

size_t pe_op_mul_mat_work(const pe_graph *g, const pe_tensor *t, int n_threads) {
    const pe_tensor *w = &g->t[t->src[0]], *x = &g->t[t->src[1]];
    const size_t bytes = dense_activations_bytes(w, x, n_threads) +
                         (size_t)n_threads * (pack_bytes(t, w, x) + unpacked_bytes(w));
    return bytes ? bytes + 64 : 0;
}

/* This thread's room for packed weight rows, or NULL when the product
 * does not pack (or the scratch was planned without it). */
static void *pack_scratch(const pe_exec *ex, const pe_tensor *t, const pe_tensor *w, const pe_tensor *x) {
    const size_t per = pack_bytes(t, w, x);
    const size_t off = dense_activations_bytes(w, x, ex->nth) + (size_t)ex->ith * per;
    return per && off + per <= ex->work_bytes ? ex->work + off : NULL;
}

/* This thread's room for rows unpacked from an interleaved weight. */
static uint8_t *unpacked_scratch(const pe_exec *ex, const pe_tensor *t, const pe_tensor *w, const pe_tensor *x) {
    const size_t per = unpacked_bytes(w);
    const size_t off = dense_activations_bytes(w, x, ex->nth) +
                       (size_t)ex->nth * pack_bytes(t, w, x) + (size_t)ex->ith * per;
    return per && off + per <= ex->work_bytes ? ex->work + off : NULL;
}

/* Q8_1's blocks' d, then s, as floats after its row */
static void q8_1_scales(int64_t k, uint8_t *row) {
    const block_q8_1 *blocks = (const block_q8_1 *)row;
    float *d = (float *)(blocks + k / QK8_1), *s = d + k / QK8_1;
    for (int64_t b = 0; b < k / QK8_1; b++) {
        d[b] = pe_f16_to_f32(blocks[b].d);
        s[b] = pe_f16_to_f32(blocks[b].s);
    }
}

/* Q8_0's pe_q8_0_scales after its row (kernels.h) */
static void q8_0_scales(int64_t k, uint8_t *row) {
    const block_q8_0 *blocks = (const block_q8_0 *)row;
    pe_q8_0_scales *out = (pe_q8_0_scales *)(row + PE_Q8_0_SCALES_AT(k));
    for (int64_t b = 0; b < k / QK8_0; b++) {
        out[b].d = pe_f16_to_f32(blocks[b].d);
        for (int t = 0; t < 8; t++) {
            const int8_t *q = blocks[b].qs + 4 * t;
            const int32_t sum = q[0] + q[1] + q[2] + q[3];
            out[b].start8[t] = -128 * sum;
            out[b].start5[t] = -16 * sum;
            out[b].start4[t] = -8 * sum;
        }
    }
}

/* Activation row r in the dot partner type at dst, and after it (with
 * `scales`) its blocks' scales as the decoding kernel takes them: Q8_1's d,
 * then s, as floats; Q8_0's pe_q8_0_scales. */
static void quantize_row(const pe_tensor *x, int64_t r, int vdt, int scales, uint8_t *dst) {
    const int64_t k = x->ne[0];
    pe_kern->type[vdt].from_float(x_row(x, r), dst, k);
    if (!scales) return;
    if (vdt == PE_TYPE_Q8_0) q8_0_scales(k, dst);
    else q8_1_scales(k, dst);
}

/* Where this thread reads the quantized activations: a lone row (decoding)
 * has one copy per thread, other batches one copy for all. */
static uint8_t *activations(const pe_exec *ex, const pe_tensor *w, const pe_tensor *x, int vdt, int64_t cols,
                            size_t *row_stride) {
    if (vdt == PE_TYPE_F32) { *row_stride = 0; return NULL; }
    *row_stride = activation_row_bytes(w, x, vdt, cols);
    return pe_nrows(x) == 1 ? ex->work + (size_t)ex->ith * round64(*row_stride) : ex->work;
}

/* Phase 1 of every product: activations -> the dot partner type, rows split
 * over threads, then a barrier so every thread sees all of them.  A lone
 * row is quantized by every thread into its own copy instead: a few hundred
 * nanoseconds, less than the others' wait at a barrier. */
static const uint8_t *quantize_activations(pe_exec *ex, const pe_tensor *w, const pe_tensor *x, int vdt,
                                           int64_t cols, size_t *row_stride) {
    uint8_t *q = activations(ex, w, x, vdt, cols, row_stride);
    if (!q) return NULL;
    const int scales = with_scales(w, x, cols);
    if (pe_nrows(x) == 1) {
        quantize_row(x, 0, vdt, scales, q);
        return q;
    }
    int64_t r0, r1;
    pe_split(pe_nrows(x), ex->ith, ex->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) quantize_row(x, r, vdt, scales, q + r * *row_stride);
    pe_pool_barrier(ex->pool);
    return q;
}

/* Products of one activation by several weights in a row (attention's Q, K
 * and V, the MLP's gate and up) quantize it once and run one after the other
 * with no barrier between (pe_op_joins): the later ones read only weights
 * and the activation rows the first left in the scratch.  Their weights must
 * be leaves (a computed one could be freed, its memory reused, while another
 * thread still reads it), want the same activation layout, and split the
 * rest of the scratch between the threads alike (a thread's packed or
 * unpacked rows must not land where another, still on the previous
 * product, keeps its own). */
int pe_op_mul_mat_joins(const pe_graph *g, const pe_tensor *prev, const pe_tensor *t) {
    if (prev->op != PE_OP_MUL_MAT || prev->src[1] != t->src[1]) return 0;
    const pe_tensor *wp = &g->t[prev->src[0]], *w = &g->t[t->src[0]], *x = &g->t[t->src[1]];
    const int vdt = pe_type_vec_dot_type(w->type);
    return wp->op == PE_OP_NONE && w->op == PE_OP_NONE && vdt == pe_type_vec_dot_type(wp->type) &&
           with_scales(w, x, pe_nrows(x)) == with_scales(wp, x, pe_nrows(x)) &&
           pack_bytes(t, w, x) == pack_bytes(prev, wp, x) && unpacked_bytes(w) == unpacked_bytes(wp);
}

/* The packed path: each whole PE_PACK_ROWS of the tile's weight rows (wd,
 * stride bw) copied once by `pack` into the type's interleaved layout (pk's:
 * pack16's, or an interleaved weight's rows8.pack16), then multiplied with
 * every activation row of the tile; two packs at once where the type has
 * gemm32.  Returns the first row left to the other paths. */
static int64_t tile_packed(const pe_packed_kernels *pk, pe_pack16_fn pack, int64_t kdim, float *dst, int64_t n,
                           const uint8_t *wd, size_t bw, const uint8_t *q, size_t qstride, int64_t i0, int64_t i1,
                           int64_t j0, int64_t j1, void *packed) {
    if (pk->gemm32 && i1 - i0 == 2 * PE_PACK_ROWS) {
        uint8_t *second = (uint8_t *)packed + pack_one_bytes(pk, kdim);
        pack(kdim, wd + i0 * bw, bw, packed);
        pack(kdim, wd + (i0 + PE_PACK_ROWS) * bw, bw, second);
        pk->gemm32(kdim, dst + j0 * n + i0, (size_t)n, packed, second, q + j0 * qstride, qstride, (int)(j1 - j0));
        return i1;
    }
    for (; i0 + PE_PACK_ROWS <= i1; i0 += PE_PACK_ROWS) {
        pack(kdim, wd + i0 * bw, bw, packed);
        for (int64_t j = j0; j < j1; j += PE_GEMM_COLS) {
            const int nc = (int)(j1 - j < PE_GEMM_COLS ? j1 - j : PE_GEMM_COLS);
            pk->gemm16(kdim, dst + j * n + i0, (size_t)n, packed, q + j * qstride, qstride, nc);
        }
    }
    return i0;
}

/* Whether a tile of j1 - j0 activation rows takes the packed path. */
static int tile_packs(const void *packed, const uint8_t *q, int64_t j0, int64_t j1) {
    return packed && q && j1 - j0 >= PACK_MIN_COLS;
}

/* One tile: weight rows [i0, i1) against activation rows [j0, j1).  Every
 * kernel gives vec_dot's bits, so which one a tile takes is a matter of
 * speed only. */
static void tile(const pe_type_kernels *k, int64_t kdim, float *dst, int64_t n, const pe_tensor *w,
                 const pe_tensor *x, const uint8_t *q, size_t qstride, int64_t i0, int64_t i1, int64_t j0,
                 int64_t j1, void *packed) {
    const uint8_t *wd = w->data;
    const size_t wstride = w->nb[1];
    if (tile_packs(packed, q, j0, j1)) {
        i0 = tile_packed(&k->packed, k->packed.pack16, kdim, dst, n, wd, wstride, q, qstride, i0, i1, j0, j1, packed);
        if (i0 == i1) return;
    }
    if (k->rows8.gemm8 && q && j1 - j0 <= PE_GEMM8_MAX_COLS) {   /* decoding: 8 rows at a time, the tile for the rest */
        for (; i0 + PE_GEMM8_ROWS <= i1; i0 += PE_GEMM8_ROWS)
            k->rows8.gemm8(kdim, dst + j0 * n + i0, (size_t)n, wd + i0 * wstride, wstride, q + j0 * qstride, qstride,
                     (int)(j1 - j0));
        if (i0 == i1) return;
    }
    if (k->gemm && q) {
        for (int64_t j = j0; j < j1; j += PE_GEMM_COLS) {
            const int nc = (int)(j1 - j < PE_GEMM_COLS ? j1 - j : PE_GEMM_COLS);
            for (int64_t i = i0; i < i1; i += PE_GEMM_ROWS) {
                const int nr = (int)(i1 - i < PE_GEMM_ROWS ? i1 - i : PE_GEMM_ROWS);
                k->gemm(kdim, dst + j * n + i, (size_t)n, wd + i * wstride, wstride, q + j * qstride, qstride, nr, nc);
            }
        }
        return;
    }
    for (int64_t j = j0; j < j1; j++) {
        const void *a = q ? (const void *)(q + j * qstride) : x_row(x, j);
        float *d = dst + j * n;
        for (int64_t i = i0; i < i1; i++) k->vec_dot(kdim, d + i, wd + i * wstride, a);
    }
}

/* Whether a batch of m activation rows takes w's decoding kernel. */
static int takes_gemm8(const pe_type_kernels *k, const pe_tensor *w, int64_t m) {
    return k->rows8.gemm8 && m <= decode_cols(w);
}

/* A tile of a weight interleaved by 8 rows: decoding's few activation rows
 * go through the layout's own kernel straight from the groups; other
 * batches see the rows
 * unpacked, 16 at a time, and the kernels of the type held.  Both give the
 * bits the weight as the file has it gives.  Two groups at a time go to the
 * table's pair kernel where it has one (AVX-512: one 512-bit vector for 16
 * rows). */
static void tile_rows8(const pe_type_kernels *k, int64_t kdim, float *dst, int64_t n, const pe_tensor *w,
                       const pe_tensor *x, const uint8_t *q, size_t qstride, int64_t m, int64_t i0, int64_t i1,
                       int64_t j0, int64_t j1, void *packed, uint8_t *rows) {
    const uint8_t *wd = w->data;
    const size_t bw = w->nb[1];
    /* (a prompt's last few columns are no decoding batch: their activation rows lack
     * the float scales a rows8.scales kernel reads) */
    if (takes_gemm8(k, w, m)) {
        for (int64_t i = i0; i < i1;) {
            const int two = i + 2 * PE_GEMM8_ROWS <= i1;   /* two groups left: their pair kernel if there is one */
            const pe_gemm8_fn gemm8 = k->rows8.gemm8, pair = two ? k->rows8.gemm8_pair : NULL;
            for (int64_t j = j0; j < j1;) {
                const int nc = (int)(j1 - j < PE_GEMM8_MAX_COLS ? j1 - j : PE_GEMM8_MAX_COLS);
                float *out = dst + j * n + i;
                const uint8_t *a = q + j * qstride;
                if (pair) {
                    pair(kdim, out, (size_t)n, wd + i * bw, bw, a, qstride, nc);
                } else {
                    for (int g = 0; g < 1 + two; g++)
                        gemm8(kdim, out + g * PE_GEMM8_ROWS, (size_t)n, wd + (i + g * PE_GEMM8_ROWS) * bw, bw, a,
                              qstride, nc);
                }
                j += nc;
            }
            i += two ? 2 * PE_GEMM8_ROWS : PE_GEMM8_ROWS;
        }
        return;
    }
    pe_tensor plain = *w;
    plain.type = pe_type_rows8_base(w->type);
    plain.data = rows;
    const pe_type_kernels *pk = plain_kernels(w);
    for (int64_t r0 = i0; r0 < i1; r0 += TILE_ROWS) {
        const int64_t r1 = r0 + TILE_ROWS < i1 ? r0 + TILE_ROWS : i1;
        int64_t r = r0;   /* rows from r on go unpacked (those the interleaved layout packs straight from go first) */
        if (k->rows8.pack16 && tile_packs(packed, q, j0, j1))
            r = tile_packed(&pk->packed, k->rows8.pack16, kdim, dst, n, wd, bw, q, qstride, r0, r1, j0, j1, packed);
        if (r == r1) continue;
        for (int64_t i = r; i < r1; i += PE_GEMM8_ROWS) k->rows8.unpack8(kdim, wd + i * bw, rows + (i - r) * bw, bw);
        tile(pk, kdim, dst + r, n, &plain, x, q, qstride, 0, r1 - r, j0, j1, packed);
    }
}

/* Decoding reads every weight row once per token, and a small model's
 * weight is a few hundred KB: memory streams, not tiles, set the speed.
 * Each thread walks its own contiguous range of rows in order (its
 * prefetches run ahead into its own rows and the hardware prefetchers follow
 * one stream), helping the others from their ranges' ends when done
 * (pe_range_next); tasks dealt from a shared counter interleave the threads
 * and cost ~30% on SmolLM2's products. */
static void decode_rows(pe_exec *ex, const pe_type_kernels *kern, int64_t k, float *dst, int64_t n,
                        const pe_tensor *w, const pe_tensor *x, const uint8_t *q, size_t qstride, int64_t m,
                        uint8_t *rows) {
    int64_t per_task = DECODE_TASK_ROWS;
    while ((n + per_task - 1) / per_task > PE_RANGE_MAX_TASKS) per_task *= 2;
    const int64_t n_tasks = (n + per_task - 1) / per_task;
    for (int64_t task = pe_range_next(ex, n_tasks); task >= 0; task = pe_range_next(ex, n_tasks)) {
        const int64_t i0 = task * per_task, i1 = i0 + per_task < n ? i0 + per_task : n;
        if (kern->rows8.unpack8)
            tile_rows8(kern, k, dst, n, w, x, q, qstride, m, i0, i1, 0, m, NULL, rows);
        else
            tile(kern, k, dst, n, w, x, q, qstride, i0, i1, 0, m, NULL);
    }
}

void pe_op_mul_mat_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *w = src(ex, t, 0), *x = src(ex, t, 1);
    const int vdt = pe_type_vec_dot_type(w->type);
    size_t qstride;
    const uint8_t *q = t->joins_prev ? activations(ex, w, x, vdt, pe_nrows(x), &qstride)
                                     : quantize_activations(ex, w, x, vdt, pe_nrows(x), &qstride);
    const pe_type_kernels *kern = &pe_kern->type[w->type];
    const int64_t k = x->ne[0], n = w->ne[1], m = pe_nrows(x);
    float *dst = t->data;
    uint8_t *rows = unpacked_scratch(ex, t, w, x);
    if (kern->rows8.unpack8 && !rows) { pe_exec_fail(ex, "mul_mat: no scratch planned for an interleaved weight"); return; }
    if (m <= PE_GEMM8_MAX_COLS || (m <= ROWS8_DECODE_COLS && takes_gemm8(kern, w, m))) {
        decode_rows(ex, kern, k, dst, n, w, x, q, qstride, m, rows);
        return;
    }
    /* a prompt batch: tiles of TILE_ROWS x TILE_COLS (TILE_COLS_ROWS8) dealt from the
     * shared counter (also where a type's decoding kernel takes batches past
     * ROWS8_DECODE_COLS, rows8.cols: tile_rows8 gives each tile to it, and there
     * are tasks for more threads than whole rows would give) */
    void *packed = pack_scratch(ex, t, w, x);
    const int64_t n_rb = (n + TILE_ROWS - 1) / TILE_ROWS, cols = tile_cols(kern);
    const int64_t n_cb = (m + cols - 1) / cols;
    int first = 1;
    for (int64_t task = next_task(ex, &first); task < n_rb * n_cb; task = next_task(ex, &first)) {
        const int64_t rb = task / n_cb, cb = task % n_cb;
        const int64_t i0 = rb * TILE_ROWS, i1 = i0 + TILE_ROWS < n ? i0 + TILE_ROWS : n;
        const int64_t j0 = cb * cols, j1 = j0 + cols < m ? j0 + cols : m;
        if (kern->rows8.unpack8)
            tile_rows8(kern, k, dst, n, w, x, q, qstride, m, i0, i1, j0, j1, packed, rows);
        else
            tile(kern, k, dst, n, w, x, q, qstride, i0, i1, j0, j1, packed);
    }
}

/* Products with experts (mul_mat_id): pair p = tok * n_used + u of the
 * batch multiplies activation row xr(p) by expert id[p].  A decoded token's
 * pairs each go through the expert's decoding kernels, reading only the
 * chosen experts' rows.  A batch of several tokens groups its pairs by
 * expert (token order within an expert, the counting sort below), gathers
 * each group's quantized activation rows into one block and multiplies it
 * as the dense path multiplies a batch (prompt tiles, packed or interleaved
 * rows), then scatters the results back to the pairs' rows.  Every element
 * is still vec_dot of its pair: the kernels all give those bits.
 *
 * A batch takes each pair alone while its experts average at most this many
 * pairs: groups of one or two share too few weight reads to pay for the
 * grouping's two extra barriers and copies (Qwen3-30B-A3B's 128 experts and
 * 8 tokens, on a machine shared with other work: grouped 5-12 ms a product,
 * pair by pair 3-6). */
#define ID_DIRECT_PAIRS_PER_EXPERT 2

typedef struct {
    int64_t n_pairs, n_exp, n_used;
    int32_t *order;   /* the pairs, grouped by expert */
    int32_t *start;   /* [n_exp + 1]: expert e's pairs are order[start[e] .. start[e + 1]) */
    int32_t *task_start;   /* [n_exp + 1]: expert e's tiles are tasks task_start[e] .. task_start[e + 1) */
} id_groups;

static int64_t id_x_row(const pe_tensor *x, int64_t n_used, int64_t pair) {
    const int64_t u = pair % n_used, tok = pair / n_used;
    return (x->ne[1] == 1 ? 0 : u) + tok * x->ne[1];
}

static int ids_in_range(const pe_tensor *ids, int64_t n_exp) {
    const int32_t *id = ids->data;
    for (int64_t p = 0; p < ids->ne[0] * ids->ne[1]; p++)
        if (id[p] < 0 || id[p] >= n_exp) return 0;
    return 1;
}

static int id_direct(const pe_tensor *w, const pe_tensor *ids) {
    return ids->ne[1] <= 1 || ids->ne[0] * ids->ne[1] <= ID_DIRECT_PAIRS_PER_EXPERT * w->ne[2] ||
           pe_type_vec_dot_type(w->type) == PE_TYPE_F32;
}

/* The activation rows a product with experts hands a kernel at a time, as
 * planning sees it: one (pairs alone), or an expert's group on average (the
 * groups at or below the decoding kernel's limit take it, where the rows
 * carry the scales it reads: group_decode_cols). */
static int64_t id_cols(const pe_tensor *w, const pe_tensor *ids) {
    return id_direct(w, ids) ? 1 : (ids->ne[0] * ids->ne[1] + w->ne[2] - 1) / w->ne[2];
}

/* A product with experts': its kernels are handed id_cols rows at a time. */
static size_t id_activations_bytes(const pe_tensor *w, const pe_tensor *x, const pe_tensor *ids, int nth) {
    return activations_bytes(w, x, pe_type_vec_dot_type(w->type), nth, id_cols(w, ids));
}

/* Scratch of the grouped path after the quantized activations: the groups,
 * the gathered activation rows, their results, then per thread packed and
 * unpacked weight rows. */
static size_t groups_bytes(int64_t n_pairs, int64_t n_exp) {
    return round64((size_t)(n_pairs + 2 * (n_exp + 1)) * sizeof(int32_t));
}

static size_t id_pack_bytes(const pe_tensor *w, const pe_tensor *ids) {
    return id_direct(w, ids) ? 0 : packs_bytes(&plain_kernels(w)->packed, w->ne[0]);
}

static size_t id_shared_bytes(const pe_tensor *w, const pe_tensor *x, const pe_tensor *ids, int nth) {
    const int vdt = pe_type_vec_dot_type(w->type);
    const size_t acts = id_activations_bytes(w, x, ids, nth);
    if (id_direct(w, ids)) return acts;
    const int64_t n_pairs = ids->ne[0] * ids->ne[1];
    return acts + groups_bytes(n_pairs, w->ne[2]) +
           round64((size_t)n_pairs * activation_row_bytes(w, x, vdt, id_cols(w, ids))) +
           round64((size_t)n_pairs * w->ne[1] * sizeof(float));
}

size_t pe_op_mul_mat_id_work(const pe_graph *g, const pe_tensor *t, int n_threads) {
    const pe_tensor *w = &g->t[t->src[0]], *x = &g->t[t->src[1]], *ids = &g->t[t->src[2]];
    const size_t bytes = id_shared_bytes(w, x, ids, n_threads) +
                         (size_t)n_threads * (id_pack_bytes(w, ids) + unpacked_bytes(w));
    return bytes ? bytes + 64 : 0;
}

/* Weight rows [i0, i1) of expert we against activation rows [j0, j1) at q,
 * results at dst (rows of w->ne[1] floats); m: the columns the decoding
 * kernels may count on (tile_rows8). */
static void expert_tile(const pe_type_kernels *kern, int64_t k, float *dst, const pe_tensor *we, const pe_tensor *x,
                        const uint8_t *q, size_t qstride, int64_t m, int64_t i0, int64_t i1, int64_t j0, int64_t j1,
                        void *packed, uint8_t *rows) {
    const int64_t n = we->ne[1];
    if (kern->rows8.unpack8)
        tile_rows8(kern, k, dst, n, we, x, q, qstride, m, i0, i1, j0, j1, packed, rows);
    else
        tile(kern, k, dst, n, we, x, q, qstride, i0, i1, j0, j1, packed);
}

static pe_tensor expert_view(const pe_tensor *w, int64_t e) {
    pe_tensor we = *w;
    we.data = (uint8_t *)w->data + e * w->nb[2];
    we.ne[2] = 1;
    return we;
}

/* Whether the decoding kernels may take a group of m columns: a kernel that
 * reads the activations' float scales only where the rows carry them. */
static int64_t group_decode_cols(const pe_type_kernels *kern, const pe_tensor *w, const pe_tensor *x,
                                 const pe_tensor *ids, int64_t m) {
    return kern->rows8.scales && !with_scales(w, x, id_cols(w, ids)) ? INT64_MAX : m;
}

/* One pair at a time, tasks of (pair, row range) in ranges per thread. */
static void id_direct_run(pe_exec *ex, pe_tensor *t, const pe_tensor *w, const pe_tensor *x, const pe_tensor *ids,
                          const uint8_t *q, size_t qstride, uint8_t *rows) {
    const pe_type_kernels *kern = &pe_kern->type[w->type];
    const int64_t k = x->ne[0], n = w->ne[1], n_used = ids->ne[0], n_pairs = ids->ne[0] * ids->ne[1];
    const int32_t *id = ids->data;
    int64_t per_task = DECODE_TASK_ROWS;
    while (n_pairs * ((n + per_task - 1) / per_task) > PE_RANGE_MAX_TASKS) per_task *= 2;
    const int64_t per_pair = (n + per_task - 1) / per_task;
    for (int64_t task = pe_range_next(ex, n_pairs * per_pair); task >= 0; task = pe_range_next(ex, n_pairs * per_pair)) {
        const int64_t pair = task / per_pair, i0 = task % per_pair * per_task;
        const int64_t i1 = i0 + per_task < n ? i0 + per_task : n;
        const int64_t xr = id_x_row(x, n_used, pair);
        float *d = pe_row(t, pair % n_used, pair / n_used, 0);
        const pe_tensor we = expert_view(w, id[pair]);
        if (q) {
            const int64_t cols = group_decode_cols(kern, w, x, ids, 1);
            expert_tile(kern, k, d, &we, x, q + xr * qstride, qstride, cols, i0, i1, 0, 1, NULL, rows);
        } else {
            const uint8_t *wd = we.data;
            for (int64_t i = i0; i < i1; i++) kern->vec_dot(k, d + i, wd + i * w->nb[1], x_row(x, xr));
        }
    }
}

/* The pairs grouped by expert, token order within each (a counting sort:
 * start[] counts, then serves as each expert's cursor, then is shifted
 * back to the groups' starts), and the tiles each group takes. */
static void group_pairs(const int32_t *id, int64_t n_rb, int64_t cols, id_groups *gr) {
    int32_t *start = gr->start;
    memset(start, 0, (size_t)(gr->n_exp + 1) * sizeof(int32_t));
    for (int64_t p = 0; p < gr->n_pairs; p++) start[id[p] + 1]++;
    for (int64_t e = 0; e < gr->n_exp; e++) start[e + 1] += start[e];
    for (int64_t p = 0; p < gr->n_pairs; p++) gr->order[start[id[p]]++] = (int32_t)p;
    for (int64_t e = gr->n_exp; e > 0; e--) start[e] = start[e - 1];
    start[0] = 0;
    gr->task_start[0] = 0;
    for (int64_t e = 0; e < gr->n_exp; e++) {
        const int64_t m = start[e + 1] - start[e];
        gr->task_start[e + 1] = gr->task_start[e] + (int32_t)(n_rb * ((m + cols - 1) / cols));
    }
}

/* The expert whose tiles hold task (the last e with task_start[e] <= task). */
static int64_t task_expert(const id_groups *gr, int64_t task) {
    int64_t lo = 0, hi = gr->n_exp - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (gr->task_start[mid] <= task) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static id_groups id_groups_at(uint8_t *at, int64_t n_pairs, int64_t n_exp, int64_t n_used) {
    id_groups gr = {n_pairs, n_exp, n_used, (int32_t *)at, NULL, NULL};
    gr.start = gr.order + n_pairs;
    gr.task_start = gr.start + n_exp + 1;
    return gr;
}

/* Rows copied between the pairs' own places and the grouped order, split
 * over the threads: the quantized activation rows in, the results out. */
static void gather_rows(const pe_exec *ex, const id_groups *gr, const pe_tensor *x, const uint8_t *q, size_t qstride,
                        uint8_t *grouped) {
    int64_t p0, p1;
    pe_split(gr->n_pairs, ex->ith, ex->nth, &p0, &p1);
    for (int64_t p = p0; p < p1; p++)
        memcpy(grouped + p * qstride, q + id_x_row(x, gr->n_used, gr->order[p]) * qstride, qstride);
}

static void scatter_results(const pe_exec *ex, const id_groups *gr, pe_tensor *t, const float *out) {
    const int64_t n = t->ne[0];
    int64_t p0, p1;
    pe_split(gr->n_pairs, ex->ith, ex->nth, &p0, &p1);
    for (int64_t p = p0; p < p1; p++) {
        const int64_t pair = gr->order[p];
        memcpy(pe_row(t, pair % gr->n_used, pair / gr->n_used, 0), out + p * n, (size_t)n * sizeof(float));
    }
}

static void id_grouped_run(pe_exec *ex, pe_tensor *t, const pe_tensor *w, const pe_tensor *x, const pe_tensor *ids,
                           const uint8_t *q, size_t qstride) {
    const pe_type_kernels *kern = &pe_kern->type[w->type];
    const int64_t k = x->ne[0], n = w->ne[1], n_exp = w->ne[2], n_pairs = ids->ne[0] * ids->ne[1];
    const int64_t cols = tile_cols(kern);
    const size_t acts = id_activations_bytes(w, x, ids, ex->nth);
    uint8_t *grouped = ex->work + acts + groups_bytes(n_pairs, n_exp);
    float *out = (float *)(grouped + round64((size_t)n_pairs * qstride));
    const size_t shared = id_shared_bytes(w, x, ids, ex->nth), pack = id_pack_bytes(w, ids);
    void *packed = pack ? ex->work + shared + (size_t)ex->ith * pack : NULL;
    uint8_t *rows = unpacked_bytes(w) ? ex->work + shared + (size_t)ex->nth * pack + (size_t)ex->ith * unpacked_bytes(w)
                                      : NULL;
    id_groups gr = id_groups_at(ex->work + acts, n_pairs, n_exp, ids->ne[0]);
    gather_rows(ex, &gr, x, q, qstride, grouped);
    pe_pool_barrier(ex->pool);
    int first = 1;
    const int64_t n_tasks = gr.task_start[n_exp];
    for (int64_t task = next_task(ex, &first); task < n_tasks; task = next_task(ex, &first)) {
        const int64_t e = task_expert(&gr, task), local = task - gr.task_start[e];
        const int64_t p0 = gr.start[e], m = gr.start[e + 1] - p0, n_cb = (m + cols - 1) / cols;
        const int64_t rb = local / n_cb, cb = local % n_cb;
        const int64_t i0 = rb * TILE_ROWS, i1 = i0 + TILE_ROWS < n ? i0 + TILE_ROWS : n;
        const int64_t j0 = cb * cols, j1 = j0 + cols < m ? j0 + cols : m;
        const pe_tensor we = expert_view(w, e);
        expert_tile(kern, k, out + p0 * n, &we, x, grouped + p0 * qstride, qstride,
                    group_decode_cols(kern, w, x, ids, m), i0, i1, j0, j1, packed, rows);
    }
    pe_pool_barrier(ex->pool);
    scatter_results(ex, &gr, t, out);
}

void pe_op_mul_mat_id_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *w = src(ex, t, 0), *x = src(ex, t, 1), *ids = src(ex, t, 2);
    if (!ids_in_range(ids, w->ne[2])) { pe_exec_fail(ex, "mul_mat_id: expert id out of range"); return; }
    const int direct = id_direct(w, ids);
    if (direct && unpacked_bytes(w) && (size_t)(ex->ith + 1) * unpacked_bytes(w) +
                                           id_shared_bytes(w, x, ids, ex->nth) > ex->work_bytes) {
        pe_exec_fail(ex, "mul_mat_id: no scratch planned for an interleaved weight");
        return;
    }
    if (!direct && pe_op_mul_mat_id_work(ex->g, t, ex->nth) > ex->work_bytes) {
        pe_exec_fail(ex, "mul_mat_id: no scratch planned");
        return;
    }
    if (!direct && ex->ith == 0) {   /* the groups, while the others quantize (the barrier below orders them) */
        const pe_type_kernels *kern = &pe_kern->type[w->type];
        id_groups gr = id_groups_at(ex->work + id_activations_bytes(w, x, ids, ex->nth),
                                    ids->ne[0] * ids->ne[1], w->ne[2], ids->ne[0]);
        group_pairs(ids->data, (w->ne[1] + TILE_ROWS - 1) / TILE_ROWS, tile_cols(kern),
                    &gr);
    }
    size_t qstride;
    const uint8_t *q = quantize_activations(ex, w, x, pe_type_vec_dot_type(w->type), id_cols(w, ids), &qstride);
    if (direct) {
        uint8_t *rows = unpacked_bytes(w) ? ex->work + id_shared_bytes(w, x, ids, ex->nth) +
                                                (size_t)ex->ith * unpacked_bytes(w)
                                          : NULL;
        id_direct_run(ex, t, w, x, ids, q, qstride, rows);
    } else {
        id_grouped_run(ex, t, w, x, ids, q, qstride);
    }
}

/* Lookups: a table interleaved by 8 rows (the tied output projection of a
 * model whose embedding is its output weight) is read through its row's
 * group, unpacked into this thread's scratch: one copy of the table serves
 * the products and the lookups. */
int pe_get_rows_readable(const pe_tensor *table) {
    const int base = pe_type_rows8_base(table->type);
    if (base < 0) return pe_kern->type[table->type].to_float != NULL;
    return pe_kern->type[table->type].rows8.unpack8 && pe_kern->type[base].to_float;
}

static size_t get_rows_group_bytes(const pe_tensor *table) {
    return pe_type_rows8_base(table->type) >= 0 ? round64(PE_GEMM8_ROWS * table->nb[1]) : 0;
}

size_t pe_op_get_rows_work(const pe_graph *g, const pe_tensor *t, int n_threads) {
    return (size_t)n_threads * get_rows_group_bytes(&g->t[t->src[0]]);
}

void pe_op_get_rows_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *table = src(ex, t, 0), *ids = src(ex, t, 1);
    const int32_t *id = ids->data;
    const int base = pe_type_rows8_base(table->type);
    const pe_to_float_fn to_float = pe_kern->type[base >= 0 ? base : table->type].to_float;
    const size_t bw = table->nb[1], group = get_rows_group_bytes(table);
    uint8_t *rows = group ? ex->work + (size_t)ex->ith * group : NULL;
    if (group && (size_t)(ex->ith + 1) * group > ex->work_bytes) { pe_exec_fail(ex, "get_rows: no scratch planned"); return; }
    int64_t r0, r1;
    pe_split(t->ne[1], ex->ith, ex->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        if (id[r] < 0 || id[r] >= table->ne[1]) { pe_exec_fail(ex, "get_rows: row id out of range"); return; }
        const uint8_t *row = (const uint8_t *)table->data + (int64_t)id[r] * bw;
        if (rows) {   /* the row's group of 8, unpacked; the row from it */
            const int64_t first = id[r] - id[r] % PE_GEMM8_ROWS;
            pe_kern->type[table->type].rows8.unpack8(table->ne[0], (const uint8_t *)table->data + first * bw, rows, bw);
            row = rows + (id[r] - first) * bw;
        }
        to_float(row, (float *)((uint8_t *)t->data + r * t->nb[1]), table->ne[0]);
    }
}
