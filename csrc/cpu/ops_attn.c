/* ops_attn.c - writes into the KV cache and attention over it.
 *
 * Attention runs one (token, KV group) at a time, reading K and V rows
 * straight from the cache.  With an F16 cache it follows llama.cpp's
 * roundings and accumulation order (query and probabilities to F16, vector
 * lanes, its exp), so that logits agree with its recorded ones to the bit.
 * K and V may also be Q8_0, each on its own: see group_queries and
 * group_values for the numerics.  The number of cells to read is an input
 * read at compute time, so a decode graph can be reused as the cache grows. */
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

/* Per thread, for each query head of a KV group: the query row (rounded
 * floats, or its Q8_0 blocks, which take less room), one score per cell
 * (padded to whole vectors) and the lanes of its output; then one row of
 * scratch (the scaled query before it is quantized, later a V row
 * dequantized to floats). */
static int64_t padded_cells(int64_t n_kv) {
    const int64_t w = pe_kern->vec.lanes * 4;
    return (n_kv + w - 1) / w * w;
}

static size_t attn_thread_floats(const pe_tensor *t, const pe_tensor *q, const pe_tensor *k) {
    const int64_t group = q->ne[1] / t->ip[0], hd = q->ne[0];
    return (size_t)(group * (hd * (1 + 4 * pe_kern->vec.lanes) + padded_cells(k->ne[1])) + hd + 16);
}

size_t pe_op_attn_work(const pe_graph *g, const pe_tensor *t, int n_threads) {
    const pe_tensor *q = &g->t[t->src[0]], *k = &g->t[t->src[1]];
    return (size_t)n_threads * attn_thread_floats(t, q, k) * sizeof(float) + 64;
}

static inline float round_f16(float x) { return pe_f16_to_f32(pe_f32_to_f16(x)); }

static inline const uint8_t *cache_row(const pe_tensor *c, int64_t cell, size_t head_off) {
    return (const uint8_t *)c->data + cell * c->nb[1] + head_off;
}

/* The query heads sharing one KV head, for one token: each K and V row is
 * read once for the whole group (GQA), while every head's arithmetic is the
 * same, in the same order, as if it ran alone. */
typedef struct {
    int64_t hd, group, n_kv, n_pad;
    int     nacc;    /* accumulators of `lanes` floats: 1 in batches, 4 for a lone token */
    int     q_type;  /* the type K's dot product takes the query in */
    size_t  q_bytes; /* bytes of one query row of q_type */
    float  *qh;      /* [group][hd]      queries rounded to F16, or [group] rows of q_bytes */
    float  *scores;  /* [group][n_pad]   scores, then probabilities */
    float  *lanes;   /* [group][W][hd]   the product with an F16 V, lane by lane */
    float  *row;     /* [hd]             scratch */
    float   mx[64];  /* largest score per head */
} attn_group;

/* The group's queries in the form K's dot product takes them, as the
 * product with the cache does in GGML: rounded to F16 for an F16 cache;
 * quantized to Q8_0 (the vec_dot partner of Q8_0) for a Q8_0 cache, so a
 * score is an integer dot product of blocks.  Soft-capped models scale the
 * query first, as Gemma 2's query_pre_attn_scalar does. */
static void group_queries(attn_group *ag, const pe_tensor *q, int64_t h0, int64_t tok, float q_scale) {
    const int64_t hd = ag->hd;
    for (int64_t gi = 0; gi < ag->group; gi++) {
        const float *qr = pe_row(q, h0 + gi, tok, 0);
        if (ag->q_type == PE_TYPE_F16) {
            for (int64_t i = 0; i < hd; i++) ag->qh[gi * hd + i] = round_f16(qr[i] * q_scale);
        } else {
            for (int64_t i = 0; i < hd; i++) ag->row[i] = qr[i] * q_scale;
            pe_kern->type[ag->q_type].from_float(ag->row, (uint8_t *)ag->qh + gi * ag->q_bytes, hd);
        }
        ag->mx[gi] = -INFINITY;
        for (int64_t c = ag->n_kv; c < ag->n_pad; c++) ag->scores[gi * ag->n_pad + c] = -INFINITY;
    }
}

/* Raw dot products (not yet scaled) with the K rows of the visible cells;
 * masked cells get -inf.  F16: in vector lanes, as llama.cpp's F16 dot. */
static void raw_dots_f16(attn_group *ag, const float *m, const pe_tensor *k, size_t head_off) {
    const int64_t hd = ag->hd;
    for (int64_t c = 0; c < ag->n_kv; c++) {
        const uint16_t *kr = (const uint16_t *)cache_row(k, c, head_off);
        for (int64_t gi = 0; gi < ag->group; gi++)
            ag->scores[gi * ag->n_pad + c] =
                m[c] == -INFINITY ? -INFINITY : pe_kern->vec.dot_f32_f16(hd, ag->qh + gi * hd, kr, ag->nacc);
    }
}

/* Quantized K: tiles of cells x heads through the type's GEMM micro-kernel
 * when it has one (every element bit-identical to vec_dot, so a score does
 * not depend on its tile), else one vec_dot per pair; tiles of masked cells
 * only are skipped. */
static void raw_dots_quant(attn_group *ag, const float *m, const pe_tensor *k, size_t head_off) {
    const pe_type_kernels *kk = &pe_kern->type[k->type];
    const int64_t n_kv = ag->n_kv, n_pad = ag->n_pad;
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
                for (int i = 0; i < nr; i++) ag->scores[(g0 + j) * n_pad + c0 + i] = tile[j * PE_GEMM_MAX + i];
        }
        for (int i = 0; i < nr; i++)
            if (!visible || m[c0 + i] == -INFINITY)
                for (int64_t gi = 0; gi < ag->group; gi++) ag->scores[gi * n_pad + c0 + i] = -INFINITY;
    }
}

/* Scores against cells [0, n_kv) as llama.cpp's non-flash path computes
 * them: the raw dot product, then scaled (unless the model soft-caps, having
 * scaled the query instead) and masked (-inf). */
static void group_scores(const pe_tensor *t, attn_group *ag, const pe_tensor *q, int64_t h0, int64_t tok,
                         const float *m, const pe_tensor *k, size_t head_off) {
    const float scale = t->fp[0], softcap = t->fp[1];
    group_queries(ag, q, h0, tok, softcap > 0 ? scale : 1.0f);
    if (k->type == PE_TYPE_F16) raw_dots_f16(ag, m, k, head_off);
    else                        raw_dots_quant(ag, m, k, head_off);
    for (int64_t gi = 0; gi < ag->group; gi++) {
        float *sc = ag->scores + gi * ag->n_pad;
        for (int64_t c = 0; c < ag->n_kv; c++) {
            if (sc[c] == -INFINITY) continue;
            float s = softcap > 0 ? softcap * tanhf(sc[c] * (1.0f / softcap)) : sc[c] * scale;
            s += m[c];
            sc[c] = s;
            if (s > ag->mx[gi]) ag->mx[gi] = s;
        }
    }
}

/* Softmax of each head's scores, in place: exponentials over whole vectors
 * (the padding is -inf), summed in double, scaled by the float inverse, and
 * for an F16 V rounded to F16 (the type of the product with the V cache). */
static void group_softmax(attn_group *ag, int to_f16) {
    for (int64_t gi = 0; gi < ag->group; gi++) {
        float *sc = ag->scores + gi * ag->n_pad;
        if (ag->mx[gi] == -INFINITY) {  /* nothing visible: zeros */
            memset(sc, 0, (size_t)ag->n_kv * sizeof(float));
            continue;
        }
        const double sum = pe_kern->vec.exp_sum(ag->n_pad, sc, sc, ag->mx[gi]);
        const float inv = (float)(1.0 / sum);
        for (int64_t c = 0; c < ag->n_kv; c++) sc[c] = to_f16 ? round_f16(sc[c] * inv) : sc[c] * inv;
    }
}

/* The product with an F16 V: cell c goes to lane c % W of each head (an fma
 * per element), and the W lanes are folded by halves into the output. */
static void group_values_f16(attn_group *ag, const pe_tensor *v, size_t head_off, float *out) {
    const int64_t hd = ag->hd, w = pe_kern->vec.lanes * ag->nacc;
    memset(ag->lanes, 0, (size_t)(ag->group * w * hd) * sizeof(float));
    for (int64_t c = 0; c < ag->n_kv; c++) {
        const uint16_t *vr = (const uint16_t *)cache_row(v, c, head_off);
        for (int64_t gi = 0; gi < ag->group; gi++) {
            const float p = ag->scores[gi * ag->n_pad + c];
            if (p != 0.0f) pe_kern->vec.fma_f16(hd, ag->lanes + (gi * w + c % w) * hd, p, vr);
        }
    }
    for (int64_t gi = 0; gi < ag->group; gi++) {
        float *acc = ag->lanes + gi * w * hd;
        for (int64_t half = w / 2; half >= 1; half /= 2)
            for (int64_t l = 0; l < half; l++)
                for (int64_t i = 0; i < hd; i++) acc[l * hd + i] += acc[(l + half) * hd + i];
        memcpy(out + gi * hd, acc, (size_t)hd * sizeof(float));
    }
}

/* The product with a quantized (Q8_0) V follows llama.cpp's flash-attention
 * path, the only one in which it lets V be quantized: each row is
 * dequantized to floats (once per group) and accumulated in F32 with F32
 * probabilities, cell after cell.  (Its non-flash product would quantize
 * the probabilities along the cells, which needs a transposed V cache.) */
static void group_values_quant(attn_group *ag, const pe_tensor *v, size_t head_off, float *out) {
    const int64_t hd = ag->hd;
    memset(out, 0, (size_t)(ag->group * hd) * sizeof(float));
    for (int64_t c = 0; c < ag->n_kv; c++) {
        int dequantized = 0;
        for (int64_t gi = 0; gi < ag->group; gi++) {
            const float p = ag->scores[gi * ag->n_pad + c];
            if (p == 0.0f) continue;
            if (!dequantized) pe_kern->type[v->type].to_float(cache_row(v, c, head_off), ag->row, hd);
            dequantized = 1;
            float *o = out + gi * hd;
            for (int64_t i = 0; i < hd; i++) o[i] += p * ag->row[i];
        }
    }
}

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
    const int32_t *lone = t->src[5] >= 0 ? (const int32_t *)g->t[t->src[5]].data : NULL;
    const int q_type = k->type == PE_TYPE_F16 ? PE_TYPE_F16 : pe_type_vec_dot_type(k->type);
    attn_group ag = {.hd = hd, .group = per, .n_kv = n_kv, .n_pad = padded_cells(n_kv),
                     .q_type = q_type, .q_bytes = pe_row_bytes(q_type, hd)};
    ag.qh = (float *)ex->work + (size_t)ex->ith * attn_thread_floats(t, q, k);
    ag.scores = ag.qh + per * hd;
    ag.lanes = ag.scores + per * ag.n_pad;
    ag.row = ag.lanes + per * hd * 4 * pe_kern->vec.lanes;
    /* a head's slice of a cache row: whole blocks, as head_dim is a multiple
     * of the block size (checked when the op was built) */
    const size_t k_head_bytes = pe_row_bytes(k->type, hd), v_head_bytes = pe_row_bytes(v->type, hd);
    int64_t p0, p1;
    pe_split(nt * tasks_per_token, ex->ith, ex->nth, &p0, &p1);
    for (int64_t p = p0; p < p1; p++) {
        const int64_t tok = p / tasks_per_token, h0 = (p % tasks_per_token) * per, kvh = h0 / group;
        const float *m = (const float *)((const uint8_t *)mask->data + tok * mask->nb[1]);
        float *out = (float *)((uint8_t *)t->data + tok * t->nb[1]) + h0 * hd;
        /* llama.cpp multiplies a lone token's rows with its row dot product
         * (4 accumulators) and a batch's with tiles (1 per output) */
        ag.nacc = (lone ? lone[tok] != 0 : nt == 1) ? 4 : 1;
        group_scores(t, &ag, q, h0, tok, m, k, (size_t)kvh * k_head_bytes);
        group_softmax(&ag, v->type == PE_TYPE_F16);
        if (v->type == PE_TYPE_F16) group_values_f16(&ag, v, (size_t)kvh * v_head_bytes, out);
        else                        group_values_quant(&ag, v, (size_t)kvh * v_head_bytes, out);
    }
}
