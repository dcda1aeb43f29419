/* kvmask.c - attention masks of a decoding batch over the cache's cells.
 *
 * The cache's bookkeeping is Python's (pyengine/kvcache); this is its one
 * loop over every (token, cell) pair, run once per cache group and step:
 * numpy needed a handful of calls per sequence for it, ~25-55 us a step. */
#include <math.h>

#include "internal.h"

void pe_kv_mask(float *out, int64_t stride, const int32_t *positions, const uint64_t *seq_bits, int64_t n_tokens,
                const int32_t *cell_pos, const uint64_t *cell_seq, int64_t n_kv, int32_t window, int32_t chunk) {
    for (int64_t t = 0; t < n_tokens; t++) {
        float *row = out + t * stride;
        const int32_t p = positions[t];
        const int32_t first = chunk > 0 && p >= 0 ? p - p % chunk : INT32_MIN;
        const uint64_t bit = seq_bits[t];
        for (int64_t c = 0; c < n_kv; c++) {
            const int visible = (cell_seq[c] & bit) && cell_pos[c] <= p && cell_pos[c] >= first &&
                                (window <= 0 || p - cell_pos[c] < window);
            row[c] = visible ? 0.0f : -INFINITY;
        }
    }
}
