/* graph_ops.c - op constructors: check the operands' shapes and types, then
 * add a node.  Everything a user's model file can get wrong is caught here,
 * at build time, with a message naming the op and the shapes. */
#include <stdio.h>
#include <string.h>

#include "backend.h"

static pe_tensor *get(pe_graph *g, int id, const char *op, const char *what) {
    pe_tensor *t = pe_graph_get(g, id);
    if (!t) pe_fail("%s: %s is not a tensor of this graph (id %d)", op, what, id);
    return t;
}

static const char *shape_str(const pe_tensor *t, char *buf, size_t n) {
    snprintf(buf, n, "[%lld,%lld,%lld,%lld] %s", (long long)t->ne[0], (long long)t->ne[1],
             (long long)t->ne[2], (long long)t->ne[3], pe_type_name(t->type));
    return buf;
}

static int fail_shapes(const char *op, const pe_tensor *a, const pe_tensor *b, const char *why) {
    char sa[96], sb[96];
    return pe_fail("%s: %s (%s vs %s)", op, why, shape_str(a, sa, sizeof sa), b ? shape_str(b, sb, sizeof sb) : "-");
}

/* Add an F32 (or `type`) result node with the given shape and sources. */
static int node(pe_graph *g, int op, int type, int n_dims, const int64_t *ne, int s0, int s1, int s2, int s3, int s4) {
    const int id = pe_graph_add(g, type, n_dims, ne);
    if (id < 0) return -1;
    pe_tensor *t = &g->t[id];
    t->op = op;
    t->src[0] = s0; t->src[1] = s1; t->src[2] = s2; t->src[3] = s3; t->src[4] = s4;
    return id;
}

static int same_shape_node(pe_graph *g, int op, const pe_tensor *a, int s0, int s1) {
    return node(g, op, PE_TYPE_F32, a->n_dims, a->ne, s0, s1, -1, -1, -1);
}

static int require_f32(const char *op, const pe_tensor *t) {
    if (t->type != PE_TYPE_F32) return fail_shapes(op, t, NULL, "operand must be F32");
    if (t->nb[0] != sizeof(float)) return fail_shapes(op, t, NULL, "rows must be contiguous");
    return 0;
}

static int require_i32(const char *op, const pe_tensor *t) {
    if (t->type != PE_TYPE_I32 || !pe_is_contiguous(t)) return fail_shapes(op, t, NULL, "indices must be a contiguous I32 tensor");
    return 0;
}

/* Whether the host's backend can read the rows of this table (before the
 * node exists: a failed check leaves the graph as it was). */
static int host_reads_rows(const pe_graph *g, int table) {
    pe_tensor probe = {.op = PE_OP_GET_ROWS};
    for (int i = 0; i < PE_MAX_SRC; i++) probe.src[i] = -1;
    probe.src[0] = table;
    return pe_backend_host()->supports_op(g, &probe);
}

int pe_op_get_rows(pe_graph *g, int table, int ids) {
    pe_tensor *a = get(g, table, "get_rows", "table"), *b = get(g, ids, "get_rows", "ids");
    if (!a || !b || require_i32("get_rows", b)) return -1;
    if (a->ne[2] != 1 || a->ne[3] != 1) return fail_shapes("get_rows", a, b, "table must be 2-D");
    if (!host_reads_rows(g, table)) return fail_shapes("get_rows", a, NULL, "no kernel to read this type");
    if (pe_type_rows8_base(a->type) >= 0 && a->ne[1] % 8) return fail_shapes("get_rows", a, NULL, "an interleaved table needs rows in 8s");
    const int64_t ne[2] = {a->ne[0], pe_nelements(b)};
    return node(g, PE_OP_GET_ROWS, PE_TYPE_F32, 2, ne, table, ids, -1, -1, -1);
}

/* interleaved: whether the op takes weights interleaved by 8 rows (mul_mat) */
static int check_weight(const char *op, const pe_tensor *w, int interleaved) {
    const int base = pe_type_rows8_base(w->type);
    if (base >= 0 && (!interleaved || w->ne[1] % 8 != 0))
        return fail_shapes(op, w, NULL, "weights interleaved by 8 rows need a plain product and rows in 8s");
    if (!pe_type_supported(base >= 0 ? base : w->type)) return fail_shapes(op, w, NULL, "weight type has no kernels");
    if (!pe_is_contiguous(w)) return fail_shapes(op, w, NULL, "weights must be contiguous");
    return 0;
}

int pe_op_mul_mat(pe_graph *g, int w, int x) {
    pe_tensor *a = get(g, w, "mul_mat", "weight"), *b = get(g, x, "mul_mat", "input");
    if (!a || !b || check_weight("mul_mat", a, 1) || require_f32("mul_mat", b)) return -1;
    if (a->ne[2] != 1 || a->ne[3] != 1) return fail_shapes("mul_mat", a, b, "weight must be 2-D");
    if (a->ne[0] != b->ne[0]) return fail_shapes("mul_mat", a, b, "inner dimensions differ");
    const int64_t ne[4] = {a->ne[1], b->ne[1], b->ne[2], b->ne[3]};
    return node(g, PE_OP_MUL_MAT, PE_TYPE_F32, b->n_dims < 2 ? 2 : b->n_dims, ne, w, x, -1, -1, -1);
}

int pe_op_mul_mat_id(pe_graph *g, int w, int x, int ids) {
    pe_tensor *a = get(g, w, "mul_mat_id", "weight"), *b = get(g, x, "mul_mat_id", "input"),
              *c = get(g, ids, "mul_mat_id", "ids");
    if (!a || !b || !c || check_weight("mul_mat_id", a, 1) || require_f32("mul_mat_id", b) || require_i32("mul_mat_id", c)) return -1;
    if (a->ne[3] != 1) return fail_shapes("mul_mat_id", a, b, "expert weights must be 3-D");
    if (a->ne[0] != b->ne[0]) return fail_shapes("mul_mat_id", a, b, "inner dimensions differ");
    if (c->ne[1] != b->ne[2] || (b->ne[1] != 1 && b->ne[1] != c->ne[0]))
        return fail_shapes("mul_mat_id", b, c, "input [K,U|1,T] and ids [U,T] disagree");
    const int64_t ne[3] = {a->ne[1], c->ne[0], c->ne[1]};
    return node(g, PE_OP_MUL_MAT_ID, PE_TYPE_F32, 3, ne, w, x, ids, -1, -1);
}

static int binary(pe_graph *g, int op, const char *name, int ia, int ib) {
    pe_tensor *a = get(g, ia, name, "a"), *b = get(g, ib, name, "b");
    if (!a || !b || require_f32(name, a) || require_f32(name, b)) return -1;
    for (int i = 0; i < PE_MAX_DIMS; i++)
        if (a->ne[i] % b->ne[i]) return fail_shapes(name, a, b, "b does not broadcast over a");
    return same_shape_node(g, op, a, ia, ib);
}

int pe_op_add(pe_graph *g, int a, int b) { return binary(g, PE_OP_ADD, "add", a, b); }
int pe_op_mul(pe_graph *g, int a, int b) { return binary(g, PE_OP_MUL, "mul", a, b); }

static int unary_param(pe_graph *g, int op, const char *name, int ia, float p, int ip) {
    pe_tensor *a = get(g, ia, name, "a");
    if (!a || require_f32(name, a)) return -1;
    const int id = same_shape_node(g, op, a, ia, -1);
    if (id >= 0) { g->t[id].fp[0] = p; g->t[id].ip[0] = ip; }
    return id;
}

int pe_op_scale(pe_graph *g, int a, float s) { return unary_param(g, PE_OP_SCALE, "scale", a, s, 0); }

int pe_op_softcap(pe_graph *g, int a, float cap) {
    if (!(cap > 0)) return pe_fail("softcap: cap must be positive (got %g)", cap);
    return unary_param(g, PE_OP_SOFTCAP, "softcap", a, cap, 0);
}

int pe_op_unary(pe_graph *g, int a, int op) {
    if (op < PE_UNARY_SILU || op > PE_UNARY_SOFTPLUS) return pe_fail("unary: unknown function %d", op);
    return unary_param(g, PE_OP_UNARY, "unary", a, 0, op);
}

int pe_op_softmax(pe_graph *g, int a) { return unary_param(g, PE_OP_SOFTMAX, "softmax", a, 0, 0); }
int pe_op_cont(pe_graph *g, int a) { return unary_param(g, PE_OP_CONT, "cont", a, 0, 0); }

int pe_op_rms_norm(pe_graph *g, int ia, int iw, float eps) {
    pe_tensor *a = get(g, ia, "rms_norm", "a");
    if (!a || require_f32("rms_norm", a)) return -1;
    if (!(eps >= 0)) return pe_fail("rms_norm: eps must be >= 0 (got %g)", eps);
    if (iw >= 0) {
        pe_tensor *w = get(g, iw, "rms_norm", "weight");
        if (!w || require_f32("rms_norm", w)) return -1;
        if (w->ne[0] != a->ne[0] || pe_nrows(w) != 1) return fail_shapes("rms_norm", a, w, "weight must be one row of the normalised length");
    }
    const int id = same_shape_node(g, PE_OP_RMS_NORM, a, ia, iw);
    if (id >= 0) g->t[id].fp[0] = eps;
    return id;
}

int pe_op_layer_norm(pe_graph *g, int ia, int iw, float eps) {
    const int id = pe_op_rms_norm(g, ia, iw, eps);
    if (id >= 0) g->t[id].ip[0] = 1;   /* centred first (ops.c) */
    return id;
}

int pe_op_glu(pe_graph *g, int gate, int up, int op) {
    pe_tensor *a = get(g, gate, "glu", "gate"), *b = get(g, up, "glu", "up");
    if (!a || !b || require_f32("glu", a) || require_f32("glu", b)) return -1;
    if (op != PE_UNARY_SILU && op != PE_UNARY_GELU) return pe_fail("glu: unsupported activation %d", op);
    for (int i = 0; i < PE_MAX_DIMS; i++)
        if (a->ne[i] != b->ne[i]) return fail_shapes("glu", a, b, "gate and up differ in shape");
    const int id = same_shape_node(g, PE_OP_GLU, a, gate, up);
    if (id >= 0) g->t[id].ip[0] = op;
    return id;
}

/* The node of rope's cos/sin table [n_dims, tokens] for these positions and
 * this setting (ip, fp): one made before, or a new one.  Every layer rotates
 * by the same angles; computing them (a sinf and a cosf per pair and token)
 * once per graph instead of once per rope node cut SmolLM2's rope time (60
 * nodes a step) by a fifth. */
static int rope_angles(pe_graph *g, int pos, int ff, const pe_tensor *setting) {
    for (int i = 0; i < g->n; i++) {
        const pe_tensor *t = &g->t[i];
        if (t->op == PE_OP_ROPE_ANGLES && t->src[0] == pos && t->src[1] == ff &&
            !memcmp(t->ip, setting->ip, sizeof t->ip) && !memcmp(t->fp, setting->fp, sizeof t->fp))
            return i;
    }
    const int multi = pe_rope_is_multi(setting->ip[1]);
    const int64_t width = setting->ip[1] == PE_ROPE_VISION ? 2 * setting->ip[0] : setting->ip[0];
    const int64_t ne[2] = {width, pe_nelements(&g->t[pos]) / (multi ? 4 : 1)};
    const int id = node(g, PE_OP_ROPE_ANGLES, PE_TYPE_F32, 2, ne, pos, ff, -1, -1, -1);
    if (id < 0) return -1;
    memcpy(g->t[id].ip, setting->ip, sizeof setting->ip);
    memcpy(g->t[id].fp, setting->fp, sizeof setting->fp);
    return id;
}

int pe_op_rope(pe_graph *g, int ia, int pos, int ff, int n_dims, int mode, float freq_base, float freq_scale,
               float ext_factor, float attn_factor, float beta_fast, float beta_slow, int n_ctx_orig) {
    pe_tensor *a = get(g, ia, "rope", "a"), *p = get(g, pos, "rope", "positions");
    if (!a || !p || require_f32("rope", a) || require_i32("rope", p)) return -1;
    if (pe_nelements(p) != a->ne[2]) return fail_shapes("rope", a, p, "one position per token (dim 2) needed");
    if (n_dims <= 0 || n_dims > a->ne[0] || n_dims % 2) return pe_fail("rope: n_dims=%d invalid for head size %lld", n_dims, (long long)a->ne[0]);
    if (mode != PE_ROPE_NORMAL && mode != PE_ROPE_NEOX) return pe_fail("rope: unknown mode %d", mode);
    if (!(freq_base > 0) || !(freq_scale > 0)) return pe_fail("rope: freq_base and freq_scale must be positive");
    if (ff >= 0) {
        pe_tensor *f = get(g, ff, "rope", "freq_factors");
        if (!f || require_f32("rope", f)) return -1;
        if (pe_nelements(f) < n_dims / 2) return fail_shapes("rope", a, f, "freq_factors needs n_dims/2 values");
    }
    const pe_tensor setting = {.ip = {n_dims, mode, n_ctx_orig},
                               .fp = {freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow}};
    const int angles = rope_angles(g, pos, ff, &setting);
    if (angles < 0) return -1;
    const int id = node(g, PE_OP_ROPE, PE_TYPE_F32, 3, g->t[ia].ne, ia, angles, -1, -1, -1);   /* positions: through the angles */
    if (id < 0) return -1;
    memcpy(g->t[id].ip, setting.ip, sizeof setting.ip);
    memcpy(g->t[id].fp, setting.fp, sizeof setting.fp);
    return id;
}

int pe_op_rope_multi(pe_graph *g, int ia, int pos, int n_dims, const int *sections, int mode,
                     float freq_base, float freq_scale) {
    pe_tensor *a = get(g, ia, "rope_multi", "a"), *p = get(g, pos, "rope_multi", "positions");
    if (!a || !p || require_f32("rope_multi", a) || require_i32("rope_multi", p)) return -1;
    if (!pe_rope_is_multi(mode)) return pe_fail("rope_multi: unknown mode %d", mode);
    if (pe_nelements(p) != 4 * a->ne[2]) return fail_shapes("rope_multi", a, p, "four positions per token (dim 2) needed");
    const int64_t width = mode == PE_ROPE_VISION ? 2 * (int64_t)n_dims : n_dims;
    if (n_dims <= 0 || width > a->ne[0] || width % 2)
        return pe_fail("rope_multi: n_dims=%d invalid for head size %lld", n_dims, (long long)a->ne[0]);
    if (!(freq_base > 0) || !(freq_scale > 0)) return pe_fail("rope_multi: freq_base and freq_scale must be positive");
    int total = 0;
    for (int i = 0; i < 4; i++) {
        if (sections[i] < 0 || sections[i] > width) return pe_fail("rope_multi: section %d = %d out of range", i, sections[i]);
        total += sections[i];
    }
    if (total <= 0) return pe_fail("rope_multi: the sections hold no pairs");
    const pe_tensor setting = {.ip = {n_dims, mode, 0, sections[0], sections[1], sections[2], sections[3]},
                               .fp = {freq_base, freq_scale, 0.0f, 1.0f, 32.0f, 1.0f}};
    const int angles = rope_angles(g, pos, -1, &setting);
    if (angles < 0) return -1;
    const int id = node(g, PE_OP_ROPE, PE_TYPE_F32, 3, g->t[ia].ne, ia, angles, -1, -1, -1);
    if (id < 0) return -1;
    memcpy(g->t[id].ip, setting.ip, sizeof setting.ip);
    memcpy(g->t[id].fp, setting.fp, sizeof setting.fp);
    return id;
}

int pe_op_set_rows(pe_graph *g, int cache, int src, int slots) {
    pe_tensor *c = get(g, cache, "set_rows", "cache"), *s = get(g, src, "set_rows", "src"),
              *i = get(g, slots, "set_rows", "slots");
    if (!c || !s || !i || require_f32("set_rows", s) || require_i32("set_rows", i)) return -1;
    if (c->type != PE_TYPE_F16 && c->type != PE_TYPE_F32 && c->type != PE_TYPE_Q8_0)
        return fail_shapes("set_rows", c, NULL, "cache must be F16, F32 or Q8_0");
    if (c->ne[2] != 1 || c->ne[3] != 1 || !pe_is_contiguous(c)) return fail_shapes("set_rows", c, NULL, "cache must be a contiguous [D,C] tensor");
    if (s->ne[0] != c->ne[0] || pe_nrows(s) != pe_nelements(i)) return fail_shapes("set_rows", c, s, "src rows must match the cache row and the slot count");
    /* the result is the cache itself, seen through a node that runs the write (read
     * before node(), which may move g->t) */
    const int base = c->view_of >= 0 ? c->view_of : cache;
    const size_t offset = c->view_of >= 0 ? c->view_offset : 0;
    const int id = node(g, PE_OP_SET_ROWS, c->type, 2, c->ne, cache, src, slots, -1, -1);
    if (id < 0) return -1;
    pe_tensor *t = &g->t[id];
    t->view_of = base;
    t->view_offset = offset;
    t->nbytes = 0;
    return id;
}

/* A K or V cache the attention kernel reads: F16, or Q8_0 when a head's
 * slice of a row is whole blocks (the kernel dots and dequantizes per head). */
static int check_attn_cache(const pe_tensor *c, int64_t hd) {
    if (c->type != PE_TYPE_F16 && c->type != PE_TYPE_Q8_0) return fail_shapes("attn", c, NULL, "K and V caches must be F16 or Q8_0");
    if (c->nb[0] != pe_type_block_bytes(c->type)) return fail_shapes("attn", c, NULL, "cache rows must be contiguous");
    if (hd % pe_type_block_size(c->type))
        return pe_fail("attn: head_dim %lld is not a multiple of the %s block size %lld", (long long)hd,
                       pe_type_name(c->type), (long long)pe_type_block_size(c->type));
    return 0;
}

int pe_op_attn(pe_graph *g, int q, int k, int v, int mask, int kv_len, int cell_pos, int n_head_kv, float scale,
               float softcap) {
    pe_tensor *tq = get(g, q, "attn", "q"), *tk = get(g, k, "attn", "k"), *tv = get(g, v, "attn", "v"),
              *tm = get(g, mask, "attn", "mask"), *tl = get(g, kv_len, "attn", "kv_len");
    if (!tq || !tk || !tv || !tm || !tl || require_f32("attn", tq) || require_f32("attn", tm) || require_i32("attn", tl)) return -1;
    const int64_t hd = tq->ne[0], nh = tq->ne[1], nt = tq->ne[2];
    if (n_head_kv <= 0 || nh % n_head_kv) return pe_fail("attn: %lld query heads do not divide into %d kv heads", (long long)nh, n_head_kv);
    /* V's heads may be narrower or wider than K's (MLA reads V as a prefix of the K row) */
    const int64_t hd_v = tv->ne[0] / n_head_kv;
    if (check_attn_cache(tk, hd) || check_attn_cache(tv, hd_v)) return -1;
    if (tk->ne[0] != hd * n_head_kv) return fail_shapes("attn", tq, tk, "cache rows must hold head_dim * n_head_kv values");
    if (hd_v < 1 || tv->ne[0] != hd_v * n_head_kv) return fail_shapes("attn", tq, tv, "V rows must hold whole heads for n_head_kv");
    if (tk->ne[1] != tv->ne[1]) return fail_shapes("attn", tk, tv, "K and V caches differ in length");
    if (tm->ne[0] < tk->ne[1] || tm->ne[1] < nt) return fail_shapes("attn", tm, tk, "mask must be [cells, tokens]");
    if (!(scale > 0)) return pe_fail("attn: scale must be positive");
    if (cell_pos >= 0) {
        const pe_tensor *tp = get(g, cell_pos, "attn", "cell_pos");
        if (!tp || require_i32("attn", tp)) return -1;
        if (tp->ne[0] < tk->ne[1]) return fail_shapes("attn", tp, tk, "one position per cache cell");
    }
    const int64_t ne[2] = {hd_v * nh, nt};
    const int id = node(g, PE_OP_ATTN, PE_TYPE_F32, 2, ne, q, k, v, mask, kv_len);
    if (id < 0) return -1;
    g->t[id].src[5] = cell_pos;
    g->t[id].ip[0] = n_head_kv;
    g->t[id].fp[0] = scale;
    g->t[id].fp[1] = softcap;
    return id;
}

int pe_op_attn_alibi(pe_graph *g, int attn, float max_bias) {
    pe_tensor *t = get(g, attn, "attn_alibi", "attn");
    if (!t) return -1;
    if (t->op != PE_OP_ATTN) return pe_fail("attn_alibi: tensor %d is no attention node", attn);
    if (!(max_bias > 0 && max_bias < 1e6f)) return pe_fail("attn_alibi: max_bias must be positive (got %g)", max_bias);
    t->fp[2] = max_bias;
    return attn;
}

int pe_op_topk(pe_graph *g, int ia, int k) {
    pe_tensor *a = get(g, ia, "topk", "a");
    if (!a || require_f32("topk", a)) return -1;
    if (k < 1 || k > a->ne[0]) return pe_fail("topk: k=%d out of range 1..%lld", k, (long long)a->ne[0]);
    const int64_t ne[2] = {k, pe_nrows(a)};
    const int id = node(g, PE_OP_TOPK, PE_TYPE_I32, 2, ne, ia, -1, -1, -1, -1);
    if (id >= 0) g->t[id].ip[0] = k;
    return id;
}

int pe_op_moe_weights(pe_graph *g, int logits, int ids, int normalize) {
    pe_tensor *a = get(g, logits, "moe_weights", "logits"), *b = get(g, ids, "moe_weights", "ids");
    if (!a || !b || require_f32("moe_weights", a) || require_i32("moe_weights", b)) return -1;
    if (b->ne[1] != pe_nrows(a)) return fail_shapes("moe_weights", a, b, "one row of ids per row of logits");
    const int id = node(g, PE_OP_MOE_WEIGHTS, PE_TYPE_F32, 2, b->ne, logits, ids, -1, -1, -1);
    if (id >= 0) g->t[id].ip[0] = normalize;
    return id;
}

int pe_op_weighted_sum(pe_graph *g, int ia, int iw) {
    pe_tensor *a = get(g, ia, "weighted_sum", "a"), *w = get(g, iw, "weighted_sum", "weights");
    if (!a || !w || require_f32("weighted_sum", a) || require_f32("weighted_sum", w)) return -1;
    if (w->ne[0] != a->ne[1] || w->ne[1] != a->ne[2]) return fail_shapes("weighted_sum", a, w, "weights must be [U,T] for a [N,U,T]");
    const int64_t ne[2] = {a->ne[0], a->ne[2]};
    return node(g, PE_OP_WEIGHTED_SUM, PE_TYPE_F32, 2, ne, ia, iw, -1, -1, -1);
}

int pe_op_attn_sinks(pe_graph *g, int attn, int sinks) {
    pe_tensor *t = get(g, attn, "attn_sinks", "attn"), *s = get(g, sinks, "attn_sinks", "sinks");
    if (!t || !s || require_f32("attn_sinks", s)) return -1;
    if (t->op != PE_OP_ATTN) return pe_fail("attn_sinks: tensor %d is not an attention node", attn);
    if (s->op != PE_OP_NONE && attn <= sinks)   /* a computed one must be ready when attention runs */
        return pe_fail("attn_sinks: the sinks (%d) must come before the attention node (%d)", sinks, attn);
    const int64_t n_head = g->t[t->src[0]].ne[1];
    if (!pe_is_contiguous(s) || pe_nelements(s) != n_head) return fail_shapes("attn_sinks", &g->t[t->src[0]], s, "one sink per query head");
    t->src[6] = sinks;
    return attn;
}

int pe_op_moe_softmax_chosen(pe_graph *g, int logits, int ids) {
    const int id = pe_op_moe_weights(g, logits, ids, 0);
    if (id >= 0) g->t[id].ip[1] = 1;   /* moe_weights_run: the softmax over the chosen logits alone */
    return id;
}

int pe_op_add_id(pe_graph *g, int ia, int ib, int iids) {
    pe_tensor *a = get(g, ia, "add_id", "a"), *b = get(g, ib, "add_id", "b"), *ids = get(g, iids, "add_id", "ids");
    if (!a || !b || !ids || require_f32("add_id", a) || require_f32("add_id", b) || require_i32("add_id", ids)) return -1;
    if (b->ne[0] != a->ne[0] || b->ne[2] != 1 || b->ne[3] != 1) return fail_shapes("add_id", a, b, "b must be [N,E] for an [N,U,T]");
    if (ids->ne[0] != a->ne[1] || ids->ne[1] != a->ne[2] || a->ne[3] != 1) return fail_shapes("add_id", a, ids, "ids must be [U,T] for an [N,U,T]");
    return node(g, PE_OP_ADD_ID, PE_TYPE_F32, a->n_dims, a->ne, ia, ib, iids, -1, -1);
}

#define MOE_ROUTE_MAX_EXPERTS 1024

int pe_op_moe_route(pe_graph *g, int logits, int bias, int k, int gating, int n_group, int n_group_used) {
    pe_tensor *a = get(g, logits, "moe_route", "logits");
    if (!a || require_f32("moe_route", a)) return -1;
    const int64_t n = a->ne[0];
    if (!pe_is_contiguous(a)) return fail_shapes("moe_route", a, NULL, "logits must be contiguous");
    if (n > MOE_ROUTE_MAX_EXPERTS) return pe_fail("moe_route: %lld experts (at most %d)", (long long)n, MOE_ROUTE_MAX_EXPERTS);
    if (k < 1 || k > n) return pe_fail("moe_route: k=%d out of range 1..%lld", k, (long long)n);
    if (gating != 0 && gating != 1) return pe_fail("moe_route: gating %d is neither softmax (0) nor sigmoid (1)", gating);
    if (n_group < 1 || n % n_group || n_group_used < 1 || n_group_used > n_group)
        return pe_fail("moe_route: %lld experts in %d groups, %d used", (long long)n, n_group, n_group_used);
    if (n_group > 1 && (n / n_group < 2 || (int64_t)n_group_used * (n / n_group) < k))
        return pe_fail("moe_route: groups of %lld experts, %d used, cannot give %d", (long long)(n / n_group), n_group_used, k);
    if (bias >= 0) {
        pe_tensor *b = get(g, bias, "moe_route", "bias");
        if (!b || require_f32("moe_route", b)) return -1;
        if (!pe_is_contiguous(b) || pe_nelements(b) != n) return fail_shapes("moe_route", a, b, "one bias per expert");
    }
    const int64_t ne[2] = {k, pe_nrows(a)};
    const int id = node(g, PE_OP_MOE_ROUTE, PE_TYPE_I32, 2, ne, logits, bias, -1, -1, -1);
    if (id >= 0) {
        g->t[id].ip[0] = k;
        g->t[id].ip[1] = gating;
        g->t[id].ip[2] = n_group;
        g->t[id].ip[3] = n_group_used;
    }
    return id;
}

int pe_op_moe_sigmoid_weights(pe_graph *g, int logits, int ids, int normalize) {
    const int id = pe_op_moe_weights(g, logits, ids, normalize);
    if (id >= 0) g->t[id].ip[1] = 2;   /* moe_weights_run: the sigmoid of the chosen logits */
    return id;
}

int pe_op_concat(pe_graph *g, int ia, int ib) {
    pe_tensor *a = get(g, ia, "concat", "a"), *b = get(g, ib, "concat", "b");
    if (!a || !b || require_f32("concat", a) || require_f32("concat", b)) return -1;
    for (int i = 1; i < PE_MAX_DIMS; i++)
        if (a->ne[i] != b->ne[i]) return fail_shapes("concat", a, b, "a and b differ beyond their first dimension");
    if (a->ne[3] != 1) return fail_shapes("concat", a, b, "at most 3 dimensions");
    int64_t ne[PE_MAX_DIMS];
    for (int i = 0; i < PE_MAX_DIMS; i++) ne[i] = a->ne[i];
    ne[0] = a->ne[0] + b->ne[0];
    const int n_dims = a->n_dims > b->n_dims ? a->n_dims : b->n_dims;
    return node(g, PE_OP_CONCAT, PE_TYPE_F32, n_dims, ne, ia, ib, -1, -1, -1);
}

int pe_op_swiglu_oai(pe_graph *g, int gate, int up, float alpha, float limit) {
    pe_tensor *a = get(g, gate, "swiglu_oai", "gate"), *b = get(g, up, "swiglu_oai", "up");
    if (!a || !b || require_f32("swiglu_oai", a) || require_f32("swiglu_oai", b)) return -1;
    if (!(limit > 0) || !(alpha > 0)) return pe_fail("swiglu_oai: alpha and limit must be positive (got %g, %g)", alpha, limit);
    for (int i = 0; i < PE_MAX_DIMS; i++)
        if (a->ne[i] != b->ne[i]) return fail_shapes("swiglu_oai", a, b, "gate and up differ in shape");
    const int id = same_shape_node(g, PE_OP_SWIGLU_OAI, a, gate, up);
    if (id >= 0) { g->t[id].fp[0] = alpha; g->t[id].fp[1] = limit; }
    return id;
}

/* ---- recurrent layers ---------------------------------------------------------- */

int pe_op_l2_norm(pe_graph *g, int ia, float eps) {
    pe_tensor *a = get(g, ia, "l2_norm", "a");
    if (!a || require_f32("l2_norm", a)) return -1;
    if (!(eps >= 0)) return pe_fail("l2_norm: eps must be >= 0 (got %g)", eps);
    const int id = same_shape_node(g, PE_OP_L2_NORM, a, ia, -1);
    if (id >= 0) g->t[id].fp[0] = eps;
    return id;
}

/* The state buffer and the sequence table of a recurrent op: an F32 [E, R]
 * buffer whose rows hold `elems` floats, and an I32 [PE_SEQ_FIELDS, S]. */
static int check_states(const char *op, const pe_tensor *state, int64_t elems, const pe_tensor *seqs) {
    if (state->type != PE_TYPE_F32 || !pe_is_contiguous(state) || state->ne[2] != 1 || state->ne[3] != 1)
        return fail_shapes(op, state, NULL, "state must be a contiguous F32 [E, rows] buffer");
    if (state->ne[0] != elems)
        return pe_fail("%s: state rows hold %lld floats, the layer needs %lld", op, (long long)state->ne[0],
                       (long long)elems);
    if (require_i32(op, seqs)) return -1;
    if (seqs->ne[0] != PE_SEQ_FIELDS || seqs->ne[2] != 1 || seqs->ne[3] != 1)
        return fail_shapes(op, seqs, NULL, "seqs must be I32 [5, n_seqs]");
    return 0;
}

/* an F32 operand with contiguous rows whose dims 0.. match ne (0: any) */
static int check_operand(const char *op, const pe_tensor *t, int n, const int64_t *ne, const char *what) {
    if (require_f32(op, t)) return -1;
    for (int i = 0; i < n; i++)
        if (ne[i] && t->ne[i] != ne[i]) return pe_fail("%s: %s has the wrong shape (dim %d is %lld, not %lld)", op, what, i,
                                                      (long long)t->ne[i], (long long)ne[i]);
    for (int i = n; i < PE_MAX_DIMS; i++)
        if (t->ne[i] != 1) return pe_fail("%s: %s has more than %d dims", op, what, n);
    return 0;
}

int pe_op_ssm_conv(pe_graph *g, int ix, int iw, int istate, int iseqs) {
    pe_tensor *x = get(g, ix, "ssm_conv", "x"), *w = get(g, iw, "ssm_conv", "kernel"),
              *s = get(g, istate, "ssm_conv", "state"), *q = get(g, iseqs, "ssm_conv", "seqs");
    if (!x || !w || !s || !q || check_operand("ssm_conv", x, 2, (const int64_t[]){0, 0}, "x")) return -1;
    const int64_t d = x->ne[0], K = w->ne[0];
    if (check_operand("ssm_conv", w, 2, (const int64_t[]){0, d}, "kernel") || !pe_is_contiguous(w)) return -1;
    if (K < 2 || K > 16) return pe_fail("ssm_conv: %lld taps (2..16 supported)", (long long)K);
    if (check_states("ssm_conv", s, (K - 1) * d, q)) return -1;
    const int64_t ne[2] = {d, x->ne[1]};
    return node(g, PE_OP_SSM_CONV, PE_TYPE_F32, 2, ne, ix, iw, istate, iseqs, -1);
}

int pe_op_ssm_scan(pe_graph *g, int ix, int idt, int iA, int iB, int iC, int iD, int idt_bias, int istate, int iseqs) {
    const char *op = "ssm_scan";
    pe_tensor *x = get(g, ix, op, "x"), *dt = get(g, idt, op, "dt"), *A = get(g, iA, op, "A"), *B = get(g, iB, op, "B"),
              *C = get(g, iC, op, "C"), *s = get(g, istate, op, "state"), *q = get(g, iseqs, op, "seqs");
    if (!x || !dt || !A || !B || !C || !s || !q) return -1;
    if (check_operand(op, x, 3, (const int64_t[]){0, 0, 0}, "x")) return -1;
    const int64_t P = x->ne[0], H = x->ne[1], T = x->ne[2], N = B->ne[0], G = B->ne[1];
    if (check_operand(op, dt, 2, (const int64_t[]){H, T}, "dt") || check_operand(op, B, 3, (const int64_t[]){N, G, T}, "B") ||
        check_operand(op, C, 3, (const int64_t[]){N, G, T}, "C"))
        return -1;
    if (G < 1 || H % G) return pe_fail("ssm_scan: %lld heads do not divide into %lld groups", (long long)H, (long long)G);
    if (require_f32(op, A) || pe_nelements(A) != H || !pe_is_contiguous(A)) return fail_shapes(op, A, x, "A must hold one contiguous value per head");
    const int extra[2] = {iD, idt_bias};
    for (int i = 0; i < 2; i++) {
        if (extra[i] < 0) continue;
        const pe_tensor *e = get(g, extra[i], op, i ? "dt_bias" : "D");
        if (!e || require_f32(op, e)) return -1;
        if (pe_nelements(e) != H || !pe_is_contiguous(e)) return fail_shapes(op, e, x, "D and dt_bias hold one contiguous value per head");
    }
    if (check_states(op, s, H * N * P, q)) return -1;
    const int id = node(g, PE_OP_SSM_SCAN, PE_TYPE_F32, 3, x->ne, ix, idt, iA, iB, iC);
    if (id < 0) return -1;
    g->t[id].src[5] = iD;
    g->t[id].src[6] = idt_bias;
    g->t[id].src[7] = istate;
    g->t[id].src[8] = iseqs;
    return id;
}

int pe_op_delta_net(pe_graph *g, int iq, int ik, int iv, int igate, int ibeta, int istate, int iseqs, float scale,
                    int chunk) {
    const char *op = "delta_net";
    pe_tensor *q = get(g, iq, op, "q"), *k = get(g, ik, op, "k"), *v = get(g, iv, op, "v"),
              *ga = get(g, igate, op, "g"), *be = get(g, ibeta, op, "beta"), *s = get(g, istate, op, "state"),
              *sq = get(g, iseqs, op, "seqs");
    if (!q || !k || !v || !ga || !be || !s || !sq) return -1;
    if (check_operand(op, q, 3, (const int64_t[]){0, 0, 0}, "q")) return -1;
    const int64_t Dk = q->ne[0], Hk = q->ne[1], T = q->ne[2];
    if (check_operand(op, k, 3, (const int64_t[]){Dk, Hk, T}, "k") || check_operand(op, v, 3, (const int64_t[]){0, 0, T}, "v"))
        return -1;
    const int64_t Dv = v->ne[0], H = v->ne[1];
    if (H % Hk) return pe_fail("delta_net: %lld value heads do not divide into %lld key heads", (long long)H, (long long)Hk);
    if (check_operand(op, ga, 2, (const int64_t[]){H, T}, "g") || check_operand(op, be, 2, (const int64_t[]){H, T}, "beta"))
        return -1;
    if (chunk < 0 || chunk > PE_DELTA_MAX_CHUNK) return pe_fail("delta_net: chunk %d out of range 0..%d", chunk, PE_DELTA_MAX_CHUNK);
    if (!(scale > 0)) return pe_fail("delta_net: scale must be positive");
    if (check_states(op, s, H * Dk * Dv, sq)) return -1;
    const int64_t ne[3] = {Dv, H, T};
    const int id = node(g, PE_OP_DELTA_NET, PE_TYPE_F32, 3, ne, iq, ik, iv, igate, ibeta);
    if (id < 0) return -1;
    g->t[id].src[5] = istate;
    g->t[id].src[6] = iseqs;
    g->t[id].ip[0] = chunk;
    g->t[id].fp[0] = scale;
    return id;
}
