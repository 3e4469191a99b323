/* tests/harness.h - shared helpers of pyfini's embedding tests.
 *
 * Every test runs in its own process (Check's fork mode): it initializes
 * CPython, acts, finalizes, and then asserts on the events its callbacks
 * recorded. Include after Python.h, check.h and (optionally) pyfini.h.
 * The helper module `_pyfini_test` is appended to the inittab by
 * harness_init(); it works in legacy and isolated sub-interpreters.
 */
#ifndef PYFINI_TEST_HARNESS_H
#define PYFINI_TEST_HARNESS_H

#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "interp_configs.h"

/* ---------------- events ----------------------------------------------- */

#define EV_MAX (1 << 20)
static char ev_buf[EV_MAX];
static size_t ev_len;
static pthread_mutex_t ev_lock = PTHREAD_MUTEX_INITIALIZER;

/* Append one line (no C API: usable in every phase). */
static inline void ev_add(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&ev_lock);
    size_t n = strlen(line);
    if (ev_len + n + 2 < EV_MAX) {
        memcpy(ev_buf + ev_len, line, n);
        ev_len += n;
        ev_buf[ev_len++] = '\n';
        ev_buf[ev_len] = '\0';
    }
    pthread_mutex_unlock(&ev_lock);
}

static inline const char *ev_text(void) { return ev_buf; }

/* Position of the line `s` (exact line) or -1. */
static inline long ev_pos(const char *s)
{
    size_t n = strlen(s);
    const char *p = ev_buf;
    while ((p = strstr(p, s)) != NULL) {
        if ((p == ev_buf || p[-1] == '\n') && p[n] == '\n') {
            return (long)(p - ev_buf);
        }
        p += 1;
    }
    return -1;
}

static inline int ev_count(const char *s)
{
    int c = 0;
    size_t n = strlen(s);
    for (const char *p = ev_buf; (p = strstr(p, s)) != NULL; p += n) {
        if ((p == ev_buf || p[-1] == '\n') && p[n] == '\n') {
            c++;
        }
    }
    return c;
}

/* Assert that the given lines all occur, in this order (NULL-terminated). */
#define EV_ORDER(...) ev_order_check(__FILE__, __LINE__, __VA_ARGS__, (const char *)NULL)
static inline void ev_order_check(const char *file, int line, ...)
{
    va_list ap;
    va_start(ap, line);
    long last = -1;
    const char *prev = "(start)";
    const char *s;
    while ((s = va_arg(ap, const char *)) != NULL) {
        long p = ev_pos(s);
        if (p < 0) {
            ck_abort_msg("%s:%d: event '%s' missing; events:\n%s", file, line, s, ev_buf);
        }
        if (p <= last) {
            ck_abort_msg("%s:%d: event '%s' came before '%s'; events:\n%s", file, line, s, prev,
                         ev_buf);
        }
        last = p;
        prev = s;
    }
    va_end(ap);
}

/* ---------------- tags: stable void * arguments ------------------------- */

#define TAG_MAX 8192
static char *tag_table[TAG_MAX];
static int tag_n;

static void *tag(const char *s)
{
    pthread_mutex_lock(&ev_lock);
    for (int i = 0; i < tag_n; i++) {
        if (strcmp(tag_table[i], s) == 0) {
            pthread_mutex_unlock(&ev_lock);
            return tag_table[i];
        }
    }
    assert(tag_n < TAG_MAX);
    char *t = strdup(s);
    tag_table[tag_n++] = t;
    pthread_mutex_unlock(&ev_lock);
    return t;
}

/* The common callback: records its tag. Not static: dladdr() names it. */
int harness_record_cb(void *arg);
int harness_record_cb(void *arg)
{
    ev_add("%s", (const char *)arg);
    return 0;
}

/* ---------------- stderr capture ---------------------------------------- */

static int cap_saved_fd = -1;
static FILE *cap_file;
/* the capture's descriptor while it is on, for the crash report (a signal
   handler reads it with pread; -1 when no capture is on) */
static volatile int cap_fd = -1;

static inline void stderr_capture_begin(void)
{
    fflush(stderr);
    cap_file = tmpfile();
    ck_assert_ptr_nonnull(cap_file);
    cap_saved_fd = dup(2);
    dup2(fileno(cap_file), 2);
    cap_fd = fileno(cap_file);
}

/* Returns the captured text (malloc'd). */
static inline char *stderr_capture_end(void)
{
    fflush(stderr);
    cap_fd = -1;
    dup2(cap_saved_fd, 2);
    close(cap_saved_fd);
    long n = ftell(cap_file);
    char *s = (char *)malloc((size_t)n + 1);
    rewind(cap_file);
    size_t got = fread(s, 1, (size_t)n, cap_file);
    s[got] = '\0';
    fclose(cap_file);
    return s;
}

static inline int count_substr(const char *hay, const char *needle)
{
    int c = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle)) {
        c++;
    }
    return c;
}

/* Say (on stdout) that this test process leaks memory on purpose (a
   "buggy extension" keeping objects alive): tools/stress then does not judge
   its valgrind "definitely lost" figure (it still judges its errors) and
   names the test. */
#define HARNESS_LEAKS_ON_PURPOSE()                                             \
    do {                                                                      \
        printf("LEAKS-ON-PURPOSE pid %ld %s\n", (long)getpid(), __func__);    \
        fflush(stdout);                                                       \
    } while (0)

/* Say (on stdout, as HARNESS_LEAKS_ON_PURPOSE) that CPython itself loses
   memory in this test process, with the reason: a test that keeps an object
   of the _pyfini_test module (a Probe, or its function in an atexit list)
   alive until a sub-interpreter's state dict or atexit list is cleared, in
   interpreter_clear() (Python/pystate.c) after the interpreter's last
   garbage collection (finalize_modules), releases the module's heap type
   too late: it is in a cycle with its own tp_mro, which no GC collects any
   more, and valgrind reports a 64-byte dict (the type's) definitely lost,
   with the type behind it (CPython 3.12.1, 3.13.0, 3.14.10; the same with
   no pyfini call in the interpreter: a parked Probe alone). pyfini
   documents the rule (POST_SHUTDOWN: "a heap type released here does not
   die by itself"). */
#define HARNESS_CPYTHON_LOSES(why)                                             \
    do {                                                                      \
        printf("LEAKS-ON-PURPOSE pid %ld %s (CPython: %s)\n", (long)getpid(),  \
               __func__, why);                                                \
        fflush(stdout);                                                       \
    } while (0)

/* The cycle count of a long loop: n, or `quick` when PYFINI_TEST_QUICK=1
   (tools/stress sets it under valgrind, where each cycle costs ~50x). */
static inline int test_cycles(int n, int quick)
{
    const char *q = getenv("PYFINI_TEST_QUICK");
    return (q != NULL && strcmp(q, "1") == 0) ? quick : n;
}

/* Run child() in a forked process with its stderr (fd 2) sent to a pipe;
   the child _exit(0)s when child() returns. Fills out (NUL-terminated, at
   most size - 1 bytes) and returns the waitpid() status. For cases that must
   crash or abort without ending the test process. */
static inline int run_in_child(void (*child)(void), char *out, size_t size)
{
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ne(pid, -1);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        child();
        _exit(0);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t n;
    while (got < size - 1 && (n = read(fds[0], out + got, size - 1 - got)) > 0) {
        got += (size_t)n;
    }
    out[got] = '\0';
    close(fds[0]);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    return status;
}

/* ---------------- the _pyfini_test module -------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *ref;
    char tag[64];
} probe_object;

typedef struct {
    PyObject *probe_type;
} test_module_state;

static int probe_traverse(PyObject *self, visitproc visit, void *arg)
{
    probe_object *p = (probe_object *)self;
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(p->ref);
    return 0;
}

static int probe_clear(PyObject *self)
{
    Py_CLEAR(((probe_object *)self)->ref);
    return 0;
}

static void probe_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    ev_add("freed %s", ((probe_object *)self)->tag);
    probe_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyObject *probe_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    const char *t;
    (void)kw;
    if (!PyArg_ParseTuple(args, "s", &t)) {
        return NULL;
    }
    probe_object *p = (probe_object *)type->tp_alloc(type, 0);
    if (p != NULL) {
        snprintf(p->tag, sizeof p->tag, "%s", t);
    }
    return (PyObject *)p;
}

static PyObject *probe_get_ref(PyObject *self, void *c)
{
    (void)c;
    PyObject *r = ((probe_object *)self)->ref;
    return Py_NewRef(r ? r : Py_None);
}

static int probe_set_ref(PyObject *self, PyObject *v, void *c)
{
    (void)c;
    Py_XSETREF(((probe_object *)self)->ref, Py_XNewRef(v));
    return 0;
}

static PyGetSetDef probe_getset[] = {
    {"ref", probe_get_ref, probe_set_ref, "a reference (makes cycles)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot probe_slots[] = {
    {Py_tp_new, (void *)probe_new},
    {Py_tp_dealloc, (void *)probe_dealloc},
    {Py_tp_traverse, (void *)probe_traverse},
    {Py_tp_clear, (void *)probe_clear},
    {Py_tp_getset, (void *)probe_getset},
    {0, NULL}};

static PyType_Spec probe_spec = {
    "_pyfini_test.Probe", sizeof(probe_object), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, probe_slots};

static PyObject *t_record(PyObject *m, PyObject *arg)
{
    (void)m;
    const char *s = PyUnicode_AsUTF8(arg);
    if (s == NULL) {
        return NULL;
    }
    ev_add("%s", s);
    Py_RETURN_NONE;
}

#ifdef PYFINI_H
static PyObject *t_register(PyObject *m, PyObject *args)
{
    (void)m;
    int phase;
    const char *t;
    if (!PyArg_ParseTuple(args, "is", &phase, &t)) {
        return NULL;
    }
    if (pyfini_atexit(harness_record_cb, tag(t), (pyfini_phase)phase) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *t_cancel(PyObject *m, PyObject *args)
{
    (void)m;
    int phase;
    const char *t;
    if (!PyArg_ParseTuple(args, "is", &phase, &t)) {
        return NULL;
    }
    int r = pyfini_atexit_cancel(harness_record_cb, tag(t), (pyfini_phase)phase);
    if (r < 0) {
        return NULL;
    }
    return PyLong_FromLong(r);
}

static PyObject *t_phase(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    int p = pyfini_current_phase();
    if (p < 0) {
        return NULL;
    }
    return PyLong_FromLong(p);
}
#endif

/* Keep obj alive in the interpreter state dict: released at its clear,
   so a cycle through it is freed only by the interpreter's last GC. */
static PyObject *t_park(PyObject *m, PyObject *args)
{
    (void)m;
    const char *key;
    PyObject *obj;
    if (!PyArg_ParseTuple(args, "sO", &key, &obj)) {
        return NULL;
    }
    PyObject *d = PyInterpreterState_GetDict(PyInterpreterState_Get());
    if (d == NULL || PyDict_SetItemString(d, key, obj) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static void sys_probe_destructor(PyObject *cap)
{
    ev_add("sys-planted %s", (const char *)PyCapsule_GetContext(cap));
}

/* A capsule in the state dict whose destructor (at Py_CLEAR(interp->dict))
   plants another capsule in sys; that one records when sys is cleared. */
static void dict_probe_destructor(PyObject *cap)
{
    const char *t = (const char *)PyCapsule_GetContext(cap);
    ev_add("state-dict cleared %s", t);
    PyObject *modules = PySys_GetObject("modules");
    ev_add("sys.modules at state-dict clear is %s",
           modules == NULL ? "missing" : PyDict_Check(modules) ? "a dict" : Py_TYPE(modules)->tp_name);
    PyObject *probe = PyCapsule_New((void *)t, "pyfini.test.sys", sys_probe_destructor);
    if (probe != NULL) {
        PyCapsule_SetContext(probe, (void *)t);
        if (PySys_SetObject("_pyfini_test_probe", probe) < 0) {
            PyErr_Clear();
        }
        Py_DECREF(probe);
    } else {
        PyErr_Clear();
    }
}

static PyObject *t_watch_state_dict(PyObject *m, PyObject *arg)
{
    (void)m;
    const char *s = PyUnicode_AsUTF8(arg);
    if (s == NULL) {
        return NULL;
    }
    void *t = tag(s);
    PyObject *cap = PyCapsule_New(t, "pyfini.test.dict", dict_probe_destructor);
    if (cap == NULL) {
        return NULL;
    }
    PyCapsule_SetContext(cap, t);
    PyObject *d = PyInterpreterState_GetDict(PyInterpreterState_Get());
    int rc = d ? PyDict_SetItemString(d, "_pyfini_test_dict_probe", cap) : -1;
    Py_DECREF(cap);
    if (rc < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

#if PY_VERSION_HEX >= 0x030D0000
static void unstable_atexit_cb(void *data) { ev_add("PyUnstable_AtExit %s", (const char *)data); }
static PyObject *t_unstable_atexit(PyObject *m, PyObject *arg)
{
    (void)m;
    const char *s = PyUnicode_AsUTF8(arg);
    if (s == NULL) {
        return NULL;
    }
    if (PyUnstable_AtExit(PyInterpreterState_Get(), unstable_atexit_cb, tag(s)) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}
#endif

static PyObject *t_interp_id(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyLong_FromLongLong(PyInterpreterState_GetID(PyInterpreterState_Get()));
}

static PyMethodDef test_methods[] = {
    {"record", t_record, METH_O, "record an event"},
#ifdef PYFINI_H
    {"register", t_register, METH_VARARGS, "pyfini_atexit(record, tag, phase)"},
    {"cancel", t_cancel, METH_VARARGS, "pyfini_atexit_cancel(record, tag, phase)"},
    {"phase", t_phase, METH_NOARGS, "pyfini_current_phase()"},
#endif
    {"park", t_park, METH_VARARGS, "store an object in the interpreter state dict"},
    {"watch_state_dict", t_watch_state_dict, METH_O, "record the state-dict clear"},
#if PY_VERSION_HEX >= 0x030D0000
    {"unstable_atexit", t_unstable_atexit, METH_O, "PyUnstable_AtExit recording a tag"},
#endif
    {"interp_id", t_interp_id, METH_NOARGS, "PyInterpreterState_GetID()"},
    {NULL, NULL, 0, NULL}};

static int test_exec(PyObject *m)
{
    test_module_state *st = (test_module_state *)PyModule_GetState(m);
    st->probe_type = PyType_FromModuleAndSpec(m, &probe_spec, NULL);
    if (st->probe_type == NULL) {
        return -1;
    }
    return PyModule_AddObjectRef(m, "Probe", st->probe_type);
}

static int test_traverse(PyObject *m, visitproc visit, void *arg)
{
    test_module_state *st = (test_module_state *)PyModule_GetState(m);
    Py_VISIT(st->probe_type);
    return 0;
}

static int test_clear(PyObject *m)
{
    test_module_state *st = (test_module_state *)PyModule_GetState(m);
    Py_CLEAR(st->probe_type);
    return 0;
}

static PyModuleDef_Slot test_slots[] = {
    {Py_mod_exec, (void *)test_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL}};

static struct PyModuleDef test_module = {
    PyModuleDef_HEAD_INIT, "_pyfini_test", "pyfini test helpers", sizeof(test_module_state),
    test_methods, test_slots, test_traverse, test_clear, NULL};

static PyObject *PyInit__pyfini_test(void) { return PyModuleDef_Init(&test_module); }

/* ---------------- interpreter helpers ------------------------------------ */

/* Py_Initialize with the test module; isolated from the user's environment.
   harness_init_nosite(): also without `site` (and so without .pth files,
   which on some Python installs import modules into every interpreter). */
static int harness_no_site;

/* PYFINI_TEST_MALLOC=malloc: every CPython allocation goes to malloc()
   (PYMEM_ALLOCATOR_MALLOC), so that valgrind and ASan see each block rather
   than obmalloc's arenas. The isolated config below ignores PYTHONMALLOC
   (PyPreConfig_InitIsolatedConfig: use_environment = 0), hence this variable
   of the harness's own; it pre-initializes with the isolated pre-config and
   only the allocator changed. CPython: Python/preconfig.c
   (_PyPreConfig_Write -> _PyMem_SetupAllocators), Py_PreInitialize. */
static inline void harness_preinit(void)
{
    const char *m = getenv("PYFINI_TEST_MALLOC");
    if (m == NULL || m[0] == '\0') {
        return;
    }
    ck_assert_msg(strcmp(m, "malloc") == 0, "PYFINI_TEST_MALLOC=%s: only \"malloc\" is known", m);
    PyPreConfig pre;
    PyPreConfig_InitIsolatedConfig(&pre);
    pre.allocator = PYMEM_ALLOCATOR_MALLOC;
    PyStatus st = Py_PreInitialize(&pre);
    ck_assert_msg(!PyStatus_Exception(st), "Py_PreInitialize failed: %s",
                  st.err_msg ? st.err_msg : "?");
}

static inline void harness_init(void)
{
    PyImport_AppendInittab("_pyfini_test", PyInit__pyfini_test);
    harness_preinit();
    PyConfig config;
    PyConfig_InitIsolatedConfig(&config);
    config.install_signal_handlers = 0;
    if (harness_no_site) {
        config.site_import = 0;
    }
    PyStatus st = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    ck_assert_msg(!PyStatus_Exception(st), "Py_InitializeFromConfig failed: %s",
                  st.err_msg ? st.err_msg : "?");
}

static inline void run(const char *code)
{
    int rc = PyRun_SimpleString(code);
    ck_assert_msg(rc == 0, "Python code failed:\n%s", code);
}

static inline void harness_init_nosite(void)
{
    harness_no_site = 1;
    harness_init();
}

enum { SUB_LEGACY = INTERP_LEGACY, SUB_ISOLATED = INTERP_ISOLATED };

/* A new sub-interpreter of config kind (common/interp_configs.h; its thread
   state becomes current), or NULL if the kind does not exist on this CPython. */
static PyThreadState *new_sub(int kind)
{
    const interp_config *c = &interp_configs[kind];
    if (!interp_config_available(c)) {
        return NULL;
    }
    PyThreadState *ts = NULL;
    PyStatus st = interp_config_create(c, &ts);
    ck_assert_msg(!PyStatus_Exception(st) && ts != NULL, "%s failed: %s",
                  c->legacy ? "Py_NewInterpreter" : "Py_NewInterpreterFromConfig",
                  st.err_msg ? st.err_msg : "?");
    return ts;
}

static inline const char *py_version(void) { return PY_VERSION; }

/* Print a skip note: Check has no "skipped" state, so the test passes and
   says so on stdout (collected into the summary). */
#define SKIP_TEST(why)                                                        \
    do {                                                                      \
        printf("SKIP %s on CPython %s: %s\n", __func__, py_version(), why);   \
        fflush(stdout);                                                       \
        return;                                                               \
    } while (0)

/* ---------------- crash reports ------------------------------------------ */

/* PYFINI_TEST_GDB=1 (tools/run-tests sets it when gdb is found): a test
   process that receives SIGSEGV, SIGBUS, SIGILL or SIGFPE writes to stdout,
   before it dies of that signal, which thread got it, what its captured
   stderr held and every thread's stack (gdb attaches to it: "thread apply
   all bt"), so that a crash seen once, on a CI machine, says where it was.
   Only async-signal-safe calls up to the exec; vfork() runs no
   pthread_atfork() handler (pyfini's and CPython's take locks the crashed
   thread may hold). SIGABRT is left alone: some tests expect it, and
   CPython's fatal errors print their own report. Sanitizer builds keep
   their own handlers and ignore the variable. Not covered: a stack
   overflow (no alternate signal stack: the handler cannot run), and a
   second thread crashing while gdb runs (it ends the process mid-report). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#  define HARNESS_SANITIZED 1
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#    define HARNESS_SANITIZED 1
#  endif
#endif

#ifndef HARNESS_SANITIZED
#include <sys/prctl.h>
#include <sys/syscall.h>

static void harness_write(const char *s)
{
    ssize_t r = write(1, s, strlen(s));
    (void)r;
}

/* v in decimal into buf (at least 24 bytes); async-signal-safe */
static void harness_utoa(unsigned long v, char *buf)
{
    char digits[24];
    size_t n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    for (size_t i = 0; i < n; i++) {
        buf[i] = digits[n - 1 - i];
    }
    buf[n] = '\0';
}

/* gdb attached to this process, its output on stdout, through sh (vfork:
   the child only dups and execs); sh's exit status: 0, 127 no gdb (or no
   sh), 124/137 gdb timed out, else gdb's failure (e.g. ptrace refused).
   gdb gets 50 s (then SIGTERM, 5 s later SIGKILL: coreutils timeout,
   --foreground so that it stays in the test's process group, which Check
   kills on its own timeout; stdin /dev/null), then sh sends this process
   SIGCONT whatever gdb did: a SIGSTOP of gdb's attach still pending on a
   thread would otherwise stop the process for good after the detach, and
   the crash would hang until Check's timeout instead of being reported
   (seen once in about 500 runs of test_crash_report_names_every_thread on
   a loaded machine); SIGCONT discards pending stop signals. */
static int harness_run_gdb(const char *pid)
{
    pid_t c = vfork();
    if (c == 0) {
        dup2(1, 2);
        execl("/bin/sh", "sh", "-c",
              "command -v gdb >/dev/null || exit 127\n"
              "timeout --foreground -k 5 50 gdb -q -nx -batch -p \"$1\" "
              "-ex 'info sharedlibrary python' -ex 'thread apply all bt 40' -ex detach "
              "</dev/null\n"
              "s=$?\n"
              "kill -CONT \"$1\"\n"
              "exit $s\n",
              "sh", pid, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    while (c > 0 && waitpid(c, &status, 0) < 0 && errno == EINTR) {
    }
    if (c < 0) {
        return 127;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void harness_on_crash(int sig)
{
    static char pid[24], tid[24], rc[24];
    harness_utoa((unsigned long)getpid(), pid);
    harness_utoa((unsigned long)syscall(SYS_gettid), tid);
    harness_write("\n*** fatal signal in test process ");
    harness_write(pid);
    harness_write(sig == SIGSEGV ? " (SIGSEGV" : sig == SIGBUS ? " (SIGBUS" :
                  sig == SIGILL ? " (SIGILL" : " (SIGFPE");
    harness_write(", in thread LWP ");
    harness_write(tid);
    harness_write(")");
    int fd = cap_fd;
    if (fd >= 0) {
        harness_write("; its captured stderr:\n");
        char buf[4096];
        off_t off = 0;
        ssize_t got;
        while ((got = pread(fd, buf, sizeof buf, off)) > 0) {
            ssize_t w = write(1, buf, (size_t)got);
            (void)w;
            off += got;
        }
    }
    /* gdb runs as this process's grandchild: where Yama's ptrace_scope is
       1, only a descendant could be traced, so this process allows any
       tracer (a plain system call; EINVAL without Yama) */
    (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    harness_write("\n*** its threads' stacks (gdb; the crashed one is LWP ");
    harness_write(tid);
    harness_write("):\n");
    int r = harness_run_gdb(pid);
    if (r != 0) {
        harness_utoa((unsigned long)r, rc);
        harness_write(r == 127 ? "*** gdb could not be run (status 127)\n"
                               : "*** gdb failed or timed out, status ");
        if (r != 127) {
            harness_write(rc);
            harness_write("\n");
        }
    }
    /* SA_RESETHAND made the action SIG_DFL; the signal stays blocked until
       this handler returns, and then ends the process (a fault re-executes
       its instruction, raise() leaves it pending) */
    raise(sig);
}

#endif /* HARNESS_SANITIZED */

static inline void harness_crash_reports(void)
{
#ifndef HARNESS_SANITIZED
    const char *e = getenv("PYFINI_TEST_GDB");
    if (e == NULL || strcmp(e, "1") != 0) {
        return;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = harness_on_crash;
    sa.sa_flags = (int)SA_RESETHAND;
    const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE};
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        sigaddset(&sa.sa_mask, sigs[i]);   /* no second report from inside the first */
    }
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        sigaction(sigs[i], &sa, NULL);
    }
#endif
}

/* Run a Check suite in fork mode; exit status for CTest. */
static inline int run_suite_here(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_FORK);
    harness_crash_reports();
    printf("CPython %s (%s)\n", PY_VERSION,
#ifdef Py_DEBUG
           "debug build"
#else
           "release build"
#endif
    );
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}

/* PYFINI_TEST_STACK_THREAD=<MB> (tools/stress sets it under valgrind): run
   the suite, and so every forked test process, in a pthread with a stack of
   MB megabytes rather than in the main thread. CPython 3.14 checks the C
   stack against the thread's bounds as the OS gives them
   (Python/ceval.c, _Py_InitializeRecursionLimits: pthread_getattr_np); for
   the main thread under valgrind these are the kernel's [stack] mapping,
   not the stack valgrind runs the program on, and every call then looks
   like an overflow ("Fatal Python error: _Py_CheckRecursiveCall:
   Unrecoverable stack overflow"). A thread's stack is the one glibc
   allocated and reports. Unset: the main thread, as before. */
struct harness_suite_run {
    Suite *suite;
    int rc;
};

static void *harness_suite_thread(void *arg)
{
    struct harness_suite_run *r = (struct harness_suite_run *)arg;
    r->rc = run_suite_here(r->suite);
    return NULL;
}

static inline int run_suite(Suite *s)
{
    const char *mb = getenv("PYFINI_TEST_STACK_THREAD");
    if (mb == NULL || mb[0] == '\0') {
        return run_suite_here(s);
    }
    char *end = NULL;
    errno = 0;
    long n = strtol(mb, &end, 10);
    if (errno != 0 || end == mb || *end != '\0' || n < 1 || n > 1024) {
        fprintf(stderr, "PYFINI_TEST_STACK_THREAD=%s: want a stack size in MB, 1 to 1024\n", mb);
        return 2;
    }
    pthread_attr_t attr;
    pthread_t th;
    struct harness_suite_run r = {s, 1};
    int e = pthread_attr_init(&attr);
    if (e == 0) {
        e = pthread_attr_setstacksize(&attr, (size_t)n << 20);
    }
    if (e == 0) {
        e = pthread_create(&th, &attr, harness_suite_thread, &r);
    }
    pthread_attr_destroy(&attr);
    if (e != 0) {
        fprintf(stderr, "PYFINI_TEST_STACK_THREAD=%s: cannot start the suite's thread: %s\n", mb,
                strerror(e));
        return 2;
    }
    /* Check's timeout signal (SIGALRM) and the rest go to the suite's thread */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    pthread_join(th, NULL);
    return r.rc;
}

#endif /* PYFINI_TEST_HARNESS_H */
