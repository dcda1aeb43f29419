/* internal.h - what the CPU backend's files share (and the quant/ kernels
 * it tables): the core's tensors and graph (core/graph.h), the kernel tables,
 * the executor context handed to ops, the thread pool and small helpers. */
#ifndef PE_INTERNAL_H
#define PE_INTERNAL_H

#if defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
#include <xmmintrin.h>
#endif
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "blocks.h"
#include "graph.h"
#include "kernels.h"
#include "pe.h"

/* Whether get_rows can read this table's rows (interleaved ones through their
 * 8-row group, unpacked). */
int pe_get_rows_readable(const pe_tensor *table);

/* PYENGINE_PROFILE=1: time per op kind, printed at exit (profile.c) */
int    pe_profile_on(void);
double pe_profile_now(void);
void   pe_profile_add(const pe_graph *g, const pe_tensor *t, double seconds);

/* ---- GELU ----------------------------------------------------------------- */

/* GELU(tanh) of every F16 value, as F16 (filled by pe_init). */
extern uint16_t pe_gelu_table[(1 << 16) + 2];
void pe_gelu_table_init(void);

/* GELU as GGML computes it: 0 below -10, identity above 10, else the table
 * entry of the input rounded to F16. */
static inline float pe_gelu(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return pe_f16_to_f32(pe_gelu_table[pe_f32_to_f16(x)]);
}

/* ---- executor ------------------------------------------------------------ */

/* What an op sees while it runs: its thread index, the shared scratch, and a
 * barrier for ops that work in phases (quantize activations, then dot). */
typedef struct pe_exec {
    int            ith, nth;
    pe_graph      *g;
    uint8_t       *work;
    size_t         work_bytes;
    struct pe_pool *pool;
    atomic_int    *chunk;      /* shared counter for dynamic work splitting */
    struct pe_range_slot *ranges;
    uint32_t       gen;        /* this node's generation (tells its ranges from older ones) */
    atomic_int    *error;      /* set by any thread on a data error */
    uint32_t       claim_gen;  /* tasks [claim_next, claim_end) of node claim_gen: taken from */
    int64_t        claim_next, claim_end;   /* a range, not yet done (pe_range_next) */
} pe_exec;

/* Ranges: a split of a node's tasks for ops that stream their input once
 * (decoding's matrix products).  Thread t owns the contiguous range
 * [t n / nth, (t + 1) n / nth) and takes its tasks in order; a thread whose
 * range is done takes tasks from the back of the others' ranges, so every
 * thread reads one stream while all are busy, and one that started late is
 * helped.  Tasks are taken a quarter of what is left at a time (at least
 * one), so the atomic operations are few while the range is long and the
 * last tasks still go one by one to whichever thread is free.  Returns the
 * next task (< n_tasks <= PE_RANGE_MAX_TASKS), or -1 when none is left. */
#define PE_RANGE_MAX_TASKS 0xFFFF
typedef struct pe_range_slot {
    atomic_ullong word;        /* generation << 32 | front << 16 | back */
    char          pad[64 - sizeof(atomic_ullong)];   /* one cache line per thread */
} pe_range_slot;
int64_t pe_range_next(pe_exec *ex, int64_t n_tasks);

/* Record a data error found while computing (first one wins). */
void pe_exec_fail(pe_exec *ex, const char *msg);
void pe_pool_barrier(struct pe_pool *pool);
/* Run fn(arg, ith, nth) on every thread of the pool (the caller is thread 0). */
typedef void (*pe_pool_fn)(void *arg, int ith, int nth);
void pe_pool_run(struct pe_pool *pool, pe_pool_fn fn, void *arg);

/* One function per op: computes its part of node t. */
typedef void (*pe_op_fn)(pe_exec *ex, pe_tensor *t);
/* Scratch bytes an op needs (0 for most). */
size_t pe_op_work_bytes(const pe_graph *g, const pe_tensor *t, int n_threads);
/* Whether node t can start on each thread as soon as that thread is done
 * with prev, the computed node before it, with no barrier between them: t
 * reads nothing prev writes or frees, and takes what prev left in the
 * scratch (sibling products of one activation share its quantized rows). */
int    pe_op_joins(const pe_graph *g, const pe_tensor *prev, const pe_tensor *t);
void   pe_op_compute(pe_exec *ex, pe_tensor *t);

/* Split n items into nth near-equal ranges: [*i0, *i1) for thread ith. */
static inline void pe_split(int64_t n, int ith, int nth, int64_t *i0, int64_t *i1) {
    const int64_t per = (n + nth - 1) / nth;
    *i0 = per * ith < n ? per * ith : n;
    *i1 = *i0 + per < n ? *i0 + per : n;
}

/* A hint to load the cache lines of [p, p + len) ahead of their use, into
 * every cache level (nothing where the compiler has no way to say it). */
static inline void pe_prefetch(const void *p, size_t len) {
#if defined(__GNUC__) || defined(__clang__)
    for (size_t o = 0; o < len; o += 64) __builtin_prefetch((const char *)p + o, 0, 3);
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
    for (size_t o = 0; o < len; o += 64) _mm_prefetch((const char *)p + o, _MM_HINT_T0);
#else
    (void)p;
    (void)len;
#endif
}

/* For small functions whose loops must keep their accumulators in
 * registers: inlined into callers that fix their counts. */
#if defined(_MSC_VER)
#define PE_ALWAYS_INLINE static __forceinline
#else
#define PE_ALWAYS_INLINE static inline __attribute__((always_inline))
#endif

#endif /* PE_INTERNAL_H */
