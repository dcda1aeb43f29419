/* error.c - the last error message, one per thread. */
#include <stdarg.h>
#include <stdio.h>

#include "graph.h"

#if defined(_MSC_VER)
#define PE_THREAD_LOCAL __declspec(thread)
#else
#define PE_THREAD_LOCAL _Thread_local
#endif

static PE_THREAD_LOCAL char pe_error_buf[512];

const char *pe_last_error(void) { return pe_error_buf; }

int pe_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pe_error_buf, sizeof pe_error_buf, fmt, ap);
    va_end(ap);
    return -1;
}
