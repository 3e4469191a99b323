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

int bench_lookups_program(long n, PyObject *key, PyTypeObject *type, PyModuleDef *moddef,
                          double ns[BENCH_NKINDS]);
int bench_lookups_shared(long n, PyObject *key, PyTypeObject *type, PyModuleDef *moddef,
                         double ns[BENCH_NKINDS]);
#endif
