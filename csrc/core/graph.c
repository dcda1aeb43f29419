/* graph.c - graph storage, views and memory planning; computing goes
 * through a backend's table (backend.h).
 *
 * Nodes are kept in creation order, which is a valid execution order because
 * an op can only take tensors that already exist.  Planning gives every
 * computed tensor a slice of one arena, reusing the slices of tensors whose
 * last reader has run; views share their base's slice and keep it alive. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

#define PE_ALIGN 64

pe_graph *pe_graph_new(void) {
    if (pe_backend_host()->init() < 0) return NULL;
    pe_graph *g = calloc(1, sizeof *g);
    if (!g) pe_fail("out of memory");
    return g;
}

static void free_buffers(pe_graph *g) {
    if (g->backend) {
        g->backend->free(g->arena);
        g->backend->free(g->work);
        g->backend->release(g);
    }
    g->arena = NULL;
    g->work = NULL;
    g->exec = NULL;
    g->backend = NULL;
    g->planned = false;
}

void pe_graph_free(pe_graph *g) {
    if (!g) return;
    free_buffers(g);
    free(g->t);
    free(g);
}

pe_tensor *pe_graph_get(const pe_graph *g, int id) {
    if (!g || id < 0 || id >= g->n) return NULL;
    return &g->t[id];
}

/* A new tensor slot with a contiguous layout; returns its id or -1. */
int pe_graph_add(pe_graph *g, int type, int n_dims, const int64_t *ne) {
    if (!g) return pe_fail("no graph");
    if (g->planned) return pe_fail("graph already computed: build a new graph to add ops");
    if (n_dims < 1 || n_dims > PE_MAX_DIMS) return pe_fail("n_dims=%d out of range 1..%d", n_dims, PE_MAX_DIMS);
    const int64_t bs = pe_type_block_size(type);
    if (bs == 0) return pe_fail("unknown tensor type %d", type);
    for (int i = 0; i < n_dims; i++)
        if (ne[i] < 1 || ne[i] > ((int64_t)1 << 40)) return pe_fail("dimension %d = %lld out of range", i, (long long)ne[i]);
    if (ne[0] % bs) return pe_fail("row length %lld is not a multiple of %s's block size", (long long)ne[0], pe_type_name(type));
    /* the shape may point into g->t (a node shaped like its source): copy it
     * before growing the array moves that memory */
    int64_t shape[PE_MAX_DIMS];
    memcpy(shape, ne, (size_t)n_dims * sizeof *ne);
    ne = shape;
    if (g->n == g->cap) {
        const int cap = g->cap ? g->cap * 2 : 256;
        pe_tensor *t = realloc(g->t, (size_t)cap * sizeof *t);
        if (!t) return pe_fail("out of memory");
        g->t = t;
        g->cap = cap;
    }
    pe_tensor *t = &g->t[g->n];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->n_dims = n_dims;
    for (int i = 0; i < PE_MAX_DIMS; i++) t->ne[i] = i < n_dims ? ne[i] : 1;
    t->nb[0] = pe_type_block_bytes(type);
    t->nb[1] = pe_row_bytes(type, t->ne[0]);
    size_t bytes = t->nb[1];
    for (int i = 2; i < PE_MAX_DIMS; i++) {
        t->nb[i] = t->nb[i - 1] * (size_t)t->ne[i - 1];
    }
    for (int i = 1; i < PE_MAX_DIMS; i++)
        if (!pe_mul_ok(bytes, (size_t)t->ne[i], &bytes)) return pe_fail("tensor size overflows");
    t->nbytes = bytes;
    for (int i = 0; i < PE_MAX_SRC; i++) t->src[i] = -1;
    t->view_of = -1;
    return g->n++;
}

int pe_graph_external(pe_graph *g, int type, int n_dims, const int64_t *ne,
                      void *data, size_t nbytes, const char *name) {
    const int id = pe_graph_add(g, type, n_dims, ne);
    if (id < 0) return -1;
    pe_tensor *t = &g->t[id];
    if (!data) { g->n--; return pe_fail("external tensor '%s' has no data", name ? name : ""); }
    if (nbytes < t->nbytes) {
        g->n--;
        return pe_fail("external tensor '%s' needs %zu bytes, buffer has %zu", name ? name : "", t->nbytes, nbytes);
    }
    t->data = data;
    t->nbytes_external = nbytes;
    t->op = PE_OP_NONE;
    if (name) snprintf(t->name, sizeof t->name, "%s", name);
    return id;
}

/* Bytes spanned by a tensor's layout: the last element's end. */
static size_t extent(const pe_tensor *t) {
    size_t end = pe_row_bytes(t->type, t->ne[0]);
    for (int i = 1; i < PE_MAX_DIMS; i++) end += (size_t)(t->ne[i] - 1) * t->nb[i];
    return end;
}

static size_t base_bytes(const pe_tensor *base) {
    return base->op == PE_OP_NONE ? base->nbytes_external : base->nbytes;
}

int pe_graph_view(pe_graph *g, int src, int n_dims, const int64_t *ne, const size_t *nb, size_t offset) {
    pe_tensor *s = pe_graph_get(g, src);
    if (!s) return pe_fail("view of unknown tensor %d", src);
    const int type = s->type;
    const int base_id = s->view_of >= 0 ? s->view_of : src;
    const size_t base_offset = (s->view_of >= 0 ? s->view_offset : 0) + offset;
    const int id = pe_graph_add(g, type, n_dims, ne);
    if (id < 0) return -1;
    pe_tensor *t = &g->t[id];
    s = &g->t[src];
    if (nb) {
        if (nb[0] != pe_type_block_bytes(type)) { g->n--; return pe_fail("views must keep elements of a row contiguous"); }
        for (int i = 1; i < PE_MAX_DIMS; i++) t->nb[i] = i < n_dims ? nb[i] : t->nb[i - 1] * (size_t)t->ne[i - 1];
    }
    const pe_tensor *base = &g->t[base_id];
    if (base_offset + extent(t) > base_bytes(base)) {
        g->n--;
        return pe_fail("view [offset %zu, %zu bytes] runs past its base tensor (%zu bytes)",
                       base_offset, extent(t), base_bytes(base));
    }
    t->op = PE_OP_VIEW;
    t->src[0] = src;
    t->view_of = base_id;
    t->view_offset = base_offset;
    t->nbytes = 0;
    if (base->op == PE_OP_NONE) t->data = (uint8_t *)base->data + base_offset;
    return id;
}

int pe_graph_reshape(pe_graph *g, int src, int n_dims, const int64_t *ne) {
    pe_tensor *s = pe_graph_get(g, src);
    if (!s) return pe_fail("reshape of unknown tensor %d", src);
    if (!pe_is_contiguous(s)) return pe_fail("reshape needs a contiguous tensor");
    int64_t n = 1;
    for (int i = 0; i < n_dims && i < PE_MAX_DIMS; i++) n *= ne[i] > 0 ? ne[i] : 0;
    if (n != pe_nelements(s)) return pe_fail("reshape changes the element count (%lld -> %lld)",
                                             (long long)pe_nelements(s), (long long)n);
    return pe_graph_view(g, src, n_dims, ne, NULL, 0);
}

int pe_graph_set_output(pe_graph *g, int id) {
    pe_tensor *t = pe_graph_get(g, id);
    if (!t) return pe_fail("unknown tensor %d", id);
    t->is_output = true;
    if (t->view_of >= 0) g->t[t->view_of].is_output = true;
    return 0;
}

/* Every view's data from its base's (after planning, or a base moving). */
static void place_views(pe_graph *g) {
    for (int i = 0; i < g->n; i++) {
        pe_tensor *t = &g->t[i];
        if (t->view_of >= 0) t->data = (uint8_t *)g->t[t->view_of].data + t->view_offset;
    }
}

int pe_graph_bind_output(pe_graph *g, int id, void *data, size_t nbytes) {
    pe_tensor *t = pe_graph_get(g, id);
    if (!t) return pe_fail("unknown tensor %d", id);
    if (t->op == PE_OP_NONE || t->view_of >= 0 || !t->is_output || !pe_is_contiguous(t))
        return pe_fail("only a contiguous computed output can be bound to caller memory");
    if (data && nbytes != t->nbytes)
        return pe_fail("an output of %zu bytes needs a buffer of that size, got %zu", t->nbytes, nbytes);
    if (data == t->bound && g->planned) return 0;   /* a decode loop binds the same buffer every step */
    t->bound = data;
    if (!g->planned) return 0;
    t->data = data ? data : g->arena + t->arena_offset;   /* the arena keeps its place either way */
    place_views(g);
    return 0;
}

int pe_graph_set_name(pe_graph *g, int id, const char *name) {
    pe_tensor *t = pe_graph_get(g, id);
    if (!t) return pe_fail("unknown tensor %d", id);
    snprintf(t->name, sizeof t->name, "%s", name ? name : "");
    return 0;
}

/* ---- memory planning ------------------------------------------------------ */

typedef struct { size_t off, size; } span;

typedef struct {
    span  *free;
    int    n, cap;
    size_t top;   /* end of the slices in use */
    size_t peak;  /* the arena size needed: the highest top ever */
} allocator;

static size_t align_up(size_t x) { return (x + PE_ALIGN - 1) & ~(size_t)(PE_ALIGN - 1); }

static int alloc_take(allocator *a, size_t size, size_t *off) {
    size = align_up(size);
    int best = -1;
    for (int i = 0; i < a->n; i++)
        if (a->free[i].size >= size && (best < 0 || a->free[i].size < a->free[best].size)) best = i;
    if (best >= 0) {
        *off = a->free[best].off;
        a->free[best].off += size;
        a->free[best].size -= size;
        if (a->free[best].size == 0) a->free[best] = a->free[--a->n];
        return 0;
    }
    *off = a->top;
    a->top += size;
    if (a->top > a->peak) a->peak = a->top;
    return 0;
}

static int alloc_give(allocator *a, size_t off, size_t size) {
    size = align_up(size);
    /* merge with neighbours so big tensors can reuse freed runs */
    for (int i = 0; i < a->n; i++) {
        if (a->free[i].off + a->free[i].size == off) { off = a->free[i].off; size += a->free[i].size; a->free[i--] = a->free[--a->n]; continue; }
        if (off + size == a->free[i].off) { size += a->free[i].size; a->free[i--] = a->free[--a->n]; continue; }
    }
    if (off + size == a->top) { a->top = off; return 0; }
    if (a->n == a->cap) {
        const int cap = a->cap ? a->cap * 2 : 64;
        span *f = realloc(a->free, (size_t)cap * sizeof *f);
        if (!f) return pe_fail("out of memory");
        a->free = f;
        a->cap = cap;
    }
    a->free[a->n++] = (span){off, size};
    return 0;
}

static bool computed(const pe_tensor *t) { return t->op != PE_OP_NONE && t->op != PE_OP_VIEW; }

/* Which computed nodes run on without a barrier before them (the backend's
 * joins), hence which are followed by one. */
static void mark_joins(pe_graph *g, const pe_backend *be) {
    pe_tensor *prev = NULL;
    for (int i = 0; i < g->n; i++) {
        pe_tensor *t = &g->t[i];
        if (!computed(t)) continue;
        t->joins_prev = prev && be->joins(g, prev, t);
        t->barrier_after = true;
        if (prev) prev->barrier_after = !t->joins_prev;
        prev = t;
    }
}

/* The first node the backend has no kernel for, or -1. */
static int first_unsupported(const pe_graph *g, const pe_backend *be) {
    for (int i = 0; i < g->n; i++)
        if (computed(&g->t[i]) && !be->supports_op(g, &g->t[i])) return i;
    return -1;
}

static int plan(pe_graph *g, const pe_backend *be, int n_threads) {
    const int missing = first_unsupported(g, be);
    if (missing >= 0)
        return pe_fail("backend %s has no kernel for node %d (op %d, '%s')", be->name, missing, g->t[missing].op,
                       g->t[missing].name);
    int *last_use = malloc((size_t)g->n * sizeof *last_use);
    if (!last_use) return pe_fail("out of memory");
    for (int i = 0; i < g->n; i++) last_use[i] = g->t[i].is_output ? INT_MAX : i;
    for (int i = 0; i < g->n; i++) {
        const pe_tensor *t = &g->t[i];
        for (int s = 0; s < PE_MAX_SRC; s++) {
            if (t->src[s] < 0) continue;
            const pe_tensor *st = &g->t[t->src[s]];
            const int owner = st->view_of >= 0 ? st->view_of : t->src[s];
            if (last_use[owner] < i) last_use[owner] = i;
        }
    }
    /* a view read late keeps its base alive until then */
    for (int i = g->n - 1; i >= 0; i--) {
        const pe_tensor *t = &g->t[i];
        if (t->view_of >= 0 && last_use[i] > last_use[t->view_of]) last_use[t->view_of] = last_use[i];
    }
    allocator a = {0};
    size_t work = 0;
    int rc = 0;
    for (int i = 0; i < g->n; i++) g->t[i].freed = false;   /* a plan again (more threads) starts over */
    for (int i = 0; i < g->n && rc == 0; i++) {
        pe_tensor *t = &g->t[i];
        if (t->op != PE_OP_NONE && t->view_of < 0) {
            alloc_take(&a, t->nbytes, &t->arena_offset);
            const size_t w = be->work_bytes(g, t, n_threads);
            if (w > work) work = w;
        }
        for (int s = 0; s < PE_MAX_SRC && rc == 0; s++) {
            if (t->src[s] < 0) continue;
            const pe_tensor *st = &g->t[t->src[s]];
            const int owner = st->view_of >= 0 ? st->view_of : t->src[s];
            pe_tensor *o = &g->t[owner];
            if (last_use[owner] == i && o->op != PE_OP_NONE && !o->freed) {
                o->freed = true;
                rc = alloc_give(&a, o->arena_offset, o->nbytes);
            }
        }
    }
    free(last_use);
    free(a.free);
    if (rc) return rc;
    mark_joins(g, be);
    g->backend = be;
    g->arena_bytes = a.peak;
    g->work_bytes = work;
    g->arena = a.peak ? be->alloc(a.peak) : NULL;
    g->work = work ? be->alloc(work) : NULL;
    if ((a.peak && !g->arena) || (work && !g->work)) {
        free_buffers(g);
        return pe_fail("out of memory planning %zu + %zu bytes", a.peak, work);
    }
    for (int i = 0; i < g->n; i++) {
        pe_tensor *t = &g->t[i];
        if (t->op != PE_OP_NONE && t->view_of < 0) t->data = t->bound ? t->bound : g->arena + t->arena_offset;
    }
    place_views(g);
    g->planned = true;
    g->planned_threads = n_threads;
    return 0;
}

int pe_graph_compute_on(pe_graph *g, const pe_backend *be, void *ctx) {
    if (!g) return pe_fail("no graph");
    const int workers = be->workers(ctx);
    /* scratch is sized per worker, and buffers belong to the backend that planned them */
    if (g->planned && (g->planned_threads < workers || g->backend != be)) free_buffers(g);
    if (!g->planned && plan(g, be, workers) < 0) return -1;
    atomic_store(&g->error, 0);
    if (be->compute(ctx, g) < 0 || be->sync(ctx) < 0) return -1;
    if (atomic_load(&g->error)) return pe_fail("%s", g->error_msg);
    return 0;
}

/* ---- introspection --------------------------------------------------------- */

int pe_graph_n_tensors(const pe_graph *g) { return g ? g->n : 0; }
int pe_tensor_type(const pe_graph *g, int id) { const pe_tensor *t = pe_graph_get(g, id); return t ? t->type : -1; }
int pe_tensor_n_dims(const pe_graph *g, int id) { const pe_tensor *t = pe_graph_get(g, id); return t ? t->n_dims : 0; }
int64_t pe_tensor_ne(const pe_graph *g, int id, int d) {
    const pe_tensor *t = pe_graph_get(g, id);
    return t && d >= 0 && d < PE_MAX_DIMS ? t->ne[d] : 0;
}
size_t pe_tensor_nb(const pe_graph *g, int id, int d) {
    const pe_tensor *t = pe_graph_get(g, id);
    return t && d >= 0 && d < PE_MAX_DIMS ? t->nb[d] : 0;
}
void *pe_tensor_data(const pe_graph *g, int id) {
    const pe_tensor *t = pe_graph_get(g, id);
    if (!t) return NULL;
    if (t->op != PE_OP_NONE && t->data == NULL) return NULL;
    return t->data;
}
size_t pe_graph_arena_bytes(const pe_graph *g) { return g ? g->arena_bytes : 0; }
