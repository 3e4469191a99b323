/* bench/lookups.h - shared by bench_state.c and both copies of lookups.c */
#ifndef PYFINI_BENCH_LOOKUPS_H
#define PYFINI_BENCH_LOOKUPS_H
#include <Python.h>
#include <time.h>

/* seconds on the monotonic clock */
static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum { BENCH_TLS, BENCH_TSTATE, BENCH_PYFINI, BENCH_STATE_DICT, BENCH_MODULE_DEF, BENCH_NKINDS };

int bench_lookups_program(long n, int first, PyObject *key, PyTypeObject *type, PyModuleDef *moddef,
                          double ns[BENCH_NKINDS]);
int bench_lookups_shared(long n, int first, PyObject *key, PyTypeObject *type, PyModuleDef *moddef,
                         double ns[BENCH_NKINDS]);
/* the shared object built at several code layouts (LOOKUPS_PAD bytes) */
#define BENCH_LAYOUTS 4
int bench_lookups_pad0(long n, int first, PyObject *key, PyTypeObject *type, PyModuleDef *moddef,
                       double ns[BENCH_NKINDS]);
int bench_lookups_pad16(long n, int first, PyObject *key, PyTypeObject *type, PyModuleDef *moddef,
                        double ns[BENCH_NKINDS]);
int bench_lookups_pad32(long n, int first, PyObject *key, PyTypeObject *type, PyModuleDef *moddef,
                        double ns[BENCH_NKINDS]);
int bench_lookups_pad48(long n, int first, PyObject *key, PyTypeObject *type, PyModuleDef *moddef,
                        double ns[BENCH_NKINDS]);
/* how each copy's hits are guarded (after its lookups ran) */
const char *bench_lookups_program_guard(void);
const char *bench_lookups_shared_guard(void);
double bench_hits_program(long n, int ndefs);
double bench_hits_shared(long n, int ndefs);
double bench_hits_pad0(long n, int ndefs);
double bench_hits_pad16(long n, int ndefs);
double bench_hits_pad32(long n, int ndefs);
double bench_hits_pad48(long n, int ndefs);
#ifdef __cplusplus
extern "C"
#endif
double bench_pybind11_internals(long n);
#endif
