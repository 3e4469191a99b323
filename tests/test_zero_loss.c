/* tests/test_zero_loss.c - pyfini_state loses nothing: create-and-end cycles
 * of an isolated sub-interpreter (legacy on 3.11) that creates a state, owns
 * and tracks a heap type and its instances (some in a garbage cycle), cost
 * the same memory per cycle as the raw C API doing the same work with a
 * module-state type. Raw and pyfini cycles are interleaved; each cycle's
 * change in CPython's allocator bytes (exact, all three domains, each block
 * once: leakcheck/worker/lc_alloc.h) and in malloc's bytes in use
 * (leakcheck/worker/lc_meter.h) is summed per variant.
 *
 * PYFINI_ZERO_LOSS_CYCLES (default 200; medians need no more) cycles of each variant, after 20
 * warm-up cycles of each.
 */
#include <Python.h>
#include <check.h>

/* pyfini's own records, counted exactly */
static long alloc_live;
static void *counting_calloc(size_t n, size_t size)
{
    void *p = calloc(n, size);
    alloc_live += p != NULL;
    return p;
}
static void counting_free(void *p)
{
    alloc_live -= p != NULL;
    free(p);
}
#define PYFINI_CALLOC(n, size) counting_calloc((n), (size))
#define PYFINI_FREE(p) counting_free(p)
#include "pyfini.h"
#include "harness.h"
#include "node.h"
#include "lc_alloc.h"   /* leakcheck's allocator meter */
#include "lc_meter.h"

#define N_INSTANCES 10

static void make_instances(PyObject *type, const pyfini_state_def *track)
{
    PyObject *cycle_head = NULL, *prev = NULL;
    for (int i = 0; i < N_INSTANCES; i++) {
        PyObject *o = node_new(type);
        ck_assert_ptr_nonnull(o);
        if (track != NULL) {
            ck_assert_int_eq(pyfini_track(track, o), 0);
        }
        if (i % 2 == 0) {
            Py_DECREF(o);   /* freed at once */
            continue;
        }
        if (prev == NULL) {
            cycle_head = o;
        } else {
            ((node_object *)prev)->ref = o;   /* steals */
        }
        prev = o;
    }
    ((node_object *)prev)->ref = cycle_head;   /* closes the cycle; garbage for the GC */
}

/* ---- the raw C API: the type in the module state -------------------------- */

typedef struct {
    PyObject *type;
} raw_module_state;

static int raw_exec(PyObject *m)
{
    raw_module_state *st = (raw_module_state *)PyModule_GetState(m);
    st->type = PyType_FromModuleAndSpec(m, &node_spec, NULL);
    if (st->type == NULL) {
        return -1;
    }
    make_instances(st->type, NULL);
    return 0;
}
static int raw_traverse(PyObject *m, visitproc visit, void *arg)
{
    Py_VISIT(((raw_module_state *)PyModule_GetState(m))->type);
    return 0;
}
static int raw_clear(PyObject *m)
{
    Py_CLEAR(((raw_module_state *)PyModule_GetState(m))->type);
    return 0;
}

/* ---- pyfini: the state owns the type (3.12+) -------------------------------- */

typedef struct {
    PyObject *type;
    int owns_type;
} lib_state;

static void lib_clear(void *p)
{
    lib_state *st = (lib_state *)p;
    if (st->owns_type) {
        Py_CLEAR(st->type);
    }
}
static const pyfini_state_def lib_def = {"pyfini.test.zero_loss", sizeof(lib_state), NULL,
                                         lib_clear};

static int lib_exec(PyObject *m)
{
    (void)m;
    lib_state *st = (lib_state *)pyfini_state(&lib_def);
    if (st == NULL) {
        return -1;
    }
#if PY_VERSION_HEX >= 0x030C0000
    st->type = PyType_FromSpec(&node_spec);
    st->owns_type = 1;
#else
    /* 3.11: a heap type released after the last GC of a sub-interpreter
       cannot be freed (see tests/test_state.c); the module owns it */
    raw_module_state *ms = (raw_module_state *)PyModule_GetState(m);
    ms->type = PyType_FromModuleAndSpec(m, &node_spec, NULL);
    st->type = ms->type;
#endif
    if (st->type == NULL || pyfini_track(&lib_def, st->type) < 0) {
        return -1;
    }
    make_instances(st->type, &lib_def);
    return 0;
}

static PyModuleDef_Slot raw_slots[] = {
    {Py_mod_exec, (void *)raw_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL}};
static PyModuleDef_Slot lib_slots[] = {
    {Py_mod_exec, (void *)lib_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL}};
static struct PyModuleDef raw_module = {PyModuleDef_HEAD_INIT, "_zl_raw", NULL,
                                        sizeof(raw_module_state), NULL, raw_slots,
                                        raw_traverse, raw_clear, NULL};
static struct PyModuleDef lib_module = {PyModuleDef_HEAD_INIT, "_zl_pyfini", NULL,
                                        sizeof(raw_module_state), NULL, lib_slots,
                                        raw_traverse, raw_clear, NULL};
static PyObject *init_raw(void) { return PyModuleDef_Init(&raw_module); }
static PyObject *init_lib(void) { return PyModuleDef_Init(&lib_module); }

static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static void one_cycle(PyThreadState *main_ts, const char *module)
{
    PyThreadState *sub = new_sub(SUB_ISOLATED);
    if (sub == NULL) {
        sub = new_sub(SUB_LEGACY);
    }
    PyObject *m = PyImport_ImportModule(module);
    if (m == NULL) {
        PyErr_Print();
    }
    ck_assert_ptr_nonnull(m);
    Py_DECREF(m);
    Py_EndInterpreter(sub);
    PyThreadState_Swap(main_ts);
}

START_TEST(test_zero_loss_against_raw_c_api)
{
    int cycles = 200;   /* CI time: the medians judged below are stable at 200 (500 until 2026-12-07: 25-53 s per row) */
    const char *env = getenv("PYFINI_ZERO_LOSS_CYCLES");
    if (env != NULL && atoi(env) > 0) {
        cycles = atoi(env);
    }
#if defined(__SANITIZE_ADDRESS__)
    cycles = cycles < 100 ? cycles : 100;   /* ASan: slow, and mallinfo sees its allocator */
#endif
    lc_alloc_install(0);
    PyImport_AppendInittab("_zl_raw", init_raw);
    PyImport_AppendInittab("_zl_pyfini", init_lib);
    Py_Initialize();
    PyThreadState *main_ts = PyThreadState_Get();
    stderr_capture_begin();
    for (int i = 0; i < 20; i++) {
        one_cycle(main_ts, "_zl_raw");
        one_cycle(main_ts, "_zl_pyfini");
    }
    long long py[2] = {0, 0}, mal[2] = {0, 0};
    long long *dpy[2], *dmal[2];   /* per-cycle changes, for the medians */
    for (int v = 0; v < 2; v++) {
        dpy[v] = (long long *)calloc((size_t)cycles, sizeof(long long));
        dmal[v] = (long long *)calloc((size_t)cycles, sizeof(long long));
    }
    long long rss0 = lc_meter_rss();
    for (int i = 0; i < cycles; i++) {
        for (int v = 0; v < 2; v++) {
            long long p0 = lc_alloc_bytes(), m0 = lc_meter_malloc();
            one_cycle(main_ts, v == 0 ? "_zl_raw" : "_zl_pyfini");
            dpy[v][i] = lc_alloc_bytes() - p0;
            py[v] += dpy[v][i];
            dmal[v][i] = lc_meter_malloc() - m0;
            mal[v] += dmal[v][i];
        }
    }
    /* a one-time growth of the main interpreter (a table resized, seen once
       as +131 kB in 2,000 cycles on 3.13.18) lands in one variant's sum by
       chance: judge the medians, which a loss in every cycle moves */
    qsort(dpy[0], (size_t)cycles, sizeof(long long), cmp_ll);
    qsort(dpy[1], (size_t)cycles, sizeof(long long), cmp_ll);
    qsort(dmal[0], (size_t)cycles, sizeof(long long), cmp_ll);
    qsort(dmal[1], (size_t)cycles, sizeof(long long), cmp_ll);
    long long med_raw = dpy[0][cycles / 2], med_lib = dpy[1][cycles / 2];
#if !defined(__SANITIZE_ADDRESS__)
    long long mmed_raw = dmal[0][cycles / 2], mmed_lib = dmal[1][cycles / 2];
#endif
    for (int v = 0; v < 2; v++) {
        free(dpy[v]);
        free(dmal[v]);
    }
    long long rss1 = lc_meter_rss();
    char *err = stderr_capture_end();
    ck_assert_msg(err[0] == '\0', "unexpected stderr (leak report?):\n%.3000s", err);
    free(err);
    double py_raw = (double)py[0] / cycles, py_lib = (double)py[1] / cycles;
    double m_raw = (double)mal[0] / cycles, m_lib = (double)mal[1] / cycles;
    printf("NOTE zero loss on CPython %s, %s, %d cycles each: CPython allocators %.1f B/cycle "
           "raw vs %.1f B/cycle pyfini (medians %lld vs %lld B); malloc in use %.1f vs %.1f "
           "B/cycle; RSS %.1f kB/cycle (both)\n",
           PY_VERSION, PY_VERSION_HEX >= 0x030C0000 ? "isolated" : "legacy", cycles, py_raw,
           py_lib, med_raw, med_lib, m_raw, m_lib, (double)(rss1 - rss0) / 1024.0 / (2.0 * cycles));
    fflush(stdout);
    ck_assert_msg(med_lib - med_raw <= 0, "pyfini loses %lld B/cycle (median) more than the raw "
                  "C API in CPython's allocators", med_lib - med_raw);
    /* pyfini's own records: every one freed, exactly */
    ck_assert_msg(alloc_live == 0, "%ld pyfini records still allocated", alloc_live);
#if !defined(__SANITIZE_ADDRESS__)
    /* malloc's bytes in use move by a few hundred bytes per cycle either way
       (chunk reuse, tcache; seen -275 to +434 B/cycle on 3.15 over 200
       cycles); a real loss would show in the exact counts above */
    /* medians: a one-time growth (seen: ~400 kB once on 3.11) does not count */
    double tol = m_raw * 0.005 > 2048.0 ? m_raw * 0.005 : 2048.0;
    ck_assert_msg((double)(mmed_lib - mmed_raw) < tol, "pyfini loses %lld B/cycle (median) more "
                  "malloc than the raw C API (tolerance %.0f)", mmed_lib - mmed_raw, tol);
#endif
    ck_assert_int_eq(Py_FinalizeEx(), 0);
}
END_TEST

static Suite *zero_loss_suite(void)
{
    Suite *s = suite_create("zero_loss");
    TCase *tc = tcase_create("zero_loss");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_zero_loss_against_raw_c_api);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return run_suite(zero_loss_suite()); }
