/* tests/test_phases.c - the four phases: order, timing against CPython's
 * finalization steps, and scale. Each test is its own process.
 *
 * Pins (CPython behaviour pyfini relies on; a failure here names what moved):
 *   - wait_for_thread_shutdown() -> threading._shutdown() runs
 *     threading._register_atexit callbacks newest first, before joining
 *     non-daemon threads (Python/pylifecycle.c, Lib/threading.py)
 *   - _PyAtExit_Call() runs atexit callbacks newest first (Modules/atexitmodule.c)
 *   - finalize_modules() replaces sys.modules by None before interpreter_clear()
 *   - interpreter_clear() (Python/pystate.c): Py_CLEAR(interp->dict), then
 *     _PyAtExit_Fini (PyUnstable_AtExit, 3.13+), then the last
 *     _PyGC_CollectNoFail, then PyDict_Clear(sysdict), PyDict_Clear(builtins)
 *   - Py_FinalizeEx -> call_ll_exitfuncs(): Py_AtExit callbacks, at most 32
 */
#include <Python.h>
#include <check.h>
#include "pyfini.h"
#include "harness.h"

/* ---- order in one interpreter ----------------------------------------- */

static const char *ORDER_CODE =
    "import atexit, threading, _pyfini_test as t\n"
    "P = '%s'\n"
    "t.register(1, P + ' PRE a')\n"
    "threading._register_atexit(t.record, P + ' threading-atexit')\n"
    "t.register(1, P + ' PRE b')\n"
    "atexit.register(t.record, P + ' py-atexit 1')\n"
    "t.register(2, P + ' USER a')\n"
    "atexit.register(t.record, P + ' py-atexit 2')\n"
    "t.register(2, P + ' USER b')\n"
    "t.register(3, P + ' POST a')\n"
    "t.register(3, P + ' POST b')\n"
    "t.register(4, P + ' RUNTIME a')\n"
    "t.register(4, P + ' RUNTIME b')\n"
    "assert t.phase() == 0\n";

static void run_order_code(const char *prefix)
{
    char code[2048];
    snprintf(code, sizeof code, ORDER_CODE, prefix);
    run(code);
}

#define CHECK_INTERP_ORDER(P)                                                      \
    EV_ORDER(P " PRE b", P " threading-atexit", P " PRE a", P " USER b",            \
             P " py-atexit 2", P " USER a", P " py-atexit 1", P " POST b", P " POST a")

/* nothing on stderr: no report from threading, atexit or pyfini */
static void expect_quiet(char *err)
{
    ck_assert_msg(err[0] == '\0', "unexpected stderr:\n%s", err);
    free(err);
}

START_TEST(test_order_main)
{
    stderr_capture_begin();
    harness_init();
    run_order_code("main");
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    expect_quiet(stderr_capture_end());
    CHECK_INTERP_ORDER("main");
    EV_ORDER("main POST a", "main RUNTIME b", "main RUNTIME a");
    ck_assert_int_eq(ev_count("main USER a"), 1);
}
END_TEST

static void order_in_sub(int kind, const char *P)
{
    stderr_capture_begin();
    harness_init();
    PyThreadState *main_ts = PyThreadState_Get();
    PyThreadState *sub = new_sub(kind);
    run_order_code(P);
    ev_add("ending");
    Py_EndInterpreter(sub);
    ev_add("ended");
    PyThreadState_Swap(main_ts);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    ev_add("finalized");
    expect_quiet(stderr_capture_end());
    EV_ORDER("ending", "sub PRE b", "sub POST a", "ended");
    CHECK_INTERP_ORDER("sub");
    /* RUNTIME_SHUTDOWN is process-wide: after the main interpreter is gone */
    EV_ORDER("ended", "sub RUNTIME b", "sub RUNTIME a", "finalized");
}

START_TEST(test_order_sub_legacy) { order_in_sub(SUB_LEGACY, "sub"); }
END_TEST

START_TEST(test_order_sub_isolated)
{
#if PY_VERSION_HEX < 0x030C0000
    SKIP_TEST("Py_NewInterpreterFromConfig (own GIL, own obmalloc) exists from 3.12 on");
#else
    order_in_sub(SUB_ISOLATED, "sub");
#endif
}
END_TEST

/* ---- POST_SHUTDOWN is after the last GC --------------------------------- */

static const char *POST_CODE =
    "import _pyfini_test as t\n"
    "t.watch_state_dict('X')\n"                    /* records the state-dict clear, plants in sys */
    "p = t.Probe('cycle'); p.ref = p\n"            /* a cycle that only the last GC frees */
    "t.park('_pyfini_test_cycle', p); del p\n"
    "if hasattr(t, 'unstable_atexit'): t.unstable_atexit('X')\n"
    "t.register(3, 'POST')\n";

static void check_post_order(void)
{
    /* pin: sys.modules is None once interpreter_clear() clears the state dict */
    ck_assert_int_eq(ev_count("sys.modules at state-dict clear is NoneType"), 1);
#if PY_VERSION_HEX >= 0x030D0000
    EV_ORDER("state-dict cleared X", "PyUnstable_AtExit X", "freed cycle", "sys-planted X", "POST");
#else
    EV_ORDER("state-dict cleared X", "freed cycle", "sys-planted X", "POST");
#endif
}

START_TEST(test_post_after_last_gc_main)
{
    harness_init();
    run(POST_CODE);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    check_post_order();
}
END_TEST

static void post_in_sub(int kind)
{
    harness_init();
    PyThreadState *main_ts = PyThreadState_Get();
    PyThreadState *sub = new_sub(kind);
    run(POST_CODE);
    Py_EndInterpreter(sub);
    ev_add("sub ended");
    check_post_order();
    EV_ORDER("POST", "sub ended");
    PyThreadState_Swap(main_ts);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
}

#define PARKED_PROBE_LOST "Probe type released after the last GC"

START_TEST(test_post_after_last_gc_sub_legacy)
{
    HARNESS_CPYTHON_LOSES(PARKED_PROBE_LOST);
    post_in_sub(SUB_LEGACY);
}
END_TEST

START_TEST(test_post_after_last_gc_sub_isolated)
{
#if PY_VERSION_HEX < 0x030C0000
    SKIP_TEST("isolated sub-interpreters exist from 3.12 on");
#else
    HARNESS_CPYTHON_LOSES(PARKED_PROBE_LOST);
    post_in_sub(SUB_ISOLATED);
#endif
}
END_TEST

/* During POST_SHUTDOWN the phase query answers POST_SHUTDOWN, and a lookup
   never re-creates the state dict (PyInterpreterState_GetDict would). */
static int phase_probe_cb(void *arg)
{
    (void)arg;
    ev_add("phase in POST: %s", pyfini_phase_name(pyfini_current_phase()));
    ev_add("register POST in POST: %d", pyfini_atexit(harness_record_cb, tag("late POST"),
                                                       PYFINI_POST_SHUTDOWN));
    ev_add("exception: %s", PyErr_ExceptionMatches(PyExc_RuntimeError) ? "RuntimeError" : "other");
    PyErr_Clear();
    return 0;
}

static int phase_probe_user_cb(void *arg)
{
    (void)arg;
    ev_add("phase in USER: %s", pyfini_phase_name(pyfini_current_phase()));
    return 0;
}

static int phase_probe_pre_cb(void *arg)
{
    (void)arg;
    ev_add("phase in PRE: %s", pyfini_phase_name(pyfini_current_phase()));
    return 0;
}

START_TEST(test_phase_query)
{
    harness_init();
    ck_assert_int_eq(pyfini_current_phase(), PYFINI_RUNNING);
    ck_assert_int_eq(pyfini_atexit(phase_probe_pre_cb, NULL, PYFINI_PRE_SHUTDOWN), 0);
    ck_assert_int_eq(pyfini_atexit(phase_probe_user_cb, NULL, PYFINI_USER), 0);
    ck_assert_int_eq(pyfini_atexit(phase_probe_cb, NULL, PYFINI_POST_SHUTDOWN), 0);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    EV_ORDER("phase in PRE: PYFINI_PRE_SHUTDOWN", "phase in USER: PYFINI_USER",
             "phase in POST: PYFINI_POST_SHUTDOWN", "register POST in POST: -1",
             "exception: RuntimeError");
    ck_assert_int_eq(ev_count("late POST"), 0);
    ck_assert_str_eq(pyfini_phase_name(PYFINI_RUNTIME_SHUTDOWN), "PYFINI_RUNTIME_SHUTDOWN");
    ck_assert_str_eq(pyfini_phase_name(42), "PYFINI_UNKNOWN_PHASE");
}
END_TEST

/* ---- PRE_SHUTDOWN: other threads still running --------------------------- */

START_TEST(test_pre_shutdown_threads_alive)
{
    harness_init();
    run("import threading, _pyfini_test as t\n"
        "ev = threading.Event()\n"
        "def worker():\n"
        "    ev.wait(30)\n"
        "    t.record('worker done')\n"
        "th = threading.Thread(target=worker); th.start()\n"
        "import builtins; builtins._pyfini_worker = (th, ev)\n");
    /* a PRE callback (Python may run) sees the non-daemon thread alive */
    run("import _pyfini_test as t\n"
        "t.register(1, 'PRE')\n"
        "def pre():\n"
        "    import builtins\n"
        "    th, ev = builtins._pyfini_worker\n"
        "    t.record('worker alive in PRE: %s' % th.is_alive())\n"
        "    ev.set()\n"
        "import threading; threading._register_atexit(pre)\n");
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    EV_ORDER("worker alive in PRE: True", "PRE", "worker done");
}
END_TEST

/* ---- scale: 1,000 callbacks per phase, one Py_AtExit slot ---------------- */

#define N_CB 1000
static int seq[5][N_CB];
static int seq_n[5];
static int args[5][N_CB];

static int seq_cb(void *arg)
{
    int *a = (int *)arg;
    int phase = (int)((a - &args[0][0]) / N_CB);
    seq[phase][seq_n[phase]++] = *a;
    return 0;
}

static int dummy_atexit_runs;
static void dummy_atexit(void) { dummy_atexit_runs++; }

START_TEST(test_thousand_per_phase_one_atexit_slot)
{
    harness_init();
    /* take 31 of CPython's 32 Py_AtExit slots: pyfini must fit in one */
    for (int i = 0; i < 31; i++) {
        ck_assert_int_eq(Py_AtExit(dummy_atexit), 0);
    }
    for (int p = 1; p <= 4; p++) {
        for (int i = 0; i < N_CB; i++) {
            args[p][i] = i;
            ck_assert_int_eq(pyfini_atexit(seq_cb, &args[p][i], (pyfini_phase)p), 0);
        }
    }
    /* a sub-interpreter's RUNTIME callbacks share the same slot */
    PyThreadState *main_ts = PyThreadState_Get();
    PyThreadState *sub = new_sub(SUB_LEGACY);
    ck_assert_int_eq(pyfini_atexit(harness_record_cb, tag("sub RUNTIME"), PYFINI_RUNTIME_SHUTDOWN), 0);
    Py_EndInterpreter(sub);
    PyThreadState_Swap(main_ts);
    /* all 32 slots are now taken */
    ck_assert_int_eq(Py_AtExit(dummy_atexit), -1);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    for (int p = 1; p <= 4; p++) {
        ck_assert_int_eq(seq_n[p], N_CB);
        for (int i = 0; i < N_CB; i++) {
            ck_assert_int_eq(seq[p][i], N_CB - 1 - i);   /* newest first */
        }
    }
    ck_assert_int_eq(dummy_atexit_runs, 31);
    ck_assert_int_eq(ev_count("sub RUNTIME"), 1);
}
END_TEST

/* ---- callbacks registering later phases ---------------------------------- */

static int later_phase[5] = {0, 1, 2, 3, 4};

static void expect_refused(int phase, const char *what)
{
    int rc = pyfini_atexit(harness_record_cb, tag("never"), (pyfini_phase)phase);
    if (rc != -1 || !PyErr_ExceptionMatches(PyExc_RuntimeError)) {
        ev_add("unexpected: %s (%s) accepted", what, pyfini_phase_name(phase));
    }
    PyErr_Clear();
}

static int chain_cb(void *arg)
{
    int phase = *(int *)arg;
    ev_add("chain in %s", pyfini_phase_name(phase));
    if (phase == PYFINI_RUNTIME_SHUTDOWN) {
        /* no thread state any more: -1, nothing registered, no crash */
        if (pyfini_atexit(harness_record_cb, tag("never"), PYFINI_RUNTIME_SHUTDOWN) != -1 ||
            pyfini_last_error() == NULL) {
            ev_add("unexpected: RUNTIME registration without a thread state");
        }
        return 0;
    }
    expect_refused(phase, "the running phase");
    if (phase > 1) {
        expect_refused(phase - 1, "an earlier phase");
    }
    if (pyfini_atexit(chain_cb, &later_phase[phase + 1], (pyfini_phase)(phase + 1)) != 0) {
        ev_add("unexpected: the next phase was refused");
        PyErr_Clear();
    }
    return 0;
}

START_TEST(test_register_later_phases_from_callbacks)
{
    static int pre = 1;
    harness_init();
    ck_assert_int_eq(pyfini_atexit(chain_cb, &pre, PYFINI_PRE_SHUTDOWN), 0);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    EV_ORDER("chain in PYFINI_PRE_SHUTDOWN", "chain in PYFINI_USER", "chain in PYFINI_POST_SHUTDOWN",
             "chain in PYFINI_RUNTIME_SHUTDOWN");
    ck_assert_msg(strstr(ev_text(), "unexpected") == NULL, "%s", ev_text());
    ck_assert_int_eq(ev_count("never"), 0);
}
END_TEST

/* ---- a USER registration while atexit runs is refused, never lost -------- */

START_TEST(test_user_registration_during_atexit)
{
    harness_init();
    run("import atexit, _pyfini_test as t\n"
        "def late():\n"
        "    try:\n"
        "        t.register(2, 'late USER')\n"
        "        t.record('accepted')\n"
        "    except RuntimeError as e:\n"
        "        t.record('refused: ' + str(e).split(':')[0])\n"
        "atexit.register(late)\n"          /* the oldest: runs last */
        "t.register(3, 'POST')\n");
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    if (ev_count("accepted") == 1) {
        EV_ORDER("accepted", "late USER", "POST");
    } else {
        ck_assert_msg(ev_count("refused: pyfini") == 1, "%s", ev_text());
        ck_assert_int_eq(ev_count("late USER"), 0);
    }
}
END_TEST

/* ---- registrations from teardown code (extension cleanup) ---------------- */

static void early_capsule_destructor(PyObject *cap)
{
    (void)cap;
    /* during the state-dict clear, before pyfini's own entry is released */
    ev_add("capsule: POST %d", pyfini_atexit(harness_record_cb, tag("POST from capsule"),
                                              PYFINI_POST_SHUTDOWN));
    PyErr_Clear();
    ev_add("capsule: USER %d", pyfini_atexit(harness_record_cb, tag("never"), PYFINI_USER));
    PyErr_Clear();
}

static void mfree_module_free(void *m)
{
    (void)m;
    ev_add("m_free: POST %d", pyfini_atexit(harness_record_cb, tag("POST from m_free"),
                                             PYFINI_POST_SHUTDOWN));
    PyErr_Clear();
}
static PyModuleDef_Slot mfree_slots[] = {
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL}};
static struct PyModuleDef mfree_module = {PyModuleDef_HEAD_INIT, "_pyfini_mfree", NULL, 0, NULL,
                                          mfree_slots, NULL, NULL, mfree_module_free};
static PyObject *init_mfree(void) { return PyModuleDef_Init(&mfree_module); }

static void teardown_registrations(int in_sub)
{
    PyImport_AppendInittab("_pyfini_mfree", init_mfree);
    harness_init();
    PyThreadState *main_ts = PyThreadState_Get();
    PyThreadState *sub = in_sub ? new_sub(SUB_LEGACY) : NULL;
    /* a capsule in the state dict BEFORE pyfini's registry */
    PyObject *cap = PyCapsule_New((void *)1, "pyfini.test.early", early_capsule_destructor);
    PyObject *d = PyInterpreterState_GetDict(PyInterpreterState_Get());
    ck_assert_int_eq(PyDict_SetItemString(d, "pyfini_test_early", cap), 0);
    Py_DECREF(cap);
    run("import sys, _pyfini_mfree, _pyfini_test as t\n"
        "t.watch_state_dict('X')\n"
        "class D:\n"
        "    def __del__(self, reg=t.register, rec=t.record):\n"
        "        try:\n"
        "            reg(3, 'POST from __del__')\n"
        "            rec('__del__: POST 0')\n"
        "        except Exception as e:\n"
        "            rec('__del__: POST failed %r' % e)\n"
        "sys._pyfini_test_d = D()\n"
        "p = t.Probe('cycle'); p.ref = p; t.park('_pyfini_test_cycle', p); del p\n");
    if (in_sub) {
        Py_EndInterpreter(sub);
        PyThreadState_Swap(main_ts);
        ev_add("sub ended");
    }
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    ck_assert_int_eq(ev_count("never"), 0);
    EV_ORDER("__del__: POST 0", "state-dict cleared X", "freed cycle", "POST from __del__");
    ck_assert_msg(ev_count("m_free: POST 0") == 1 && ev_count("capsule: POST 0") == 1 &&
                  ev_count("capsule: USER -1") == 1, "%s", ev_text());
    EV_ORDER("freed cycle", "POST from capsule");
    EV_ORDER("freed cycle", "POST from m_free");
}

START_TEST(test_post_registered_during_teardown_main) { teardown_registrations(0); }
END_TEST

START_TEST(test_post_registered_during_teardown_sub)
{
    HARNESS_CPYTHON_LOSES(PARKED_PROBE_LOST);
    teardown_registrations(1);
}
END_TEST

/* ---- first use from inside an atexit callback ------------------------------ */

START_TEST(test_first_use_inside_atexit)
{
    stderr_capture_begin();
    harness_init();
    run("import atexit, _pyfini_test as t\n"
        "def late():\n"
        "    for p, n in ((1, 'PRE'), (2, 'USER'), (3, 'POST')):\n"
        "        try:\n"
        "            t.register(p, 'late ' + n)\n"
        "            t.record('registered ' + n)\n"
        "        except RuntimeError:\n"
        "            t.record('refused ' + n)\n"
        "atexit.register(late)\n");
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    char *err = stderr_capture_end();
    /* PRE_SHUTDOWN is over: refused, or - when pyfini cannot tell (threading
       never imported) - reported as not run; never run late */
    ck_assert_msg(ev_count("late PRE") == 0, "PRE ran after its step:\n%s", ev_text());
    ck_assert_msg(ev_count("refused PRE") == 1 ||
                  strstr(err, "PYFINI_PRE_SHUTDOWN callback") != NULL, "%s\n%s", ev_text(), err);
    /* USER: runs (inside the atexit step) or is refused or reported - never silent */
    ck_assert_msg(ev_count("late USER") == 1 || ev_count("refused USER") == 1 ||
                  strstr(err, "PYFINI_USER callback") != NULL, "%s\n%s", ev_text(), err);
    EV_ORDER("registered POST", "late POST");
    free(err);
}
END_TEST

/* ---- repeated Py_Initialize / Py_FinalizeEx (4 loops, as _testembed) ----- */

START_TEST(test_init_fini_loops)
{
    for (int loop = 0; loop < 4; loop++) {
        char code[512];
        harness_init();
        snprintf(code, sizeof code,
                 "import _pyfini_test as t\n"
                 "for p, n in ((1, 'PRE'), (2, 'USER'), (3, 'POST'), (4, 'RUNTIME')):\n"
                 "    t.register(p, 'loop %d ' + n)\n", loop);
        run(code);
        ck_assert_int_eq(Py_FinalizeEx(), 0);
        ev_add("--- loop %d finalized", loop);
    }
    for (int loop = 0; loop < 4; loop++) {
        char a[64], b[64], c[64];
        snprintf(a, sizeof a, "loop %d PRE", loop);
        snprintf(b, sizeof b, "loop %d RUNTIME", loop);
        snprintf(c, sizeof c, "--- loop %d finalized", loop);
        EV_ORDER(a, b, c);
        ck_assert_int_eq(ev_count(b), 1);
    }
}
END_TEST

static Suite *phases_suite(void)
{
    Suite *s = suite_create("phases");
    TCase *tc = tcase_create("phases");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_order_main);
    tcase_add_test(tc, test_order_sub_legacy);
    tcase_add_test(tc, test_order_sub_isolated);
    tcase_add_test(tc, test_post_after_last_gc_main);
    tcase_add_test(tc, test_post_after_last_gc_sub_legacy);
    tcase_add_test(tc, test_post_after_last_gc_sub_isolated);
    tcase_add_test(tc, test_phase_query);
    tcase_add_test(tc, test_pre_shutdown_threads_alive);
    tcase_add_test(tc, test_thousand_per_phase_one_atexit_slot);
    tcase_add_test(tc, test_register_later_phases_from_callbacks);
    tcase_add_test(tc, test_init_fini_loops);
    tcase_add_test(tc, test_user_registration_during_atexit);
    tcase_add_test(tc, test_post_registered_during_teardown_main);
    tcase_add_test(tc, test_post_registered_during_teardown_sub);
    tcase_add_test(tc, test_first_use_inside_atexit);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return run_suite(phases_suite()); }
