/* ops_attn.c - writes into the KV cache and attention over it.
 *
 * Attention runs one (token, KV group) at a time, reading K and V rows
 * straight from the F16 cache, with llama.cpp's roundings and accumulation
 * order (query and probabilities to F16, vector lanes, its exp), so that
 * logits agree with its recorded ones to the bit.  The number
 * of cells to read is an input read at compute time, so a decode graph can
 * be reused as the cache grows. */
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

/* Per thread, for each query head of a KV group: the rounded query row, one
 * score per cell (padded to whole vectors) and the lanes of its output. */
static int64_t padded_cells(int64_t n_kv) {
    const int64_t w = pe_kern->vec.lanes * 4;
    return (n_kv + w - 1) / w * w;
}

static size_t attn_thread_floats(const pe_tensor *t, const pe_tensor *q, const pe_tensor *k) {
    const int64_t group = q->ne[1] / t->ip[0];
    return (size_t)(group * (q->ne[0] * (1 + 4 * pe_kern->vec.lanes) + padded_cells(k->ne[1])) + 16);
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
    int64_t hd, group, n_kv, n_pad;
    int     nacc;    /* accumulators of `lanes` floats: 1 in batches, 4 for a lone token */
    float  *qh;      /* [group][hd]      queries rounded to F16 */
    float  *scores;  /* [group][n_pad]   scores, then probabilities */
    float  *lanes;   /* [group][W][hd]   the product with V, lane by lane */
    float   mx[64];  /* largest score per head */
} attn_group;

/* Scores against cells [0, n_kv) as llama.cpp's non-flash path computes
 * them: the query rounded to F16 (its product with the F16 cache), the dot
 * product in vector lanes, then scaled (soft-capped models scale the query
 * first, as Gemma 2's query_pre_attn_scalar does) and masked (-inf). */
static void group_scores(const pe_tensor *t, attn_group *ag, const pe_tensor *q, int64_t h0, int64_t tok,
                         const float *m, const pe_tensor *k, size_t head_off) {
    const float scale = t->fp[0], softcap = t->fp[1];
    const float q_scale = softcap > 0 ? scale : 1.0f;
    const int64_t hd = ag->hd, n_kv = ag->n_kv, n_pad = ag->n_pad;
    for (int64_t gi = 0; gi < ag->group; gi++) {
        const float *qr = pe_row(q, h0 + gi, tok, 0);
        for (int64_t i = 0; i < hd; i++) ag->qh[gi * hd + i] = round_f16(qr[i] * q_scale);
        ag->mx[gi] = -INFINITY;
        for (int64_t c = n_kv; c < n_pad; c++) ag->scores[gi * n_pad + c] = -INFINITY;
    }
    for (int64_t c = 0; c < n_kv; c++) {
        if (m[c] == -INFINITY) {
            for (int64_t gi = 0; gi < ag->group; gi++) ag->scores[gi * n_pad + c] = -INFINITY;
            continue;
        }
        const uint16_t *kr = (const uint16_t *)((const uint8_t *)k->data + c * k->nb[1] + head_off);
        for (int64_t gi = 0; gi < ag->group; gi++) {
            float s = pe_kern->vec.dot_f32_f16(hd, ag->qh + gi * hd, kr, ag->nacc);
            s = softcap > 0 ? softcap * tanhf(s * (1.0f / softcap)) : s * scale;
            s += m[c];
            ag->scores[gi * n_pad + c] = s;
            if (s > ag->mx[gi]) ag->mx[gi] = s;
        }
    }
}

/* Softmax of each head's scores, in place: exponentials over whole vectors
 * (the padding is -inf), summed in double, scaled by the float inverse, and
 * rounded to F16 (the type of the product with the V cache). */
static void group_softmax(attn_group *ag) {
    for (int64_t gi = 0; gi < ag->group; gi++) {
        float *sc = ag->scores + gi * ag->n_pad;
        if (ag->mx[gi] == -INFINITY) {  /* nothing visible: zeros */
            memset(sc, 0, (size_t)ag->n_kv * sizeof(float));
            continue;
        }
        const double sum = pe_kern->vec.exp_sum(ag->n_pad, sc, sc, ag->mx[gi]);
        const float inv = (float)(1.0 / sum);
        for (int64_t c = 0; c < ag->n_kv; c++) sc[c] = round_f16(sc[c] * inv);
    }
}

/* The product with V: cell c goes to lane c % W of each head (an fma per
 * element), and the W lanes are folded by halves into the output. */
static void group_values(attn_group *ag, const pe_tensor *v, size_t head_off, float *out) {
    const int64_t hd = ag->hd, w = pe_kern->vec.lanes * ag->nacc;
    memset(ag->lanes, 0, (size_t)(ag->group * w * hd) * sizeof(float));
    for (int64_t c = 0; c < ag->n_kv; c++) {
        const uint16_t *vr = (const uint16_t *)((const uint8_t *)v->data + c * v->nb[1] + head_off);
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
    attn_group ag = {.hd = hd, .group = per, .n_kv = n_kv, .n_pad = padded_cells(n_kv)};
    ag.qh = (float *)ex->work + (size_t)ex->ith * attn_thread_floats(t, q, k);
    ag.scores = ag.qh + per * hd;
    ag.lanes = ag.scores + per * ag.n_pad;
    int64_t p0, p1;
    pe_split(nt * tasks_per_token, ex->ith, ex->nth, &p0, &p1);
    for (int64_t p = p0; p < p1; p++) {
        const int64_t tok = p / tasks_per_token, h0 = (p % tasks_per_token) * per, kvh = h0 / group;
        const float *m = (const float *)((const uint8_t *)mask->data + tok * mask->nb[1]);
        const size_t head_off = (size_t)kvh * hd * sizeof(uint16_t);
        float *out = (float *)((uint8_t *)t->data + tok * t->nb[1]) + h0 * hd;
        /* llama.cpp multiplies a lone token's rows with its row dot product
         * (4 accumulators) and a batch's with tiles (1 per output) */
        ag.nacc = (lone ? lone[tok] != 0 : nt == 1) ? 4 : 1;
        group_scores(t, &ag, q, h0, tok, m, k, head_off);
        group_softmax(&ag);
        group_values(&ag, v, head_off, out);
    }
}
