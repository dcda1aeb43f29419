/* backend.c - the registry of the backends compiled in (PYENGINE_BACKENDS in
 * CMakeLists.txt defines PE_BACKEND_<NAME> for each), for the graph and for
 * device discovery (pyengine/ml/device.py). */
#include "backend.h"

static const pe_backend *const compiled[] = {
    &pe_backend_cpu,   /* the host's: always built, always first */
};

int pe_backend_count(void) { return (int)(sizeof compiled / sizeof compiled[0]); }

const pe_backend *pe_backend_at(int i) { return i >= 0 && i < pe_backend_count() ? compiled[i] : NULL; }

const pe_backend *pe_backend_host(void) { return compiled[0]; }

const char *pe_backend_name(int i) {
    const pe_backend *be = pe_backend_at(i);
    return be ? be->name : NULL;
}

int pe_backend_devices(int i) {
    const pe_backend *be = pe_backend_at(i);
    if (!be) return pe_fail("no backend %d (this build has %d)", i, pe_backend_count());
    if (be->init() < 0) return -1;
    return be->n_devices();
}
