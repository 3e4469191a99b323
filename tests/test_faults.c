/* tests/test_faults.c - fault injection: every allocation pyfini makes fails
 * in turn, during registration, cancel, state creation, tracking, phase
 * dispatch and leak reporting.
 *
 * Each walk runs one operation again and again; run k fails the k-th
 * allocation the operation reaches (pyfini's own records through
 * PYFINI_CALLOC, its Python objects and allocating CPython calls through the
 * test-build hook PYFINI_TEST_FAULTS, include/pyfini.h section 1), until a
 * run reaches no k-th allocation. Each run asserts: the documented error
 * (MemoryError, -1 / NULL, pyfini_last_error() says so) or success; every
 * registration made before it runs exactly once; the new one at most once
 * (exactly once if it succeeded); pyfini's records all freed; no crash.
 * Sub-interpreter operations run in one process, one legacy sub-interpreter
 * per run; main-interpreter ones fork a process per run (Py_FinalizeEx).
 * Prints "N fault sites walked" per operation (docs/reliability.md).
 */
#include <Python.h>
#include <check.h>
#include <sys/resource.h>
#include <time.h>

/* ---- the fault hook and the counting allocator ------------------------------ */

static long fault_at = -1;        /* fail the allocation reached as the fault_at-th; -1 never */
static long fault_reached;        /* allocations reached since armed */
static const char *fault_site;    /* the site failed, or NULL */
static long alloc_live;           /* pyfini's records alive */

static int fault_now(const char *site)
{
    if (fault_at < 0 || ++fault_reached < fault_at) {
        return 0;
    }
    fault_at = -1;
    fault_site = site;
    return 1;
}
static void *counting_calloc(size_t n, size_t size)
{
    if (fault_now("PYFINI_CALLOC")) {
        return NULL;
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
#define PYFINI_TEST_FAULTS(site) fault_now(site)
#include "pyfini.h"
#include "harness.h"
#include "node.h"

static void fault_arm(long k)
{
    fault_reached = 0;
    fault_site = NULL;
    fault_at = k;
}

static char run_label[160];

/* Disarm; the site failed (NULL: none was reached), also named in the
   run's failure messages. */
static const char *fault_disarm(void)
{
    fault_at = -1;
    if (fault_site != NULL) {
        size_t n = strlen(run_label);
        snprintf(run_label + n, sizeof run_label - n, " (%s)", fault_site);
    }
    return fault_site;
}

/* ---- checks that also work in a forked child ------------------------------- */

static int in_child;   /* a forked run: report on stderr and _exit(1) */

#define FCHECK(cond, ...) fcheck((cond), #cond, __LINE__, __VA_ARGS__)
static void fcheck(int ok, const char *what, int line, const char *fmt, ...)
{
    if (ok) {
        return;
    }
    char msg[1500];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* the newest events only: Check refuses messages over ~4 kB */
    const char *ev = ev_text();
    size_t n = strlen(ev);
    const char *tail = n > 1500 ? ev + n - 1500 : ev;
    if (in_child) {
        fprintf(stderr, "test_faults.c:%d: %s: %s failed: %s\nevents (newest):\n%s", line,
                run_label, what, msg, tail);
        fflush(stderr);
        _exit(1);
    }
    ck_abort_msg("test_faults.c:%d: %s: %s failed: %s\nevents (newest):\n%s", line, run_label,
                 what, msg, tail);
}

/* Make pyfini_last_error() say something else first, so that a stale
   message cannot pass for the fault's. */
static void last_error_reset(void)
{
    FCHECK(pyfini_atexit(NULL, NULL, PYFINI_USER) == -1, "NULL callback accepted");
    PyErr_Clear();
}

/* After a failed call: MemoryError set (cleared here), the last error about
   memory. */
static void expect_nomem(const char *site)
{
    FCHECK(PyErr_Occurred() != NULL, "no exception (fault at %s)", site);
    FCHECK(PyErr_ExceptionMatches(PyExc_MemoryError), "not a MemoryError (fault at %s)", site);
    PyErr_Clear();
    const char *e = pyfini_last_error();
    FCHECK(e != NULL && (strstr(e, "MemoryError") != NULL || strstr(e, "out of memory") != NULL ||
                         strstr(e, "cannot create a thread state") != NULL),
           "last error '%s' (fault at %s)", e ? e : "(null)", site);
}

/* The sites of one walk, for its summary line. */
#define SITES_MAX 64
static const char *walk_sites[SITES_MAX];
static int walk_nsites;

static void walk_note(const char *site)
{
    for (int i = 0; i < walk_nsites; i++) {
        if (strcmp(walk_sites[i], site) == 0) {
            return;
        }
    }
    if (walk_nsites < SITES_MAX) {
        walk_sites[walk_nsites++] = site;
    }
}

/* CPU seconds of this process and its waited-for children. */
static double cpu_seconds(void)
{
    struct rusage self, children;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &children);
    return (double)(self.ru_utime.tv_sec + self.ru_stime.tv_sec + children.ru_utime.tv_sec +
                    children.ru_stime.tv_sec) +
           (double)(self.ru_utime.tv_usec + self.ru_stime.tv_usec + children.ru_utime.tv_usec +
                    children.ru_stime.tv_usec) / 1e6;
}

/* Run trial(k) for k = 1, 2, ... until a run reaches no k-th allocation
   (trial returns 0); prints and returns the number of sites walked. */
static long walk(const char *name, int (*trial)(long k))
{
    walk_nsites = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    double c0 = cpu_seconds();
    long k = 1;
    while (trial(k)) {
        k++;
        ck_assert_msg(k < 2000, "%s: more than 2000 sites?", name);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%s: %ld fault sites walked in %.2f s (%.2f s CPU): ", name, k - 1,
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9,
           cpu_seconds() - c0);
    for (int i = 0; i < walk_nsites; i++) {
        printf("%s%s", i ? ", " : "", walk_sites[i]);
    }
    printf("\n");
    fflush(stdout);
    return k - 1;
}

/* ---- sub-interpreter runs --------------------------------------------------- */

static PyThreadState *main_ts;
static long runtime_expected;   /* RUNTIME_SHUTDOWN callbacks that must run at the end */
static long run_no;             /* runs of this process, for unique tags */

static PyThreadState *sub_begin(long k, const char *what)
{
    snprintf(run_label, sizeof run_label, "%s, fault %ld", what, k);
    run_no++;
    PyThreadState *sub = new_sub(SUB_LEGACY);
    FCHECK(sub != NULL, "no sub-interpreter");
    return sub;
}

static void sub_end(PyThreadState *sub)
{
    PyThreadState_Swap(sub);
    Py_EndInterpreter(sub);
    PyThreadState_Swap(main_ts);
}

/* A tag unique to this run: "<what> <run> <phase>" (k: the run's fault,
   named in the label). */
static const char *tagged(const char *what, long k, int phase)
{
    char t[128];
    (void)k;
    snprintf(t, sizeof t, "%s %ld %s", what, run_no, pyfini_phase_name(phase));
    return (const char *)tag(t);
}

static void register_kept(long k, const char *op)
{
    char what[64];
    snprintf(what, sizeof what, "kept %s", op);
    for (int p = PYFINI_PRE_SHUTDOWN; p <= PYFINI_RUNTIME_SHUTDOWN; p++) {
        FCHECK(pyfini_atexit(harness_record_cb, (void *)tagged(what, k, p), (pyfini_phase)p) == 0,
               "kept registration failed");
    }
    runtime_expected++;
}

static void expect_kept(long k, const char *op)
{
    char what[64];
    snprintf(what, sizeof what, "kept %s", op);
    for (int p = PYFINI_PRE_SHUTDOWN; p <= PYFINI_POST_SHUTDOWN; p++) {
        const char *t = tagged(what, k, p);
        FCHECK(ev_count(t) == 1, "'%s' ran %d times", t, ev_count(t));
    }
}

/* A Python atexit callback registered last, after the operation: it runs
   first in USER, after pyfini's PRE_SHUTDOWN marker began the phase. */
static void register_python_probe(long k)
{
    char code[300];
    snprintf(code, sizeof code,
             "import atexit, _pyfini_test\n"
             "atexit.register(lambda: _pyfini_test.record('python atexit %ld: phase %%d' %% "
             "_pyfini_test.phase()))\n", run_no);
    (void)k;
    run(code);
}

static void expect_python_probe(long k)
{
    char t[64];
    snprintf(t, sizeof t, "python atexit %ld: phase %d", run_no, PYFINI_USER);
    (void)k;
    FCHECK(ev_count(t) == 1, "'%s' missing (pyfini's phase markers)", t);
}

/* ---- runs of registration and cancel: one sub-interpreter per run, or
   (batch) every run of a walk in one, checked after its end -------------- */

typedef struct run_rec {
    long run, k;
    int rc;
    const char *site;
    const char *tag;
    long live_delta;   /* pyfini records the run leaves alive after its interpreter's end */
} run_rec;

typedef struct operation {
    const char *what;
    void (*op)(run_rec *r);      /* in the run's sub-interpreter */
    void (*check)(run_rec *r);   /* after its end */
} operation;

#define RECS_MAX 64
static run_rec recs[RECS_MAX];
static int nrecs;
static const operation *cur_op;
static PyThreadState *batch_sub;   /* batch: the walk's sub-interpreter */

/* The outcome of a call that may fail: the documented error, or success
   (rc_ok). */
static void expect_outcome(run_rec *r, int rc_ok)
{
    if (r->site != NULL) {
        walk_note(r->site);
    }
    if (r->rc < 0) {
        FCHECK(r->site != NULL, "failed without a fault");
        expect_nomem(r->site);
    } else {
        FCHECK(r->rc == rc_ok && !PyErr_Occurred(), "returned %d", r->rc);
    }
}

static int trial_op(long k)
{
    FCHECK(nrecs < RECS_MAX, "too many runs");
    run_rec *r = &recs[nrecs++];
    memset(r, 0, sizeof *r);
    r->k = k;
    PyThreadState *sub = batch_sub;
    long live = alloc_live;
    if (sub == NULL) {
        sub = sub_begin(k, cur_op->what);
    } else {
        snprintf(run_label, sizeof run_label, "%s, fault %ld", cur_op->what, k);
        run_no++;
    }
    r->run = run_no;
    cur_op->op(r);
    if (batch_sub == NULL) {
        sub_end(sub);
        cur_op->check(r);
        FCHECK(alloc_live == live + r->live_delta, "pyfini records alive: %ld, before %ld",
               alloc_live, live);
        nrecs = 0;
    }
    return r->site != NULL;
}

/* Walk op; batch: every run in one sub-interpreter, whose end then checks
   them all (and that no failed registration was reported as dropped). */
static void walk_op(const char *name, const operation *op, int batch)
{
    cur_op = op;
    nrecs = 0;
    if (!batch) {
        walk(name, trial_op);
        return;
    }
    long live = alloc_live;
    stderr_capture_begin();
    batch_sub = sub_begin(0, op->what);
    walk(name, trial_op);
    register_python_probe(0);
    long probe_run = run_no;
    PyThreadState *sub = batch_sub;
    batch_sub = NULL;
    sub_end(sub);
    char *err = stderr_capture_end();
    FCHECK(strstr(err, "did not run") == NULL, "a dropped callback reported:\n%s", err);
    free(err);
    long delta = 0;
    for (int i = 0; i < nrecs; i++) {
        run_no = recs[i].run;
        snprintf(run_label, sizeof run_label, "%s, fault %ld%s%s", op->what, recs[i].k,
                 recs[i].site ? " at " : "", recs[i].site ? recs[i].site : "");
        op->check(&recs[i]);
        delta += recs[i].live_delta;
    }
    run_no = probe_run;
    expect_python_probe(0);
    FCHECK(alloc_live == live + delta, "pyfini records alive: %ld, before %ld", alloc_live, live);
    nrecs = 0;
}

/* pyfini_atexit with registrations made before it (first == 0) or as the
   sub-interpreter's first call (its registry made in it). */
static int reg_phase, reg_first;
static void op_register(run_rec *r)
{
    if (!reg_first) {
        register_kept(r->k, "reg");
        r->live_delta = 1;   /* the kept RUNTIME_SHUTDOWN entry */
    }
    last_error_reset();
    r->tag = tagged("new", r->k, reg_phase);
    fault_arm(r->k);
    r->rc = pyfini_atexit(harness_record_cb, (void *)r->tag, (pyfini_phase)reg_phase);
    r->site = fault_disarm();
    expect_outcome(r, 0);
    if (r->rc == 0 && reg_phase == PYFINI_RUNTIME_SHUTDOWN) {
        runtime_expected++;
        r->live_delta++;
    }
    if (reg_first) {
        /* later calls work (and retry what the fault left undone: a PRE
           registration imports threading, so its phase marker is due) */
        FCHECK(pyfini_atexit(harness_record_cb, (void *)tagged("after", r->k, PYFINI_PRE_SHUTDOWN),
                             PYFINI_PRE_SHUTDOWN) == 0, "registration after the fault failed");
        register_python_probe(r->k);
    }
}

static void check_register(run_rec *r)
{
    if (!reg_first) {
        expect_kept(r->k, "reg");
    } else {
        FCHECK(ev_count(tagged("after", r->k, PYFINI_PRE_SHUTDOWN)) == 1,
               "later registration lost");
        expect_python_probe(r->k);
    }
    if (reg_phase != PYFINI_RUNTIME_SHUTDOWN) {
        FCHECK(ev_count(r->tag) == (r->rc == 0), "'%s' ran %d times, registration returned %d",
               r->tag, ev_count(r->tag), r->rc);
    }
}

static const operation registration = {"registration", op_register, check_register};

/* pyfini_atexit for USER from inside a PRE_SHUTDOWN callback (the phases
   are running: a failed registration must not run from its release). */
int register_in_pre_cb(void *arg);
int register_in_pre_cb(void *arg)
{
    run_rec *r = (run_rec *)arg;
    last_error_reset();
    fault_arm(r->k);
    r->rc = pyfini_atexit(harness_record_cb, (void *)r->tag, PYFINI_USER);
    r->site = fault_disarm();
    expect_outcome(r, 0);
    return 0;
}

static void op_register_in_phase(run_rec *r)
{
    register_kept(r->k, "in-phase");
    r->live_delta = 1;
    r->rc = -2;
    r->tag = tagged("new", r->k, PYFINI_USER);
    FCHECK(pyfini_atexit(register_in_pre_cb, r, PYFINI_PRE_SHUTDOWN) == 0, "registration");
}

static void check_register_in_phase(run_rec *r)
{
    expect_kept(r->k, "in-phase");
    FCHECK(r->rc == 0 || r->rc == -1, "the PRE_SHUTDOWN callback did not run");
    FCHECK(ev_count(r->tag) == (r->rc == 0), "'%s' ran %d times, registration returned %d",
           r->tag, ev_count(r->tag), r->rc);
}

static const operation registration_in_phase = {"registration in PRE_SHUTDOWN",
                                                op_register_in_phase, check_register_in_phase};

/* pyfini_atexit_cancel of an existing registration. */
static int cancel_phase;
static void op_cancel(run_rec *r)
{
    register_kept(r->k, "cancel");
    r->live_delta = 1;
    r->tag = tagged("target", r->k, cancel_phase);
    FCHECK(pyfini_atexit(harness_record_cb, (void *)r->tag, (pyfini_phase)cancel_phase) == 0,
           "target registration failed");
    last_error_reset();
    fault_arm(r->k);
    r->rc = pyfini_atexit_cancel(harness_record_cb, (void *)r->tag, (pyfini_phase)cancel_phase);
    r->site = fault_disarm();
    expect_outcome(r, 1);
    /* a cancel that failed cancelled nothing: the target runs */
    if (r->rc < 0 && cancel_phase == PYFINI_RUNTIME_SHUTDOWN) {
        runtime_expected++;
        r->live_delta++;
    }
}

static void check_cancel(run_rec *r)
{
    expect_kept(r->k, "cancel");
    if (cancel_phase != PYFINI_RUNTIME_SHUTDOWN) {
        FCHECK(ev_count(r->tag) == (r->rc < 0), "'%s' ran %d times, cancel returned %d", r->tag,
               ev_count(r->tag), r->rc);
    }
}

static const operation cancel = {"cancel", op_cancel, check_cancel};

/* ---- states ----------------------------------------------------------------- */

typedef struct {
    long magic;
} small_state;

static long inits_a, clears_a, inits_b, clears_b;
static int init_a(void *p)
{
    ((small_state *)p)->magic = 0xa;
    inits_a++;
    return 0;
}
static void clear_a(void *p)
{
    FCHECK(((small_state *)p)->magic == 0xa, "state a cleared with magic %ld",
           ((small_state *)p)->magic);
    clears_a++;
}
static int init_b(void *p)
{
    ((small_state *)p)->magic = 0xb;
    inits_b++;
    return 0;
}
static void clear_b(void *p)
{
    FCHECK(((small_state *)p)->magic == 0xb, "state b cleared with magic %ld",
           ((small_state *)p)->magic);
    clears_b++;
}
static const pyfini_state_def def_a = {"pyfini.test.faults.a", sizeof(small_state), init_a,
                                       clear_a};
static const pyfini_state_def def_b = {"pyfini.test.faults.b", sizeof(small_state), init_b,
                                       clear_b};

/* pyfini_state(&def_b), with state a made before it (first == 0) or as
   the interpreter's first pyfini call. */
static int state_first;
static int trial_state(long k)
{
    long live = alloc_live;
    PyThreadState *sub = sub_begin(k, "state creation");
    inits_a = clears_a = inits_b = clears_b = 0;
    small_state *a = NULL;
    if (!state_first) {
        register_kept(k, "state");
        a = (small_state *)pyfini_state(&def_a);
        FCHECK(a != NULL && a->magic == 0xa, "state a");
    }
    last_error_reset();
    fault_arm(k);
    small_state *b = (small_state *)pyfini_state(&def_b);
    const char *site = fault_disarm();
    if (site != NULL) {
        walk_note(site);
    }
    if (b == NULL) {
        FCHECK(site != NULL, "failed without a fault");
        expect_nomem(site);
        FCHECK(inits_b == 0, "init ran %ld times for a failed creation", inits_b);
        FCHECK(pyfini_state_find(&def_b) == NULL && !PyErr_Occurred(), "a failed state exists");
        b = (small_state *)pyfini_state(&def_b);   /* not poisoned: made now */
    } else {
        FCHECK(!PyErr_Occurred(), "exception with a state");
    }
    FCHECK(b != NULL && b->magic == 0xb && inits_b == 1, "state b: %p, %ld inits", (void *)b,
           inits_b);
    FCHECK(pyfini_state(&def_b) == b && pyfini_state_find(&def_b) == b, "state b moved");
    if (a != NULL) {
        FCHECK(pyfini_state(&def_a) == a && inits_a == 1, "state a lost");
    }
    sub_end(sub);
    if (!state_first) {
        expect_kept(k, "state");
    }
    FCHECK(clears_b == 1 && clears_a == (a != NULL), "clears: a %ld, b %ld", clears_a, clears_b);
    FCHECK(alloc_live == live + !state_first, "pyfini records alive: %ld, before %ld", alloc_live,
           live);
    return site != NULL;
}

/* Tracked objects kept alive on purpose (a leak), so that the report at the
   end names every object tracked. */
static const pyfini_state_def def_track = {"pyfini.test.faults.track", sizeof(small_state), NULL,
                                           NULL};

static int tracked_alive_in_report(const char *err)
{
    const char *p = strstr(err, "state \"pyfini.test.faults.track\": ");
    int n = 0;
    if (p == NULL || sscanf(p + strlen("state \"pyfini.test.faults.track\": "), "%d", &n) != 1) {
        return 0;
    }
    return n;
}

/* pyfini_track of one more object, after one tracked earlier. */
static int trial_track(long k)
{
    long live = alloc_live;
    stderr_capture_begin();
    PyThreadState *sub = sub_begin(k, "tracking");
    register_kept(k, "track");
    FCHECK(pyfini_state(&def_track) != NULL, "state");
    PyObject *type = PyType_FromSpec(&node_spec);
    FCHECK(type != NULL, "type");
    PyObject *earlier = node_new(type);
    PyObject *later = node_new(type);
    FCHECK(pyfini_track(&def_track, earlier) == 0, "earlier track");
    last_error_reset();
    fault_arm(k);
    int rc = pyfini_track(&def_track, later);
    const char *site = fault_disarm();
    if (site != NULL) {
        walk_note(site);
    }
    if (rc < 0) {
        FCHECK(site != NULL, "failed without a fault");
        expect_nomem(site);
    } else {
        FCHECK(rc == 0 && !PyErr_Occurred(), "rc %d", rc);
    }
    Py_DECREF(type);   /* the instances (leaked on purpose) hold it */
    sub_end(sub);
    char *err = stderr_capture_end();
    expect_kept(k, "track");
    int n = tracked_alive_in_report(err);
    FCHECK(n == 1 + (rc == 0), "report names %d objects (track returned %d):\n%s", n, rc, err);
    free(err);
    /* the leaked state's memory is kept on purpose */
    FCHECK(alloc_live == live + 2, "pyfini records alive: %ld, before %ld", alloc_live, live);
    return site != NULL;
}

/* ---- the end of an interpreter ---------------------------------------------- */

int raising_cb(void *arg);
int raising_cb(void *arg)
{
    ev_add("raising %s", (const char *)arg);
    PyErr_SetString(PyExc_ValueError, "boom from the test");
    return -1;
}

int phase_cb(void *arg);
int phase_cb(void *arg)
{
    ev_add("%s: phase %d", (const char *)arg, pyfini_current_phase());
    PyErr_Clear();
    return 0;
}

typedef struct {
    PyObject *type;
} lone_state;

static void lone_clear(void *p)
{
    Py_CLEAR(((lone_state *)p)->type);
}
static const pyfini_state_def def_lone = {"pyfini.test.faults.lone", sizeof(lone_state), NULL,
                                          lone_clear};

/* Everything pyfini does at an interpreter's end: callbacks in each phase
   (one that raises: its report), two states, a tracked heap type that only
   its own cycles hold (freed) and a leaked tracked instance (reported). */
static void end_setup(long k, int leak)
{
    register_kept(k, "end");
    for (int p = PYFINI_PRE_SHUTDOWN; p <= PYFINI_USER; p++) {
        FCHECK(pyfini_atexit(phase_cb, (void *)tagged("phase", k, p), (pyfini_phase)p) == 0,
               "phase callback");
        FCHECK(pyfini_atexit(raising_cb, (void *)tagged("raising", k, p), (pyfini_phase)p) == 0,
               "raising callback");
    }
    FCHECK(pyfini_state(&def_a) != NULL && pyfini_state(&def_b) != NULL, "states");
    register_python_probe(k);
    if (leak) {
        FCHECK(pyfini_state(&def_track) != NULL, "state");
        PyObject *type = PyType_FromSpec(&node_spec);
        FCHECK(type != NULL && pyfini_track(&def_track, type) == 0, "track type");
        PyObject *leaked = node_new(type);   /* leaked on purpose */
        FCHECK(leaked != NULL && pyfini_track(&def_track, leaked) == 0, "track instance");
        PyObject *gone = node_new(type);
        FCHECK(gone != NULL && pyfini_track(&def_track, gone) == 0, "track instance");
        Py_DECREF(gone);
        Py_DECREF(type);   /* held by the leaked instance */
        /* a type that the state holds until its clear: then only its own
           cycles hold it, which POST_SHUTDOWN breaks (freed, not reported) */
        lone_state *st = (lone_state *)pyfini_state(&def_lone);
        FCHECK(st != NULL, "state");
        st->type = PyType_FromSpec(&node_spec);
        FCHECK(st->type != NULL && pyfini_track(&def_lone, st->type) == 0, "track type");
    }
}

static void end_check(long k)
{
    expect_kept(k, "end");
    for (int p = PYFINI_PRE_SHUTDOWN; p <= PYFINI_USER; p++) {
        char t[160];
        snprintf(t, sizeof t, "%s: phase %d", tagged("phase", k, p), p);
        FCHECK(ev_count(t) == 1, "'%s' ran %d times", t, ev_count(t));
        const char *r = tagged("raising", k, p);
        char line[160];
        snprintf(line, sizeof line, "raising %s", r);
        FCHECK(ev_count(line) == 1, "'%s' ran %d times", line, ev_count(line));
    }
    expect_python_probe(k);
    FCHECK(clears_a == 1 && clears_b == 1, "clears: a %ld, b %ld", clears_a, clears_b);
}

/* Leak reports at the end of a leak run: the leaked instance's state;
   on 3.11 also the lone type's (CPython keeps a reference to a heap type
   released at POST_SHUTDOWN in a sub-interpreter; see tests/test_state.c) -
   unless POST_SHUTDOWN ran early, at the state-dict clear (a fault there),
   before CPython takes that reference. */
#define END_LEAK_REPORTS (PY_VERSION_HEX < 0x030C0000 ? 2 : 1)
static int end_leak_reports(const char *err)
{
    int early = strstr(err, "running POST_SHUTDOWN early") != NULL ||
                strstr(err, "running it at the state-dict clear") != NULL;
    return early ? 1 : END_LEAK_REPORTS;
}

/* Py_EndInterpreter with the fault armed. */
static int end_leak;
static long end_leaked;   /* states kept by the leak runs' reports */
static int trial_end(long k)
{
    long live = alloc_live;
    stderr_capture_begin();
    PyThreadState *sub = sub_begin(k, end_leak ? "leak reporting" : "phase dispatch");
    inits_a = clears_a = inits_b = clears_b = 0;
    end_setup(k, end_leak);
    fault_arm(k);
    PyThreadState_Swap(sub);
    Py_EndInterpreter(sub);
    const char *site = fault_disarm();
    PyThreadState_Swap(main_ts);
    char *err = stderr_capture_end();
    if (site != NULL) {
        walk_note(site);
    }
    end_check(k);
    FCHECK(count_substr(err, ") failed in phase ") == 2, "failure reports:\n%s", err);
    int leaks = count_substr(err, "pyfini: leak in ");
    if (end_leak) {
        /* the leaked instance and its type; the lone type freed */
        int n = tracked_alive_in_report(err);
        FCHECK(n == 2 && leaks == end_leak_reports(err), "%d leak reports, %d objects named:\n%s",
               leaks, n, err);
        end_leaked += leaks;
    }
    free(err);
    /* each leaking state's memory is kept */
    FCHECK(alloc_live == live + 1 + leaks, "pyfini records alive: %ld, before %ld", alloc_live,
           live);
    return site != NULL;
}

/* ---- main-interpreter runs: one process each -------------------------------- */

/* Run trial(k) in a process forked from this one (CPython initialized,
   the setup made) that finalizes CPython: 1 if the fault was reached, 0 if
   not; fails the test on anything else. */
static int (*main_trial)(long k);
static long main_k;

static void forked_child(void)
{
    in_child = 1;
    PyOS_AfterFork_Child();   /* the parent initialized CPython */
    _exit(main_trial(main_k) ? 10 : 0);
}

static int forked(long k)
{
    char out[16384];
    main_k = k;
    PyOS_BeforeFork();   /* paired with PyOS_AfterFork_Child / _Parent (3.13's import lock) */
    int status = run_in_child(forked_child, out, sizeof out);
    PyOS_AfterFork_Parent();
    ck_assert_msg(WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 10),
                  "run %ld: status 0x%x:\n%s", k, (unsigned)status, out);
    /* the site reached is the first line of a run that reached one */
    if (WEXITSTATUS(status) == 10) {
        char site[80] = "";
        if (sscanf(out, "site %79[^\n]", site) == 1) {
            walk_note(tag(site));
        }
    }
    return WEXITSTATUS(status) == 10;
}

static void child_note(const char *site)
{
    if (site != NULL) {
        fprintf(stderr, "site %s\n", site);
    }
}

/* The first pyfini call of the main interpreter (its registry and the
   process-wide list), for RUNTIME_SHUTDOWN, then the whole end. */
static int main_first_trial(long k)
{
    snprintf(run_label, sizeof run_label, "main first registration, fault %ld", k);
    last_error_reset();
    fault_arm(k);
    int rc = pyfini_atexit(harness_record_cb, (void *)"new runtime", PYFINI_RUNTIME_SHUTDOWN);
    const char *site = fault_disarm();
    child_note(site);
    if (rc < 0) {
        FCHECK(site != NULL, "failed without a fault");
        expect_nomem(site);
    }
    register_kept(k, "main");
    register_python_probe(k);
    FCHECK(Py_FinalizeEx() == 0, "Py_FinalizeEx");
    /* RUNTIME_SHUTDOWN ran at the end of Py_FinalizeEx (call_ll_exitfuncs) */
    expect_kept(k, "main");
    FCHECK(ev_count(tagged("kept main", k, PYFINI_RUNTIME_SHUTDOWN)) == 1, "kept RUNTIME");
    FCHECK(ev_count("new runtime") == (rc == 0), "new RUNTIME ran %d times, rc %d",
           ev_count("new runtime"), rc);
    expect_python_probe(k);
    FCHECK(alloc_live == 0, "pyfini records alive: %ld", alloc_live);
    return site != NULL;
}

/* Py_FinalizeEx with the fault armed: the main interpreter's end. */
static int main_end_trial(long k)
{
    snprintf(run_label, sizeof run_label, "main end, fault %ld", k);
    stderr_capture_begin();
    fault_arm(k);
    int rc = Py_FinalizeEx();
    const char *site = fault_disarm();
    char *err = stderr_capture_end();
    child_note(site);
    FCHECK(rc == 0, "Py_FinalizeEx: %d\n%s", rc, err);
    end_check(k);
    FCHECK(ev_count(tagged("kept end", k, PYFINI_RUNTIME_SHUTDOWN)) == 1, "kept RUNTIME");
    FCHECK(count_substr(err, ") failed in phase ") == 2, "failure reports:\n%s", err);
    free(err);
    FCHECK(alloc_live == 0, "pyfini records alive: %ld", alloc_live);
    return site != NULL;
}

/* ---- the tests ----------------------------------------------------------------- */

static void sub_walks_begin(void)
{
    harness_init_nosite();   /* no site: each sub-interpreter starts faster */
    main_ts = PyThreadState_Get();
    /* the main interpreter's registry and process-wide list, made first */
    ck_assert_int_eq(pyfini_atexit(harness_record_cb, tag("main 0 PYFINI_RUNTIME_SHUTDOWN"),
                                   PYFINI_RUNTIME_SHUTDOWN), 0);
    runtime_expected = 1;
}

/* Py_FinalizeEx; then every RUNTIME_SHUTDOWN callback ran exactly once and
   pyfini's records are all freed but the `leaked` states kept on purpose. */
static void sub_walks_end(long leaked)
{
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    /* RUNTIME_SHUTDOWN ran inside Py_FinalizeEx (call_ll_exitfuncs) */
    long ran = 0;
    for (const char *p = ev_text(); (p = strstr(p, " PYFINI_RUNTIME_SHUTDOWN\n")) != NULL; p++) {
        ran++;
    }
    ck_assert_msg(ran == runtime_expected, "%ld RUNTIME_SHUTDOWN callbacks ran, %ld expected",
                  ran, runtime_expected);
    ck_assert_msg(alloc_live == leaked, "pyfini records alive at exit: %ld, %ld expected",
                  alloc_live, leaked);
}

/* Under ASan the walks take about three times as long: they run on one
   CPython (3.14, whose ASan row CI runs in the sid tree) and the others say
   so. */
#if defined(__SANITIZE_ADDRESS__)
#  define ASAN_ONE_CPYTHON()                                                   \
    do {                                                                      \
        if (PY_VERSION_HEX < 0x030E0000 || PY_VERSION_HEX >= 0x030F0000) {    \
            SKIP_TEST("under ASan the fault walks run on CPython 3.14 only (CI time)"); \
        }                                                                     \
    } while (0)
#else
#  define ASAN_ONE_CPYTHON() ((void)0)
#endif

START_TEST(test_faults_registration)
{
    ASAN_ONE_CPYTHON();
    sub_walks_begin();
    reg_first = 1;
    reg_phase = PYFINI_PRE_SHUTDOWN;
    walk_op("registration (first call, PRE_SHUTDOWN)", &registration, 0);
    reg_first = 0;
    for (reg_phase = PYFINI_PRE_SHUTDOWN; reg_phase <= PYFINI_RUNTIME_SHUTDOWN; reg_phase++) {
        char name[80];
        snprintf(name, sizeof name, "registration (%s)", pyfini_phase_name(reg_phase));
        walk_op(name, &registration, 1);
    }
    /* one interpreter per run: the fault is reached at its end */
    walk_op("registration (USER, from a PRE_SHUTDOWN callback)", &registration_in_phase, 0);
    sub_walks_end(0);
}
END_TEST

START_TEST(test_faults_cancel)
{
    ASAN_ONE_CPYTHON();
    sub_walks_begin();
    for (cancel_phase = PYFINI_PRE_SHUTDOWN; cancel_phase <= PYFINI_RUNTIME_SHUTDOWN;
         cancel_phase++) {
        char name[80];
        snprintf(name, sizeof name, "cancel (%s)", pyfini_phase_name(cancel_phase));
        walk_op(name, &cancel, 1);
    }
    sub_walks_end(0);
}
END_TEST

START_TEST(test_faults_state_and_tracking)
{
    ASAN_ONE_CPYTHON();
    HARNESS_LEAKS_ON_PURPOSE();   /* the tracking runs keep their objects */
    sub_walks_begin();
    state_first = 1;
    walk("state creation (first call)", trial_state);
    state_first = 0;
    walk("state creation", trial_state);
    long runs = walk("tracking", trial_track) + 1;
    sub_walks_end(runs);   /* each tracking run's state, kept for its leak */
}
END_TEST

START_TEST(test_faults_end)
{
    ASAN_ONE_CPYTHON();
    HARNESS_LEAKS_ON_PURPOSE();   /* the leak-report runs keep one instance */
    sub_walks_begin();
    end_leak = 1;
    end_leaked = 0;
    walk("phase dispatch and leak reporting (Py_EndInterpreter)", trial_end);
    sub_walks_end(end_leaked);   /* the leak runs' states, kept on purpose */
}
END_TEST

START_TEST(test_faults_main)
{
    ASAN_ONE_CPYTHON();
    /* each run a fork of this process: no pyfini call made yet, then the
       whole setup of the end made once */
    harness_init_nosite();
    main_trial = main_first_trial;
    walk("registration (main interpreter's first call, RUNTIME_SHUTDOWN)", forked);
    end_setup(0, 0);
    main_trial = main_end_trial;
    walk("phase dispatch (Py_FinalizeEx)", forked);
}
END_TEST

static Suite *faults_suite(void)
{
    Suite *s = suite_create("faults");
    TCase *tc = tcase_create("faults");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_faults_registration);
    tcase_add_test(tc, test_faults_cancel);
    tcase_add_test(tc, test_faults_state_and_tracking);
    tcase_add_test(tc, test_faults_end);
    tcase_add_test(tc, test_faults_main);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return run_suite(faults_suite()); }
