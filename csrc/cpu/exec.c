/* exec.c - the CPU backend: its table (core/backend.h), the executor that
 * runs a planned graph's nodes in order on the thread pool, and the work
 * ranges ops split a node's tasks by. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "internal.h"

/* What computing a graph keeps between calls (g->exec). */
typedef struct cpu_exec {
    atomic_int    *chunks;     /* per node: next work chunk (dynamic splitting) */
    pe_range_slot *ranges;     /* per thread: its range of a node's tasks (pe_range_next) */
    int            n_ranges;
    uint32_t       gen_base;   /* generation of node 0 in the current compute */
} cpu_exec;

static bool computed(const pe_tensor *t) { return t->op != PE_OP_NONE && t->op != PE_OP_VIEW; }

typedef struct {
    pe_graph *g;
    cpu_exec *st;
    pe_pool  *pool;
} run_ctx;

static void run_nodes(void *arg, int ith, int nth) {
    run_ctx *rc = arg;
    pe_graph *g = rc->g;
    cpu_exec *st = rc->st;
    pe_exec ex = {.ith = ith, .nth = nth, .g = g, .work = g->work, .work_bytes = g->work_bytes,
                  .pool = rc->pool, .ranges = st->ranges, .error = &g->error};
    const int timed = ith == 0 && pe_profile_on();
    for (int i = 0; i < g->n; i++) {
        pe_tensor *t = &g->t[i];
        if (!computed(t)) continue;
        const double t0 = timed ? pe_profile_now() : 0;
        ex.chunk = &st->chunks[i];
        ex.gen = st->gen_base + (uint32_t)i;
        pe_op_compute(&ex, t);
        /* no early exit on a data error: every thread must reach every
         * barrier; ops skip the work an error makes meaningless */
        if (t->barrier_after) pe_pool_barrier(rc->pool);
        if (timed) pe_profile_add(g, t, pe_profile_now() - t0);
    }
}

/* ---- ranges (internal.h) --------------------------------------------------- */

static uint64_t range_word(uint32_t gen, int64_t front, int64_t back) {
    return (uint64_t)gen << 32 | (uint64_t)front << 16 | (uint64_t)back;
}

/* The slot's value for this node: one an earlier node left stands for the
 * owner's whole range (whichever thread gets there first writes it). */
static uint64_t range_now(const pe_exec *ex, int owner, int64_t n_tasks, uint64_t word) {
    const uint32_t gen = (uint32_t)(word >> 32);
    if (gen == ex->gen) return word;
    /* the owner is on a later node (no barrier between, pe_op_joins): it left
     * this one only when every task of it was taken */
    if (gen > ex->gen) return range_word(ex->gen, 0, 0);
    return range_word(ex->gen, owner * n_tasks / ex->nth, (owner + 1) * n_tasks / ex->nth);
}

/* Tasks of `owner`'s range, a quarter of those left (at least one): from
 * its front for the owner, its back for others; the first is returned and
 * the rest kept in ex's claim. */
static int64_t range_take(pe_exec *ex, int owner, int64_t n_tasks) {
    atomic_ullong *slot = &ex->ranges[owner].word;
    const int from_back = owner != ex->ith;
    unsigned long long seen = atomic_load_explicit(slot, memory_order_relaxed);   /* the slot's type */
    for (;;) {
        const uint64_t now = range_now(ex, owner, n_tasks, seen);
        const int64_t front = (int64_t)(now >> 16 & 0xFFFF), back = (int64_t)(now & 0xFFFF);
        if (front >= back) return -1;
        const int64_t count = (back - front + 3) / 4;
        const int64_t first = from_back ? back - count : front;
        const uint64_t next = from_back ? now - (uint64_t)count : now + ((uint64_t)count << 16);
        if (atomic_compare_exchange_weak_explicit(slot, &seen, next, memory_order_relaxed, memory_order_relaxed)) {
            ex->claim_gen = ex->gen;
            ex->claim_next = first + 1;
            ex->claim_end = first + count;
            return first;
        }
    }
}

int64_t pe_range_next(pe_exec *ex, int64_t n_tasks) {
    if (ex->claim_gen == ex->gen && ex->claim_next < ex->claim_end) return ex->claim_next++;
    int64_t task = range_take(ex, ex->ith, n_tasks);
    for (int v = 1; task < 0 && v < ex->nth; v++) task = range_take(ex, (ex->ith + v) % ex->nth, n_tasks);
    return task;
}

void pe_exec_fail(pe_exec *ex, const char *msg) {
    int expected = 0;
    if (atomic_compare_exchange_strong(ex->error, &expected, 1))
        snprintf(ex->g->error_msg, sizeof ex->g->error_msg, "%s", msg);
}

/* ---- the backend's table ---------------------------------------------------- */

static void cpu_release(pe_graph *g) {
    cpu_exec *st = g->exec;
    if (!st) return;
    free(st->chunks);
    free(st->ranges);
    free(st);
    g->exec = NULL;
}

/* The executor's state for a graph planned for g->planned_threads workers. */
static cpu_exec *exec_state(pe_graph *g) {
    if (g->exec) return g->exec;
    cpu_exec *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->chunks = malloc((size_t)(g->n + 1) * sizeof *st->chunks);
    st->ranges = malloc((size_t)g->planned_threads * sizeof *st->ranges);
    if (!st->chunks || !st->ranges) {
        free(st->chunks);
        free(st->ranges);
        free(st);
        return NULL;
    }
    st->n_ranges = g->planned_threads;
    for (int i = 0; i < st->n_ranges; i++) atomic_init(&st->ranges[i].word, 0);
    st->gen_base = 1;   /* generation 0: the slots' start, no node's */
    g->exec = st;
    return st;
}

static int cpu_compute(void *ctx, pe_graph *g) {
    pe_pool *pool = ctx;
    const int nth = pe_pool_n_threads(pool);
    cpu_exec *st = exec_state(g);
    if (!st) return pe_fail("out of memory for the executor's state");
    for (int i = 0; i <= g->n; i++) atomic_init(&st->chunks[i], nth);
    if (st->gen_base > UINT32_MAX - (uint32_t)g->n - 1) {   /* generations wrap: start the slots over */
        for (int i = 0; i < st->n_ranges; i++) atomic_store(&st->ranges[i].word, 0);
        st->gen_base = 1;
    }
    run_ctx rc = {g, st, pool};
    pe_pool_run(pool, run_nodes, &rc);
    st->gen_base += (uint32_t)g->n + 1;
    return 0;
}

/* pe_pool_run returns when every worker is done: nothing is left in flight */
static int cpu_sync(void *ctx) { (void)ctx; return 0; }

static int cpu_init(void) { pe_init(); return 0; }
static int cpu_n_devices(void) { return 1; }
static void *cpu_alloc(size_t bytes) { return malloc(bytes); }
static void cpu_free(void *buffer) { free(buffer); }
static int cpu_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); return 0; }
static int cpu_workers(void *ctx) { return pe_pool_n_threads(ctx); }

/* Every op the graph builder makes has a CPU kernel; a lookup table's type
 * needs a way to read its rows. */
static int cpu_supports_op(const pe_graph *g, const pe_tensor *t) {
    if (t->op <= PE_OP_VIEW || t->op >= PE_OP_COUNT) return 0;
    return t->op != PE_OP_GET_ROWS || pe_get_rows_readable(pe_graph_get(g, t->src[0]));
}

const pe_backend pe_backend_cpu = {
    .name = "cpu",
    .init = cpu_init,
    .n_devices = cpu_n_devices,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .supports_op = cpu_supports_op,
    .work_bytes = pe_op_work_bytes,
    .joins = pe_op_joins,
    .workers = cpu_workers,
    .compute = cpu_compute,
    .sync = cpu_sync,
    .release = cpu_release,
};

int pe_graph_compute(pe_graph *g, pe_pool *pool) { return pe_graph_compute_on(g, &pe_backend_cpu, pool); }
