/* bench/bench_state.c - what a lookup of per-interpreter state costs, and
 * what pyfini adds to a sub-interpreter's create-and-end cycle. Figures, not
 * pass/fail; ratios side by side in one run.
 *
 *   lookups (ns per lookup, best of 5 runs of N lookups each), measured in
 *   the program and in a shared object (where thread-locals go through
 *   __tls_get_addr, as in an extension module):
 *     thread-local pointer read   the limit: a plain _Thread_local variable
 *     CPython thread-state fetch  PyThreadState_GetUnchecked()->interp: the
 *                                 floor of any per-interpreter lookup
 *     pyfini_state() hit          pyfini's per-thread cache
 *     state dict + dict lookup    PyInterpreterState_GetDict() + PyDict_GetItemWithError()
 *     module state by def         PyType_GetModuleByDef() + PyModule_GetState()
 *   audit hook (ns per call of id() and compile(), which raise an
 *   audit event): without any audit hook, then with one C hook doing what
 *   pyfini's does (compare the event name), in this run, before pyfini adds
 *   its own (3.11, 3.12, 3.13.0-3.13.1; PYFINI_NO_AUDIT_HOOK): what that hook
 *   costs every audited event of the process.
 *   cycles (ms per create/end of an isolated sub-interpreter; legacy on 3.11):
 *     rounds of bare, bare again (the A/A control: what noise alone shows)
 *     and with pyfini (all four phases used, one state), in rotating order;
 *     the median of the per-round ratios with a 95 % confidence interval.
 *
 * usage: bench_state [lookups] [rounds]   (defaults 20000000 and 300)
 */
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "pyfini.h"
#include "lookups.h"
#include "interp_configs.h"

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

static const char *kind_name[BENCH_NKINDS] = {
    "thread-local pointer read", "CPython thread-state fetch", "pyfini_state() hit",
    "state dict + dict lookup", "module state by def"};

/* ---- the process-wide cost of one C audit hook --------------------------------- */

/* ns per call of fn(*args), best of 5 runs of n calls after one untimed
   run; -1 on error */
static double ns_per_call(PyObject *fn, PyObject *args, long n)
{
    double best = -1;
    for (int run = -1; run < 5; run++) {
        double t0 = bench_now();
        for (long i = 0; i < n; i++) {
            PyObject *r = PyObject_Call(fn, args, NULL);
            if (r == NULL) {
                return -1;
            }
            Py_DECREF(r);
        }
        double ns = (bench_now() - t0) * 1e9 / (double)n;
        if (run >= 0 && (best < 0 || ns < best)) {
            best = ns;
        }
    }
    return best;
}

/* the work of pyfini__audit_hook without its effects: compare the name */
static long audit_matches;
static int name_comparing_audit_hook(const char *event, PyObject *args, void *data)
{
    (void)args;
    (void)data;
    if ((event[0] == 'c' && strncmp(event, "cpython.", 8) == 0 &&
         (strcmp(event + 8, "PyInterpreterState_Clear") == 0 ||
          strcmp(event + 8, "_PySys_ClearAuditHooks") == 0)) ||
        (event[0] == 'p' && strcmp(event, "pyfini.audit_hook_probe") == 0)) {
        audit_matches++;
    }
    return 0;
}

/* Before any pyfini lookup (a C audit hook cannot be removed). */
static int audit_hook_cost(long n)
{
    PyObject *builtins = PyEval_GetBuiltins();   /* borrowed */
    PyObject *id = builtins ? PyDict_GetItemString(builtins, "id") : NULL;
    PyObject *compile = builtins ? PyDict_GetItemString(builtins, "compile") : NULL;
    PyObject *id_args = PyTuple_Pack(1, Py_None);
    PyObject *compile_args = Py_BuildValue("(sss)", "0", "<bench>", "eval");
    const char *what[2] = {"id(None)", "compile(\"0\", ..., \"eval\")"};
    PyObject *fns[2] = {id, compile}, *args[2] = {id_args, compile_args};
    long calls[2] = {n / 20, n / 2000};
    double ns[2][2];
    int rc = id != NULL && compile != NULL && id_args != NULL && compile_args != NULL ? 0 : -1;
    for (int with = 0; with < 2 && rc == 0; with++) {
        if (with && PySys_AddAuditHook(name_comparing_audit_hook, NULL) < 0) {
            rc = -1;
        }
        for (int k = 0; k < 2 && rc == 0; k++) {
            ns[k][with] = ns_per_call(fns[k], args[k], calls[k] > 4 ? calls[k] : 4);
            rc = ns[k][with] < 0 ? -1 : 0;
        }
    }
    if (rc == 0) {
        printf("\nthe process-wide cost of one C audit hook (pyfini's on 3.11, 3.12, 3.13.0-3.13.1 "
               "unless PYFINI_NO_AUDIT_HOOK; one per copy of the header), ns per call, best of 5:\n");
        printf("  %-28s %10s %14s %10s\n", "audited call", "no hook", "one C hook", "added");
        for (int k = 0; k < 2; k++) {
            printf("  %-28s %10.1f %14.1f %+10.1f\n", what[k], ns[k][0], ns[k][1],
                   ns[k][1] - ns[k][0]);
        }
    }
    Py_XDECREF(id_args);
    Py_XDECREF(compile_args);
    return rc;
}

/* ---- cycles ----------------------------------------------------------------- */
static int noop_cb(void *arg)
{
    (void)arg;
    return 0;
}

static void clear_state(void *p) { (void)p; }
static const pyfini_state_def cycle_def = {"pyfini.bench.cycle", 64, NULL, clear_state};

/* a new isolated sub-interpreter (own GIL, own obmalloc; legacy on 3.11),
   its thread state current */
static PyThreadState *new_isolated(void)
{
    PyThreadState *sub = NULL;
    /* isolated (3.12+), else legacy: common/interp_configs.h */
    const interp_config *ic = &interp_configs[INTERP_ISOLATED];
    if (!interp_config_available(ic)) {
        ic = &interp_configs[INTERP_LEGACY];
    }
    if (PyStatus_Exception(interp_config_create(ic, &sub))) {
        fprintf(stderr, "%s failed\n", ic->legacy ? "Py_NewInterpreter" : "Py_NewInterpreterFromConfig");
        exit(1);
    }
    return sub;
}

static double one_cycle(PyThreadState *main_ts, int with_pyfini, int subject_imports_threading)
{
    double t0 = bench_now();
    PyThreadState *sub = new_isolated();
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
    return bench_now() - t0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* median of v[0..n) and a 95 % confidence interval of the median from order
   statistics (normal approximation of the binomial); sorts v */
static void median_ci(double *v, int n, double *med, double *lo, double *hi)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    *med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
    double half = 0.98 * sqrt((double)n);   /* 1.96 * sqrt(n) / 2 */
    int l = (int)floor(n / 2.0 - half), h = (int)ceil(n / 2.0 + half);
    *lo = v[l < 0 ? 0 : l];
    *hi = v[h > n - 1 ? n - 1 : h];
}

enum { BARE, BARE_AGAIN, WITH_PYFINI, NVARIANTS };

static void cycles(PyThreadState *main_ts, int rounds)
{
    for (int i = 0; i < 20; i++) {   /* warm-up */
        one_cycle(main_ts, i & 1, i & 2);
    }
    printf("\nsub-interpreter create/end cycle (%s), %d rounds; each round runs bare, bare again "
           "and with pyfini in rotating order:\n",
           PY_VERSION_HEX >= 0x030C0000 ? "isolated" : "legacy", rounds);
    printf("  %-40s %9s %9s   %-26s %-26s\n", "subject", "bare ms", "pyfini ms",
           "pyfini / bare (95% CI)", "A/A control (95% CI)");
    double *t[NVARIANTS], *ratio = (double *)malloc(sizeof(double) * (size_t)rounds),
                           *control = (double *)malloc(sizeof(double) * (size_t)rounds);
    for (int v = 0; v < NVARIANTS; v++) {
        t[v] = (double *)malloc(sizeof(double) * (size_t)rounds);
    }
    for (int threading = 1; threading >= 0; threading--) {
        for (int r = 0; r < rounds; r++) {
            for (int j = 0; j < NVARIANTS; j++) {
                int v = (r + j) % NVARIANTS;
                t[v][r] = one_cycle(main_ts, v == WITH_PYFINI, threading);
            }
            ratio[r] = t[WITH_PYFINI][r] / t[BARE][r];
            control[r] = t[BARE_AGAIN][r] / t[BARE][r];
        }
        double bm, pm, rm, rl, rh, cm, cl, ch, lo, hi;
        median_ci(t[BARE], rounds, &bm, &lo, &hi);
        median_ci(t[WITH_PYFINI], rounds, &pm, &lo, &hi);
        median_ci(ratio, rounds, &rm, &rl, &rh);
        median_ci(control, rounds, &cm, &cl, &ch);
        char rs[64], cs[64];
        snprintf(rs, sizeof rs, "%+.1f%% (%+.1f..%+.1f)", (rm - 1) * 100, (rl - 1) * 100,
                 (rh - 1) * 100);
        snprintf(cs, sizeof cs, "%+.1f%% (%+.1f..%+.1f)", (cm - 1) * 100, (cl - 1) * 100,
                 (ch - 1) * 100);
        printf("  %-40s %9.3f %9.3f   %-26s %-26s\n",
               threading ? "imports threading (typical program)"
                         : "empty (PRE_SHUTDOWN imports threading)",
               bm * 1e3, pm * 1e3, rs, cs);
    }
    printf("  with pyfini = a callback in each of the four phases + one state (goal: <= 2 %% added)\n");
    for (int v = 0; v < NVARIANTS; v++) {
        free(t[v]);
    }
    free(ratio);
    free(control);
}

/* ---- code layouts, 8 defs, two interpreters on two threads ----------------- */
typedef int (*lookups_fn)(long, PyObject *, PyTypeObject *, PyModuleDef *, double *);
static const lookups_fn layout_fns[BENCH_LAYOUTS] = {bench_lookups_pad0, bench_lookups_pad16,
                                                     bench_lookups_pad32, bench_lookups_pad48};
static const int layout_pad[BENCH_LAYOUTS] = {0, 16, 32, 48};

typedef struct {
    long n;
    pthread_barrier_t *barrier;
    double ns;
} hit_thread;

/* its own interpreter (own GIL where it exists), hits in the shared object */
static void *hits_in_own_interpreter(void *arg)
{
    hit_thread *h = (hit_thread *)arg;
#if PY_VERSION_HEX < 0x030C0000
    PyGILState_STATE g = PyGILState_Ensure();   /* 3.11: one GIL, so turns */
    PyThreadState *own = PyThreadState_Get();
#endif
    PyThreadState *sub = new_isolated();
#if PY_VERSION_HEX >= 0x030C0000
    pthread_barrier_wait(h->barrier);   /* both at once, each under its own GIL */
#endif
    h->ns = bench_hits_shared(h->n, 1);
    Py_EndInterpreter(sub);
#if PY_VERSION_HEX < 0x030C0000
    PyThreadState_Swap(own);   /* PyGILState_Release needs its own thread state current */
    PyGILState_Release(g);
#endif
    return NULL;
}

static void layouts_and_threads(long n, PyTypeObject *type, const double shared[BENCH_NKINDS])
{
    PyObject *key = PyUnicode_FromString("pyfini.bench.key.layout");
    double hit[BENCH_LAYOUTS], lo = 1e30, hi = 0;
    printf("\nthe shared object at %d code layouts (lookups moved by N bytes from a 64-byte "
           "boundary), ns:\n  %-6s %10s %10s %10s %10s\n", BENCH_LAYOUTS, "N", "TLS read",
           "fetch", "pyfini hit", "state dict");
    for (int l = 0; l < BENCH_LAYOUTS; l++) {
        double ns[BENCH_NKINDS];
        if (layout_fns[l](n, key, type, &bench_module, ns) < 0) {
            PyErr_Print();
            exit(1);
        }
        hit[l] = ns[BENCH_PYFINI];
        lo = hit[l] < lo ? hit[l] : lo;
        hi = hit[l] > hi ? hit[l] : hi;
        printf("  %-6d %10.2f %10.2f %10.2f %10.2f\n", layout_pad[l], ns[BENCH_TLS],
               ns[BENCH_TSTATE], ns[BENCH_PYFINI], ns[BENCH_STATE_DICT]);
    }
    printf("  pyfini hit across layouts: %.2f..%.2f ns, spread %.2f ns (goal: within +-0.5 ns)\n",
           lo, hi, hi - lo);
    Py_DECREF(key);
    double one = bench_hits_shared(n, 1), eight = bench_hits_shared(n, 8);
    /* two interpreters on two threads at once, each its own def lookups */
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, 2);
    hit_thread h[2] = {{n, &barrier, 0}, {n, &barrier, 0}};
    pthread_t th[2];
    PyThreadState *main_ts = PyEval_SaveThread();
    for (int i = 0; i < 2; i++) {
        pthread_create(&th[i], NULL, hits_in_own_interpreter, &h[i]);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
    }
    PyEval_RestoreThread(main_ts);
    pthread_barrier_destroy(&barrier);
    printf("\npyfini_state() hits in the shared object, ns per lookup:\n"
           "  one def %.2f; 8 defs in turn %.2f (%.2fx); two interpreters on two threads at once "
           "%.2f and %.2f (%.2fx)  (goal: <= 2x the one-def hit)\n",
           one, eight, eight / one, h[0].ns, h[1].ns,
           (h[0].ns > h[1].ns ? h[0].ns : h[1].ns) / one);
#ifdef BENCH_HAVE_PYBIND11
    double pb = bench_pybind11_internals(n);
    printf("  pybind11 %s detail::get_internals() (real headers, after a sub-interpreter was "
           "seen): %.2f ns; pyfini hit / pybind11 = %.2fx (goal < 1)\n", "3.x", pb,
           shared[BENCH_PYFINI] / pb);
#else
    printf("  pybind11 3.x: headers not found, not measured\n");
#endif
    printf("  goals in the shared object: hit - fetch = %.2f ns (<= 1.5), hit / TLS read = %.2fx "
           "(<= 2), state dict / hit = %.1fx (>= 4)\n",
           shared[BENCH_PYFINI] - shared[BENCH_TSTATE], shared[BENCH_PYFINI] / shared[BENCH_TLS],
           shared[BENCH_STATE_DICT] / shared[BENCH_PYFINI]);
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 20000000L;
    int rounds = argc > 2 ? atoi(argv[2]) : 300;
    if (n < 4 || rounds < 1) {
        fprintf(stderr, "usage: bench_state [lookups >= 4] [rounds >= 1]\n");
        return 2;
    }
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
    if (audit_hook_cost(n) < 0) {
        PyErr_Print();
        return 1;
    }
    PyObject *key = PyUnicode_FromString("pyfini.bench.key");
    PyObject *mod = PyImport_ImportModule("_pyfini_bench");
    PyObject *type = mod ? PyObject_GetAttrString(mod, "T") : NULL;
    double ns[2][BENCH_NKINDS];
    if (type == NULL ||
        bench_lookups_program(n, key, (PyTypeObject *)type, &bench_module, ns[0]) < 0 ||
        bench_lookups_shared(n, key, (PyTypeObject *)type, &bench_module, ns[1]) < 0) {
        PyErr_Print();
        return 1;
    }
    printf("\nlookup of per-interpreter state (%ld lookups, best of 5), ns per lookup and x the "
           "thread-local read:\n",
           n);
    printf("  %-28s %18s %18s\n", "method", "in the program", "in a shared object");
    for (int k = 0; k < BENCH_NKINDS; k++) {
        printf("  %-28s %8.2f %7.1fx  %8.2f %7.1fx\n", kind_name[k], ns[0][k],
               ns[0][k] / ns[0][BENCH_TLS], ns[1][k], ns[1][k] / ns[1][BENCH_TLS]);
    }
    for (int s = 0; s < 2; s++) {
        printf("  %s: hit %.1fx the thread-local read (goal <= 2x), %.1fx faster than the state "
               "dict (goal >= 4x); pyfini's own share over CPython's fetch: %.2f ns\n",
               s ? "shared object" : "program", ns[s][BENCH_PYFINI] / ns[s][BENCH_TLS],
               ns[s][BENCH_STATE_DICT] / ns[s][BENCH_PYFINI],
               ns[s][BENCH_PYFINI] - ns[s][BENCH_TSTATE]);
    }
    printf("  hits guarded by (CPython %s): in the program %s; in the shared object %s\n",
           PY_VERSION, bench_lookups_program_guard(), bench_lookups_shared_guard());
    layouts_and_threads(n, (PyTypeObject *)type, ns[1]);
    cycles(PyThreadState_Get(), rounds);
    Py_DECREF(type);
    Py_DECREF(mod);
    Py_DECREF(key);
    return Py_FinalizeEx() < 0 ? 1 : 0;
}
