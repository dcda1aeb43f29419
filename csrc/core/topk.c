/* topk.c - the k best logits of a row, for the samplers (pyengine/sample).
 *
 * Sampling narrows the vocabulary to a few dozen candidates (top-k, or the
 * greedy pick) once per token of every sequence; numpy needed a partition,
 * a few masks and a copy of the row for it, ~30-60 us per token, more once a
 * forward pass has pushed the row out of the caches.  One pass here keeps
 * the best k in order and skips, a vector maximum at a time, what cannot
 * enter. */
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

int64_t pe_top_k(const float *x, int64_t n, int64_t k, const int64_t *skip, int64_t n_skip, float *val,
                 int64_t *pos) {
    int64_t count = 0, s = 0;
    if (k <= 0) return 0;
    pe_init();
    for (int64_t i0 = 0; i0 < n; i0 += TOPK_RUN) {
        const int64_t len = n - i0 < TOPK_RUN ? n - i0 : TOPK_RUN;
        /* a full set admits only values above its last; until then every value
         * is looked at (so -inf ones fill a set the finite ones cannot) */
        if (count == k && !(pe_kern->vec.max(len, x + i0) > val[k - 1])) continue;
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
