/* ops_attn.c - writes into the KV cache and attention over it.
 *
 * Attention runs one (token, KV group) at a time, reading K and V rows
 * straight from the cache.  With an F16 cache it follows llama.cpp's
 * roundings (query and probabilities to F16, vector lanes, its exp) and its
 * batches' accumulation order, for every token.
 * K and V may also be Q8_0, each on its own (see group_queries and
 * group_values_quant).  The number
 * of cells to read is an input read at compute time, so a decode graph can
 * be reused as the cache grows. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "blocks.h"
#include "internal.h"
#include "vec_math.h"

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
#define ATTN_PREFETCH 8 /* slots ahead whose K row is asked for */
/* Accumulators (of `lanes` floats) of the F16 products with K and V, for
 * every token whatever its batch: the tiles' arithmetic, which the
 * transposed V's product (a prompt's) gives too.  vec.c's nacc 4 (llama.cpp's
 * row product for a lone token) would give up the transposed V for prompts,
 * and its values kernel is no faster now that nacc 1's goes lane by lane
 * (AVX-512, 2048 cells, 4 heads of 64: 13.8 against 11.5 us; one head at a
 * time, as before, 37.9). */
#define ATTN_NACC 1

static int64_t padded(int64_t n) { return (n + ATTN_ALIGN - 1) / ATTN_ALIGN * ATTN_ALIGN; }

/* The width of one V head: K's head_dim, or another where V's rows differ
 * (MLA: the latent, a prefix of the K row). */
static int64_t v_head_dim(const pe_tensor *t, const pe_tensor *v) { return v->ne[0] / t->ip[0]; }

/* Per thread: the queries of a KV group (rounded floats, or the Q8_0 blocks
 * a quantized K takes, which need less room), one score per position slot
 * and head, the output lanes of each head, a row of scratch, the cell of
 * each slot, the list of visible cells and the slot of each. */
static size_t attn_thread_bytes(const pe_tensor *t, const pe_tensor *q, const pe_tensor *k, const pe_tensor *v) {
    const int64_t group = q->ne[1] / t->ip[0], slots = padded(k->ne[1]) + ATTN_ALIGN, hd_v = v_head_dim(t, v);
    const int64_t hd = q->ne[0] > hd_v ? q->ne[0] : hd_v;
    const size_t floats = (size_t)(group * (hd * (1 + 4 * pe_kern->vec.lanes) + slots) + hd);
    return floats * sizeof(float) + 3 * (size_t)slots * sizeof(int32_t) + 64;
}

/* A batch's prompt tokens read V from a transposed copy (vt_build): for
 * each KV head, row d holds element d of every cell's V, so the product
 * with V runs along cells in whole vectors.  It pays for batches of many
 * tokens; a copy larger than VT_MAX_BYTES is not made. */
#define VT_MIN_TOKENS 8
#define VT_MAX_BYTES ((size_t)64 << 20)

static size_t vt_bytes(const pe_tensor *t, const pe_graph *g) {
    const pe_tensor *q = &g->t[t->src[0]], *k = &g->t[t->src[1]], *v = &g->t[t->src[2]];
    if (k->type != PE_TYPE_F16 || v->type != PE_TYPE_F16 || q->ne[2] < VT_MIN_TOKENS) return 0;
    const size_t bytes = (size_t)t->ip[0] * (size_t)v_head_dim(t, v) * (size_t)padded(k->ne[1]) * sizeof(uint16_t);
    return bytes <= VT_MAX_BYTES ? bytes : 0;
}

size_t pe_op_attn_work(const pe_graph *g, const pe_tensor *t, int n_threads) {
    const pe_tensor *q = &g->t[t->src[0]], *k = &g->t[t->src[1]], *v = &g->t[t->src[2]];
    return (size_t)n_threads * attn_thread_bytes(t, q, k, v) + vt_bytes(t, g) + 64;
}

/* The query heads sharing one KV head, for one token: each K and V row is
 * read once for the whole group (GQA), while every head's arithmetic is the
 * same, in the same order, as if it ran alone. */
typedef struct {
    int64_t  hd, hd_v, group, n_slots;  /* K's and V's head widths; n_slots: position slots, a multiple of ATTN_ALIGN */
    int      ahead;    /* prefetch K and V rows (a decode step's scattered cells) */
    int      q_type;   /* the type K's dot product takes the query in */
    size_t   q_bytes;  /* bytes of one query row of q_type */
    float   *qh;       /* [group][hd]       queries rounded to F16, or [group] rows of q_bytes */
    float   *row;      /* [max(hd, hd_v)]   scratch */
    float   *scores;   /* [group][n_slots]  scores, then probabilities, by position slot */
    float   *lanes;    /* [group][W][hd_v]  the product with V, lane by lane */
    int32_t *cell;     /* [n_slots]         the cell at each slot, -1 if none */
    int32_t *visible;  /* [n_visible]       the visible cells, in cell order (place_cells) */
    int32_t *vslot;    /* [n_visible]       the slot of each */
    int64_t  n_visible;
    int64_t  cell_offset;  /* every visible cell's offset from its slot when they share one (>= 0), else -1 */
    const uint16_t *vt;  /* this KV head's transposed V ([hd_v][vt_width]), or NULL */
    int64_t  vt_width;
    float    mx[64];   /* largest score per head */
} attn_group;

/* Whether the 8 mask values at m are all -inf (hidden): a decode step's
 * mask hides every other sequence's cells, mostly in long runs. */
static inline int hidden8(const float *m) {
    const uint64_t hidden2 = 0xFF800000FF800000u;   /* two -inf */
    uint64_t u[4];
    memcpy(u, m, sizeof u);
    return (u[0] == hidden2) & (u[1] == hidden2) & (u[2] == hidden2) & (u[3] == hidden2);
}

/* Lays the visible cells of [0, n_kv) out by position; returns 0 when their
 * positions span more slots than there is room for (then by cell index:
 * place_by_cell).  One pass over the mask lists the visible cells
 * (ag->visible) without a branch per cell (a decode step's sequences take
 * turns in the cells: a branch on each would be mispredicted often), the
 * others go over that list only. */
static int place_cells(attn_group *ag, const float *m, const int32_t *pos, int64_t n_kv, int64_t room) {
    int64_t nv = 0;
    for (int64_t c = 0; c < n_kv; c++) {
        if ((c & 7) == 0 && m[c] == -INFINITY && c + 8 <= n_kv && hidden8(m + c)) {
            c += 7;
            continue;
        }
        ag->visible[nv] = (int32_t)c;   /* kept when visible */
        nv += m[c] != -INFINITY;
    }
    ag->n_visible = nv;
    ag->cell_offset = -1;
    int64_t lo = INT64_MAX, hi = -1;
    for (int64_t i = 0; i < nv; i++) {
        const int64_t p = pos ? pos[ag->visible[i]] : ag->visible[i];
        lo = p < lo ? p : lo;
        hi = p > hi ? p : hi;
    }
    if (hi < 0) { ag->n_slots = 0; return 1; }
    const int64_t base = lo / ATTN_ALIGN * ATTN_ALIGN;
    ag->n_slots = padded(hi - base + 1);
    if (ag->n_slots > room) return 0;
    for (int64_t i = 0; i < ag->n_slots; i++) ag->cell[i] = -1;
    for (int64_t i = 0; i < nv; i++) {
        const int32_t c = ag->visible[i];
        ag->vslot[i] = (int32_t)((pos ? pos[c] : c) - base);
        ag->cell[ag->vslot[i]] = c;
        const int64_t offset = c - ag->vslot[i];
        if (i == 0) ag->cell_offset = offset >= 0 ? offset : -1;
        else if (offset != ag->cell_offset) ag->cell_offset = -1;
    }
    return 1;
}

static void place_by_cell(attn_group *ag, int64_t n_kv) {
    ag->n_slots = padded(n_kv);
    for (int64_t i = 0; i < ag->n_slots; i++) ag->cell[i] = -1;
    for (int64_t i = 0; i < ag->n_visible; i++) {
        ag->vslot[i] = ag->visible[i];
        ag->cell[ag->visible[i]] = ag->visible[i];
    }
    ag->cell_offset = ag->n_visible ? 0 : -1;
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
            pe_kern->vec.scale_round_f16(hd, ag->qh + gi * hd, qr, 1.0f);
        } else {
            pe_kern->type[ag->q_type].from_float(qr, (uint8_t *)ag->qh + gi * ag->q_bytes, hd);
        }
        ag->mx[gi] = -INFINITY;
    }
}

/* The raw scores of up to 4 cells (K rows kr, at slots slot[]) for every
 * head of the group: F16 products in tiles of 4 heads x 4 cells (each K row
 * converted once for the heads), a quantized K's one head at a time. */
static void cells_scores(attn_group *ag, const pe_tensor *k, const uint8_t *const kr[4], const int64_t slot[4],
                         int m) {
    const int64_t hd = ag->hd, n = ag->n_slots;
    float s[16];
    if (ag->q_type == PE_TYPE_F16) {
        for (int64_t g0 = 0; g0 < ag->group; g0 += 4) {
            const int nq = ag->group - g0 < 4 ? (int)(ag->group - g0) : 4;
            const float *x[4];
            for (int a = 0; a < nq; a++) x[a] = ag->qh + (g0 + a) * hd;
            pe_kern->vec.dot_tile_f32_f16(hd, x, nq, (const uint16_t *const *)kr, m, ATTN_NACC, s);
            for (int a = 0; a < nq; a++)
                for (int j = 0; j < m; j++) ag->scores[(g0 + a) * n + slot[j]] = s[4 * a + j];
        }
        return;
    }
    for (int64_t gi = 0; gi < ag->group; gi++) {
        for (int j = 0; j < m; j++)
            pe_kern->type[k->type].vec_dot(hd, &s[j], kr[j], (const uint8_t *)ag->qh + gi * ag->q_bytes);
        for (int j = 0; j < m; j++) ag->scores[gi * n + slot[j]] = s[j];
    }
}

/* Every slot no visible cell takes to -inf: the slots around the visible
 * cells' when those are one run of cells at one offset (a prompt's), else
 * all of them first. */
static void hide_empty_slots(attn_group *ag) {
    const int64_t n = ag->n_slots, nv = ag->n_visible;
    const int run = ag->cell_offset >= 0 && nv > 0 && ag->visible[nv - 1] - ag->visible[0] == nv - 1;
    const int64_t lo = run ? ag->vslot[0] : n, hi = run ? lo + nv : n;   /* [lo, hi): the scores' */
    for (int64_t gi = 0; gi < ag->group; gi++) {
        float *sc = ag->scores + gi * n;
        for (int64_t i = 0; i < lo; i++) sc[i] = -INFINITY;
        for (int64_t i = hi; i < n; i++) sc[i] = -INFINITY;
    }
}

/* The soft cap and scale over the visible slots' raw scores, and each
 * head's largest. */
static void cap_scores(const pe_tensor *t, attn_group *ag) {
    const float scale = t->fp[0], softcap = t->fp[1];
    for (int64_t gi = 0; gi < ag->group; gi++) {
        float *sc = ag->scores + gi * ag->n_slots;
        for (int64_t i = 0; i < ag->n_visible; i++) {
            const float s = softcap * pe_tanhf(sc[ag->vslot[i]] * (1.0f / softcap)) * scale;
            sc[ag->vslot[i]] = s;
            if (s > ag->mx[gi]) ag->mx[gi] = s;
        }
    }
}

/* Scores as llama.cpp's non-flash path computes them: the dot product with
 * the query as group_queries made it (F16: in vector lanes), soft-capped,
 * then scaled; empty slots are -inf.  (Models that scale the query instead,
 * as Gemma does, pass a scale of 1.) */
static void group_scores(const pe_tensor *t, attn_group *ag, const pe_tensor *q, int64_t h0, int64_t tok,
                         const pe_tensor *k, size_t k_off, const pe_tensor *v) {
    const int64_t n = ag->n_slots;
    /* a generated token's cells lie scattered over a cache too big for the
     * caches: K rows are asked for a few cells ahead, V rows as their scores
     * go (the product with V reads them next); a prompt's tokens share
     * theirs, already cached.  Whole rows, every KV head's part: one group's
     * part alone (a stride of rows with gaps) streamed at about half the
     * speed, and the thread's next group, if it has one, finds its part
     * cached (1 token over 1500 cells: attention ~20% faster) */
    const int ahead = ag->ahead;
    group_queries(ag, q, h0, tok);
    hide_empty_slots(ag);
    /* four visible cells at a time (each score on its own: their order does
     * not matter): independent dot products overlap */
    const int32_t *cell = ag->visible;
    const int64_t nv = ag->n_visible;
    for (int64_t i0 = 0; i0 < nv; i0 += 4) {
        const int m = nv - i0 < 4 ? (int)(nv - i0) : 4;
        int64_t slot[4];
        const uint8_t *kr[4];
        for (int j = 0; j < m; j++) {
            const int64_t i = i0 + j;
            if (ahead && i + ATTN_PREFETCH < nv)
                pe_prefetch((const uint8_t *)k->data + cell[i + ATTN_PREFETCH] * k->nb[1], k->nb[1]);
            slot[j] = ag->vslot[i];
            kr[j] = (const uint8_t *)k->data + cell[i] * k->nb[1] + k_off;
            if (ahead) pe_prefetch((const uint8_t *)v->data + cell[i] * v->nb[1], v->nb[1]);
        }
        cells_scores(ag, k, kr, slot, m);
    }
    if (t->fp[1] > 0) {
        cap_scores(t, ag);
        return;
    }
    /* no soft cap: the scale goes over whole vectors (empty slots stay -inf) */
    for (int64_t gi = 0; gi < ag->group; gi++) ag->mx[gi] = pe_kern->vec.scale_max(n, ag->scores + gi * n, t->fp[0]);
}

/* ggml's ALiBi slope of head h of n_head (soft_max's): powers of m0 over the
 * first 2^floor(log2 n_head) heads, odd powers of m1 over the rest. */
static float alibi_slope(int64_t h, int64_t n_head, float max_bias) {
    const int64_t n_log2 = (int64_t)1 << (int)floor(log2((double)n_head));
    const float m0 = powf(2.0f, -max_bias / (float)n_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / (float)n_log2);
    return h < n_log2 ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - n_log2) + 1));
}

/* ALiBi: each visible slot's scaled score plus the head's slope times the
 * mask's value there (-|distance|), and each head's new largest. */
static void alibi_scores(attn_group *ag, const float *m, int64_t h0, int64_t n_head, float max_bias) {
    for (int64_t gi = 0; gi < ag->group; gi++) {
        const float slope = alibi_slope(h0 + gi, n_head, max_bias);
        float *sc = ag->scores + gi * ag->n_slots;
        float mx = -INFINITY;
        for (int64_t i = 0; i < ag->n_visible; i++) {
            const float s = sc[ag->vslot[i]] + slope * m[ag->visible[i]];
            sc[ag->vslot[i]] = s;
            mx = s > mx ? s : mx;
        }
        ag->mx[gi] = mx;
    }
}

/* Softmax of each head's scores, in place: exponentials over whole vectors,
 * summed in double, scaled by the float inverse, and for an F16 V rounded to
 * F16 (the type of the product with the V cache).  With sinks (one logit per
 * query head, or NULL), as llama.cpp's softmax takes them: the max over the
 * scores and the head's sink, and exp(sink - max) added to the sum last. */
static void group_softmax(attn_group *ag, int to_f16, const float *sinks) {
    const int64_t n = ag->n_slots;
    for (int64_t gi = 0; gi < ag->group; gi++) {
        float *sc = ag->scores + gi * n;
        if (ag->mx[gi] == -INFINITY) {  /* nothing visible: zeros */
            memset(sc, 0, (size_t)n * sizeof(float));
            continue;
        }
        const float mx = sinks && sinks[gi] > ag->mx[gi] ? sinks[gi] : ag->mx[gi];
        double sum = pe_kern->vec.exp_sum(n, sc, sc, mx);
        if (sinks) sum += (double)pe_expf(sinks[gi] - mx);
        const float inv = (float)(1.0 / sum);
        if (to_f16) {
            pe_kern->vec.scale_round_f16(n, sc, sc, inv);
        } else {
            for (int64_t i = 0; i < n; i++) sc[i] *= inv;
        }
    }
}

/* The column of the transposed V that slot 0 maps to, when every visible
 * cell sits at that fixed offset from its slot (one sequence's cells in
 * position order, as a prompt fills them: place_cells notes it) and the
 * slots fit; else -1. */
static int64_t vt_column(const attn_group *ag) {
    const int64_t c0 = ag->cell_offset;
    return c0 >= 0 && c0 + ag->n_slots <= ag->vt_width ? c0 : -1;
}

/* Fills the transposed V: vt[h][d][c] = V[c][h][d] for cells below n_kv and
 * 0 up to width, in 64-cell blocks dealt round-robin over the threads. */
static void vt_build(const pe_exec *ex, const pe_tensor *v, int64_t n_kv_head, int64_t hd, int64_t n_kv, int64_t width,
                     uint16_t *vt) {
    const int64_t blocks = width / ATTN_ALIGN;
    for (int64_t u = ex->ith; u < n_kv_head * blocks; u += ex->nth) {
        const int64_t h = u / blocks, c0 = (u % blocks) * ATTN_ALIGN;
        const uint16_t *row[ATTN_ALIGN];
        for (int64_t c = 0; c < ATTN_ALIGN; c++)
            row[c] = c0 + c < n_kv ? (const uint16_t *)((const uint8_t *)v->data + (c0 + c) * v->nb[1]) + h * hd : NULL;
        for (int64_t d = 0; d < hd; d++) {
            uint16_t *dst = vt + (h * hd + d) * width + c0;
            for (int64_t c = 0; c < ATTN_ALIGN; c++) dst[c] = row[c] ? row[c][d] : 0;
        }
    }
}

/* Whether this batch makes the transposed V: enough tokens, and a cache
 * not so much larger than them that copying it costs more than it saves.
 * (values_t_f16 gives values_f16's bits: whether it is made changes no
 * result.) */
static int vt_wanted(const pe_exec *ex, const pe_tensor *t, int64_t nt, int64_t n_kv) {
    const pe_tensor *q = &ex->g->t[t->src[0]], *k = &ex->g->t[t->src[1]], *v = &ex->g->t[t->src[2]];
    const size_t bytes = vt_bytes(t, ex->g);
    if (!bytes || (size_t)ex->nth * attn_thread_bytes(t, q, k, v) + bytes > ex->work_bytes) return 0;
    return nt >= VT_MIN_TOKENS && nt * ATTN_ALIGN >= n_kv;
}

/* The product with an F16 V: slot i goes to lane i % W of each head (an fma
 * per element), and the W lanes are folded by halves into the output.  A
 * batch's token whose cells lie at one offset from their slots (vt_column)
 * reads V from the transposed copy, four heads at a time. */
static void group_values_f16(attn_group *ag, const pe_tensor *v, size_t head_off, float *out) {
    const int64_t c0 = ag->vt ? vt_column(ag) : -1;
    for (int64_t g0 = 0; g0 < ag->group; g0 += 4) {
        const int nh = ag->group - g0 < 4 ? (int)(ag->group - g0) : 4;
        const float *p[4];
        float *o[4];
        for (int a = 0; a < nh; a++) {
            p[a] = ag->scores + (g0 + a) * ag->n_slots;
            o[a] = out + (g0 + a) * ag->hd_v;
        }
        if (c0 >= 0) {
            pe_kern->vec.values_t_f16(ag->n_slots, nh, p, ag->vt + c0, (size_t)ag->vt_width, ag->hd_v, o);
            continue;
        }
        pe_kern->vec.values_f16(ag->n_slots, nh, ag->cell, p, (const uint8_t *)v->data + head_off, v->nb[1], ag->hd_v,
                                ATTN_NACC, o, ag->lanes);
    }
}

/* The product with a quantized (Q8_0) V follows llama.cpp's flash-attention
 * path, the only one in which it lets V be quantized: each row is
 * dequantized to floats (once per group) and accumulated in F32 with F32
 * probabilities, slot after slot.  (Its non-flash product would quantize
 * the probabilities along the cells, which needs a transposed V cache.) */
static void group_values_quant(attn_group *ag, const pe_tensor *v, size_t head_off, float *out) {
    const int64_t hd = ag->hd_v, n = ag->n_slots;
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

/* What every (token, heads) run of one attention op shares. */
typedef struct {
    const pe_tensor *t, *q, *k, *v, *mask;
    const int32_t   *cell_pos;
    int64_t          nt, group, n_kv, room;
    size_t           k_head_bytes, v_head_bytes;   /* a head's slice of a cache row */
    const uint16_t  *vt;                            /* the transposed V, or NULL */
    const pe_tensor *sinks;                         /* F32 [H] sink logits (pe_op_attn_sinks), or NULL */
} attn_op;

/* Heads h0 .. h0 + nh - 1 (of one KV group) of token tok; a token's cells
 * are laid out once for the runs that follow on the same token (*placed). */
static void run_heads(const attn_op *op, attn_group *ag, int64_t tok, int64_t h0, int64_t nh, int64_t *placed) {
    const pe_tensor *t = op->t, *v = op->v;
    const int64_t hd_v = ag->hd_v, kvh = h0 / op->group;
    const float *m = (const float *)((const uint8_t *)op->mask->data + tok * op->mask->nb[1]);
    float *out = (float *)((uint8_t *)t->data + tok * t->nb[1]) + h0 * hd_v;
    ag->group = nh;
    if (tok != *placed && !place_cells(ag, m, op->cell_pos, op->n_kv, op->room)) place_by_cell(ag, op->n_kv);
    *placed = tok;
    ag->vt = op->vt ? op->vt + kvh * hd_v * ag->vt_width : NULL;
    const size_t k_off = (size_t)kvh * op->k_head_bytes, v_off = (size_t)kvh * op->v_head_bytes;
    group_scores(t, ag, op->q, h0, tok, op->k, k_off, v);
    if (t->fp[2] > 0) alibi_scores(ag, m, h0, op->q->ne[1], t->fp[2]);
    const float *sinks = t->src[6] >= 0 ? (const float *)op->sinks->data + h0 : NULL;
    group_softmax(ag, v->type == PE_TYPE_F16, sinks);
    if (v->type == PE_TYPE_F16) group_values_f16(ag, v, v_off, out);
    else                        group_values_quant(ag, v, v_off, out);
}

void pe_op_attn_run(pe_exec *ex, pe_tensor *t) {
    const pe_graph *g = ex->g;
    const pe_tensor *q = &g->t[t->src[0]], *k = &g->t[t->src[1]], *v = &g->t[t->src[2]];
    const int64_t hd = q->ne[0], hd_v = v_head_dim(t, v), nt = q->ne[2], n_kv_head = t->ip[0];
    const int64_t n_head = q->ne[1], group = n_head / n_kv_head;
    const int64_t n_kv = *(const int32_t *)g->t[t->src[4]].data;
    if (n_kv < 0 || n_kv > k->ne[1]) { pe_exec_fail(ex, "attn: kv length out of range"); return; }
    if (group > 64) { pe_exec_fail(ex, "attn: more than 64 query heads per KV head"); return; }
    attn_op op = {.t = t, .q = q, .k = k, .v = v, .mask = &g->t[t->src[3]],
                  .cell_pos = t->src[5] >= 0 ? (const int32_t *)g->t[t->src[5]].data : NULL,
                  .sinks = t->src[6] >= 0 ? &g->t[t->src[6]] : NULL,
                  .nt = nt, .group = group, .n_kv = n_kv, .room = padded(k->ne[1]) + ATTN_ALIGN,
                  .k_head_bytes = pe_row_bytes(k->type, hd), .v_head_bytes = pe_row_bytes(v->type, hd_v)};
    const int q_type = k->type == PE_TYPE_F16 ? PE_TYPE_F16 : pe_type_vec_dot_type(k->type);
    attn_group ag = {.hd = hd, .hd_v = hd_v, .q_type = q_type, .q_bytes = pe_row_bytes(q_type, hd)};
    const int64_t hd_max = hd > hd_v ? hd : hd_v;
    uint8_t *mine = ex->work + (size_t)ex->ith * attn_thread_bytes(t, q, k, v);   /* room for a whole group */
    ag.cell = (int32_t *)mine;
    ag.visible = ag.cell + op.room;
    ag.vslot = ag.visible + op.room;
    ag.qh = (float *)(ag.vslot + op.room);
    ag.scores = ag.qh + group * hd;
    ag.lanes = ag.scores + group * op.room;
    ag.row = ag.lanes + group * hd_max * 4 * pe_kern->vec.lanes;
    if (vt_wanted(ex, t, nt, n_kv)) {
        uint16_t *vt = (uint16_t *)(ex->work + (size_t)ex->nth * attn_thread_bytes(t, q, k, v));
        ag.vt_width = padded(n_kv);
        vt_build(ex, v, n_kv_head, hd_v, n_kv, ag.vt_width, vt);
        pe_pool_barrier(ex->pool);
        op.vt = vt;
    }
    int64_t placed = -1;
    if (nt < 4 * ex->nth) {
        /* A few tokens (a decode step's, each seeing its own sequence): the
         * threads take even contiguous runs of (token, head), so a thread
         * lays out each token's cells once for all of the token's heads it
         * takes, and the heads of a KV group it takes share each K and V
         * row's conversion (a group may be split between two threads: one
         * token's 3 groups go 4.5 heads to a thread, not 2 groups to one and
         * 1 to the other) */
        ag.ahead = 1;
        int64_t u0, u1;
        pe_split(nt * n_head, ex->ith, ex->nth, &u0, &u1);
        for (int64_t u = u0, nh; u < u1; u += nh) {
            const int64_t h0 = u % n_head;
            nh = group - h0 % group < u1 - u ? group - h0 % group : u1 - u;
            run_heads(&op, &ag, u / n_head, h0, nh, &placed);
        }
        return;
    }
    /* A prompt's tokens are dealt round-robin (a causal prompt's later
     * tokens see more cells, and contiguous halves would leave one thread
     * the long rows), every KV group of one after the other on the layout
     * of its cells made once. */
    for (int64_t tok = ex->ith; tok < nt; tok += ex->nth)
        for (int64_t h0 = 0; h0 < n_head; h0 += group) run_heads(&op, &ag, tok, h0, group, &placed);
}
