/* bench/bench_state.c - what a lookup of per-interpreter state costs, and
 * what pyfini adds to a sub-interpreter's create-and-end cycle. Figures, not
 * pass/fail; ratios side by side in one run.
 *
 *   lookups (ns per lookup), measured in the program and in a shared object
 *   (where thread-locals go through __tls_get_addr, as in an extension
 *   module), and in shared objects at 4 code layouts:
 *     thread-local pointer read   the limit: a plain _Thread_local variable
 *     CPython thread-state fetch  PyThreadState_GetUnchecked()->interp: the
 *                                 floor of any per-interpreter lookup
 *     pyfini_state() hit          pyfini's process-wide hit table
 *     state dict + dict lookup    PyInterpreterState_GetDict() + PyDict_GetItemWithError()
 *     module state by def         PyType_GetModuleByDef() + PyModule_GetState()
 *   plus hits with 8 defs in turn and pybind11 3.x's get_internals() (where
 *   its headers exist). LOOKUP_ROUNDS rounds, each a batch of every one of
 *   them in turn (the order rotated each round): a core whose speed changes
 *   during a run (this VM's does, by 1.5x) changes every figure of a round
 *   alike, so each goal is judged on the median of its per-round ratio or
 *   difference. Then hits in two interpreters on two threads: per round each
 *   thread alone, then both at once.
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
 * usage: bench_state [lookups] [rounds]   (defaults 20000000 and 300: the
 *   lookups of each method and copy over all LOOKUP_ROUNDS rounds, and the
 *   rounds of create/end cycles)
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

#define LOOKUP_ROUNDS 40

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
               "unless PYFINI_NO_AUDIT_HOOK; one per copy, i.e. per shared object), ns per call, "
               "best of 5:\n");
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

static const char *met(int ok) { return ok ? "met" : "NOT met"; }

enum { BARE, BARE_AGAIN, WITH_PYFINI, NVARIANTS };

static void cycles(PyThreadState *main_ts, int rounds)
{
    for (int i = 0; i < 20; i++) {   /* warm-up */
        one_cycle(main_ts, i & 1, i & 2);
    }
    printf("\nsub-interpreter create/end cycle (%s), %d rounds; each round runs bare, bare again "
           "and with pyfini in rotating order:\n",
           PY_VERSION_HEX >= 0x030C0000 ? "isolated" : "legacy", rounds);
    printf("  %-40s %9s %9s   %-26s %-26s %s\n", "subject", "bare ms", "pyfini ms",
           "pyfini / bare (95% CI)", "A/A control (95% CI)", "<= 2 % added");
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
        /* judged on the median, as the lookups' goals */
        printf("  %-40s %9.3f %9.3f   %-26s %-26s %s\n",
               threading ? "imports threading (typical program)"
                         : "empty (PRE_SHUTDOWN imports threading)",
               bm * 1e3, pm * 1e3, rs, cs, met(rm <= 1.02));
    }
    printf("  with pyfini = a callback in each of the four phases + one state (goal: <= 2 %% added;\n"
           "  an empty subject pays PRE_SHUTDOWN's import of threading: README, Benchmark)\n");
    for (int v = 0; v < NVARIANTS; v++) {
        free(t[v]);
    }
    free(ratio);
    free(control);
}

/* ---- lookups: every method, copy and layout in each round ------------------- */
typedef int (*lookups_fn)(long, int, PyObject *, PyTypeObject *, PyModuleDef *, double *);
/* the copies of lookups.c: in the program, in a shared object, and in
   shared objects at 4 code layouts */
enum { SRC_PROGRAM, SRC_SHARED, SRC_PAD0, NSRC = SRC_PAD0 + BENCH_LAYOUTS };
static const lookups_fn src_fns[NSRC] = {bench_lookups_program, bench_lookups_shared,
                                         bench_lookups_pad0,    bench_lookups_pad16,
                                         bench_lookups_pad32,   bench_lookups_pad48};
static const int layout_pad[BENCH_LAYOUTS] = {0, 16, 32, 48};
/* what one round measures besides the copies: hits in the shared object
   with one def and with 8 defs in turn, and pybind11's get_internals() */
enum { ITEM_HIT1 = NSRC, ITEM_HIT8, ITEM_PYBIND11, NITEMS };

typedef struct {
    int rounds;
    long batch;                               /* lookups per timed batch */
    double *ns[NSRC][BENCH_NKINDS];           /* [round] */
    double *hit1, *hit8, *pybind11;           /* [round]; pybind11 NULL if absent */
} lookup_rounds;

/* median of v[0..n) and its 95 % interval, without reordering v */
static void median_of(const double *v, int n, double *med, double *lo, double *hi)
{
    double *c = (double *)malloc(sizeof(double) * (size_t)n);
    memcpy(c, v, sizeof(double) * (size_t)n);
    median_ci(c, n, med, lo, hi);
    free(c);
}

/* per-round a[r] OP b[r], then its median and 95 % interval */
enum { RATIO, DIFF };
static void per_round(const double *a, const double *b, int n, int op, double *med, double *lo,
                      double *hi)
{
    double *c = (double *)malloc(sizeof(double) * (size_t)n);
    for (int r = 0; r < n; r++) {
        c[r] = op == RATIO ? a[r] / b[r] : a[r] - b[r];
    }
    median_ci(c, n, med, lo, hi);
    free(c);
}

/* rounds x (every copy's five methods, one-def and 8-def hits, pybind11),
   in an order rotated by one each round; -1 with an exception set */
static int measure_lookups(lookup_rounds *lr, PyObject *key, PyTypeObject *type)
{
    for (int r = 0; r < lr->rounds; r++) {
        for (int j = 0; j < NITEMS; j++) {
            int it = (r + j) % NITEMS;
            double ns[BENCH_NKINDS];
            if (it < NSRC) {
                if (src_fns[it](lr->batch, r % BENCH_NKINDS, key, type, &bench_module, ns) < 0) {
                    return -1;
                }
                for (int k = 0; k < BENCH_NKINDS; k++) {
                    lr->ns[it][k][r] = ns[k];
                }
            } else if (it == ITEM_HIT1 || it == ITEM_HIT8) {
                double h = bench_hits_shared(lr->batch, it == ITEM_HIT1 ? 1 : 8);
                if (h < 0) {
                    return -1;
                }
                (it == ITEM_HIT1 ? lr->hit1 : lr->hit8)[r] = h;
            } else if (lr->pybind11 != NULL) {
#ifdef BENCH_HAVE_PYBIND11
                lr->pybind11[r] = bench_pybind11_internals(lr->batch);
                if (lr->pybind11[r] < 0) {
                    PyErr_SetString(PyExc_RuntimeError, "pybind11's get_internals() failed");
                    return -1;
                }
#endif
            }
        }
    }
    return 0;
}


static void report_lookups(const lookup_rounds *lr)
{
    int n = lr->rounds;
    double med, lo, hi;
    printf("\nlookup of per-interpreter state, ns per lookup: %d rounds, each a batch of %ld "
           "lookups of every method in every copy (in turn, the order rotated each round); "
           "the median over the rounds, and x the thread-local read (the median of the "
           "per-round ratios):\n", n, lr->batch);
    printf("  %-28s %18s %18s\n", "method", "in the program", "in a shared object");
    for (int k = 0; k < BENCH_NKINDS; k++) {
        double m[2], x[2];
        for (int s = 0; s < 2; s++) {
            median_of(lr->ns[s][k], n, &m[s], &lo, &hi);
            per_round(lr->ns[s][k], lr->ns[s][BENCH_TLS], n, RATIO, &x[s], &lo, &hi);
        }
        printf("  %-28s %8.2f %7.2fx  %8.2f %7.2fx\n", kind_name[k], m[0], x[0], m[1], x[1]);
    }
    printf("  hits guarded by (CPython %s): in the program %s; in the shared object %s\n",
           PY_VERSION, bench_lookups_program_guard(), bench_lookups_shared_guard());

    const double *const *sh = (const double *const *)lr->ns[SRC_SHARED];
    printf("\ngoals, in the shared object (the median of the per-round figures, its 95 %% "
           "interval):\n");
    per_round(sh[BENCH_PYFINI], sh[BENCH_TSTATE], n, DIFF, &med, &lo, &hi);
    printf("  hit - CPython's fetch        %6.2f ns  (%.2f..%.2f)   goal <= 1.5 ns: %s\n", med,
           lo, hi, met(med <= 1.5));
    per_round(sh[BENCH_PYFINI], sh[BENCH_TLS], n, RATIO, &med, &lo, &hi);
    printf("  hit / thread-local read      %6.2fx     (%.2f..%.2f)   goal <= 2x: %s\n", med, lo,
           hi, met(med <= 2));
    per_round(sh[BENCH_STATE_DICT], sh[BENCH_PYFINI], n, RATIO, &med, &lo, &hi);
    double fetch_med, flo, fhi;
    per_round(sh[BENCH_STATE_DICT], sh[BENCH_TSTATE], n, RATIO, &fetch_med, &flo, &fhi);
    printf("  state dict / hit             %6.2fx     (%.2f..%.2f)   goal >= 4x: %s  "
           "(state dict / CPython's fetch alone: %.2fx, the most any hit can reach)\n",
           med, lo, hi, met(med >= 4), fetch_med);
    if (lr->pybind11 != NULL) {
        double pm;
        median_of(lr->pybind11, n, &pm, &lo, &hi);
        per_round(sh[BENCH_PYFINI], lr->pybind11, n, RATIO, &med, &lo, &hi);
        printf("  hit / pybind11 %-13s %6.2fx     (%.2f..%.2f)   goal < 1: %s  (pybind11 3.x "
               "detail::get_internals(), real headers, after a sub-interpreter was seen: "
               "%.2f ns)\n", "", med, lo, hi, met(med < 1), pm);
    } else {
        printf("  hit / pybind11               pybind11 3.x headers not found: not measured\n");
    }
    per_round(lr->hit8, lr->hit1, n, RATIO, &med, &lo, &hi);
    printf("  8 defs in turn / one def     %6.2fx     (%.2f..%.2f)   goal <= 2x: %s\n", med, lo,
           hi, met(med <= 2));
    double lay[BENCH_LAYOUTS], tls[BENCH_LAYOUTS], llo = 1e30, lhi = 0, tlo = 1e30, thi = 0;
    for (int l = 0; l < BENCH_LAYOUTS; l++) {
        median_of(lr->ns[SRC_PAD0 + l][BENCH_PYFINI], n, &lay[l], &lo, &hi);
        median_of(lr->ns[SRC_PAD0 + l][BENCH_TLS], n, &tls[l], &lo, &hi);
        llo = lay[l] < llo ? lay[l] : llo;
        lhi = lay[l] > lhi ? lay[l] : lhi;
        tlo = tls[l] < tlo ? tls[l] : tlo;
        thi = tls[l] > thi ? tls[l] : thi;
    }
    printf("  hit at %d code layouts       %.2f..%.2f ns: %.2f +- %.2f ns   goal within +-0.5 ns: "
           "%s  (lookups moved by", BENCH_LAYOUTS, llo, lhi, (llo + lhi) / 2, (lhi - llo) / 2,
           met((lhi - llo) / 2 <= 0.5));
    for (int l = 0; l < BENCH_LAYOUTS; l++) {
        printf(" %d: %.2f%s", layout_pad[l], lay[l], l + 1 < BENCH_LAYOUTS ? "," : "");
    }
    printf(" bytes from a 64-byte boundary; the thread-local read there: %.2f..%.2f ns)\n", tlo,
           thi);
}

/* ---- two interpreters on two threads ----------------------------------------- */
typedef struct {
    int id, rounds;
    long batch;
    pthread_barrier_t *barrier;
    double *alone, *together;   /* [round] */
} hit_thread;

/* its own interpreter (own GIL where it exists), hits in the shared object:
   each round this thread alone (the other waiting), then the other alone,
   then both at once. 3.11 has one GIL: the threads' rounds take turns, all
   "alone". */
static void *hits_in_own_interpreter(void *arg)
{
    hit_thread *h = (hit_thread *)arg;
#if PY_VERSION_HEX < 0x030C0000
    PyGILState_STATE g = PyGILState_Ensure();   /* 3.11: one GIL, so turns */
    PyThreadState *own = PyThreadState_Get();
#endif
    PyThreadState *sub = new_isolated();
    for (int r = 0; r < h->rounds; r++) {
#if PY_VERSION_HEX >= 0x030C0000
        for (int turn = 0; turn < 2; turn++) {
            pthread_barrier_wait(h->barrier);
            if (turn == h->id) {
                h->alone[r] = bench_hits_shared(h->batch, 1);
            }
        }
        pthread_barrier_wait(h->barrier);   /* both at once, each under its own GIL */
        h->together[r] = bench_hits_shared(h->batch, 1);
#else
        h->alone[r] = bench_hits_shared(h->batch, 1);
        h->together[r] = h->alone[r];
#endif
    }
    Py_EndInterpreter(sub);
#if PY_VERSION_HEX < 0x030C0000
    PyThreadState_Swap(own);   /* PyGILState_Release needs its own thread state current */
    PyGILState_Release(g);
#endif
    return NULL;
}

static void two_threads(const lookup_rounds *lr)
{
    int n = lr->rounds;
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, 2);
    hit_thread h[2];
    for (int i = 0; i < 2; i++) {
        h[i] = (hit_thread){i, n, lr->batch, &barrier, (double *)calloc((size_t)n, sizeof(double)),
                            (double *)calloc((size_t)n, sizeof(double))};
    }
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
    /* the goal: at once, the slower thread, / the main thread's one-def
       hit (per round: the threads' rounds and the main thread's run at
       other times, so medians); and at once / alone per thread and round,
       what the two threads cost each other */
    double one, a[2], t[2], x[2], lo, hi, worst = 0;
    median_of(lr->hit1, n, &one, &lo, &hi);
    for (int i = 0; i < 2; i++) {
        median_of(h[i].alone, n, &a[i], &lo, &hi);
        median_of(h[i].together, n, &t[i], &lo, &hi);
        per_round(h[i].together, h[i].alone, n, RATIO, &x[i], &lo, &hi);
        worst = x[i] > worst ? x[i] : worst;
    }
    double slow = t[0] > t[1] ? t[0] : t[1];
#if PY_VERSION_HEX >= 0x030C0000
    printf("\ntwo own-GIL interpreters on two threads, hits in the shared object (%d rounds: each "
           "thread alone, then both at once), ns per lookup:\n"
           "  thread 1: alone %.2f, at once %.2f (%.2fx); thread 2: alone %.2f, at once %.2f "
           "(%.2fx)\n"
           "  at once, the slower thread / the one-def hit (%.2f ns): %.2fx   goal <= 2x: %s  "
           "(at once / alone, the worse thread: %.2fx)\n",
           n, a[0], t[0], x[0], a[1], t[1], x[1], one, slow / one, met(slow / one <= 2), worst);
#else
    (void)worst;
    printf("\ntwo legacy interpreters on two threads (CPython 3.11: one GIL, so they take turns), "
           "hits in the shared object, ns per lookup:\n"
           "  thread 1 %.2f, thread 2 %.2f; the slower / the one-def hit (%.2f ns): %.2fx   "
           "goal <= 2x: %s\n",
           a[0], a[1], one, slow / one, met(slow / one <= 2));
#endif
    for (int i = 0; i < 2; i++) {
        free(h[i].alone);
        free(h[i].together);
    }
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
    lookup_rounds lr = {LOOKUP_ROUNDS, n / LOOKUP_ROUNDS > 4 ? n / LOOKUP_ROUNDS : 4, {{NULL}},
                        NULL, NULL, NULL};
    for (int s = 0; s < NSRC; s++) {
        for (int k = 0; k < BENCH_NKINDS; k++) {
            lr.ns[s][k] = (double *)calloc(LOOKUP_ROUNDS, sizeof(double));
        }
    }
    lr.hit1 = (double *)calloc(LOOKUP_ROUNDS, sizeof(double));
    lr.hit8 = (double *)calloc(LOOKUP_ROUNDS, sizeof(double));
#ifdef BENCH_HAVE_PYBIND11
    lr.pybind11 = (double *)calloc(LOOKUP_ROUNDS, sizeof(double));
#endif
    if (type == NULL || key == NULL || measure_lookups(&lr, key, (PyTypeObject *)type) < 0) {
        PyErr_Print();
        return 1;
    }
    report_lookups(&lr);
    two_threads(&lr);
    for (int s = 0; s < NSRC; s++) {
        for (int k = 0; k < BENCH_NKINDS; k++) {
            free(lr.ns[s][k]);
        }
    }
    free(lr.hit1);
    free(lr.hit8);
    free(lr.pybind11);
    cycles(PyThreadState_Get(), rounds);
    Py_DECREF(type);
    Py_DECREF(mod);
    Py_DECREF(key);
    return Py_FinalizeEx() < 0 ? 1 : 0;
}
