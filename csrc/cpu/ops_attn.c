/* ops_attn.c - writes into the KV cache and attention over it.
 *
 * Attention runs one (token, head) pair at a time with an online softmax
 * (one pass over the cells, no score matrix), reading K and V rows straight
 * from the F16 cache.  The number of cells to read is an input read at
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

size_t pe_op_attn_work(const pe_graph *g, const pe_tensor *t, int n_threads) {
    const pe_tensor *q = &g->t[t->src[0]];
    return (size_t)n_threads * ((size_t)q->ne[0] * sizeof(float) + 64);
}

void pe_op_attn_run(pe_exec *ex, pe_tensor *t) {
    const pe_graph *g = ex->g;
    const pe_tensor *q = &g->t[t->src[0]], *k = &g->t[t->src[1]], *v = &g->t[t->src[2]];
    const pe_tensor *mask = &g->t[t->src[3]], *len = &g->t[t->src[4]];
    const int64_t hd = q->ne[0], nh = q->ne[1], nt = q->ne[2];
    const int n_kv_head = t->ip[0];
    const int64_t group = nh / n_kv_head;
    const float scale = t->fp[0], softcap = t->fp[1];
    const int64_t n_kv = *(const int32_t *)len->data;
    if (n_kv < 0 || n_kv > k->ne[1]) { pe_exec_fail(ex, "attn: kv length out of range"); return; }
    float *acc = (float *)(ex->work + (size_t)ex->ith * (hd * sizeof(float) + 64));
    const pe_vec_kernels *vk = &pe_kern->vec;
    int64_t p0, p1;
    pe_split(nt * nh, ex->ith, ex->nth, &p0, &p1);
    for (int64_t p = p0; p < p1; p++) {
        const int64_t tok = p / nh, h = p % nh;
        const float *qr = pe_row(q, h, tok, 0);
        const float *m = (const float *)((const uint8_t *)mask->data + tok * mask->nb[1]);
        const size_t head_off = (size_t)(h / group) * hd * sizeof(uint16_t);
        float mx = -INFINITY, sum = 0.0f;
        memset(acc, 0, (size_t)hd * sizeof(float));
        for (int64_t c = 0; c < n_kv; c++) {
            if (m[c] == -INFINITY) continue;
            const uint16_t *kr = (const uint16_t *)((const uint8_t *)k->data + c * k->nb[1] + head_off);
            const uint16_t *vr = (const uint16_t *)((const uint8_t *)v->data + c * v->nb[1] + head_off);
            float s = vk->dot_f32_f16(hd, qr, kr) * scale;
            if (softcap > 0) s = softcap * tanhf(s / softcap);
            s += m[c];
            if (s > mx) {
                const float shrink = expf(mx - s);  /* rescale what was summed so far */
                mx = s;
                sum = sum * shrink + 1.0f;
                vk->scale_mad_f16(hd, acc, shrink, vr, 1.0f);
            } else {
                const float e = expf(s - mx);
                sum += e;
                vk->scale_mad_f16(hd, acc, 1.0f, vr, e);
            }
        }
        float *d = (float *)((uint8_t *)t->data + tok * t->nb[1]) + h * hd;
        const float inv = sum > 0 ? 1.0f / sum : 0.0f;
        for (int64_t i = 0; i < hd; i++) d[i] = acc[i] * inv;
    }
}
