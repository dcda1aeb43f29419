/* backend.h - what a backend gives the core: one table of functions that the
 * graph is planned and computed through.
 *
 * The core (csrc/core) builds graphs, checks shapes and plans memory; it
 * never computes.  A backend owns a kind of memory and the code that runs
 * ops on it: the CPU's (csrc/cpu: the executor, the thread pool, the kernel
 * tables) is the one built today.  Another (CUDA, Metal) is one more folder
 * with one more table, compiled in through the PYENGINE_BACKENDS CMake list
 * and named in the registry (core/backend.c); the core stays as it is. */
#ifndef PE_BACKEND_H
#define PE_BACKEND_H

#include <stddef.h>

#include "graph.h"

typedef struct pe_backend {
    const char *name;          /* "cpu" */
    /* once, before the first graph: probe the hardware, build the tables;
     * 0 on success (a backend whose devices are absent says so here) */
    int    (*init)(void);
    /* the devices it can compute on (the CPU: one) */
    int    (*n_devices)(void);
    /* a buffer of `bytes` in the backend's memory (NULL: out of memory), and
     * its release; the planner takes the arena and the ops' scratch so */
    void  *(*alloc)(size_t bytes);
    void   (*free)(void *buffer);
    /* host memory to and from the backend's: bytes from src to dst (both
     * the host's for the CPU); 0 on success */
    int    (*copy)(void *dst, const void *src, size_t bytes);
    /* whether it has a kernel for node t as built (type, shape, operands) */
    int    (*supports_op)(const pe_graph *g, const pe_tensor *t);
    /* scratch bytes node t needs when computed by `workers` workers */
    size_t (*work_bytes)(const pe_graph *g, const pe_tensor *t, int workers);
    /* whether node t may start while prev, the computed node before it, is
     * still running on other workers (no barrier between them) */
    int    (*joins)(const pe_graph *g, const pe_tensor *prev, const pe_tensor *t);
    /* the workers an executor (ctx: the CPU's thread pool) computes with */
    int    (*workers)(void *ctx);
    /* run every computed node of a planned graph in order; 0 on success.
     * May return before the results are in memory the host reads: sync
     * waits for them. */
    int    (*compute)(void *ctx, pe_graph *g);
    int    (*sync)(void *ctx);
    /* drop the state compute keeps in g->exec (the graph is freed or planned again) */
    void   (*release)(pe_graph *g);
} pe_backend;

/* The tables of the backends that exist: each folder's own (cpu/exec.c). */
extern const pe_backend pe_backend_cpu;

/* The backends this build holds, the host's (the CPU) first (pe_backend_count
 * and the rest of discovery in pe.h). */
const pe_backend *pe_backend_at(int i);
/* The one that builds graphs' host-side checks (pe_graph_new initialises it). */
const pe_backend *pe_backend_host(void);

/* Plan g on `be` (first call, or more workers than planned for) and compute
 * it through ctx, an executor of `be`.  0 on success. */
int pe_graph_compute_on(pe_graph *g, const pe_backend *be, void *ctx);

#endif /* PE_BACKEND_H */
