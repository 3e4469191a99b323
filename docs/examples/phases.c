/* docs/examples/phases.c - docs/phases.md: one callback per phase, each
 * doing what its phase allows, registered in a sub-interpreter together with
 * Python-level atexit and threading._register_atexit callbacks. */
#include <Python.h>
#include "pyfini.h"

/* docs: begin phases */
static int pre(void *arg)          /* PYFINI_PRE_SHUTDOWN: threads still run, Python runs */
{
    (void)arg;
    return PyRun_SimpleString("import threading\n"
                              "print('PRE_SHUTDOWN: Python runs,',\n"
                              "      threading.active_count(), 'thread(s) alive', flush=True)\n");
}

static int user(void *arg)         /* PYFINI_USER: one of the atexit callbacks */
{
    (void)arg;
    return PyRun_SimpleString("print('USER: Python runs, in atexit order', flush=True)\n");
}

static int post(void *arg)         /* PYFINI_POST_SHUTDOWN: after the last GC */
{
    PyObject *owned = arg;         /* no Python code; Py_DECREF of what we own is fine */
    printf("POST_SHUTDOWN: phase %s, releasing a %s\n",
           pyfini_phase_name(pyfini_current_phase()), Py_TYPE(owned)->tp_name);
    Py_DECREF(owned);
    return 0;
}

static int runtime(void *arg)      /* PYFINI_RUNTIME_SHUTDOWN: process-wide, no C API */
{
    printf("RUNTIME_SHUTDOWN: %s\n", (const char *)arg);
    return 0;
}

static int register_all(void)      /* in the interpreter whose end we follow */
{
    PyObject *owned = PyDict_New();
    if (owned == NULL) return -1;
    if (pyfini_atexit(pre, NULL, PYFINI_PRE_SHUTDOWN) < 0 ||
        pyfini_atexit(user, NULL, PYFINI_USER) < 0 ||
        pyfini_atexit(post, owned, PYFINI_POST_SHUTDOWN) < 0 ||
        pyfini_atexit(runtime, "after every interpreter is gone", PYFINI_RUNTIME_SHUTDOWN) < 0) {
        Py_DECREF(owned);          /* (a real program would also cancel the ones made) */
        return -1;
    }
    return 0;
}
/* docs: end phases */

#include "example.h"

static int body(void)
{
    if (register_all() < 0) {
        return -1;
    }
    /* registered after pyfini's callbacks: newest first, so these run first */
    return PyRun_SimpleString(
        "import atexit, threading\n"
        "atexit.register(print, 'atexit: a Python atexit callback', flush=True)\n"
        "threading._register_atexit(print, 'threading._register_atexit: a callback', flush=True)\n");
}

int main(void)
{
    return example_run_in_subinterpreter(body);
}
