/* tests/test_threads.c - pyfini under concurrency, with exact counts.
 *
 * test_isolated_interpreters_in_threads: 8 threads, each creating, using
 * (callbacks in all four phases, two states, tracking) and ending its own
 * isolated interpreter with its own GIL (CPython 3.12+; 3.11: legacy
 * sub-interpreters sharing the one GIL), over and over for
 * PYFINI_THREADS_SECONDS seconds (default 3; `make stress` runs 60).
 * test_race_first_calls: 8 threads of one interpreter racing its first
 * pyfini_state() and pyfini_atexit() calls, in a fresh interpreter each round
 * (the main one, then isolated sub-interpreters with their own GIL).
 * Exact: every callback ran exactly once, every init once per interpreter,
 * every clear once, every record pyfini allocated freed.
 * Each test is its own process.
 */
#include <Python.h>
#include <check.h>
#include <stdatomic.h>
#include <time.h>

/* pyfini's allocations, counted across threads */
static atomic_long alloc_live;
static void *counting_calloc(size_t n, size_t size)
{
    void *p = calloc(n, size);
    if (p != NULL) {
        atomic_fetch_add(&alloc_live, 1);
    }
    return p;
}
static void counting_free(void *p)
{
    if (p != NULL) {
        atomic_fetch_sub(&alloc_live, 1);
    }
    free(p);
}
#define PYFINI_CALLOC(n, size) counting_calloc((n), (size))
#define PYFINI_FREE(p) counting_free(p)
#include "pyfini.h"
#include "harness.h"

#define NTHREADS 8

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double run_seconds(void)
{
    const char *e = getenv("PYFINI_THREADS_SECONDS");
    double s = e ? atof(e) : 3.0;
    return s > 0 ? s : 3.0;
}

/* ---- the slots: one per registration, counting its runs ------------------ */

#define NSLOTS (1 << 20)
static atomic_int slot_runs[NSLOTS];
static atomic_int slot_phase_ok[NSLOTS];
static atomic_long slots_used;
static atomic_long runs_by_phase[5];

/* The callback of every phase: counts its run and checks the phase it runs in
   (PRE/USER/POST through pyfini_current_phase(); RUNTIME has no thread state). */
int count_cb(void *arg);
int count_cb(void *arg)
{
    atomic_int *slot = (atomic_int *)arg;
    long i = slot - slot_runs;
    int p = (int)(i % 4) + 1;   /* slot i is registered for phase i % 4 + 1 */
    atomic_fetch_add(slot, 1);
    atomic_fetch_add(&runs_by_phase[p], 1);
    int cur = p == PYFINI_RUNTIME_SHUTDOWN ? p : pyfini_current_phase();
    if (cur == p) {
        atomic_fetch_add(&slot_phase_ok[i], 1);
    }
    return 0;
}

/* Register count_cb for phase p with a fresh slot (slot index = p - 1 mod 4). */
static int register_counted(int p)
{
    for (;;) {
        long i = atomic_load(&slots_used);
        if ((int)(i % 4) + 1 == p) {
            if (atomic_compare_exchange_weak(&slots_used, &i, i + 1)) {
                ck_assert_msg(i < NSLOTS, "more than %d registrations", NSLOTS);
                return pyfini_atexit(count_cb, &slot_runs[i], (pyfini_phase)p);
            }
        } else if (atomic_compare_exchange_weak(&slots_used, &i, i + 1)) {
            /* a slot of another phase, unused: mark it so the check skips it */
            atomic_store(&slot_runs[i], -1000);
        }
    }
}

static void check_slots(void)
{
    long n = atomic_load(&slots_used), used = 0;
    for (long i = 0; i < n; i++) {
        int r = atomic_load(&slot_runs[i]);
        if (r == -1000) {
            continue;
        }
        used++;
        ck_assert_msg(r == 1, "registration %ld (phase %ld) ran %d times", i, i % 4 + 1, r);
        ck_assert_msg(atomic_load(&slot_phase_ok[i]) == 1, "registration %ld ran outside phase %ld",
                      i, i % 4 + 1);
    }
    printf("NOTE %ld registrations, each ran exactly once (PRE %ld, USER %ld, POST %ld, RUNTIME %ld)\n",
           used, atomic_load(&runs_by_phase[1]), atomic_load(&runs_by_phase[2]),
           atomic_load(&runs_by_phase[3]), atomic_load(&runs_by_phase[4]));
}

/* ---- two states ----------------------------------------------------------- */

typedef struct {
    int64_t interp_id;
    int inits;
    PyObject *obj;   /* owned; released by clear */
} st_t;

static atomic_long inits_a, clears_a, inits_b, clears_b;

static int init_a(void *s)
{
    st_t *st = (st_t *)s;
    st->interp_id = PyInterpreterState_GetID(PyInterpreterState_Get());
    st->inits++;
    st->obj = PyList_New(0);
    atomic_fetch_add(&inits_a, 1);
    return st->obj ? 0 : -1;
}
static void clear_a(void *s)
{
    st_t *st = (st_t *)s;
    ck_assert_int_eq(st->inits, 1);
    Py_CLEAR(st->obj);
    atomic_fetch_add(&clears_a, 1);
}
static const pyfini_state_def def_a = {"pyfini.test.threads.a", sizeof(st_t), init_a, clear_a};

static const pyfini_state_def def_b;
static int init_b(void *s)
{
    st_t *st = (st_t *)s;
    st->interp_id = PyInterpreterState_GetID(PyInterpreterState_Get());
    st->inits++;
    /* a state made inside another's init */
    if (pyfini_state(&def_a) == NULL) {
        return -1;
    }
    atomic_fetch_add(&inits_b, 1);
    return 0;
}
static void clear_b(void *s)
{
    ck_assert_int_eq(((st_t *)s)->inits, 1);
    atomic_fetch_add(&clears_b, 1);
}
static const pyfini_state_def def_b = {"pyfini.test.threads.b", sizeof(st_t), init_b, clear_b};

/* In the current interpreter: both states, both the same on a second call,
   and two tracked objects (an instance and its heap type) that die before
   POST_SHUTDOWN, so no leak is reported. */
static int use_states(void)
{
    int64_t id = PyInterpreterState_GetID(PyInterpreterState_Get());
    st_t *b = (st_t *)pyfini_state(&def_b);
    st_t *a = (st_t *)pyfini_state(&def_a);
    if (a == NULL || b == NULL) {
        return -1;
    }
    if (a->interp_id != id || b->interp_id != id || pyfini_state(&def_a) != a ||
        pyfini_state_find(&def_b) != b || a->inits != 1 || b->inits != 1) {
        PyErr_SetString(PyExc_AssertionError, "wrong state for this interpreter");
        return -1;
    }
    PyObject *g = PyDict_New();
    if (g == NULL) {
        return -1;
    }
    PyObject *r = PyRun_String("class Tracked: pass\nobj = Tracked()\n", Py_file_input, g, g);
    Py_XDECREF(r);
    PyObject *obj = r ? PyDict_GetItemString(g, "obj") : NULL;
    PyObject *type = r ? PyDict_GetItemString(g, "Tracked") : NULL;
    int rc = (obj && type && pyfini_track(&def_a, obj) == 0 && pyfini_track(&def_b, type) == 0 &&
              PyList_Append(a->obj, Py_None) == 0)
                 ? 0
                 : -1;
    Py_DECREF(g);
    return rc;
}

/* Register one counted callback in each of the four phases. */
static int register_all_phases(void)
{
    for (int p = 1; p <= 4; p++) {
        if (register_counted(p) < 0) {
            return -1;
        }
    }
    return 0;
}

/* ---- 8 threads, each with its own isolated interpreters ------------------ */

static double deadline;
static atomic_long cycles_done;
static atomic_int thread_failed;
static char fail_msg[512];

static void thread_fail(const char *what)
{
    if (atomic_exchange(&thread_failed, 1) == 0) {
        snprintf(fail_msg, sizeof fail_msg, "%s, %.2f s before the deadline, after %ld cycles: %s",
                 what, deadline - now_s(), atomic_load(&cycles_done),
                 pyfini_last_error() ? pyfini_last_error() : "(no pyfini error)");
    }
}

/* 3.12+: an isolated interpreter with its own GIL, made by a thread without
   a thread state. 3.11 has no own GIL: a legacy sub-interpreter made while
   the thread holds the one GIL (PyGILState_Ensure). */
#if PY_VERSION_HEX >= 0x030C0000
#  define WORKER_KIND INTERP_ISOLATED
#else
#  define WORKER_KIND INTERP_LEGACY
#endif

/* CPython 3.12.1 and 3.13.0 now and then fail the creation of isolated
   interpreters on several threads at once ("Failed to import encodings
   module"; a BufferedReader method applied to a FileIO) - shown without
   pyfini by tools/repro/own-gil-concurrent-create.c, docs/reliability.md;
   pybind11 creates them one at a time before 3.13. On 3.12.x and
   3.13.0-3.13.1 the workers create their interpreters one at a time; all
   the rest (pyfini's registrations, states, tracking, the interpreters'
   ends) stays concurrent. pyfini runs no code of its own during a creation
   but its audit hook's name compare. Decided at run time (Py_Version). */
static pthread_mutex_t creation_lock = PTHREAD_MUTEX_INITIALIZER;
static int creation_serialized(void)
{
    unsigned long v = (unsigned long)Py_Version;
    return v >= 0x030C0000UL && v < 0x030D02F0UL;
}

static void *interp_worker(void *unused)
{
    (void)unused;
    long mine = 0;
    do {
#if PY_VERSION_HEX < 0x030C0000
        PyGILState_STATE g = PyGILState_Ensure();
        PyThreadState *outer = PyThreadState_Get();
#endif
        PyThreadState *ts = NULL;
        int one_at_a_time = creation_serialized();
        if (one_at_a_time) {
            pthread_mutex_lock(&creation_lock);
        }
        PyStatus st = interp_config_create(&interp_configs[WORKER_KIND], &ts);
        if (one_at_a_time) {
            pthread_mutex_unlock(&creation_lock);
        }
        if (PyStatus_Exception(st) || ts == NULL) {
            char what[256];
            snprintf(what, sizeof what, "creating the interpreter failed (%s: %s, exitcode %d)",
                     st.func ? st.func : "no function", st.err_msg ? st.err_msg : "no message",
                     st.exitcode);
            thread_fail(what);
            break;
        }
        if (register_all_phases() < 0 || use_states() < 0) {
            PyErr_Print();
            thread_fail("use in the interpreter failed");
        }
        Py_EndInterpreter(ts);
#if PY_VERSION_HEX < 0x030C0000
        PyThreadState_Swap(outer);
        PyGILState_Release(g);
#endif
        mine++;
        atomic_fetch_add(&cycles_done, 1);
    } while (now_s() < deadline && !atomic_load(&thread_failed));
    return (void *)mine;
}

START_TEST(test_isolated_interpreters_in_threads)
{
    double secs = run_seconds();
    stderr_capture_begin();
    harness_init();
    /* the main interpreter uses pyfini too */
    ck_assert_int_eq(register_all_phases(), 0);
    ck_assert_int_eq(use_states(), 0);
    PyThreadState *main_ts = PyEval_SaveThread();
    double t0 = now_s();
    deadline = t0 + secs;
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        ck_assert_int_eq(pthread_create(&th[i], NULL, interp_worker, NULL), 0);
    }
    long min_cycles = -1, max_cycles = 0;
    for (int i = 0; i < NTHREADS; i++) {
        void *r;
        pthread_join(th[i], &r);
        long c = (long)r;
        min_cycles = (min_cycles < 0 || c < min_cycles) ? c : min_cycles;
        max_cycles = c > max_cycles ? c : max_cycles;
    }
    double took = now_s() - t0;
    PyEval_RestoreThread(main_ts);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    char *err = stderr_capture_end();
    ck_assert_msg(!atomic_load(&thread_failed), "%s\nstderr:\n%s", fail_msg, err);
    long n = atomic_load(&cycles_done) + 1;   /* + the main interpreter */
    ck_assert_int_eq(atomic_load(&inits_a), n);
    ck_assert_int_eq(atomic_load(&inits_b), n);
    ck_assert_int_eq(atomic_load(&clears_a), n);
    ck_assert_int_eq(atomic_load(&clears_b), n);
    for (int p = 1; p <= 4; p++) {
        ck_assert_msg(atomic_load(&runs_by_phase[p]) == n, "phase %d: %ld runs for %ld interpreters", p,
                      atomic_load(&runs_by_phase[p]), n);
    }
    check_slots();
    ck_assert_msg(strstr(err, "pyfini:") == NULL, "pyfini reported:\n%.4000s", err);
    ck_assert_int_eq(atomic_load(&alloc_live), 0);
    printf("NOTE %s on CPython %s: threads: %d, %.1f s, %ld %s created and ended (%ld-%ld per "
           "thread)\n",
           __func__, py_version(), NTHREADS, took, n - 1,
           WORKER_KIND == INTERP_ISOLATED ? "isolated interpreters with their own GIL"
                                          : "legacy sub-interpreters (3.11: one shared GIL)",
           min_cycles, max_cycles);
    if (creation_serialized()) {
        printf("NOTE %s on CPython %s: the interpreters were created one at a time (CPython's own "
               "creations race: tools/repro/own-gil-concurrent-create.c); used and ended "
               "concurrently\n",
               __func__, py_version());
    }
    free(err);
}
END_TEST

/* ---- 8 threads of one interpreter racing its first pyfini calls ---------- */

static pthread_barrier_t barrier;
static PyInterpreterState *race_interp;
static void *race_seen[NTHREADS];
static int race_rc[NTHREADS];

static void *racer(void *arg)
{
    long i = (long)arg;
    PyThreadState *ts = PyThreadState_New(race_interp);
    pthread_barrier_wait(&barrier);
    PyEval_RestoreThread(ts);
    if (i % 2 == 0) {
        race_rc[i] = register_counted((int)(i / 2) % 4 + 1);
        race_seen[i] = pyfini_state(&def_b);
    } else {
        race_seen[i] = pyfini_state(&def_b);
        race_rc[i] = register_counted((int)(i / 2) % 4 + 1);
    }
    if (race_seen[i] == NULL || race_rc[i] < 0) {
        PyErr_Print();
    }
    PyThreadState_Clear(ts);
    PyThreadState_DeleteCurrent();
    return NULL;
}

/* 8 threads attach to the current interpreter at once and race. */
static void race_round(void)
{
    race_interp = PyInterpreterState_Get();
    PyThreadState *mine = PyEval_SaveThread();
    pthread_t th[NTHREADS];
    pthread_barrier_init(&barrier, NULL, NTHREADS);
    for (long i = 0; i < NTHREADS; i++) {
        ck_assert_int_eq(pthread_create(&th[i], NULL, racer, (void *)i), 0);
    }
    for (int i = 0; i < NTHREADS; i++) {
        pthread_join(th[i], NULL);
    }
    pthread_barrier_destroy(&barrier);
    PyEval_RestoreThread(mine);
    for (int i = 0; i < NTHREADS; i++) {
        ck_assert_int_eq(race_rc[i], 0);
        ck_assert_ptr_nonnull(race_seen[i]);
        ck_assert_ptr_eq(race_seen[i], race_seen[0]);
    }
    ck_assert_ptr_eq(pyfini_state(&def_b), race_seen[0]);
}

START_TEST(test_race_first_calls)
{
    double secs = run_seconds() / 3;   /* a third of the time of the test above */
    stderr_capture_begin();
    harness_init();
    race_round();
    long rounds = 1;
    double t0 = now_s();
    PyThreadState *main_ts = PyThreadState_Get();
    do {
        /* 3.11: legacy sub-interpreters, the racers share the one GIL */
        PyThreadState *ts = new_sub(WORKER_KIND == INTERP_ISOLATED ? SUB_ISOLATED : SUB_LEGACY);
        race_round();
        Py_EndInterpreter(ts);
        PyThreadState_Swap(main_ts);
        rounds++;
    } while (now_s() < t0 + secs);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    char *err = stderr_capture_end();
    ck_assert_int_eq(atomic_load(&inits_b), rounds);
    ck_assert_int_eq(atomic_load(&inits_a), rounds);
    ck_assert_int_eq(atomic_load(&clears_b), rounds);
    ck_assert_int_eq(atomic_load(&clears_a), rounds);
    for (int p = 1; p <= 4; p++) {
        ck_assert_int_eq(atomic_load(&runs_by_phase[p]), 2 * rounds);
    }
    check_slots();
    ck_assert_msg(strstr(err, "pyfini:") == NULL, "pyfini reported:\n%.4000s", err);
    ck_assert_int_eq(atomic_load(&alloc_live), 0);
    printf("NOTE %s on CPython %s: threads: %d, %ld rounds (the main interpreter, then %s), %.1f s\n",
           __func__, py_version(), NTHREADS, rounds,
           WORKER_KIND == INTERP_ISOLATED ? "isolated ones with their own GIL" : "legacy ones",
           now_s() - t0);
    free(err);
}
END_TEST

/* ---- a crash in a test process prints every thread's stack -------------- */

/* tests/harness.h (PYFINI_TEST_GDB=1, which tools/run-tests sets): a thread
   test that crashed once on a CI machine must say where. A child with a
   second thread raises SIGSEGV in a named function; its report must name
   that function and both threads, and it must still die of SIGSEGV. */
#ifndef HARNESS_SANITIZED
static void *parked_thread(void *unused)
{
    (void)unused;
    pause();
    return NULL;
}

__attribute__((noinline)) void crash_here_for_the_report(void);
__attribute__((noinline)) void crash_here_for_the_report(void)
{
    raise(SIGSEGV);
    __asm__ volatile("");   /* not a tail call: this frame stays on the stack */
}

/* run_in_child's child: the report goes to stdout, so stdout joins stderr
   in the pipe */
static void crash_child(void)
{
    dup2(2, 1);
    setenv("PYFINI_TEST_GDB", "1", 1);
    harness_crash_reports();
    pthread_t th;
    if (pthread_create(&th, NULL, parked_thread, NULL) != 0) {
        _exit(3);
    }
    crash_here_for_the_report();
    _exit(4);
}
#endif

START_TEST(test_crash_report_names_every_thread)
{
#ifdef HARNESS_SANITIZED
    printf("SKIP %s on CPython %s: sanitizer builds print their own crash reports\n", __func__,
           PY_VERSION);
#else
    if (system("command -v gdb >/dev/null 2>&1") != 0) {
        printf("SKIP %s on CPython %s: no gdb on this machine (tools/install-deps installs it)\n",
               __func__, PY_VERSION);
        return;
    }
    static char out[1 << 16];
    int status = run_in_child(crash_child, out, sizeof out);
    size_t len = strlen(out);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV,
                  "the child did not die of SIGSEGV (status %#x):\n%s", status, out);
    if (strstr(out, "ptrace: Operation not permitted") != NULL) {
        printf("SKIP %s on CPython %s: this machine does not let gdb attach (ptrace refused: a "
               "container without CAP_SYS_PTRACE, or Yama's ptrace_scope 2 or 3)\n", __func__,
               PY_VERSION);
        return;
    }
    ck_assert_msg(strstr(out, "*** fatal signal in test process") != NULL &&
                      strstr(out, "crash_here_for_the_report") != NULL &&
                      strstr(out, "parked_thread") != NULL && strstr(out, "Thread 2") != NULL,
                  "the crash report does not name both threads' stacks:\n%.4000s", out);
    printf("NOTE %s (CPython %s build): a crash prints its threads' stacks through gdb (%zu "
           "bytes)\n", __func__, PY_VERSION, len);
#endif
}
END_TEST

static Suite *threads_suite(void)
{
    Suite *s = suite_create("threads");
    TCase *tc = tcase_create("threads");
    tcase_set_timeout(tc, 60 + 3 * run_seconds());
    tcase_add_test(tc, test_isolated_interpreters_in_threads);
    tcase_add_test(tc, test_race_first_calls);
    tcase_add_test(tc, test_crash_report_names_every_thread);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return run_suite(threads_suite()); }
