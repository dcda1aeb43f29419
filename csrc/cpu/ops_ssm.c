/* ops_ssm.c - the recurrent layers' ops: the L2 norm, the short convolution
 * (ssm_conv), Mamba-2's selective scan (ssm_scan) and the gated delta rule
 * (delta_net), token by token and chunked.  The loops over elements are the
 * kernels' of cpu/vec_ssm.c (one order on every instruction set); this file
 * walks sequences, heads and tokens.  Threads take whole (sequence, head)
 * tasks, so a split never changes what a task computes. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "vec_math.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

static inline const pe_tensor *src(const pe_exec *ex, const pe_tensor *t, int i) {
    return t->src[i] >= 0 ? &ex->g->t[t->src[i]] : NULL;
}

/* element (i1, i2) of a tensor with rows of floats */
static inline float *at(const pe_tensor *t, int64_t i0, int64_t i1, int64_t i2) {
    return (float *)((uint8_t *)t->data + i1 * t->nb[1] + i2 * t->nb[2]) + i0;
}

/* ---- L2 norm --------------------------------------------------------------------- */

void pe_op_l2_norm_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *a = src(ex, t, 0);
    const int64_t n = a->ne[0];
    int64_t r0, r1;
    pe_split(pe_nrows(a), ex->ith, ex->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % a->ne[1], i2 = (r / a->ne[1]) % a->ne[2], i3 = r / (a->ne[1] * a->ne[2]);
        const float *x = pe_row(a, i1, i2, i3);
        float *d = (float *)pe_row(t, i1, i2, i3);
        const float norm = sqrtf((float)pe_kern->vec.sum_sq(n, x));
        const float scale = 1.0f / fmaxf(norm, t->fp[0]);
        for (int64_t i = 0; i < n; i++) d[i] = x[i] * scale;
    }
}

/* ---- sequences ------------------------------------------------------------------- */

typedef struct {
    int64_t first, count, row_in, row_out, pos;
} seq_span;

static seq_span seq_at(const pe_tensor *seqs, int64_t s) {
    const int32_t *f = (const int32_t *)seqs->data + s * PE_SEQ_FIELDS;
    return (seq_span){f[PE_SEQ_FIRST], f[PE_SEQ_COUNT], f[PE_SEQ_ROW_IN], f[PE_SEQ_ROW_OUT], f[PE_SEQ_POS]};
}

/* Whether the table fits the batch (n_tokens) and the state rows (n_rows), and
 * no row a sequence writes is one another sequence reads.  Every thread
 * checks (the table is small) and all skip the op alike when it is wrong. */
static int seqs_valid(pe_exec *ex, const pe_tensor *seqs, int64_t n_tokens, int64_t n_rows, const char *op) {
    const int64_t n = seqs->ne[1];
    const char *why = NULL;
    for (int64_t s = 0; s < n && !why; s++) {
        const seq_span a = seq_at(seqs, s);
        if (a.first < 0 || a.count < 0 || a.first + a.count > n_tokens) why = "a sequence's tokens fall outside the batch";
        else if (a.row_in < 0 || a.row_in >= n_rows || a.row_out < 0 || a.row_out >= n_rows) why = "a state row is out of range";
        else if (a.pos < 0) why = "a negative position";
        for (int64_t o = 0; o < n && !why; o++)
            if (o != s && seq_at(seqs, o).row_out == a.row_in) why = "a sequence reads a row another one writes";
    }
    if (!why) return 1;
    if (ex->ith == 0) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s: %s", op, why);
        pe_exec_fail(ex, msg);
    }
    return 0;
}

/* Zero the output columns no sequence names (a padded batch), on thread 0. */
static void zero_unnamed(pe_exec *ex, pe_tensor *t, const pe_tensor *seqs, int64_t n_tokens) {
    if (ex->ith != 0) return;
    const size_t col = t->nb[t->n_dims - 1];
    for (int64_t c = 0; c < n_tokens; c++) {
        int named = 0;
        for (int64_t s = 0; s < seqs->ne[1] && !named; s++) {
            const seq_span a = seq_at(seqs, s);
            named = c >= a.first && c < a.first + a.count;
        }
        if (!named) memset((uint8_t *)t->data + c * col, 0, col);
    }
}

/* A sequence's state row slice [off, off + n) in the row it writes, holding
 * the row it reads (copied over when they differ). */
static float *state_slice(const pe_tensor *state, const seq_span *a, int64_t off, int64_t n) {
    float *out = (float *)state->data + a->row_out * state->ne[0] + off;
    if (a->row_in != a->row_out)
        memcpy(out, (const float *)state->data + a->row_in * state->ne[0] + off, (size_t)n * sizeof(float));
    return out;
}

/* Per-thread scratch: the op's bytes for one thread, 64-aligned. */
static size_t thread_bytes(const pe_graph *g, const pe_tensor *t);

size_t pe_op_ssm_work(const pe_graph *g, const pe_tensor *t, int n_threads) {
    return (size_t)n_threads * thread_bytes(g, t) + 64;
}

static float *thread_scratch(const pe_exec *ex, const pe_tensor *t) {
    uint8_t *p = ex->work + (size_t)ex->ith * thread_bytes(ex->g, t);
    return (float *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
}

/* ---- short convolution ----------------------------------------------------------- */

#define CONV_BLOCK 64   /* channels per task */

void pe_op_ssm_conv_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *x = src(ex, t, 0), *w = src(ex, t, 1), *state = src(ex, t, 2), *seqs = src(ex, t, 3);
    const int64_t d = x->ne[0], K = w->ne[0], T = x->ne[1], n_blocks = (d + CONV_BLOCK - 1) / CONV_BLOCK;
    if (!seqs_valid(ex, seqs, T, state->ne[1], "ssm_conv")) return;
    zero_unnamed(ex, t, seqs, T);
    float *wt = thread_scratch(ex, t);              /* [K][CONV_BLOCK] the taps by channel */
    float *keep = wt + K * CONV_BLOCK;              /* [K-1][CONV_BLOCK] the new window */
    int64_t k0, k1;
    pe_split(seqs->ne[1] * n_blocks, ex->ith, ex->nth, &k0, &k1);
    for (int64_t task = k0; task < k1; task++) {
        const seq_span a = seq_at(seqs, task / n_blocks);
        const int64_t c0 = task % n_blocks * CONV_BLOCK, nc = d - c0 < CONV_BLOCK ? d - c0 : CONV_BLOCK;
        if (a.count == 0) continue;
        for (int64_t j = 0; j < K; j++)
            for (int64_t c = 0; c < nc; c++) wt[j * nc + c] = ((const float *)w->data)[(c0 + c) * K + j];
        const float *old = (const float *)state->data + a.row_in * state->ne[0] + c0;
        /* column m of the window: the state's K-1 columns, then the inputs */
        #define WINDOW(m) ((m) < K - 1 ? old + (m) * d : at(x, c0, a.first + (m) - (K - 1), 0))
        const float *cols[16];
        for (int64_t i = 0; i < a.count; i++) {
            for (int64_t j = 0; j < K; j++) cols[j] = WINDOW(i + j);
            pe_kern->ssm.conv_token(nc, (int)K, cols, wt, at(t, c0, a.first + i, 0));
        }
        for (int64_t j = 0; j < K - 1; j++) memcpy(keep + j * nc, WINDOW(a.count + j), (size_t)nc * sizeof(float));
        #undef WINDOW
        float *dst = (float *)state->data + a.row_out * state->ne[0] + c0;
        for (int64_t j = 0; j < K - 1; j++) memcpy(dst + j * d, keep + j * nc, (size_t)nc * sizeof(float));
    }
}

/* ---- selective scan -------------------------------------------------------------- */

void pe_op_ssm_scan_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *x = src(ex, t, 0), *dt = src(ex, t, 1), *A = src(ex, t, 2), *B = src(ex, t, 3),
                    *C = src(ex, t, 4), *D = src(ex, t, 5), *bias = src(ex, t, 6), *state = src(ex, t, 7),
                    *seqs = src(ex, t, 8);
    const int64_t P = x->ne[0], H = x->ne[1], T = x->ne[2], N = B->ne[0], G = B->ne[1];
    if (!seqs_valid(ex, seqs, T, state->ne[1], "ssm_scan")) return;
    zero_unnamed(ex, t, seqs, T);
    float *xdt = thread_scratch(ex, t);   /* [P] */
    int64_t k0, k1;
    pe_split(seqs->ne[1] * H, ex->ith, ex->nth, &k0, &k1);
    for (int64_t task = k0; task < k1; task++) {
        const seq_span a = seq_at(seqs, task / H);
        const int64_t h = task % H, grp = h / (H / G);
        if (a.count == 0) continue;
        float *S = state_slice(state, &a, h * N * P, N * P);
        const float Ah = ((const float *)A->data)[h];
        const float Dh = D ? ((const float *)D->data)[h] : 0.0f, bh = bias ? ((const float *)bias->data)[h] : 0.0f;
        for (int64_t i = a.first; i < a.first + a.count; i++) {
            const float step = pe_softplusf(*at(dt, h, i, 0) + bh);
            const float *xi = at(x, 0, h, i);
            for (int64_t p = 0; p < P; p++) xdt[p] = xi[p] * step;
            float *y = at(t, 0, h, i);
            pe_kern->ssm.scan_token(P, N, S, xdt, at(B, 0, grp, i), at(C, 0, grp, i), pe_expf(step * Ah), y);
            if (D) for (int64_t p = 0; p < P; p++) y[p] = fmaf(Dh, xi[p], y[p]);
        }
    }
}

/* ---- gated delta rule ------------------------------------------------------------ */

typedef struct {
    const pe_tensor *q, *k, *v, *g, *beta;
    float   scale;
    int64_t Dk, Dv, Hk;
} delta_in;

static void delta_tokens(const delta_in *in, float *S, int64_t h, int64_t first, int64_t n, float *qs, pe_tensor *out) {
    const int64_t hk = h % in->Hk;
    for (int64_t i = first; i < first + n; i++) {
        const float *q = at(in->q, 0, hk, i);
        for (int64_t r = 0; r < in->Dk; r++) qs[r] = q[r] * in->scale;
        pe_kern->ssm.delta_token(in->Dk, in->Dv, S, at(in->k, 0, hk, i), qs, at(in->v, 0, h, i),
                                 pe_expf(*at(in->g, h, i, 0)), *at(in->beta, h, i, 0), at(out, 0, h, i));
    }
}

/* One piece of n tokens (2 <= n <= chunk) of head h from token `first`: the
 * kernel's chunked form (vec_ssm.c) on the rows of this head. */
static void delta_piece(const delta_in *in, float *S, int64_t h, int64_t first, int64_t n, float *sc, pe_tensor *out) {
    const int64_t hk = h % in->Hk;
    const pe_delta_rows rows = {
        .q = at(in->q, 0, hk, first), .k = at(in->k, 0, hk, first), .v = at(in->v, 0, h, first),
        .g = at(in->g, h, first, 0), .beta = at(in->beta, h, first, 0), .out = at(out, 0, h, first),
        .q_step = (int64_t)(in->q->nb[2] / sizeof(float)), .k_step = (int64_t)(in->k->nb[2] / sizeof(float)),
        .v_step = (int64_t)(in->v->nb[2] / sizeof(float)), .g_step = (int64_t)(in->g->nb[1] / sizeof(float)),
        .beta_step = (int64_t)(in->beta->nb[1] / sizeof(float)), .out_step = (int64_t)(out->nb[2] / sizeof(float)),
        .scale = in->scale};
    pe_kern->ssm.delta_chunk(n, in->Dk, in->Dv, S, &rows, sc);
}

void pe_op_delta_net_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *q = src(ex, t, 0), *v = src(ex, t, 2), *state = src(ex, t, 5), *seqs = src(ex, t, 6);
    const delta_in in = {.q = q, .k = src(ex, t, 1), .v = v, .g = src(ex, t, 3), .beta = src(ex, t, 4),
                         .scale = t->fp[0], .Dk = q->ne[0], .Dv = v->ne[0], .Hk = q->ne[1]};
    const int64_t Dk = in.Dk, Dv = in.Dv, H = v->ne[1], T = q->ne[2], chunk = t->ip[0];
    if (!seqs_valid(ex, seqs, T, state->ne[1], "delta_net")) return;
    zero_unnamed(ex, t, seqs, T);
    float *sc = thread_scratch(ex, t);
    int64_t k0, k1;
    pe_split(seqs->ne[1] * H, ex->ith, ex->nth, &k0, &k1);
    for (int64_t task = k0; task < k1; task++) {
        const seq_span a = seq_at(seqs, task / H);
        const int64_t h = task % H;
        if (a.count == 0) continue;
        float *S = state_slice(state, &a, h * Dk * Dv, Dk * Dv);
        if (chunk == 0) { delta_tokens(&in, S, h, a.first, a.count, sc, t); continue; }
        /* pieces cut where the position is a multiple of chunk */
        for (int64_t i = 0; i < a.count;) {
            const int64_t pos = a.pos + i, n_left = a.count - i, to_edge = chunk - pos % chunk;
            const int64_t n = to_edge < n_left ? to_edge : n_left;
            if (n == 1) delta_tokens(&in, S, h, a.first + i, 1, sc, t);
            else delta_piece(&in, S, h, a.first + i, n, sc, t);
            i += n;
        }
    }
}

static size_t thread_bytes(const pe_graph *g, const pe_tensor *t) {
    size_t floats = 0;
    if (t->op == PE_OP_SSM_CONV) floats = 2 * (size_t)g->t[t->src[1]].ne[0] * CONV_BLOCK;
    else if (t->op == PE_OP_SSM_SCAN) floats = (size_t)g->t[t->src[0]].ne[0];
    else if (t->op == PE_OP_DELTA_NET) {
        const int64_t Dk = g->t[t->src[0]].ne[0], Dv = g->t[t->src[2]].ne[0];
        floats = t->ip[0] ? pe_delta_chunk_floats(t->ip[0], Dk, Dv) : (size_t)Dk;
    }
    return (floats * sizeof(float) + 127) / 64 * 64;
}
