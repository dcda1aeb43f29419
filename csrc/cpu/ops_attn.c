/* ops_attn.c - writes into the KV cache and attention over it.
 *
 * Attention runs one (token, KV group) at a time, reading K and V rows
 * straight from the cache.  With an F16 cache it follows llama.cpp's
 * roundings and accumulation order (query and probabilities to F16, vector
 * lanes, its exp), so that logits agree with its recorded ones to the bit.
 * K and V may also be Q8_0, each on its own (see group_queries and
 * group_values_quant).  The number
 * of cells to read is an input read at compute time, so a decode graph can
 * be reused as the cache grows. */
#include <math.h>
#include <stdint.h>
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

/* Attention runs in position order.  llama.cpp, running one sequence, holds
 * position p in cell p, and its lanes and softmax chunks follow the cell
 * index; here the visible cells are laid out by position (slot p - base, base
 * a multiple of the widest lane count) before the softmax and the product
 * with V, so the arithmetic is the same wherever the cache put them and
 * whatever else it holds. */
#define ATTN_ALIGN 64   /* >= 4 * lanes on every ISA */

static int64_t padded(int64_t n) { return (n + ATTN_ALIGN - 1) / ATTN_ALIGN * ATTN_ALIGN; }

/* Per thread: the queries of a KV group (rounded floats, or the Q8_0 blocks
 * a quantized K takes, which need less room), one score per position slot
 * and head, the output lanes of each head, a row of scratch, and the cell of
 * each slot. */
static size_t attn_thread_bytes(const pe_tensor *t, const pe_tensor *q, const pe_tensor *k) {
    const int64_t group = q->ne[1] / t->ip[0], slots = padded(k->ne[1]) + ATTN_ALIGN, hd = q->ne[0];
    const size_t floats = (size_t)(group * (hd * (1 + 4 * pe_kern->vec.lanes) + slots) + hd);
    return floats * sizeof(float) + (size_t)slots * sizeof(int32_t) + 64;
}

size_t pe_op_attn_work(const pe_graph *g, const pe_tensor *t, int n_threads) {
    const pe_tensor *q = &g->t[t->src[0]], *k = &g->t[t->src[1]];
    return (size_t)n_threads * attn_thread_bytes(t, q, k) + 64;
}

static inline float round_f16(float x) { return pe_f16_to_f32(pe_f32_to_f16(x)); }

/* The query heads sharing one KV head, for one token: each K and V row is
 * read once for the whole group (GQA), while every head's arithmetic is the
 * same, in the same order, as if it ran alone. */
typedef struct {
    int64_t  hd, group, n_slots;  /* n_slots: position slots, a multiple of ATTN_ALIGN */
    int      nacc;     /* accumulators of `lanes` floats: 1 in batches, 4 for a lone token */
    int      q_type;   /* the type K's dot product takes the query in */
    size_t   q_bytes;  /* bytes of one query row of q_type */
    float   *qh;       /* [group][hd]       queries rounded to F16, or [group] rows of q_bytes */
    float   *row;      /* [hd]              scratch */
    float   *scores;   /* [group][n_slots]  scores, then probabilities, by position slot */
    float   *lanes;    /* [group][W][hd]    the product with V, lane by lane */
    int32_t *cell;     /* [n_slots]         the cell at each slot, -1 if none */
    float    mx[64];   /* largest score per head */
} attn_group;

/* Lays the visible cells of [0, n_kv) out by position; returns 0 when their
 * positions span more slots than there is room for (then by cell index). */
static int place_cells(attn_group *ag, const float *m, const int32_t *pos, int64_t n_kv, int64_t room) {
    int64_t lo = INT64_MAX, hi = -1;
    for (int64_t c = 0; c < n_kv; c++) {
        if (m[c] == -INFINITY) continue;
        const int64_t p = pos ? pos[c] : c;
        if (p < lo) lo = p;
        if (p > hi) hi = p;
    }
    if (hi < 0) { ag->n_slots = 0; return 1; }
    const int64_t base = lo / ATTN_ALIGN * ATTN_ALIGN;
    ag->n_slots = padded(hi - base + 1);
    if (ag->n_slots > room) return 0;
    for (int64_t i = 0; i < ag->n_slots; i++) ag->cell[i] = -1;
    for (int64_t c = 0; c < n_kv; c++)
        if (m[c] != -INFINITY) ag->cell[(pos ? pos[c] : c) - base] = (int32_t)c;
    return 1;
}

static void place_by_cell(attn_group *ag, const float *m, int64_t n_kv) {
    ag->n_slots = padded(n_kv);
    for (int64_t i = 0; i < ag->n_slots; i++) ag->cell[i] = i < n_kv && m[i] != -INFINITY ? (int32_t)i : -1;
}

/* The group's queries in the form K's dot product takes them, as the
 * product with the cache does in GGML: rounded to F16 for an F16 cache;
 * quantized to Q8_0 (Q8_0's vec_dot partner) for a Q8_0 cache, so a score is
 * an integer dot product of blocks. */
static void group_queries(attn_group *ag, const pe_tensor *q, int64_t h0, int64_t tok) {
    const int64_t hd = ag->hd;
    for (int64_t gi = 0; gi < ag->group; gi++) {
        const float *qr = pe_row(q, h0 + gi, tok, 0);
        if (ag->q_type == PE_TYPE_F16) {
            for (int64_t i = 0; i < hd; i++) ag->qh[gi * hd + i] = round_f16(qr[i]);
        } else {
            pe_kern->type[ag->q_type].from_float(qr, (uint8_t *)ag->qh + gi * ag->q_bytes, hd);
        }
        ag->mx[gi] = -INFINITY;
    }
}

/* Raw dot products of head gi's query with the K rows of up to 4 cells. */
static inline void raw_dots(const attn_group *ag, const pe_tensor *k, const uint8_t *const kr[4], int n, int64_t gi,
                            float out[4]) {
    if (ag->q_type == PE_TYPE_F16) {
        pe_kern->vec.dot4_f32_f16(ag->hd, ag->qh + gi * ag->hd, (const uint16_t *const *)kr, n, ag->nacc, out);
        return;
    }
    for (int j = 0; j < n; j++)
        pe_kern->type[k->type].vec_dot(ag->hd, &out[j], kr[j], (const uint8_t *)ag->qh + gi * ag->q_bytes);
}

/* Scores as llama.cpp's non-flash path computes them: the dot product with
 * the query as group_queries made it (F16: in vector lanes), soft-capped,
 * then scaled; empty slots are -inf.  (Models that scale the query instead,
 * as Gemma does, pass a scale of 1.) */
static void group_scores(const pe_tensor *t, attn_group *ag, const pe_tensor *q, int64_t h0, int64_t tok,
                         const pe_tensor *k, size_t head_off) {
    const float scale = t->fp[0], softcap = t->fp[1];
    const int64_t n = ag->n_slots;
    group_queries(ag, q, h0, tok);
    for (int64_t gi = 0; gi < ag->group; gi++)
        for (int64_t i = 0; i < n; i++) ag->scores[gi * n + i] = -INFINITY;
    /* four visible cells at a time: independent dot products overlap */
    int64_t slot[4];
    const uint8_t *kr[4];
    int m = 0;
    for (int64_t i = 0; i <= n; i++) {
        if (i < n && ag->cell[i] >= 0) {
            slot[m] = i;
            kr[m++] = (const uint8_t *)k->data + ag->cell[i] * k->nb[1] + head_off;
        }
        if (m == 4 || (i == n && m > 0)) {
            for (int64_t gi = 0; gi < ag->group; gi++) {
                float s[4];
                raw_dots(ag, k, kr, m, gi, s);
                for (int j = 0; j < m; j++) {
                    if (softcap > 0) s[j] = softcap * tanhf(s[j] * (1.0f / softcap));
                    s[j] *= scale;
                    ag->scores[gi * n + slot[j]] = s[j];
                    if (s[j] > ag->mx[gi]) ag->mx[gi] = s[j];
                }
            }
            m = 0;
        }
    }
}

/* Softmax of each head's scores, in place: exponentials over whole vectors,
 * summed in double, scaled by the float inverse, and for an F16 V rounded to
 * F16 (the type of the product with the V cache). */
static void group_softmax(attn_group *ag, int to_f16) {
    const int64_t n = ag->n_slots;
    for (int64_t gi = 0; gi < ag->group; gi++) {
        float *sc = ag->scores + gi * n;
        if (ag->mx[gi] == -INFINITY) {  /* nothing visible: zeros */
            memset(sc, 0, (size_t)n * sizeof(float));
            continue;
        }
        const double sum = pe_kern->vec.exp_sum(n, sc, sc, ag->mx[gi]);
        const float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < n; i++) sc[i] = to_f16 ? round_f16(sc[i] * inv) : sc[i] * inv;
    }
}

/* The product with an F16 V: slot i goes to lane i % W of each head (an fma
 * per element), and the W lanes are folded by halves into the output. */
static void group_values_f16(attn_group *ag, const pe_tensor *v, size_t head_off, float *out) {
    for (int64_t gi = 0; gi < ag->group; gi++)
        pe_kern->vec.values_f16(ag->n_slots, ag->cell, ag->scores + gi * ag->n_slots, (const uint8_t *)v->data + head_off,
                                v->nb[1], ag->hd, ag->nacc, out + gi * ag->hd, ag->lanes);
}

/* The product with a quantized (Q8_0) V follows llama.cpp's flash-attention
 * path, the only one in which it lets V be quantized: each row is
 * dequantized to floats (once per group) and accumulated in F32 with F32
 * probabilities, slot after slot.  (Its non-flash product would quantize
 * the probabilities along the cells, which needs a transposed V cache.) */
static void group_values_quant(attn_group *ag, const pe_tensor *v, size_t head_off, float *out) {
    const int64_t hd = ag->hd, n = ag->n_slots;
    memset(out, 0, (size_t)(ag->group * hd) * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        const int32_t c = ag->cell[i];
        if (c < 0) continue;
        int dequantized = 0;
        for (int64_t gi = 0; gi < ag->group; gi++) {
            const float p = ag->scores[gi * n + i];
            if (p == 0.0f) continue;
            if (!dequantized) pe_kern->type[v->type].to_float((const uint8_t *)v->data + c * v->nb[1] + head_off, ag->row, hd);
            dequantized = 1;
            float *o = out + gi * hd;
            for (int64_t d = 0; d < hd; d++) o[d] += p * ag->row[d];
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
    const int32_t *lone = t->src[5] >= 0 ? (const int32_t *)g->t[t->src[5]].data : NULL;
    const int32_t *cell_pos = t->src[6] >= 0 ? (const int32_t *)g->t[t->src[6]].data : NULL;
    /* a task is the heads of one KV group for one token; with fewer groups
     * than threads (decode with one KV head), a task is a single head */
    const int64_t per = nt * n_kv_head >= ex->nth ? group : 1;
    const int64_t tasks_per_token = q->ne[1] / per;
    const int64_t room = padded(k->ne[1]) + ATTN_ALIGN;
    const int q_type = k->type == PE_TYPE_F16 ? PE_TYPE_F16 : pe_type_vec_dot_type(k->type);
    attn_group ag = {.hd = hd, .group = per, .q_type = q_type, .q_bytes = pe_row_bytes(q_type, hd)};
    uint8_t *mine = ex->work + (size_t)ex->ith * attn_thread_bytes(t, q, k);
    ag.cell = (int32_t *)mine;
    ag.qh = (float *)(mine + (size_t)room * sizeof(int32_t));
    ag.scores = ag.qh + per * hd;
    ag.lanes = ag.scores + per * room;
    ag.row = ag.lanes + per * hd * 4 * pe_kern->vec.lanes;
    /* a head's slice of a cache row: whole blocks, as head_dim is a multiple
     * of the block size (checked when the op was built) */
    const size_t k_head_bytes = pe_row_bytes(k->type, hd), v_head_bytes = pe_row_bytes(v->type, hd);
    /* tasks dealt round-robin: a causal prompt's later tokens see more cells,
     * and contiguous halves would leave one thread the long rows */
    for (int64_t p = ex->ith; p < nt * tasks_per_token; p += ex->nth) {
        const int64_t tok = p / tasks_per_token, h0 = (p % tasks_per_token) * per, kvh = h0 / group;
        const float *m = (const float *)((const uint8_t *)mask->data + tok * mask->nb[1]);
        float *out = (float *)((uint8_t *)t->data + tok * t->nb[1]) + h0 * hd;
        /* llama.cpp multiplies a lone token's rows with its row dot product
         * (4 accumulators) and a batch's with tiles (1 per output) */
        ag.nacc = (lone ? lone[tok] != 0 : nt == 1) ? 4 : 1;
        if (!place_cells(&ag, m, cell_pos, n_kv, room)) place_by_cell(&ag, m, n_kv);
        group_scores(t, &ag, q, h0, tok, k, (size_t)kvh * k_head_bytes);
        group_softmax(&ag, v->type == PE_TYPE_F16);
        if (v->type == PE_TYPE_F16) group_values_f16(&ag, v, (size_t)kvh * v_head_bytes, out);
        else                        group_values_quant(&ag, v, (size_t)kvh * v_head_bytes, out);
    }
}
