/* ops_rope.c - rotary position embeddings (normal and NeoX layouts), with
 * frequency base/scale, per-dimension frequency factors and YaRN ramps, and
 * the multi-section kinds (M-RoPE: the rotated pairs split into sections, each
 * turned by its own position stream of a token; vision: the same with each
 * section's frequencies starting over, over pairs spread across the whole head).
 * The angles are built by repeated multiplication in float, as GGML does
 * (so they are llama.cpp's to the last bit); the logarithms, the power and
 * the cos/sin of each angle are taken in double and rounded once, so the
 * table does not depend on the C library's float functions. */
#include <math.h>

#include "internal.h"

#define PE_PI 3.14159265358979323846f

static float log_f(float x) { return (float)log((double)x); }

static float corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return n_dims * log_f(n_ctx_orig / (n_rot * 2 * PE_PI)) / (2 * log_f(base));
}

static float yarn_ramp(float low, float high, int i0) {
    const float y = (i0 / 2 - low) / fmaxf(0.001f, high - low);
    return 1 - fminf(1, fmaxf(0, y));
}

/* The position stream (0..3) that turns pair `pair` under sections sec[4]:
 * the sections repeat every sum-of-sections pairs (ggml's rope_multi).  M-RoPE
 * gives each stream a run of pairs; interleaved M-RoPE lets streams 0, 1, 2
 * take turns, stream s while it has pairs left (3 sec[s] turns), the fourth
 * stream whatever none of them takes. */
static int section_of(const int32_t *sec, int pair, int mode) {
    const int sector = pair % (sec[0] + sec[1] + sec[2] + sec[3]);
    if (mode == PE_ROPE_IMROPE) {
        const int s = sector % 3;
        return sector < 3 * sec[s] ? s : 3;
    }
    int s = 0, end = sec[0];
    while (s < 3 && sector >= end) end += sec[++s];
    return s;
}

/* Vision rope: a stream's angle starts over at its section's first pair (so
 * both halves of a patch's 2D position get the full range of frequencies). */
static void restart_section(const int32_t *sec, int pair, const float *pos, float *theta) {
    const int sector = pair % (sec[0] + sec[1] + sec[2] + sec[3]);
    if (sector == 0) theta[0] = pos[0];
    else if (sector == sec[0]) theta[1] = pos[1];
    else if (sector == sec[0] + sec[1]) theta[2] = pos[2];
    else if (sector == sec[0] + sec[1] + sec[2]) theta[3] = pos[3];
}

/* Pairs the table holds: n_dims / 2, or n_dims for vision (whose n_dims is
 * half the rotated width, as ggml counts it). */
static int rope_pairs(const pe_tensor *t) { return t->ip[1] == PE_ROPE_VISION ? t->ip[0] : t->ip[0] / 2; }

/* cos/sin of every rotated pair for one token (pos: its 4 position streams;
 * the plain kinds read stream 0 only), into cache[2 * pair]
 * (t: a node holding the rope setting in ip and fp). */
static void angles(const pe_tensor *t, const float *ff, const float *pos, float *cache) {
    const int n_dims = t->ip[0], mode = t->ip[1], n_ctx_orig = t->ip[2], n_pairs = rope_pairs(t);
    const int multi = pe_rope_is_multi(mode);
    const int32_t *sec = &t->ip[3];
    const float base = t->fp[0], freq_scale = t->fp[1], ext_factor = t->fp[2];
    const float attn_factor = t->fp[3], beta_fast = t->fp[4], beta_slow = t->fp[5];
    const float theta_scale = (float)pow((double)base, (double)(-2.0f / n_dims));
    float low = 0, high = 0;
    if (ext_factor != 0.0f) {
        low = fmaxf(0, floorf(corr_dim(n_dims, n_ctx_orig, beta_fast, base)));
        high = fminf(n_dims - 1, ceilf(corr_dim(n_dims, n_ctx_orig, beta_slow, base)));
    }
    float theta[4] = {pos[0], pos[1], pos[2], pos[3]};
    for (int pair = 0; pair < n_pairs; pair++) {
        const int i0 = 2 * pair;
        if (mode == PE_ROPE_VISION) restart_section(sec, pair, pos, theta);
        const float extrap = theta[multi ? section_of(sec, pair, mode) : 0] / (ff ? ff[pair] : 1.0f);
        const float interp = freq_scale * extrap;
        float angle = interp, mscale = attn_factor;
        if (ext_factor != 0.0f) {
            const float mix = yarn_ramp(low, high, i0) * ext_factor;
            angle = fmaf(interp, 1 - mix, extrap * mix);   /* fused, as ggml's FMA builds compute it */
            mscale *= 1.0f + 0.1f * log_f(1.0f / freq_scale);
        }
        cache[i0] = (float)cos((double)angle) * mscale;
        cache[i0 + 1] = (float)sin((double)angle) * mscale;
        for (int s = 0; s < 4; s++) theta[s] *= theta_scale;
    }
}

/* The table: per token, cos/sin of every rotated pair (angles()).  The
 * multi-section kinds take 4 positions a token, token by token. */
void pe_op_rope_angles_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *p = &ex->g->t[t->src[0]];
    const float *ff = t->src[1] >= 0 ? (const float *)ex->g->t[t->src[1]].data : NULL;
    const int32_t *pos = p->data;
    const int multi = pe_rope_is_multi(t->ip[1]);
    int64_t r0, r1;
    pe_split(t->ne[1], ex->ith, ex->nth, &r0, &r1);
    for (int64_t tok = r0; tok < r1; tok++) {
        float streams[4];
        for (int s = 0; s < 4; s++) streams[s] = (float)pos[multi ? tok * 4 + s : tok];
        angles(t, ff, streams, (float *)pe_row(t, tok, 0, 0));
    }
}

/* Rows (head, token) split over the threads, each rotated by its token's
 * angles from the table. */
void pe_op_rope_run(pe_exec *ex, pe_tensor *t) {
    const pe_tensor *a = &ex->g->t[t->src[0]], *table = &ex->g->t[t->src[1]];
    /* M-RoPE (interleaved or not) rotates as NeoX; vision as NeoX over twice ggml's n_dims */
    const int n_dims = 2 * rope_pairs(t), neox = t->ip[1] != PE_ROPE_NORMAL;
    const int64_t hd = a->ne[0], nh = a->ne[1];
    int64_t r0, r1;
    pe_split(nh * a->ne[2], ex->ith, ex->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t h = r % nh, tok = r / nh;
        const float *cache = pe_row(table, tok, 0, 0);
        const float *x = pe_row(a, h, tok, 0);
        float *d = pe_row(t, h, tok, 0);
        for (int i0 = 0; i0 < n_dims; i0 += 2) {
            const float c = cache[i0], s = cache[i0 + 1];
            const int ia = neox ? i0 / 2 : i0, ib = neox ? i0 / 2 + n_dims / 2 : i0 + 1;
            const float x0 = x[ia], x1 = x[ib];
            /* GGML's x0*c - x1*s as GCC contracts it: the first product fused */
            d[ia] = fmaf(x0, c, -(x1 * s));
            d[ib] = fmaf(x0, s, x1 * c);
        }
        for (int64_t i = n_dims; i < hd; i++) d[i] = x[i];
    }
}
