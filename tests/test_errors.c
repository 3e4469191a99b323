/* tests/test_errors.c - failing callbacks, misuse, cancel, allocation
 * failure, and pyfini's own memory (every record it allocates is freed).
 * Each test is its own process.
 */
#include <Python.h>
#include <check.h>

/* Count pyfini's own allocations, and fail them on demand. */
static long alloc_live;       /* records alive */
static long alloc_fail_in = -1;  /* fail the N-th next allocation (0 = next), -1 never */
static void *counting_calloc(size_t n, size_t size)
{
    if (alloc_fail_in == 0) {
        alloc_fail_in = -1;
        return NULL;
    }
    if (alloc_fail_in > 0) {
        alloc_fail_in--;
    }
    void *p = calloc(n, size);
    if (p != NULL) {
        alloc_live++;
    }
    return p;
}
static void counting_free(void *p)
{
    if (p != NULL) {
        alloc_live--;
    }
    free(p);
}
#define PYFINI_CALLOC(n, size) counting_calloc((n), (size))
#define PYFINI_FREE(p) counting_free(p)
#include "pyfini.h"
#include "harness.h"

int failing_cb(void *arg);
int failing_cb(void *arg)
{
    ev_add("failing %s", (const char *)arg);
    return -1;
}

int raising_cb(void *arg);
int raising_cb(void *arg)
{
    ev_add("raising %s", (const char *)arg);
    PyErr_SetString(PyExc_ValueError, "boom from the test");
    return -1;
}

int raising_but_zero_cb(void *arg);
int raising_but_zero_cb(void *arg)
{
    ev_add("raising-0 %s", (const char *)arg);
    PyErr_SetString(PyExc_KeyError, "left set");
    return 0;
}

/* ---- failures are reported once; the rest still runs -------------------- */

static void register_failures(const char *who)
{
    char t[64];
    for (int p = 1; p <= 4; p++) {
        snprintf(t, sizeof t, "%s ok-before %d", who, p);
        ck_assert_int_eq(pyfini_atexit(harness_record_cb, tag(t), (pyfini_phase)p), 0);
        snprintf(t, sizeof t, "%s %d", who, p);
        ck_assert_int_eq(pyfini_atexit(failing_cb, tag(t), (pyfini_phase)p), 0);
        snprintf(t, sizeof t, "%s ok-after %d", who, p);
        ck_assert_int_eq(pyfini_atexit(harness_record_cb, tag(t), (pyfini_phase)p), 0);
    }
    for (int p = 1; p <= 2; p++) {
        snprintf(t, sizeof t, "%s %d", who, p);
        ck_assert_int_eq(pyfini_atexit(raising_cb, tag(t), (pyfini_phase)p), 0);
        ck_assert_int_eq(pyfini_atexit(raising_but_zero_cb, tag(t), (pyfini_phase)p), 0);
    }
}

START_TEST(test_failures_reported_once)
{
    stderr_capture_begin();
    harness_init();
    register_failures("main");
    PyThreadState *main_ts = PyThreadState_Get();
    PyThreadState *sub = new_sub(SUB_LEGACY);
    long long sub_id = PyInterpreterState_GetID(PyInterpreterState_Get());
    register_failures("sub");
    Py_EndInterpreter(sub);
    PyThreadState_Swap(main_ts);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    char *err = stderr_capture_end();
    /* every callback ran, failing ones included */
    for (int p = 1; p <= 4; p++) {
        char a[64], b[64], c[64];
        snprintf(a, sizeof a, "sub ok-after %d", p);
        snprintf(b, sizeof b, "failing sub %d", p);
        snprintf(c, sizeof c, "sub ok-before %d", p);
        EV_ORDER(a, b, c);
        snprintf(a, sizeof a, "main ok-after %d", p);
        snprintf(b, sizeof b, "failing main %d", p);
        snprintf(c, sizeof c, "main ok-before %d", p);
        EV_ORDER(a, b, c);
    }
    /* one report per failure: 4 phases x 2 interpreters returning -1,
       2 phases x 2 interpreters raising, 2 x 2 leaving an exception set */
    ck_assert_int_eq(count_substr(err, "pyfini: callback "), 16);
    ck_assert_int_eq(count_substr(err, "(failing_cb in "), 8);
    ck_assert_int_eq(count_substr(err, "(raising_cb in "), 4);
    ck_assert_int_eq(count_substr(err, "raised ValueError: boom from the test"), 4);
    ck_assert_int_eq(count_substr(err, "raised KeyError: 'left set'"), 4);
    char want[128];
    snprintf(want, sizeof want, "failed in phase PYFINI_PRE_SHUTDOWN of interpreter %lld", sub_id);
    ck_assert_msg(count_substr(err, want) == 3, "missing '%s' in:\n%s", want, err);
    ck_assert_int_eq(count_substr(err, "failed in phase PYFINI_POST_SHUTDOWN of interpreter 0"), 1);
    ck_assert_int_eq(count_substr(err, "failed in phase PYFINI_RUNTIME_SHUTDOWN of the process"), 2);
    /* no duplicate report by atexit or threading themselves */
    ck_assert_msg(strstr(err, "Traceback") == NULL && strstr(err, "Exception ignored") == NULL,
                  "unexpected extra report:\n%s", err);
    free(err);
}
END_TEST

/* ---- misuse ---------------------------------------------------------------- */

START_TEST(test_misuse)
{
    harness_init();
    ck_assert_int_eq(pyfini_atexit(NULL, NULL, PYFINI_USER), -1);
    ck_assert(PyErr_ExceptionMatches(PyExc_TypeError));
    PyErr_Clear();
    ck_assert_int_eq(pyfini_atexit(harness_record_cb, NULL, (pyfini_phase)0), -1);
    ck_assert(PyErr_ExceptionMatches(PyExc_ValueError));
    PyErr_Clear();
    ck_assert_int_eq(pyfini_atexit(harness_record_cb, NULL, (pyfini_phase)5), -1);
    ck_assert(PyErr_ExceptionMatches(PyExc_ValueError));
    PyErr_Clear();
    ck_assert_int_eq(pyfini_atexit_cancel(NULL, NULL, PYFINI_USER), -1);
    ck_assert(PyErr_ExceptionMatches(PyExc_TypeError));
    PyErr_Clear();
    ck_assert_int_eq(pyfini_atexit_cancel(harness_record_cb, NULL, (pyfini_phase)-3), -1);
    ck_assert(PyErr_ExceptionMatches(PyExc_ValueError));
    PyErr_Clear();

    /* no thread state: -1, nothing registered, no exception, a message */
    PyThreadState *ts = PyEval_SaveThread();
    ck_assert_int_eq(pyfini_atexit(harness_record_cb, tag("no tstate"), PYFINI_USER), -1);
    ck_assert_ptr_nonnull(pyfini_last_error());
    ck_assert_msg(strstr(pyfini_last_error(), "no thread state") != NULL, "%s", pyfini_last_error());
    ck_assert_int_eq(pyfini_atexit(harness_record_cb, tag("no tstate"), PYFINI_RUNTIME_SHUTDOWN), -1);
    ck_assert_int_eq(pyfini_atexit_cancel(harness_record_cb, tag("no tstate"), PYFINI_USER), -1);
    ck_assert_int_eq(pyfini_current_phase(), -1);
    PyEval_RestoreThread(ts);
    ck_assert(!PyErr_Occurred());

    /* an unrelated object under the registry key */
    PyObject *d = PyInterpreterState_GetDict(PyInterpreterState_Get());
    ck_assert_int_eq(PyDict_SetItemString(d, PYFINI_REGISTRY_KEY, Py_None), 0);
    ck_assert_int_eq(pyfini_atexit(harness_record_cb, tag("bad key"), PYFINI_USER), -1);
    ck_assert(PyErr_ExceptionMatches(PyExc_RuntimeError));
    PyErr_Clear();
    ck_assert_int_eq(PyDict_DelItemString(d, PYFINI_REGISTRY_KEY), 0);

    ck_assert_int_eq(Py_FinalizeEx(), 0);
    /* after finalization: no thread state */
    ck_assert_int_eq(pyfini_atexit(harness_record_cb, tag("after"), PYFINI_USER), -1);
    ck_assert_int_eq(pyfini_atexit(harness_record_cb, tag("after"), PYFINI_RUNTIME_SHUTDOWN), -1);
    ck_assert_int_eq(ev_count("no tstate") + ev_count("after") + ev_count("bad key"), 0);
    ck_assert_int_eq(alloc_live, 0);
}
END_TEST

/* ---- allocation failure: MemoryError, earlier registrations intact ------- */

START_TEST(test_allocation_failure)
{
    harness_init();
    for (int p = 1; p <= 4; p++) {
        char t[32];
        snprintf(t, sizeof t, "kept %d", p);
        ck_assert_int_eq(pyfini_atexit(harness_record_cb, tag(t), (pyfini_phase)p), 0);
        alloc_fail_in = 0;
        ck_assert_int_eq(pyfini_atexit(harness_record_cb, tag("lost"), (pyfini_phase)p), -1);
        ck_assert(PyErr_ExceptionMatches(PyExc_MemoryError));
        PyErr_Clear();
    }
    /* failure while creating the registry of a new sub-interpreter */
    PyThreadState *main_ts = PyThreadState_Get();
    PyThreadState *sub = new_sub(SUB_LEGACY);
    alloc_fail_in = 0;
    ck_assert_int_eq(pyfini_atexit(harness_record_cb, tag("lost"), PYFINI_POST_SHUTDOWN), -1);
    ck_assert(PyErr_ExceptionMatches(PyExc_MemoryError));
    PyErr_Clear();
    ck_assert_int_eq(pyfini_atexit(harness_record_cb, tag("sub kept"), PYFINI_POST_SHUTDOWN), 0);
    Py_EndInterpreter(sub);
    PyThreadState_Swap(main_ts);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    EV_ORDER("sub kept", "kept 1", "kept 2", "kept 3", "kept 4");
    ck_assert_int_eq(ev_count("lost"), 0);
    ck_assert_int_eq(alloc_live, 0);
}
END_TEST

/* ---- cancel ----------------------------------------------------------------- */

static int canceller_cb(void *arg)
{
    int phase = *(int *)arg;
    char t[64];
    snprintf(t, sizeof t, "victim %d", phase);
    int r = pyfini_atexit_cancel(harness_record_cb, tag(t), (pyfini_phase)phase);
    ev_add("cancel from %s: %d", pyfini_phase_name(phase), r);
    return 0;
}

START_TEST(test_cancel)
{
    static int phases[5] = {0, 1, 2, 3, 4};
    harness_init();
    for (int p = 1; p <= 4; p++) {
        char t[64];
        /* cancelled before finalization */
        snprintf(t, sizeof t, "cancelled %d", p);
        ck_assert_int_eq(pyfini_atexit(harness_record_cb, tag(t), (pyfini_phase)p), 0);
        ck_assert_int_eq(pyfini_atexit(harness_record_cb, tag(t), (pyfini_phase)p), 0);
        ck_assert_int_eq(pyfini_atexit_cancel(harness_record_cb, tag(t), (pyfini_phase)p), 1);
        /* registered twice: one stays */
        ck_assert_int_eq(pyfini_atexit_cancel(harness_record_cb, tag("never registered"),
                                              (pyfini_phase)p), 0);
        /* cancelled from inside a callback of the same phase, which runs first */
        snprintf(t, sizeof t, "victim %d", p);
        ck_assert_int_eq(pyfini_atexit(harness_record_cb, tag(t), (pyfini_phase)p), 0);
        ck_assert_int_eq(pyfini_atexit(canceller_cb, &phases[p], (pyfini_phase)p), 0);
    }
    /* a USER cancel really leaves atexit: atexit drops its callable, which
       frees pyfini's record at once */
    ck_assert_int_eq(pyfini_atexit(harness_record_cb, tag("gone"), PYFINI_USER), 0);
    long live = alloc_live;
    ck_assert_int_eq(pyfini_atexit_cancel(harness_record_cb, tag("gone"), PYFINI_USER), 1);
    ck_assert_int_eq(alloc_live, live - 1);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    for (int p = 1; p <= 4; p++) {
        char t[64];
        snprintf(t, sizeof t, "cancelled %d", p);
        ck_assert_int_eq(ev_count(t), 1);
        snprintf(t, sizeof t, "victim %d", p);
        ck_assert_msg(ev_count(t) == 0, "%s ran:\n%s", t, ev_text());
        snprintf(t, sizeof t, "cancel from %s: 1", pyfini_phase_name(p));
        ck_assert_msg(ev_count(t) == 1, "missing '%s':\n%s", t, ev_text());
    }
    ck_assert_int_eq(ev_count("gone"), 0);
    ck_assert_int_eq(alloc_live, 0);
}
END_TEST

/* ---- a callback leaving the GIL state as it found it ----------------------- */

START_TEST(test_no_loss_sub_cycles)
{
    /* pyfini's own records are all freed, for every interpreter kind */
    harness_init();
    PyThreadState *main_ts = PyThreadState_Get();
    int n = test_cycles(20, 4);
    for (int i = 0; i < n; i++) {
        PyThreadState *sub = new_sub(i % 2 ? SUB_ISOLATED : SUB_LEGACY);
        if (sub == NULL) {
            sub = new_sub(SUB_LEGACY);
        }
        for (int p = 1; p <= 3; p++) {
            ck_assert_int_eq(pyfini_atexit(harness_record_cb, tag("cycle"), (pyfini_phase)p), 0);
        }
        Py_EndInterpreter(sub);
        PyThreadState_Swap(main_ts);
    }
    ck_assert_int_eq(ev_count("cycle"), 3 * n);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    ck_assert_int_eq(alloc_live, 0);
}
END_TEST

static Suite *errors_suite(void)
{
    Suite *s = suite_create("errors");
    TCase *tc = tcase_create("errors");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_failures_reported_once);
    tcase_add_test(tc, test_misuse);
    tcase_add_test(tc, test_allocation_failure);
    tcase_add_test(tc, test_cancel);
    tcase_add_test(tc, test_no_loss_sub_cycles);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return run_suite(errors_suite()); }
