/* graph.h - what the backend-neutral core shares (csrc/core): tensors, the
 * graph's storage and shapes, the type traits, errors and small helpers.
 * Nothing here knows how or where a graph is computed: that is a backend's
 * (backend.h), whose files may include this header but not the other way
 * round. */
#ifndef PE_GRAPH_H
#define PE_GRAPH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pe.h"

#define PE_MAX_DIMS 4
#define PE_MAX_SRC  9   /* ssm_scan: x, dt, A, B, C, D, dt_bias, state, seqs */
#define PE_MAX_NAME 48

/* Record an error message for pe_last_error(); always returns -1. */
int pe_fail(const char *fmt, ...);

/* The type an interleaved type holds (its rows by 8), or -1. */
int pe_type_rows8_base(int type);
/* Whether a type can be a weight (it has a dot product: traits, not kernels). */
int pe_type_is_weight(int type);

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
    int        planned_threads;   /* the workers the scratch is sized for */
    const struct pe_backend *backend;   /* the one that planned the buffers (and frees them) */
    void      *exec;           /* that backend's state for computing this graph */
    atomic_int error;          /* set by the first thread that hits a data error */
    char       error_msg[256];
};

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

#endif /* PE_GRAPH_H */
