/* ops.c - the op dispatcher and the row-wise ops (elementwise, norms,
 * softmax, expert routing).  Rows are split evenly over the threads.  The
 * same input gives the same bits on every instruction set: exp and tanh
 * are vec_math.h's, not the C library's, and the loops over a row take the
 * kernels' fixed orders (sum_sq, exp_sum). */
#include <math.h>
#include <string.h>

#include "blocks.h"
#include "internal.h"
#include "vec_math.h"

/* no a*b+c fused by the compiler: the same bits whatever the flags */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

void pe_op_get_rows_run(pe_exec *ex, pe_tensor *t);
void pe_op_mul_mat_run(pe_exec *ex, pe_tensor *t);
void pe_op_mul_mat_id_run(pe_exec *ex, pe_tensor *t);
void pe_op_rope_run(pe_exec *ex, pe_tensor *t);
void pe_op_rope_angles_run(pe_exec *ex, pe_tensor *t);
void pe_op_set_rows_run(pe_exec *ex, pe_tensor *t);
void pe_op_attn_run(pe_exec *ex, pe_tensor *t);
size_t pe_op_mul_mat_work(const pe_graph *g, const pe_tensor *t, int n_threads);
size_t pe_op_mul_mat_id_work(const pe_graph *g, const pe_tensor *t, int n_threads);
int pe_op_mul_mat_joins(const pe_graph *g, const pe_tensor *prev, const pe_tensor *t);
size_t pe_op_attn_work(const pe_graph *g, const pe_tensor *t, int n_threads);
size_t pe_op_get_rows_work(const pe_graph *g, const pe_tensor *t, int n_threads);
void pe_op_l2_norm_run(pe_exec *ex, pe_tensor *t);
void pe_op_ssm_conv_run(pe_exec *ex, pe_tensor *t);
void pe_op_ssm_scan_run(pe_exec *ex, pe_tensor *t);
void pe_op_delta_net_run(pe_exec *ex, pe_tensor *t);
size_t pe_op_ssm_work(const pe_graph *g, const pe_tensor *t, int n_threads);

static inline pe_tensor *src(const pe_exec *ex, const pe_tensor *t, int i) {
    return t->src[i] >= 0 ? &ex->g->t[t->src[i]] : NULL;
}

/* Row r of a tensor, counting rows over dims 1..3. */
static inline float *row_f32(const pe_tensor *t, int64_t r) {
    const int64_t i1 = r % t->ne[1], i2 = (r / t->ne[1]) % t->ne[2], i3 = r / (t->ne[1] * t->ne[2]);
    return (float *)pe_row(t, i1, i2, i3);
}

static void binary_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *a = src(ex, t, 0), *b = src(ex, t, 1);
    const int64_t n = a->ne[0], nb0 = b->ne[0];
    int64_t r0, r1;
    pe_split(pe_nrows(a), ex->ith, ex->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % a->ne[1], i2 = (r / a->ne[1]) % a->ne[2], i3 = r / (a->ne[1] * a->ne[2]);
        const float *x = pe_row(a, i1, i2, i3);
        const float *y = pe_row(b, i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3]);
        float *d = row_f32(t, r);
        if (t->op == PE_OP_ADD) {
            if (nb0 == n) for (int64_t i = 0; i < n; i++) d[i] = x[i] + y[i];
            else for (int64_t i = 0; i < n; i++) d[i] = x[i] + y[i % nb0];
        } else {
            if (nb0 == n) for (int64_t i = 0; i < n; i++) d[i] = x[i] * y[i];
            else for (int64_t i = 0; i < n; i++) d[i] = x[i] * y[i % nb0];
        }
    }
}

/* erf(x / sqrt 2) in double (the C library's erf agrees across systems to
 * far below a float's last bit), rounded once */
static float gelu_erf(float x) { return (float)erf((double)(x * 0.70710678f)); }

static void unary_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *a = src(ex, t, 0);
    const int64_t n = a->ne[0];
    const float p = t->fp[0];
    int64_t r0, r1;
    pe_split(pe_nrows(a), ex->ith, ex->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const float *x = row_f32(a, r);
        float *d = row_f32(t, r);
        switch (t->op == PE_OP_UNARY ? 100 + t->ip[0] : t->op) {
        case PE_OP_SCALE:   for (int64_t i = 0; i < n; i++) d[i] = x[i] * p; break;
        case PE_OP_SOFTCAP: for (int64_t i = 0; i < n; i++) d[i] = p * pe_tanhf(x[i] / p); break;
        case PE_OP_CONT:    memcpy(d, x, (size_t)n * sizeof(float)); break;
        case 100 + PE_UNARY_SILU:     for (int64_t i = 0; i < n; i++) d[i] = x[i] / (1.0f + pe_expf(0.0f - x[i])); break;
        case 100 + PE_UNARY_GELU:     for (int64_t i = 0; i < n; i++) d[i] = pe_gelu(x[i]); break;
        case 100 + PE_UNARY_GELU_ERF: for (int64_t i = 0; i < n; i++) d[i] = 0.5f * x[i] * (1.0f + gelu_erf(x[i])); break;
        case 100 + PE_UNARY_RELU:     for (int64_t i = 0; i < n; i++) d[i] = x[i] > 0 ? x[i] : 0; break;
        case 100 + PE_UNARY_SIGMOID:  for (int64_t i = 0; i < n; i++) d[i] = 1.0f / (1.0f + pe_expf(0.0f - x[i])); break;
        case 100 + PE_UNARY_SOFTPLUS: for (int64_t i = 0; i < n; i++) d[i] = pe_softplusf(x[i]); break;
        default: break;
        }
    }
}

static void glu_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *gate = src(ex, t, 0), *up = src(ex, t, 1);
    int64_t r0, r1;
    pe_split(pe_nrows(gate), ex->ith, ex->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        if (t->ip[0] == PE_UNARY_SILU) pe_kern->vec.silu_mul(gate->ne[0], row_f32(t, r), row_f32(gate, r), row_f32(up, r));
        else pe_kern->vec.gelu_mul(gate->ne[0], row_f32(t, r), row_f32(gate, r), row_f32(up, r));
    }
}

/* x - mean(x) into d (which may be x's row), the mean summed in double in
 * element order: one order whatever the ISA or thread split */
static const float *centred_row(int64_t n, const float *x, float *d) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += x[i];
    const float mean = (float)(sum / (double)n);
    for (int64_t i = 0; i < n; i++) d[i] = x[i] - mean;
    return d;
}

static void rms_norm_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *a = src(ex, t, 0), *w = src(ex, t, 1);
    const int64_t n = a->ne[0];
    const float *wd = w ? (const float *)w->data : NULL;
    int64_t r0, r1;
    pe_split(pe_nrows(a), ex->ith, ex->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const float *x = row_f32(a, r);
        float *d = row_f32(t, r);
        if (t->ip[0]) x = centred_row(n, x, d);   /* a layer norm: the RMS norm of x - mean(x) */
        const float mean = (float)(pe_kern->vec.sum_sq(n, x) / (double)n);
        const float scale = 1.0f / sqrtf(mean + t->fp[0]);
        /* (x * scale) * w, the same rounding as a norm followed by a mul */
        if (wd) for (int64_t i = 0; i < n; i++) d[i] = (x[i] * scale) * wd[i];
        else for (int64_t i = 0; i < n; i++) d[i] = x[i] * scale;
    }
}

/* softmax: the kernels' max and exp_sum (their chunk order), the float inverse */
static void softmax_row(int64_t n, float *d, const float *x) {
    const float mx = pe_kern->vec.max(n, x);
    const float inv = (float)(1.0 / pe_kern->vec.exp_sum(n, d, x, mx));
    for (int64_t i = 0; i < n; i++) d[i] *= inv;
}

static void softmax_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *a = src(ex, t, 0);
    int64_t r0, r1;
    pe_split(pe_nrows(a), ex->ith, ex->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) softmax_row(a->ne[0], row_f32(t, r), row_f32(a, r));
}

static void topk_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *a = src(ex, t, 0);
    const int k = t->ip[0];
    int64_t r0, r1;
    pe_split(pe_nrows(a), ex->ith, ex->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const float *x = row_f32(a, r);
        int32_t *out = (int32_t *)((uint8_t *)t->data + r * t->nb[1]);
        /* insertion into a sorted list of k: k is small (experts used) */
        for (int j = 0; j < k; j++) out[j] = -1;
        for (int64_t i = 0; i < a->ne[0]; i++) {
            int j = k;
            while (j > 0 && (out[j - 1] < 0 || x[i] > x[out[j - 1]])) j--;
            if (j >= k) continue;
            memmove(out + j + 1, out + j, (size_t)(k - j - 1) * sizeof *out);
            out[j] = (int32_t)i;
        }
    }
}

/* The softmax over the k chosen logits alone, as llama.cpp takes it over
 * the gathered logits: their max, exponentials summed in double, the float
 * inverse.  Returns -1 for an id out of range. */
static int softmax_chosen(int64_t n, int64_t k, const float *x, const int32_t *id, float *d) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < k; j++) {
        if (id[j] < 0 || id[j] >= n) return -1;
        mx = x[id[j]] > mx ? x[id[j]] : mx;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < k; j++) {
        d[j] = pe_expf(x[id[j]] - mx);
        sum += d[j];
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t j = 0; j < k; j++) d[j] *= inv;
    return 0;
}

/* add_id: row (u, t) of a plus row ids[u, t] of b (each chosen expert's bias). */
static void add_id_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *a = src(ex, t, 0), *b = src(ex, t, 1), *ids = src(ex, t, 2);
    const int64_t n = a->ne[0], n_rows = b->ne[1];
    int64_t r0, r1;
    pe_split(pe_nrows(a), ex->ith, ex->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t u = r % a->ne[1], tok = r / a->ne[1];
        const int32_t e = *(const int32_t *)((const uint8_t *)ids->data + u * ids->nb[0] + tok * ids->nb[1]);
        if (e < 0 || e >= n_rows) { pe_exec_fail(ex, "add_id: expert id out of range"); return; }
        const float *x = pe_row(a, u, tok, 0), *y = pe_row(b, e, 0, 0);
        float *d = row_f32(t, r);
        for (int64_t i = 0; i < n; i++) d[i] = x[i] + y[i];
    }
}

/* gpt-oss's unit, in llama.cpp's steps: the gate clamped from above, the up
 * part on both sides, gate * sigmoid(alpha * gate) * (up + 1), i.e.
 * g / (1 + exp(alpha * -g)) * (u + 1).  The exponentials are the table's
 * exp_sum over the row (pe_expf's bits in vector lanes: this file's own
 * pe_expf, built without FMA instructions, costs ~50 ns a value). */
static void swiglu_oai_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *gate = src(ex, t, 0), *up = src(ex, t, 1);
    const float alpha = t->fp[0], limit = t->fp[1];
    const int64_t n = gate->ne[0];
    int64_t r0, r1;
    pe_split(pe_nrows(gate), ex->ith, ex->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const float *x = row_f32(gate, r), *y = row_f32(up, r);
        float *d = row_f32(t, r);
        for (int64_t i = 0; i < n; i++) d[i] = alpha * (0.0f - (limit < x[i] ? limit : x[i]));   /* std::min */
        pe_kern->vec.exp_sum(n, d, d, 0.0f);                                                    /* exp(d - 0) */
        for (int64_t i = 0; i < n; i++) {
            const float g = limit < x[i] ? limit : x[i];
            const float u = y[i] < -limit ? -limit : (limit < y[i] ? limit : y[i]);   /* std::clamp */
            d[i] = g / (1.0f + d[i]) * (u + 1.0f);
        }
    }
}

/* Sigmoid gating: each chosen logit's sigmoid, optionally over their sum. */
static int sigmoid_chosen(int64_t n, int64_t k, const float *x, const int32_t *id, int normalize, float *d) {
    float sum = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        if (id[j] < 0 || id[j] >= n) return -1;
        d[j] = 1.0f / (1.0f + pe_expf(-x[id[j]]));
        sum += d[j];
    }
    if (normalize) {
        const float floor = 6.103515625e-5f;   /* llama.cpp's clamp of the sum: F16's smallest normal */
        sum = sum < floor ? floor : sum;
        for (int64_t j = 0; j < k; j++) d[j] /= sum;
    }
    return 0;
}

static void moe_weights_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *a = src(ex, t, 0), *ids = src(ex, t, 1);
    const int64_t n = a->ne[0], k = ids->ne[0];
    int64_t r0, r1;
    pe_split(pe_nrows(a), ex->ith, ex->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const float *x = row_f32(a, r);
        const int32_t *id = (const int32_t *)((const uint8_t *)ids->data + r * ids->nb[1]);
        float *d = (float *)((uint8_t *)t->data + r * t->nb[1]);
        if (t->ip[1] == 2) {
            if (sigmoid_chosen(n, k, x, id, t->ip[0], d)) { pe_exec_fail(ex, "moe_weights: expert id out of range"); return; }
            continue;
        }
        if (t->ip[1]) {
            if (softmax_chosen(n, k, x, id, d)) { pe_exec_fail(ex, "moe_weights: expert id out of range"); return; }
            continue;
        }
        float mx = -INFINITY;
        for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) sum += pe_expf(x[i] - mx);
        float picked = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            if (id[j] < 0 || id[j] >= n) { pe_exec_fail(ex, "moe_weights: expert id out of range"); return; }
            d[j] = (float)(pe_expf(x[id[j]] - mx) / sum);
            picked += d[j];
        }
        if (t->ip[0]) for (int64_t j = 0; j < k; j++) d[j] /= picked;
    }
}

/* Puts expert e of score s into the descending list best[0..count) (ties: the
 * lower id first), keeping at most k. */
static void route_insert(float *val, int32_t *ids, int64_t *count, int64_t k, float s, int32_t e) {
    if (*count == k && !(s > val[k - 1])) return;
    int64_t at = *count < k ? (*count)++ : k - 1;
    while (at > 0 && val[at - 1] < s) {
        val[at] = val[at - 1];
        ids[at] = ids[at - 1];
        at--;
    }
    val[at] = s;
    ids[at] = e;
}

/* One token's routing (pe_op_moe_route): scores s = gate(x) + bias, the
 * groups outside the best n_used masked, the k best of the rest. */
static void route_row(const pe_tensor *t, const float *x, const float *bias, int64_t n, int32_t *out) {
    const int64_t k = t->ip[0], n_group = t->ip[2], n_used = t->ip[3], per = n / n_group;
    float s[1024], val[1024];
    if (t->ip[1] == 0) {
        float mx = -INFINITY;
        for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) sum += (s[i] = pe_expf(x[i] - mx));
        const float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < n; i++) s[i] *= inv;
    } else {
        for (int64_t i = 0; i < n; i++) s[i] = 1.0f / (1.0f + pe_expf(-x[i]));
    }
    if (bias) for (int64_t i = 0; i < n; i++) s[i] += bias[i];
    if (n_group > 1) {
        float gval[1024];
        int32_t gids[1024];
        int64_t gcount = 0;
        for (int64_t g = 0; g < n_group; g++) {
            float top[2];
            int32_t tid[2];
            int64_t c = 0;
            for (int64_t i = 0; i < per; i++) route_insert(top, tid, &c, 2, s[g * per + i], (int32_t)i);
            route_insert(gval, gids, &gcount, n_used, top[0] + top[1], (int32_t)g);
        }
        uint8_t keep[1024] = {0};
        for (int64_t j = 0; j < gcount; j++) keep[gids[j]] = 1;
        for (int64_t i = 0; i < n; i++) if (!keep[i / per]) s[i] = -INFINITY;
    }
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++) route_insert(val, out, &count, k, s[i], (int32_t)i);
}

static void moe_route_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *a = src(ex, t, 0);
    const float *bias = t->src[1] >= 0 ? (const float *)src(ex, t, 1)->data : NULL;
    int64_t r0, r1;
    pe_split(pe_nrows(a), ex->ith, ex->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++)
        route_row(t, row_f32(a, r), bias, a->ne[0], (int32_t *)((uint8_t *)t->data + r * t->nb[1]));
}

static void weighted_sum_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *a = src(ex, t, 0), *w = src(ex, t, 1);
    const int64_t n = a->ne[0], nu = a->ne[1];
    int64_t r0, r1;
    pe_split(a->ne[2], ex->ith, ex->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        float *d = (float *)((uint8_t *)t->data + r * t->nb[1]);
        const float *wr = (const float *)((const uint8_t *)w->data + r * w->nb[1]);
        for (int64_t u = 0; u < nu; u++) {
            const float *x = pe_row(a, u, r, 0);
            if (u == 0) for (int64_t i = 0; i < n; i++) d[i] = x[i] * wr[0];
            else for (int64_t i = 0; i < n; i++) d[i] += x[i] * wr[u];
        }
    }
}

/* Copies only: each output row is a's row, then b's. */
static void concat_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *a = src(ex, t, 0), *b = src(ex, t, 1);
    const int64_t na = a->ne[0], nb = b->ne[0];
    int64_t r0, r1;
    pe_split(pe_nrows(t), ex->ith, ex->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % t->ne[1], i2 = r / t->ne[1];
        float *d = (float *)((uint8_t *)t->data + i1 * t->nb[1] + i2 * t->nb[2]);
        const uint8_t *x = (const uint8_t *)pe_row(a, i1, i2, 0), *y = (const uint8_t *)pe_row(b, i1, i2, 0);
        for (int64_t i = 0; i < na; i++) d[i] = *(const float *)(x + i * a->nb[0]);
        for (int64_t i = 0; i < nb; i++) d[na + i] = *(const float *)(y + i * b->nb[0]);
    }
}

void pe_op_compute(pe_exec *ex, pe_tensor *t) {
    switch (t->op) {
    case PE_OP_GET_ROWS:     pe_op_get_rows_run(ex, t); break;
    case PE_OP_MUL_MAT:      pe_op_mul_mat_run(ex, t); break;
    case PE_OP_MUL_MAT_ID:   pe_op_mul_mat_id_run(ex, t); break;
    case PE_OP_ADD:
    case PE_OP_MUL:          binary_run(ex, t); break;
    case PE_OP_SCALE:
    case PE_OP_SOFTCAP:
    case PE_OP_UNARY:
    case PE_OP_CONT:         unary_run(ex, t); break;
    case PE_OP_GLU:          glu_run(ex, t); break;
    case PE_OP_RMS_NORM:     rms_norm_run(ex, t); break;
    case PE_OP_SOFTMAX:      softmax_run(ex, t); break;
    case PE_OP_ROPE:         pe_op_rope_run(ex, t); break;
    case PE_OP_ROPE_ANGLES:  pe_op_rope_angles_run(ex, t); break;
    case PE_OP_SET_ROWS:     pe_op_set_rows_run(ex, t); break;
    case PE_OP_ATTN:         pe_op_attn_run(ex, t); break;
    case PE_OP_TOPK:         topk_run(ex, t); break;
    case PE_OP_MOE_WEIGHTS:  moe_weights_run(ex, t); break;
    case PE_OP_WEIGHTED_SUM: weighted_sum_run(ex, t); break;
    case PE_OP_ADD_ID:       add_id_run(ex, t); break;
    case PE_OP_SWIGLU_OAI:   swiglu_oai_run(ex, t); break;
    case PE_OP_L2_NORM:      pe_op_l2_norm_run(ex, t); break;
    case PE_OP_SSM_CONV:     pe_op_ssm_conv_run(ex, t); break;
    case PE_OP_SSM_SCAN:     pe_op_ssm_scan_run(ex, t); break;
    case PE_OP_DELTA_NET:    pe_op_delta_net_run(ex, t); break;
    case PE_OP_CONCAT:       concat_run(ex, t); break;
    case PE_OP_MOE_ROUTE:    moe_route_run(ex, t); break;
    default: break;
    }
}

size_t pe_op_work_bytes(const pe_graph *g, const pe_tensor *t, int n_threads) {
    switch (t->op) {
    case PE_OP_MUL_MAT:    return pe_op_mul_mat_work(g, t, n_threads);
    case PE_OP_MUL_MAT_ID: return pe_op_mul_mat_id_work(g, t, n_threads);
    case PE_OP_ATTN:       return pe_op_attn_work(g, t, n_threads);
    case PE_OP_GET_ROWS:   return pe_op_get_rows_work(g, t, n_threads);
    case PE_OP_SSM_CONV:
    case PE_OP_SSM_SCAN:
    case PE_OP_DELTA_NET:  return pe_op_ssm_work(g, t, n_threads);
    default:               return 0;
    }
}

int pe_op_joins(const pe_graph *g, const pe_tensor *prev, const pe_tensor *t) {
    return t->op == PE_OP_MUL_MAT && pe_op_mul_mat_joins(g, prev, t);
}
