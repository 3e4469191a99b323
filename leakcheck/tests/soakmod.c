/* soakmod.c - the subject of `tools/stress soak`: the extension module
 * _pyfini_soak, which uses all of pyfini in every interpreter that imports
 * it, for pyfini-leakcheck to run through thousands of create/end cycles.
 *
 * Its exec slot, once per interpreter (multi-phase: legacy and isolated):
 *   - two per-interpreter states: "pyfini.soak.a", whose init creates
 *     "pyfini.soak.b" (a state made inside another's init: cleared after it);
 *   - one callback in each of the four phases, with state b as argument:
 *     PRE_SHUTDOWN, USER and POST_SHUTDOWN count themselves; the
 *     RUNTIME_SHUTDOWN one (process-wide: it would pile up one record per
 *     interpreter, and the worker never finalizes) is registered through
 *     the main interpreter and cancelled again by the POST_SHUTDOWN
 *     callback, which checks that exactly that one was removed;
 *   - a heap type (PyType_FromModuleAndSpec, held by the module's state) and
 *     one instance of it (a module attribute: freed when CPython clears the
 *     module's dict at the interpreter's end), both tracked by pyfini_track()
 *     in state a: if either were still alive at POST_SHUTDOWN pyfini would
 *     report a leak on stderr, which pyfini-leakcheck reads as LEAK (the
 *     type is in a cycle with its module and its own tp_mro: pyfini breaks
 *     it at POST_SHUTDOWN). The instance's tp_dealloc finds state b
 *     (pyfini_state_find) and counts itself.
 * State b's clear, the last thing pyfini runs for the interpreter, checks
 * that each callback ran exactly once, in its phase and in order, that each
 * state's init and clear ran once (a before b), that the cancel removed one
 * registration, that the instance was freed once, and aborts with a message
 * on stderr on any other count (pyfini-leakcheck then reports a crash, with
 * the message). Then it counts the interpreter and, when PYFINI_SOAK_COUNTS
 * names a file, writes "interpreters N" there (rewritten each time: no
 * allocation, as the counters are), so that the caller can compare N with
 * the cycles that imported the module.
 * Cycles run one after another; the counters are atomics all the same.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#if PY_VERSION_HEX < 0x030C0000
#include <structmember.h>
#define Py_T_PYSSIZET T_PYSSIZET
#define Py_READONLY READONLY
#endif

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "pyfini.h"

typedef struct soak_b {
    long long interp;   /* PyInterpreterState_GetID */
    int init_a, init_b, clear_a, clear_b;
    int pre, user, post, runtime, cancelled, freed;
} soak_b;

typedef struct soak_a {
    soak_b *b;
} soak_a;

static long soak_interpreters;   /* interpreters whose counts were all right */

__attribute__((noreturn, format(printf, 2, 3))) static void soak_fail(const soak_b *b, const char *fmt, ...);
static void soak_fail(const soak_b *b, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "_pyfini_soak: interpreter %lld: ", b ? b->interp : -1LL);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (b) {
        fprintf(stderr, " (init a %d b %d, clear a %d b %d, PRE %d, USER %d, POST %d, RUNTIME %d, "
                "cancelled %d, freed %d)",
                b->init_a, b->init_b, b->clear_a, b->clear_b, b->pre, b->user, b->post, b->runtime,
                b->cancelled, b->freed);
    }
    fputc('\n', stderr);
    fflush(stderr);
    abort();
}

static int soak_init_a(void *state);
static int soak_init_b(void *state);
static void soak_clear_a(void *state);
static void soak_clear_b(void *state);
static const pyfini_state_def soak_a_def = {"pyfini.soak.a", sizeof(soak_a), soak_init_a, soak_clear_a};
static const pyfini_state_def soak_b_def = {"pyfini.soak.b", sizeof(soak_b), soak_init_b, soak_clear_b};

static int soak_init_b(void *state)
{
    soak_b *b = (soak_b *)state;
    b->interp = (long long)PyInterpreterState_GetID(PyInterpreterState_Get());
    b->init_b++;
    return 0;
}

static int soak_init_a(void *state)
{
    soak_a *a = (soak_a *)state;
    a->b = (soak_b *)pyfini_state(&soak_b_def);   /* made inside a's init */
    if (a->b == NULL) {
        return -1;
    }
    a->b->init_a++;
    return 0;
}

static void soak_clear_a(void *state)
{
    soak_b *b = ((soak_a *)state)->b;
    b->clear_a++;
    if (b->clear_b != 0 || b->post != 1) {
        soak_fail(b, "state a cleared after state b or before the POST_SHUTDOWN callback");
    }
}

static void soak_write_counts(long n)
{
    const char *path = getenv("PYFINI_SOAK_COUNTS");
    if (path == NULL || path[0] == '\0') {
        return;
    }
    char line[64];
    int len = snprintf(line, sizeof line, "interpreters %ld\n", n);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, line, (size_t)len) != len) {
        fprintf(stderr, "_pyfini_soak: cannot write PYFINI_SOAK_COUNTS=%s\n", path);
        fflush(stderr);
        abort();
    }
    close(fd);
}

static void soak_clear_b(void *state)
{
    soak_b *b = (soak_b *)state;
    b->clear_b++;
    if (b->init_a != 1 || b->init_b != 1 || b->clear_a != 1 || b->clear_b != 1 || b->pre != 1 ||
        b->user != 1 || b->post != 1 || b->runtime != 0 || b->cancelled != 1 || b->freed != 1) {
        soak_fail(b, "a count is not exactly once");
    }
    if (pyfini_state_find(&soak_b_def) != b) {
        soak_fail(b, "state b not found during its own clear");
    }
    soak_write_counts(__atomic_add_fetch(&soak_interpreters, 1, __ATOMIC_RELAXED));
}

/* ---- the four phases ---------------------------------------------------- */

static int soak_runtime_cb(void *arg)
{
    /* cancelled in every interpreter: it never runs */
    soak_b *b = (soak_b *)arg;
    b->runtime++;
    soak_fail(b, "a cancelled RUNTIME_SHUTDOWN callback ran");
}

static int soak_pre_cb(void *arg)
{
    soak_b *b = (soak_b *)arg;
    b->pre++;
    if (pyfini_current_phase() != PYFINI_PRE_SHUTDOWN || b->user != 0 || b->post != 0) {
        soak_fail(b, "PRE_SHUTDOWN callback out of its phase (%d)", pyfini_current_phase());
    }
    return 0;
}

static int soak_user_cb(void *arg)
{
    soak_b *b = (soak_b *)arg;
    b->user++;
    if (pyfini_current_phase() != PYFINI_USER || b->pre != 1 || b->post != 0) {
        soak_fail(b, "USER callback out of its phase (%d)", pyfini_current_phase());
    }
    return 0;
}

static int soak_post_cb(void *arg)
{
    soak_b *b = (soak_b *)arg;
    b->post++;
    if (pyfini_current_phase() != PYFINI_POST_SHUTDOWN || b->pre != 1 || b->user != 1 || b->clear_a != 0 ||
        b->freed != 1) {
        soak_fail(b, "POST_SHUTDOWN callback out of its phase (%d), or before the tracked instance's end",
                  pyfini_current_phase());
    }
    int r = pyfini_atexit_cancel(soak_runtime_cb, b, PYFINI_RUNTIME_SHUTDOWN);
    if (r != 1) {
        soak_fail(b, "cancelling its RUNTIME_SHUTDOWN callback returned %d: %s", r,
                  pyfini_last_error() ? pyfini_last_error() : "no error");
    }
    b->cancelled++;
    return 0;
}

/* ---- the tracked type and instance --------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *weakrefs;
} soak_object;

static void soak_object_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    soak_b *b = (soak_b *)pyfini_state_find(&soak_b_def);
    if (b == NULL) {
        soak_fail(NULL, "state b not found from the tracked instance's tp_dealloc");
    }
    b->freed++;
    if (((soak_object *)self)->weakrefs != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyMemberDef soak_object_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET, offsetof(soak_object, weakrefs), Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL}};

static PyType_Slot soak_object_slots[] = {
    {Py_tp_dealloc, (void *)soak_object_dealloc},
    {Py_tp_members, (void *)soak_object_members},
    {0, NULL}};

static PyType_Spec soak_object_spec = {"_pyfini_soak.Tracked", sizeof(soak_object), 0, Py_TPFLAGS_DEFAULT,
                                       soak_object_slots};

typedef struct {
    PyObject *type;
} soak_module_state;

static int soak_exec(PyObject *m)
{
    soak_module_state *ms = (soak_module_state *)PyModule_GetState(m);
    if (pyfini_current_phase() != PYFINI_RUNNING) {
        PyErr_Format(PyExc_RuntimeError, "_pyfini_soak: imported in phase %d", pyfini_current_phase());
        return -1;
    }
    soak_a *a = (soak_a *)pyfini_state(&soak_a_def);
    if (a == NULL) {
        return -1;
    }
    soak_b *b = a->b;
    if (pyfini_state(&soak_a_def) != a || pyfini_state_find(&soak_b_def) != b || b->init_a != 1 ||
        b->init_b != 1) {
        soak_fail(b, "the states are not the ones just made");
    }
    if (pyfini_atexit(soak_pre_cb, b, PYFINI_PRE_SHUTDOWN) < 0 || pyfini_atexit(soak_user_cb, b, PYFINI_USER) < 0 ||
        pyfini_atexit(soak_post_cb, b, PYFINI_POST_SHUTDOWN) < 0 ||
        pyfini_atexit(soak_runtime_cb, b, PYFINI_RUNTIME_SHUTDOWN) < 0) {
        return -1;
    }
    ms->type = PyType_FromModuleAndSpec(m, &soak_object_spec, NULL);
    if (ms->type == NULL) {
        return -1;
    }
    if (pyfini_track(&soak_a_def, ms->type) < 0 || PyModule_AddObjectRef(m, "Tracked", ms->type) < 0) {
        return -1;
    }
    PyObject *instance = PyType_GenericAlloc((PyTypeObject *)ms->type, 0);
    if (instance == NULL) {
        return -1;
    }
    int rc = pyfini_track(&soak_a_def, instance) < 0 ? -1 : PyModule_AddObjectRef(m, "instance", instance);
    Py_DECREF(instance);
    return rc;
}

static int soak_traverse(PyObject *m, visitproc visit, void *arg)
{
    soak_module_state *ms = (soak_module_state *)PyModule_GetState(m);
    Py_VISIT(ms->type);
    return 0;
}

static int soak_clear(PyObject *m)
{
    soak_module_state *ms = (soak_module_state *)PyModule_GetState(m);
    Py_CLEAR(ms->type);
    return 0;
}

static void soak_free(void *m) { soak_clear((PyObject *)m); }

static PyModuleDef_Slot soak_slots[] = {
    {Py_mod_exec, (void *)soak_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef soak_module = {
    PyModuleDef_HEAD_INIT, "_pyfini_soak", "tools/stress soak: pyfini's four phases, two states and tracking",
    sizeof(soak_module_state), NULL, soak_slots, soak_traverse, soak_clear, soak_free,
};

PyMODINIT_FUNC PyInit__pyfini_soak(void) { return PyModuleDef_Init(&soak_module); }
