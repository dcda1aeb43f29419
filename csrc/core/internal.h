/* internal.h - what the core's files share: tensors, the graph, the executor
 * context handed to ops, and small helpers. */
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
#include "kernels.h"
#include "pe.h"

#define PE_MAX_DIMS 4
#define PE_MAX_SRC  9   /* ssm_scan: x, dt, A, B, C, D, dt_bias, state, seqs */
#define PE_MAX_NAME 48

/* Record an error message for pe_last_error(); always returns -1. */
int pe_fail(const char *fmt, ...);

/* The type an interleaved type holds (its rows by 8), or -1. */
int pe_type_rows8_base(int type);

/* a * b into *out, 0 on overflow of size_t */
static inline int pe_mul_ok(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

typedef enum pe_op {
    PE_OP_NONE = 0,     /* external leaf */
    PE_OP_VIEW,
    PE_OP_GET_ROWS,
    PE_OP_MUL_MAT,
    PE_OP_MUL_MAT_ID,
    PE_OP_ADD,
    PE_OP_MUL,
    PE_OP_SCALE,
    PE_OP_SOFTCAP,
    PE_OP_RMS_NORM,
    PE_OP_UNARY,
    PE_OP_GLU,
    PE_OP_SOFTMAX,
    PE_OP_ROPE,
    PE_OP_SET_ROWS,
    PE_OP_ATTN,
    PE_OP_TOPK,
    PE_OP_MOE_WEIGHTS,
    PE_OP_WEIGHTED_SUM,
    PE_OP_CONT,
    PE_OP_ROPE_ANGLES,  /* rope's cos/sin per position, shared by the rope nodes of one setting */
    PE_OP_ADD_ID,       /* a bias row per chosen expert (gpt-oss) */
    PE_OP_SWIGLU_OAI,   /* gpt-oss's clamped gated unit */
    PE_OP_L2_NORM,
    PE_OP_SSM_CONV,
    PE_OP_SSM_SCAN,
    PE_OP_DELTA_NET,
    PE_OP_CONCAT,       /* two tensors side by side along dim 0 (MLA's query and key rows) */
    PE_OP_MOE_ROUTE,    /* experts chosen by gated scores + a bias, within the best groups (DeepSeek) */
    PE_OP_COUNT
} pe_op;

typedef struct pe_tensor {
    int     type;
    int     n_dims;
    int64_t ne[PE_MAX_DIMS];   /* elements per dim; unused dims are 1 */
    size_t  nb[PE_MAX_DIMS];   /* byte strides */
    int     op;
    int     src[PE_MAX_SRC];   /* tensor ids, -1 when absent */
    int32_t ip[8];             /* integer op parameters */
    float   fp[12];            /* float op parameters */
    void   *data;              /* set for externals; for others after planning */
    void   *bound;             /* an output computed straight into caller memory (pe_graph_bind_output) */
    int     view_of;           /* base tensor id of a view, else -1 */
    size_t  view_offset;
    size_t  nbytes;            /* bytes owned (computed tensors) */
    size_t  nbytes_external;   /* buffer size given for an external tensor */
    size_t  arena_offset;
    bool    is_output;
    bool    freed;             /* planning: slice returned to the allocator */
    bool    joins_prev;        /* planning: runs on the previous computed node's scratch (pe_op_joins) */
    bool    barrier_after;     /* planning: threads wait for each other after this node */
    char    name[PE_MAX_NAME];
} pe_tensor;

struct pe_graph {
    pe_tensor *t;
    int        n, cap;
    uint8_t   *arena;          /* computed tensors live here after planning */
    size_t     arena_bytes;
    uint8_t   *work;           /* per-op scratch (quantized activations, ...) */
    size_t     work_bytes;
    bool       planned;
    int        planned_threads;
    atomic_int *chunks;        /* per node: next work chunk (dynamic splitting) */
    struct pe_range_slot *ranges; /* per thread: its range of a node's tasks (pe_range_next) */
    uint32_t   gen_base;       /* generation of node 0 in the current compute */
    atomic_int error;          /* set by the first thread that hits a data error */
    char       error_msg[256];
};

/* Whether get_rows can read this table's rows (interleaved ones through their
 * 8-row group, unpacked). */
int pe_get_rows_readable(const pe_tensor *table);

/* PYENGINE_PROFILE=1: time per op kind, printed at exit (profile.c) */
int    pe_profile_on(void);
double pe_profile_now(void);
void   pe_profile_add(const pe_graph *g, const pe_tensor *t, double seconds);

pe_tensor *pe_graph_get(const pe_graph *g, int id);
int pe_graph_add(pe_graph *g, int type, int n_dims, const int64_t *ne);

static inline int64_t pe_nrows(const pe_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }
static inline int64_t pe_nelements(const pe_tensor *t) { return t->ne[0] * pe_nrows(t); }
/* a pointer to row (i1, i2, i3) */
static inline void *pe_row(const pe_tensor *t, int64_t i1, int64_t i2, int64_t i3) {
    return (uint8_t *)t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}
static inline bool pe_is_contiguous(const pe_tensor *t) {
    size_t expect = pe_row_bytes(t->type, t->ne[0]);
    if (t->nb[0] != pe_type_block_bytes(t->type)) return false;
    for (int i = 1; i < PE_MAX_DIMS; i++) {
        if (t->ne[i] > 1 && t->nb[i] != expect) return false;
        expect *= (size_t)t->ne[i];
    }
    return true;
}

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
