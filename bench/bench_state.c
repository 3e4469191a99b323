/* bench/bench_state.c - what a lookup of per-interpreter state costs, and
 * what pyfini adds to a sub-interpreter's create-and-end cycle. Figures, not
 * pass/fail; ratios side by side in one run.
 *
 *   lookups (ns per lookup, best of 5 runs of N lookups each):
 *     thread-local pointer read   the limit: a plain _Thread_local variable
 *     pyfini_state() hit          pyfini's per-thread cache
 *     state dict + dict lookup    PyInterpreterState_GetDict() + PyDict_GetItemWithError()
 *     module state by def         PyType_GetModuleByDef() + PyModule_GetState()
 *   cycles (ms per create/end of an isolated sub-interpreter; legacy on 3.11),
 *     interleaved: bare vs with pyfini (all four phases used, one state).
 *
 * usage: bench_state [lookups] [cycles]   (defaults 20000000 and 300)
 */
#include <Python.h>
#include <stdint.h>
#include <time.h>
#include "pyfini.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
    long counter;
} bench_state;
static const pyfini_state_def bench_def = {"pyfini.bench.state", sizeof(bench_state), NULL, NULL};

static _Thread_local bench_state *tls_state;
static volatile uintptr_t sink;

/* ---- a module with state, and a type defined by it ------------------------- */
typedef struct {
    long counter;
} mod_state;
static PyModuleDef bench_module;
static PyType_Slot bench_type_slots[] = {{0, NULL}};
static PyType_Spec bench_type_spec = {"_pyfini_bench.T", sizeof(PyObject), 0, Py_TPFLAGS_DEFAULT,
                                      bench_type_slots};
static int bench_exec(PyObject *m)
{
    PyObject *t = PyType_FromModuleAndSpec(m, &bench_type_spec, NULL);
    if (t == NULL) {
        return -1;
    }
    return PyModule_AddObject(m, "T", t);
}
static PyModuleDef_Slot bench_slots[] = {{Py_mod_exec, (void *)bench_exec}, {0, NULL}};
static PyModuleDef bench_module = {PyModuleDef_HEAD_INIT, "_pyfini_bench", NULL, sizeof(mod_state),
                                   NULL, bench_slots, NULL, NULL, NULL};
static PyObject *init_bench(void) { return PyModuleDef_Init(&bench_module); }

typedef enum { TLS, PYFINI, STATE_DICT, MODULE_DEF, NKINDS } kind;
static const char *kind_name[NKINDS] = {"thread-local pointer read", "pyfini_state() hit",
                                        "state dict + dict lookup", "module state by def"};

static double run_lookups(kind k, long n, PyObject *key, PyTypeObject *type)
{
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now();
        switch (k) {
        case TLS:
            for (long i = 0; i < n; i++) {
                sink += (uintptr_t)tls_state;
                __asm__ volatile("" ::: "memory");   /* one real TLS read per iteration */
            }
            break;
        case PYFINI:
            for (long i = 0; i < n; i++) {
                sink += (uintptr_t)pyfini_state(&bench_def);
            }
            break;
        case STATE_DICT:
            for (long i = 0; i < n; i++) {
                PyObject *d = PyInterpreterState_GetDict(PyInterpreterState_Get());
                PyObject *cap = PyDict_GetItemWithError(d, key);
                sink += (uintptr_t)PyCapsule_GetPointer(cap, "pyfini.bench");
            }
            break;
        case MODULE_DEF:
            for (long i = 0; i < n; i++) {
                PyObject *m = PyType_GetModuleByDef(type, &bench_module);
                sink += (uintptr_t)PyModule_GetState(m);
            }
            break;
        default:
            break;
        }
        double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    return best / (double)n * 1e9;
}

static int noop_cb(void *arg)
{
    (void)arg;
    return 0;
}

static void clear_state(void *p) { (void)p; }
static const pyfini_state_def cycle_def = {"pyfini.bench.cycle", 64, NULL, clear_state};

static double one_cycle(PyThreadState *main_ts, int with_pyfini, int subject_imports_threading)
{
    double t0 = now();
    PyThreadState *sub = NULL;
#if PY_VERSION_HEX >= 0x030C0000
    PyInterpreterConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.allow_threads = 1;
    cfg.check_multi_interp_extensions = 1;
    cfg.gil = PyInterpreterConfig_OWN_GIL;
    PyStatus st = Py_NewInterpreterFromConfig(&sub, &cfg);
    if (PyStatus_Exception(st)) {
        fprintf(stderr, "Py_NewInterpreterFromConfig failed\n");
        exit(1);
    }
#else
    sub = Py_NewInterpreter();
#endif
    if (subject_imports_threading) {
        PyObject *t = PyImport_ImportModule("threading");
        if (t == NULL) {
            PyErr_Print();
            exit(1);
        }
        Py_DECREF(t);
    }
    if (with_pyfini) {
        for (int p = PYFINI_PRE_SHUTDOWN; p <= PYFINI_RUNTIME_SHUTDOWN; p++) {
            if (pyfini_atexit(noop_cb, NULL, (pyfini_phase)p) < 0) {
                PyErr_Print();
                exit(1);
            }
        }
        if (pyfini_state(&cycle_def) == NULL) {
            PyErr_Print();
            exit(1);
        }
    }
    Py_EndInterpreter(sub);
    PyThreadState_Swap(main_ts);
    return now() - t0;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 20000000L;
    int cycles = argc > 2 ? atoi(argv[2]) : 300;
    PyImport_AppendInittab("_pyfini_bench", init_bench);
    Py_Initialize();
    printf("pyfini %d.%d.%d benchmarks on CPython %s%s\n", PYFINI_VERSION_MAJOR,
           PYFINI_VERSION_MINOR, PYFINI_VERSION_PATCH, PY_VERSION,
#ifdef Py_DEBUG
           " (debug build)"
#else
           ""
#endif
    );
    tls_state = (bench_state *)pyfini_state(&bench_def);
    PyObject *key = PyUnicode_FromString("pyfini.bench.key");
    PyObject *cap = PyCapsule_New(tls_state, "pyfini.bench", NULL);
    PyDict_SetItem(PyInterpreterState_GetDict(PyInterpreterState_Get()), key, cap);
    Py_DECREF(cap);
    PyObject *mod = PyImport_ImportModule("_pyfini_bench");
    PyObject *type = mod ? PyObject_GetAttrString(mod, "T") : NULL;
    if (type == NULL) {
        PyErr_Print();
        return 1;
    }

    double ns[NKINDS];
    for (int k = 0; k < NKINDS; k++) {
        ns[k] = run_lookups((kind)k, k >= STATE_DICT ? n / 4 : n, key, (PyTypeObject *)type);
    }
    printf("\nlookup of per-interpreter state (%ld lookups, best of 5):\n", n);
    printf("  %-28s %8s %14s\n", "method", "ns", "x TLS read");
    for (int k = 0; k < NKINDS; k++) {
        printf("  %-28s %8.2f %14.1f\n", kind_name[k], ns[k], ns[k] / ns[TLS]);
    }
    printf("  pyfini_state() hit is %.1fx the plain thread-local read (goal: <= 2x) and "
           "%.1fx faster than the state-dict lookup (goal: >= 10x)\n",
           ns[PYFINI] / ns[TLS], ns[STATE_DICT] / ns[PYFINI]);

    PyThreadState *main_ts = PyThreadState_Get();
    for (int i = 0; i < 20; i++) {   /* warm-up */
        one_cycle(main_ts, i & 1, i & 2);
    }
    /* [subject imports threading][with pyfini] */
    double t[2][2] = {{0, 0}, {0, 0}};
    for (int i = 0; i < cycles; i++) {
        for (int th = 0; th < 2; th++) {
            for (int pf = 0; pf < 2; pf++) {
                t[th][pf] += one_cycle(main_ts, pf, th);
            }
        }
    }
    printf("\nsub-interpreter create/end cycle (%s, %d interleaved cycles each), ms per cycle:\n",
           PY_VERSION_HEX >= 0x030C0000 ? "isolated" : "legacy", cycles);
    printf("  %-44s %10s %12s %10s\n", "subject", "bare", "with pyfini", "added");
    printf("  %-44s %10.3f %12.3f %+9.2f%%\n", "imports threading (typical program)",
           t[1][0] / cycles * 1e3, t[1][1] / cycles * 1e3, (t[1][1] / t[1][0] - 1.0) * 100.0);
    printf("  %-44s %10.3f %12.3f %+9.2f%%\n", "empty (pyfini's PRE_SHUTDOWN imports threading)",
           t[0][0] / cycles * 1e3, t[0][1] / cycles * 1e3, (t[0][1] / t[0][0] - 1.0) * 100.0);
    printf("  with pyfini = all four phases registered + one state (goal: <= 2 %% added)\n");
    Py_DECREF(type);
    Py_DECREF(mod);
    Py_DECREF(key);
    return Py_FinalizeEx() < 0 ? 1 : 0;
}
