/* ops_attn.c - writes into the KV cache and attention over it.
 *
 * Attention runs one (token, head) pair at a time, reading K and V rows
 * straight from the cache, F16 or Q8_0 (each independently), with
 * llama.cpp's roundings (see group_queries and group_values) so logits agree
 * with it to float noise.  The number of cells to read is an input read at
 * compute time, so a decode graph can be reused as the cache grows. */
#include <math.h>
#include <string.h>

#include "blocks.h"
#include "internal.h"

void pe_op_set_rows_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *cache = &ex->g->t[t->src[0]], *s = &ex->g->t[t->src[1]], *slots = &ex->g->t[t->src[2]];
    const int32_t *slot = slots->data;
    const int64_t d = s->ne[0], n_cells = cache->ne[1];
    int64_t r0, r1;
    pe_split(pe_nrows(s), ex->ith, ex->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        if (slot[r] < 0 || slot[r] >= n_cells) { pe_exec_fail(ex, "set_rows: cache slot out of range"); return; }
        const int64_t i1 = r % s->ne[1], i2 = (r / s->ne[1]) % s->ne[2], i3 = r / (s->ne[1] * s->ne[2]);
        const float *x = pe_row(s, i1, i2, i3);
        uint8_t *dst = (uint8_t *)cache->data + (int64_t)slot[r] * cache->nb[1];
        switch (cache->type) {
        case PE_TYPE_F16: pe_kern->vec.f32_to_f16(d, x, (uint16_t *)dst); break;
        case PE_TYPE_F32: memcpy(dst, x, (size_t)d * sizeof(float)); break;
        default:          pe_kern->type[cache->type].from_float(x, dst, d); break;
        }
    }
}

/* Per thread: for each query head of a KV group, the query row (floats, or
 * its Q8_0 blocks when K is Q8_0, which take less room) and one score per
 * cell; then one row of scratch (the scaled query before it is quantized,
 * later a V row dequantized to floats). */
static size_t attn_thread_floats(const pe_tensor *t, const pe_tensor *q, const pe_tensor *k) {
    const int64_t group = q->ne[1] / t->ip[0];
    return (size_t)(group * (q->ne[0] + k->ne[1] + 16) + q->ne[0] + 16);
}

size_t pe_op_attn_work(const pe_graph *g, const pe_tensor *t, int n_threads) {
    const pe_tensor *q = &g->t[t->src[0]], *k = &g->t[t->src[1]];
    return (size_t)n_threads * attn_thread_floats(t, q, k) * sizeof(float) + 64;
}

static inline float round_f16(float x) { return pe_f16_to_f32(pe_f32_to_f16(x)); }

/* The query heads sharing one KV head, for one token: each K and V row is
 * read once for the whole group (GQA), while every head's arithmetic is the
 * same, in the same order, as if it ran alone. */
typedef struct {
    int64_t hd, group, n_kv;
    float  *qh;      /* [group][hd]   queries rounded to F16, or [group] Q8_0 rows of q_bytes */
    int     q_type;  /* K's vec_dot partner type (Q8_0 K) */
    size_t  q_bytes; /* bytes of one query row of q_type */
    float  *scores;  /* [group][n_kv] scores, then unnormalised probabilities */
    float  *row;     /* [hd] scratch */
    float   mx[64];  /* largest score per head */
} attn_group;

/* The group's queries in the form K's dot product takes them, as GGML's
 * product with the cache does: rounded to F16 for an F16 cache; quantized to
 * Q8_0 (the vec_dot partner of Q8_0) for a Q8_0 cache, so a score is an
 * integer dot product of blocks.  Soft-capped models scale the query first
 * (Gemma's query_pre_attn_scalar). */
static void group_queries(attn_group *ag, const pe_tensor *q, const pe_tensor *k, int64_t h0, int64_t tok,
                          float q_scale) {
    const int64_t hd = ag->hd;
    for (int64_t gi = 0; gi < ag->group; gi++) {
        const float *qr = pe_row(q, h0 + gi, tok, 0);
        if (k->type == PE_TYPE_F16) {
            for (int64_t i = 0; i < hd; i++) ag->qh[gi * hd + i] = round_f16(qr[i] * q_scale);
        } else {
            for (int64_t i = 0; i < hd; i++) ag->row[i] = qr[i] * q_scale;
            pe_kern->type[ag->q_type].from_float(ag->row, (uint8_t *)ag->qh + gi * ag->q_bytes, hd);
        }
        ag->mx[gi] = -INFINITY;
    }
}

static inline const uint8_t *cache_row(const pe_tensor *c, int64_t cell, size_t head_off) {
    return (const uint8_t *)c->data + cell * c->nb[1] + head_off;
}

/* Raw dot products (no scale) of the group's queries with the K rows of the
 * visible cells; masked cells get -inf. */
static void raw_dots_f16(attn_group *ag, const float *m, const pe_tensor *k, size_t head_off) {
    const int64_t hd = ag->hd, n_kv = ag->n_kv;
    for (int64_t c = 0; c < n_kv; c++) {
        const uint16_t *kr = (const uint16_t *)cache_row(k, c, head_off);
        for (int64_t gi = 0; gi < ag->group; gi++)
            ag->scores[gi * n_kv + c] = m[c] == -INFINITY ? -INFINITY : pe_kern->vec.dot_f32_f16(hd, ag->qh + gi * hd, kr);
    }
}

/* Quantized K: tiles of cells x heads through the type's GEMM micro-kernel
 * when it has one (every element bit-identical to vec_dot, so a score does
 * not depend on its tile), else one vec_dot per pair. */
static void raw_dots_quant(attn_group *ag, const float *m, const pe_tensor *k, size_t head_off) {
    const pe_type_kernels *kk = &pe_kern->type[k->type];
    const int64_t n_kv = ag->n_kv;
    const uint8_t *qq = (const uint8_t *)ag->qh;
    for (int64_t c0 = 0; c0 < n_kv; c0 += PE_GEMM_MAX) {
        const int nr = (int)(n_kv - c0 < PE_GEMM_MAX ? n_kv - c0 : PE_GEMM_MAX);
        int visible = 0;
        for (int i = 0; i < nr; i++) visible |= m[c0 + i] != -INFINITY;
        for (int64_t g0 = 0; visible && g0 < ag->group; g0 += PE_GEMM_MAX) {
            const int nc = (int)(ag->group - g0 < PE_GEMM_MAX ? ag->group - g0 : PE_GEMM_MAX);
            float tile[PE_GEMM_MAX * PE_GEMM_MAX];
            if (kk->gemm) {
                kk->gemm(ag->hd, tile, PE_GEMM_MAX, cache_row(k, c0, head_off), k->nb[1], qq + g0 * ag->q_bytes,
                         ag->q_bytes, nr, nc);
            } else {
                for (int j = 0; j < nc; j++)
                    for (int i = 0; i < nr; i++)
                        kk->vec_dot(ag->hd, &tile[j * PE_GEMM_MAX + i], cache_row(k, c0 + i, head_off),
                                    qq + (g0 + j) * ag->q_bytes);
            }
            for (int j = 0; j < nc; j++)
                for (int i = 0; i < nr; i++) ag->scores[(g0 + j) * n_kv + c0 + i] = tile[j * PE_GEMM_MAX + i];
        }
        for (int i = 0; i < nr; i++)
            if (!visible || m[c0 + i] == -INFINITY)
                for (int64_t gi = 0; gi < ag->group; gi++) ag->scores[gi * n_kv + c0 + i] = -INFINITY;
    }
}

/* Scores against cells [0, n_kv): the raw dot products, scaled (unless the
 * model soft-caps, having scaled the query instead) and masked; masked cells
 * stay -inf. */
static void group_scores(const pe_tensor *t, attn_group *ag, const pe_tensor *q, int64_t h0, int64_t tok,
                         const float *m, const pe_tensor *k, size_t head_off) {
    const float scale = t->fp[0], softcap = t->fp[1];
    const int64_t n_kv = ag->n_kv;
    group_queries(ag, q, k, h0, tok, softcap > 0 ? scale : 1.0f);
    if (k->type == PE_TYPE_F16) raw_dots_f16(ag, m, k, head_off);
    else                        raw_dots_quant(ag, m, k, head_off);
    for (int64_t gi = 0; gi < ag->group; gi++) {
        float *sc = ag->scores + gi * n_kv;
        for (int64_t c = 0; c < n_kv; c++) {
            if (sc[c] == -INFINITY) continue;
            float s = softcap > 0 ? softcap * tanhf(sc[c] * (1.0f / softcap)) : sc[c] * scale;
            s += m[c];
            sc[c] = s;
            if (s > ag->mx[gi]) ag->mx[gi] = s;
        }
    }
}

/* Scores -> unnormalised probabilities in place; inv[gi] = 1 / their sum. */
static void group_softmax(attn_group *ag, float *inv) {
    for (int64_t gi = 0; gi < ag->group; gi++) {
        float *sc = ag->scores + gi * ag->n_kv;
        double sum = 0.0;
        for (int64_t c = 0; c < ag->n_kv; c++) {
            sc[c] = ag->mx[gi] == -INFINITY || sc[c] == -INFINITY ? 0.0f : expf(sc[c] - ag->mx[gi]);
            sum += sc[c];
        }
        inv[gi] = sum > 0 ? (float)(1.0 / sum) : 0.0f;  /* nothing visible: zeros */
    }
}

/* out[gi] += p * V[c] over the cells.  An F16 cache weighs its rows with the
 * probability rounded to F16, as GGML's product of probabilities with an F16
 * V cache does.  Other types (Q8_0) follow llama.cpp's flash-attention path,
 * the only one in which it lets V be quantized: each row is dequantized to
 * floats once per group and accumulated with F32 probabilities.  (Its
 * non-flash product would quantize the probabilities along the cells, which
 * needs a transposed V cache and gains nothing here.) */
static void group_values(attn_group *ag, const pe_tensor *v, size_t head_off, const float *inv, float *out) {
    const int64_t hd = ag->hd, n_kv = ag->n_kv;
    const int f16 = v->type == PE_TYPE_F16;
    for (int64_t c = 0; c < n_kv; c++) {
        const uint8_t *vr = cache_row(v, c, head_off);
        int dequantized = 0;
        for (int64_t gi = 0; gi < ag->group; gi++) {
            const float e = ag->scores[gi * n_kv + c];
            if (e == 0.0f) continue;
            float *o = out + gi * hd;
            if (f16) {
                pe_kern->vec.scale_mad_f16(hd, o, 1.0f, (const uint16_t *)vr, round_f16(e * inv[gi]));
                continue;
            }
            if (!dequantized) pe_kern->type[v->type].to_float(vr, ag->row, hd);
            dequantized = 1;
            const float p = e * inv[gi];
            for (int64_t i = 0; i < hd; i++) o[i] += p * ag->row[i];
        }
    }
}

/* Two passes, as GGML's softmax-then-product does: normalised probabilities
 * weight V rows. */
void pe_op_attn_run(pe_exec *ex, pe_tensor *t) {
    const pe_graph *g = ex->g;
    const pe_tensor *q = &g->t[t->src[0]], *k = &g->t[t->src[1]], *v = &g->t[t->src[2]];
    const pe_tensor *mask = &g->t[t->src[3]], *len = &g->t[t->src[4]];
    const int64_t hd = q->ne[0], nt = q->ne[2], n_kv_head = t->ip[0];
    const int64_t group = q->ne[1] / n_kv_head;
    const int64_t n_kv = *(const int32_t *)len->data;
    if (n_kv < 0 || n_kv > k->ne[1]) { pe_exec_fail(ex, "attn: kv length out of range"); return; }
    if (group > 64) { pe_exec_fail(ex, "attn: more than 64 query heads per KV head"); return; }
    /* a task is the heads of one KV group for one token; with fewer groups
     * than threads (decode with one KV head), a task is a single head */
    const int64_t per = nt * n_kv_head >= ex->nth ? group : 1;
    const int64_t tasks_per_token = q->ne[1] / per;
    const int q_type = k->type == PE_TYPE_F16 ? PE_TYPE_F16 : pe_type_vec_dot_type(k->type);
    attn_group ag = {.hd = hd, .group = per, .n_kv = n_kv, .q_type = q_type, .q_bytes = pe_row_bytes(q_type, hd)};
    ag.qh = (float *)ex->work + (size_t)ex->ith * attn_thread_floats(t, q, k);
    ag.scores = ag.qh + per * hd + 8;
    ag.row = ag.scores + per * k->ne[1] + 8;
    /* a head's slice of a cache row: whole blocks, as head_dim is a multiple
     * of the block size (checked when the op was built) */
    const size_t k_head_bytes = pe_row_bytes(k->type, hd), v_head_bytes = pe_row_bytes(v->type, hd);
    int64_t p0, p1;
    pe_split(nt * tasks_per_token, ex->ith, ex->nth, &p0, &p1);
    for (int64_t p = p0; p < p1; p++) {
        const int64_t tok = p / tasks_per_token, h0 = (p % tasks_per_token) * per, kvh = h0 / group;
        const float *m = (const float *)((const uint8_t *)mask->data + tok * mask->nb[1]);
        float *out = (float *)((uint8_t *)t->data + tok * t->nb[1]) + h0 * hd;
        memset(out, 0, (size_t)(per * hd) * sizeof(float));
        group_scores(t, &ag, q, h0, tok, m, k, (size_t)kvh * k_head_bytes);
        float inv[64];
        group_softmax(&ag, inv);
        group_values(&ag, v, (size_t)kvh * v_head_bytes, inv, out);
    }
}
