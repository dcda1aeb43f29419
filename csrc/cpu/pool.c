/* pool.c - a persistent thread pool.
 *
 * Workers are created once.  A job is published by bumping an epoch; workers
 * spin on it for a short while (the next op or token usually follows at once)
 * and then sleep on a condition variable, so an idle engine costs no CPU.
 * Inside a job, ops synchronise with a spinning barrier. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#if defined(_WIN32)
#include <windows.h>
typedef HANDLE pe_thread_t;
typedef SRWLOCK pe_mutex_t;
typedef CONDITION_VARIABLE pe_cond_t;
static void mutex_init(pe_mutex_t *m) { InitializeSRWLock(m); }
static void mutex_lock(pe_mutex_t *m) { AcquireSRWLockExclusive(m); }
static void mutex_unlock(pe_mutex_t *m) { ReleaseSRWLockExclusive(m); }
static void mutex_destroy(pe_mutex_t *m) { (void)m; }
static void cond_init(pe_cond_t *c) { InitializeConditionVariable(c); }
static void cond_wait(pe_cond_t *c, pe_mutex_t *m) { SleepConditionVariableSRW(c, m, INFINITE, 0); }
static void cond_broadcast(pe_cond_t *c) { WakeAllConditionVariable(c); }
static void cond_destroy(pe_cond_t *c) { (void)c; }
static void cpu_relax(void) { YieldProcessor(); }
static void thread_yield(void) { SwitchToThread(); }
#else
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
typedef pthread_t pe_thread_t;
typedef pthread_mutex_t pe_mutex_t;
typedef pthread_cond_t pe_cond_t;
static void mutex_init(pe_mutex_t *m) { pthread_mutex_init(m, NULL); }
static void mutex_lock(pe_mutex_t *m) { pthread_mutex_lock(m); }
static void mutex_unlock(pe_mutex_t *m) { pthread_mutex_unlock(m); }
static void mutex_destroy(pe_mutex_t *m) { pthread_mutex_destroy(m); }
static void cond_init(pe_cond_t *c) { pthread_cond_init(c, NULL); }
static void cond_wait(pe_cond_t *c, pe_mutex_t *m) { pthread_cond_wait(c, m); }
static void cond_broadcast(pe_cond_t *c) { pthread_cond_broadcast(c); }
static void cond_destroy(pe_cond_t *c) { pthread_cond_destroy(c); }
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static void cpu_relax(void) { _mm_pause(); }
#elif defined(__aarch64__)
static void cpu_relax(void) { __asm__ volatile("yield"); }
#else
static void cpu_relax(void) {}
#endif
static void thread_yield(void) { sched_yield(); }
#endif

/* spins before a waiting worker goes to sleep (~2.5 ms at Zen 4's 25 ns a
 * pause, longer where a pause is slower): between two decoding steps the
 * Python side (sampling, text, the cache's bookkeeping) takes up to ~0.5 ms,
 * and a worker asleep by then costs the next step ~0.2 ms to wake (Gemma-3,
 * 20000 spins: 223 us a token in the graph's first node, 2 us now) */
#define PE_SPIN_BEFORE_SLEEP 100000
/* spins at a barrier before yielding the core (~50 us): on a busy or
 * oversubscribed machine a waiting thread must let the others run */
#define PE_SPIN_BEFORE_YIELD 2000

struct pe_pool {
    int          n_threads;
    pe_thread_t *threads;
    struct worker_arg { struct pe_pool *pool; int ith; } *args;

    pe_pool_fn   fn;
    void        *fn_arg;
    atomic_int   epoch;     /* bumped to publish a job */
    atomic_int   n_done;    /* workers finished with the current job */
    atomic_int   stop;

    atomic_int   bar_count;
    atomic_int   bar_gen;

    pe_mutex_t   mu;
    pe_cond_t    cv;
};

void pe_pool_barrier(pe_pool *pool) {
    if (!pool || pool->n_threads == 1) return;
    const int gen = atomic_load_explicit(&pool->bar_gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&pool->bar_count, 1, memory_order_acq_rel) == pool->n_threads - 1) {
        atomic_store_explicit(&pool->bar_count, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&pool->bar_gen, 1, memory_order_release);
        return;
    }
    for (long spins = 0; atomic_load_explicit(&pool->bar_gen, memory_order_acquire) == gen; spins++) {
        if (spins < PE_SPIN_BEFORE_YIELD) cpu_relax();
        else thread_yield();
    }
}

static int wait_for_job(pe_pool *pool, int seen) {
    for (int i = 0; i < PE_SPIN_BEFORE_SLEEP; i++) {
        const int e = atomic_load_explicit(&pool->epoch, memory_order_acquire);
        if (e != seen || atomic_load(&pool->stop)) return e;
        cpu_relax();
    }
    mutex_lock(&pool->mu);
    while (atomic_load(&pool->epoch) == seen && !atomic_load(&pool->stop))
        cond_wait(&pool->cv, &pool->mu);
    mutex_unlock(&pool->mu);
    return atomic_load(&pool->epoch);
}

#if defined(_WIN32)
static DWORD WINAPI worker_main(LPVOID p)
#else
static void *worker_main(void *p)
#endif
{
    struct worker_arg *wa = p;
    pe_pool *pool = wa->pool;
    /* epoch starts at 0 and a job may be published before this thread runs:
     * start from 0, not from whatever the epoch is by now */
    int seen = 0;
    for (;;) {
        seen = wait_for_job(pool, seen);
        if (atomic_load(&pool->stop)) break;
        pool->fn(pool->fn_arg, wa->ith, pool->n_threads);
        atomic_fetch_add_explicit(&pool->n_done, 1, memory_order_acq_rel);
    }
    return 0;
}

pe_pool *pe_pool_new(int n_threads) {
    pe_init();
    if (n_threads <= 0) n_threads = pe_physical_cores();
    if (n_threads > 256) { pe_fail("n_threads=%d is too many (at most 256)", n_threads); return NULL; }
    pe_pool *pool = calloc(1, sizeof *pool);
    if (!pool) { pe_fail("out of memory"); return NULL; }
    pool->n_threads = n_threads;
    mutex_init(&pool->mu);
    cond_init(&pool->cv);
    pool->threads = calloc((size_t)n_threads, sizeof *pool->threads);
    pool->args = calloc((size_t)n_threads, sizeof *pool->args);
    if (!pool->threads || !pool->args) { pe_pool_free(pool); pe_fail("out of memory"); return NULL; }
    for (int i = 1; i < n_threads; i++) {
        pool->args[i].pool = pool;
        pool->args[i].ith = i;
#if defined(_WIN32)
        pool->threads[i] = CreateThread(NULL, 0, worker_main, &pool->args[i], 0, NULL);
        const int failed = pool->threads[i] == NULL;
#else
        const int failed = pthread_create(&pool->threads[i], NULL, worker_main, &pool->args[i]) != 0;
#endif
        if (failed) {
            pool->n_threads = i;  /* free joins the ones that started */
            pe_pool_free(pool);
            pe_fail("could not start thread %d", i);
            return NULL;
        }
    }
    return pool;
}

void pe_pool_free(pe_pool *pool) {
    if (!pool) return;
    mutex_lock(&pool->mu);
    atomic_store(&pool->stop, 1);
    cond_broadcast(&pool->cv);
    mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->n_threads; i++) {
        if (!pool->threads) break;
#if defined(_WIN32)
        WaitForSingleObject(pool->threads[i], INFINITE);
        CloseHandle(pool->threads[i]);
#else
        pthread_join(pool->threads[i], NULL);
#endif
    }
    mutex_destroy(&pool->mu);
    cond_destroy(&pool->cv);
    free(pool->threads);
    free(pool->args);
    free(pool);
}

int pe_pool_n_threads(const pe_pool *pool) { return pool ? pool->n_threads : 1; }

void pe_pool_run(pe_pool *pool, pe_pool_fn fn, void *arg) {
    if (!pool || pool->n_threads == 1) { fn(arg, 0, 1); return; }
    pool->fn = fn;
    pool->fn_arg = arg;
    atomic_store_explicit(&pool->n_done, 0, memory_order_relaxed);
    mutex_lock(&pool->mu);
    atomic_fetch_add_explicit(&pool->epoch, 1, memory_order_acq_rel);
    cond_broadcast(&pool->cv);
    mutex_unlock(&pool->mu);
    fn(arg, 0, pool->n_threads);
    for (long spins = 0; atomic_load_explicit(&pool->n_done, memory_order_acquire) < pool->n_threads - 1; spins++) {
        if (spins < PE_SPIN_BEFORE_YIELD) cpu_relax();
        else thread_yield();
    }
}

int pe_physical_cores(void) {
#if defined(_WIN32)
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    return si.dwNumberOfProcessors > 0 ? (int)si.dwNumberOfProcessors : 1;
#else
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
#if defined(__linux__)
    /* count distinct sibling sets: one per physical core */
    char seen[256][64];
    int n_seen = 0;
    for (long cpu = 0; cpu < n && cpu < 1024; cpu++) {
        char path[128], buf[64] = {0};
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/topology/thread_siblings_list", cpu);
        FILE *f = fopen(path, "r");
        if (!f) return (int)n;
        const size_t got = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[got] = 0;
        int dup = 0;
        for (int j = 0; j < n_seen && !dup; j++) dup = strcmp(seen[j], buf) == 0;
        if (!dup && n_seen < 256) strcpy(seen[n_seen++], buf);
    }
    return n_seen > 0 ? n_seen : (int)n;
#else
    return (int)n;
#endif
#endif
}
