/* topk.c - the k best logits of a row, for the samplers (pyengine/sample).
 *
 * Sampling narrows the vocabulary to a few dozen candidates (top-k, or the
 * greedy pick) once per token of every sequence; numpy needed a partition,
 * a few masks and a copy of the row for it, ~30-60 us per token, more once a
 * forward pass has pushed the row out of the caches.  One pass here keeps
 * the best k in order and skips, a vector maximum at a time, what cannot
 * enter.  Greedy sampling under penalties (pe_greedy_penalised) takes the
 * best outside the penalised ids, and whether the row holds a NaN, from one
 * such pass (pe_best_outside), and rewrites the few penalised logits apart:
 * in numpy, after a forward pass had pushed its working set out of the
 * caches, the same pick took ~80-150 us a token. */
#include <math.h>

#include "internal.h"

#define TOPK_RUN 64   /* values whose maximum is compared with the set's last at once */

/* Puts (v, pos) into best (descending, ties by position: a later position
 * goes after equal values), dropping the last entry when count == k. */
static void insert(float *val, int64_t *pos, int64_t *count, int64_t k, float v, int64_t p) {
    int64_t at = *count < k ? *count : k - 1;
    while (at > 0 && val[at - 1] < v) {
        val[at] = val[at - 1];
        pos[at] = pos[at - 1];
        at--;
    }
    val[at] = v;
    pos[at] = p;
    if (*count < k) (*count)++;
}

/* The k best of x outside the ascending positions skip[]: pe_top_k, and
 * with `nan` (not NULL) every run's maximum taken, which notes there
 * whether any value, skipped or not, is NaN. */
static int64_t best_k(const float *x, int64_t n, int64_t k, const int64_t *skip, int64_t n_skip, float *val,
                      int64_t *pos, int *nan) {
    int64_t count = 0, s = 0;
    pe_init();
    for (int64_t i0 = 0; i0 < n; i0 += TOPK_RUN) {
        const int64_t len = n - i0 < TOPK_RUN ? n - i0 : TOPK_RUN;
        /* a full set admits only values above its last; until then every value
         * is looked at (so -inf ones fill a set the finite ones cannot) */
        const int full = count == k;
        float run_max = INFINITY;
        if (nan) run_max = pe_kern->vec.max_nan(len, x + i0, nan);
        else if (full) run_max = pe_kern->vec.max(len, x + i0);
        if (full && !(run_max > val[k - 1])) continue;
        for (int64_t i = i0; i < i0 + len; i++) {
            while (s < n_skip && skip[s] < i) s++;
            if (s < n_skip && skip[s] == i) continue;
            const float v = x[i];
            if (isnan(v)) continue;
            if (count < k || v > val[k - 1]) insert(val, pos, &count, k, v, i);
        }
    }
    return count;
}

int64_t pe_top_k(const float *x, int64_t n, int64_t k, const int64_t *skip, int64_t n_skip, float *val,
                 int64_t *pos) {
    return k > 0 ? best_k(x, n, k, skip, n_skip, val, pos, NULL) : 0;
}

int64_t pe_best_outside(const float *x, int64_t n, const int64_t *skip, int64_t n_skip, int *nan) {
    float value = -INFINITY;
    int64_t position = -1;
    *nan = 0;
    return best_k(x, n, 1, skip, n_skip, &value, &position, nan) ? position : -1;
}

/* llama.cpp's repetition, frequency and presence penalties on one logit
 * seen `count` times, in float as numpy computes them (no fused steps) */
static float penalised(float v, float count, float repeat, float frequency, float presence) {
    v = v <= 0.0f ? v * repeat : v / repeat;
    const float seen = count * frequency;
    return v - (seen + presence);
}

int64_t pe_greedy_penalised(const float *x, int64_t n, const int64_t *ids, const float *counts, int64_t n_ids,
                            float repeat, float frequency, float presence, int *status) {
    int nan = 0;
    const int64_t best = pe_best_outside(x, n, ids, n_ids, &nan);
    const float untouched = best >= 0 ? x[best] : -INFINITY;
    float raw_top = untouched, top = -INFINITY;
    int64_t token = -1;
    for (int64_t i = 0; i < n_ids; i++) {
        const float v = x[ids[i]];
        raw_top = v > raw_top ? v : raw_top;
        const float p = penalised(v, counts[i], repeat, frequency, presence);
        if (p > top || (token < 0 && p == p)) {   /* ids ascend: the first of equals is the lowest */
            top = p;
            token = ids[i];
        }
    }
    if (nan) *status = PE_GREEDY_NAN;
    else if (raw_top == INFINITY) *status = PE_GREEDY_POS_INF;
    else if (raw_top == -INFINITY) *status = PE_GREEDY_NONE;
    else *status = 0;
    if (*status) return -1;
    if (top == -INFINITY && untouched == -INFINITY) return -1;
    if (token < 0 || top < untouched) return best;
    return top > untouched || token < best ? token : best;
}
