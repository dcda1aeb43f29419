/* profile.c - wall time per op kind, for development: PYENGINE_PROFILE=1 in
 * the environment makes the executor time every node (from its start until
 * all threads pass its barrier) and prints a table to stderr at exit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(_WIN32)
#include <windows.h>
#endif

#include "internal.h"

static const char *const op_names[PE_OP_COUNT] = {
    "none", "view", "get_rows", "mul_mat", "mul_mat_id", "add", "mul", "scale", "softcap", "rms_norm",
    "unary", "glu", "softmax", "rope", "set_rows", "attn", "topk", "moe_weights", "weighted_sum", "cont",
    "rope_angles", "add_id", "swiglu_oai", "l2_norm", "ssm_conv", "ssm_scan", "delta_net", "concat", "moe_route",
};

/* mul_mat is kept per weight type, everything else per op */
static double seconds[PE_OP_COUNT][PE_TYPE_COUNT];
static long   calls[PE_OP_COUNT][PE_TYPE_COUNT];
static int    state = -1;   /* -1 unknown, 0 off, 1 on */

static void dump(void) {
    double total = 0;
    for (int o = 0; o < PE_OP_COUNT; o++)
        for (int ty = 0; ty < PE_TYPE_COUNT; ty++) total += seconds[o][ty];
    fprintf(stderr, "pyengine profile (%.3f s in graph nodes)\n", total);
    for (int o = 0; o < PE_OP_COUNT; o++)
        for (int ty = 0; ty < PE_TYPE_COUNT; ty++)
            if (calls[o][ty])
                fprintf(stderr, "  %-12s %-6s %8ld calls %9.3f ms %5.1f%%\n", op_names[o],
                        ty ? pe_type_name(ty) : "", calls[o][ty], seconds[o][ty] * 1e3,
                        total > 0 ? 100 * seconds[o][ty] / total : 0.0);
}

int pe_profile_on(void) {
    if (state < 0) {
        const char *v = getenv("PYENGINE_PROFILE");
        state = v && strcmp(v, "0") != 0 && *v;
        if (state) atexit(dump);
    }
    return state;
}

#if defined(_WIN32)   /* MinGW's C runtime may lack timespec_get */
double pe_profile_now(void) {
    LARGE_INTEGER ticks, per_second;
    QueryPerformanceCounter(&ticks);
    QueryPerformanceFrequency(&per_second);
    return (double)ticks.QuadPart / (double)per_second.QuadPart;
}
#else
double pe_profile_now(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#endif

void pe_profile_add(const pe_graph *g, const pe_tensor *t, double dt) {
    const int ty = t->op == PE_OP_MUL_MAT || t->op == PE_OP_MUL_MAT_ID ? g->t[t->src[0]].type : 0;
    seconds[t->op][ty] += dt;
    calls[t->op][ty]++;
}
