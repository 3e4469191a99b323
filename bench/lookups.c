/* bench/lookups.c - the lookup loops of bench_state. Compiled twice: into
 * the program, and into a shared object, where every _Thread_local access
 * goes through the dynamic TLS model as it does in an extension module.
 * LOOKUPS_FN names the entry point of each copy. */
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include "pyfini.h"
#include "lookups.h"

#ifndef LOOKUPS_FN
#  error "define LOOKUPS_FN"
#endif

typedef struct {
    long counter;
} bench_state;
static const pyfini_state_def bench_def = {"pyfini.bench.state", sizeof(bench_state), NULL, NULL};

static _Thread_local bench_state *tls_state;
static volatile uintptr_t sink;

static PyThreadState *cpython_tstate(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return PyThreadState_GetUnchecked();
#else
    return _PyThreadState_UncheckedGet();
#endif
}

/* One lookup each, in a function the compiler may not inline or hoist out of
   the loop: the unit a binding library's method pays (a thread-local's
   address, in a shared object a __tls_get_addr call, is computed per call). */
#define BENCH_NOINLINE __attribute__((noinline))
#ifndef LOOKUPS_PAD
#  define LOOKUPS_PAD 0
#endif
#define BENCH_STR2(x) #x
#define BENCH_STR(x) BENCH_STR2(x)
/* the code layout: LOOKUPS_PAD bytes of a function never called, on a
   64-byte boundary, move the lookups after it (built without reordering
   functions, see CMakeLists.txt) */
BENCH_NOINLINE __attribute__((aligned(64), used)) void LOOKUPS_PAD_FN(void);
BENCH_NOINLINE __attribute__((aligned(64), used)) void LOOKUPS_PAD_FN(void)
{
    __asm__ volatile(".skip " BENCH_STR(LOOKUPS_PAD) " + 1, 0xcc");
}
/* What keeps this copy's hits from an ended interpreter's entry, after a
   fill (see pyfini__hit_guarded): LOOKUPS_FN##_guard. */
#define BENCH_CAT2(a, b) a##b
#define BENCH_CAT(a, b) BENCH_CAT2(a, b)
const char *BENCH_CAT(LOOKUPS_FN, _guard)(void);
const char *BENCH_CAT(LOOKUPS_FN, _guard)(void)
{
    if (pyfini__exit_hook_reliable()) {
        return "PyUnstable_AtExit: epoch only, no call";
    }
    if (!__atomic_load_n(&PYFINI__COPY.hits_need_id, __ATOMIC_SEQ_CST)) {
        return "the C audit hook: epoch only, no call";
    }
    return "the interpreter-ID check: + a PyInterpreterState_GetID call";
}
/* Each lookup starts with an empty asm statement that the compiler must
   keep (no instruction): without it, gcc finds lookup_tls() pure and calls
   it once for the whole loop. */
#define BENCH_OPAQUE() __asm__ volatile("" ::: "memory")
static BENCH_NOINLINE void *lookup_tls(void)
{
    BENCH_OPAQUE();
    return tls_state;
}
static BENCH_NOINLINE void *lookup_tstate(void)
{
    BENCH_OPAQUE();
    return cpython_tstate()->interp;
}
static BENCH_NOINLINE void *lookup_pyfini(void)
{
    BENCH_OPAQUE();
    return pyfini_state(&bench_def);
}
static BENCH_NOINLINE void *lookup_state_dict(PyObject *key)
{
    BENCH_OPAQUE();
    PyObject *d = PyInterpreterState_GetDict(PyInterpreterState_Get());
    return PyCapsule_GetPointer(PyDict_GetItemWithError(d, key), "pyfini.bench");
}
static BENCH_NOINLINE void *lookup_module_def(PyTypeObject *type, PyModuleDef *moddef)
{
    BENCH_OPAQUE();
    return PyModule_GetState(PyType_GetModuleByDef(type, moddef));
}

/* 8 defs in turn */
static const pyfini_state_def bench_defs[8] = {
    {"pyfini.bench.d0", 8, NULL, NULL}, {"pyfini.bench.d1", 8, NULL, NULL},
    {"pyfini.bench.d2", 8, NULL, NULL}, {"pyfini.bench.d3", 8, NULL, NULL},
    {"pyfini.bench.d4", 8, NULL, NULL}, {"pyfini.bench.d5", 8, NULL, NULL},
    {"pyfini.bench.d6", 8, NULL, NULL}, {"pyfini.bench.d7", 8, NULL, NULL}};
static BENCH_NOINLINE void *lookup_pyfini_def(const pyfini_state_def *def)
{
    BENCH_OPAQUE();
    return pyfini_state(def);
}

/* pyfini_state() hits only: ns per lookup of one timed batch of n lookups
   in the current interpreter, ndefs 1 (one def) or 8 (8 defs in turn); -1
   with an exception set. The sum of the results stays in a register and is
   stored once: two threads measuring at once share no written cache line. */
double LOOKUPS_HIT_FN(long n, int ndefs)
{
    for (int i = 0; i < 8; i++) {
        if (pyfini_state(&bench_defs[i]) == NULL) {
            return -1;
        }
    }
    uintptr_t acc = 0;
    double t0 = bench_now();
    if (ndefs == 1) {
        for (long i = 0; i < n; i++) {
            acc += (uintptr_t)lookup_pyfini_def(&bench_defs[0]);
        }
    } else {
        for (long i = 0; i < n; i++) {
            acc += (uintptr_t)lookup_pyfini_def(&bench_defs[i & 7]);
        }
    }
    double dt = bench_now() - t0;
    if (acc == 1) {   /* keep the loads */
        sink = acc;
    }
    return dt / (double)n * 1e9;
}

/* ns per lookup of each kind: one timed batch of n lookups each, the kinds
   in turn starting at kind `first` (the caller rotates it and runs many
   rounds: kinds measured next to each other see the same machine, so
   their ratios hold even when the core's speed changes between rounds); -1
   with an exception set */
int LOOKUPS_FN(long n, int first, PyObject *key, PyTypeObject *type, PyModuleDef *moddef,
               double ns[BENCH_NKINDS])
{
    /* pyfini's state is the one the state dict and the thread-local hold */
    tls_state = (bench_state *)pyfini_state(&bench_def);
    if (tls_state == NULL) {
        return -1;
    }
    PyObject *d = PyInterpreterState_GetDict(PyInterpreterState_Get());
    PyObject *cap = PyDict_GetItemWithError(d, key);   /* borrowed */
    if (cap == NULL) {
        if (PyErr_Occurred()) {
            return -1;
        }
        cap = PyCapsule_New(tls_state, "pyfini.bench", NULL);
        if (cap == NULL || PyDict_SetItem(d, key, cap) < 0) {
            Py_XDECREF(cap);
            return -1;
        }
        Py_DECREF(cap);
    }
    uintptr_t acc = 0;
    for (int j = 0; j < BENCH_NKINDS; j++) {
        int k = (first + j) % BENCH_NKINDS;
        double t0 = bench_now();
        switch (k) {
        case BENCH_TLS:
            for (long i = 0; i < n; i++) {
                acc += (uintptr_t)lookup_tls();
            }
            break;
        case BENCH_TSTATE:
            for (long i = 0; i < n; i++) {
                acc += (uintptr_t)lookup_tstate();
            }
            break;
        case BENCH_PYFINI:
            for (long i = 0; i < n; i++) {
                acc += (uintptr_t)lookup_pyfini();
            }
            break;
        case BENCH_STATE_DICT:
            for (long i = 0; i < n; i++) {
                acc += (uintptr_t)lookup_state_dict(key);
            }
            break;
        case BENCH_MODULE_DEF:
            for (long i = 0; i < n; i++) {
                acc += (uintptr_t)lookup_module_def(type, moddef);
            }
            break;
        default:
            break;
        }
        ns[k] = (bench_now() - t0) / (double)n * 1e9;
    }
    if (acc == 1) {   /* keep the loads */
        sink = acc;
        fputc('\n', stderr);
    }
    return 0;
}
