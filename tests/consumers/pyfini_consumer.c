/* pyfini_consumer.c - the extension module that every consumer project here
 * builds: it frees its per-interpreter record in a POST_SHUTDOWN callback,
 * and the callback appends one line to the file named by the environment
 * variable PYFINI_CONSUMER_LOG:
 *
 *     interpreter 1: PYFINI_POST_SHUTDOWN
 *
 * (the ID of the interpreter it was imported in, and the phase pyfini says
 * is running). Multi-phase init, so it loads in legacy and isolated
 * sub-interpreters; the module attribute `built_for` ("3.13.0 release")
 * lets the test check which CPython's headers it was compiled with.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "pyfini.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef Py_DEBUG
#  define CONSUMER_BUILD " debug"
#else
#  define CONSUMER_BUILD " release"
#endif

typedef struct {
    long long interp_id;
    char log_path[];           /* PYFINI_CONSUMER_LOG, copied */
} consumer_record;

/* POST_SHUTDOWN: after the interpreter's last garbage collection; no Python
   code runs here, plain C does. Owns and frees the record. */
static int consumer_post_shutdown(void *arg)
{
    consumer_record *rec = (consumer_record *)arg;
    int ok = 0;
    FILE *f = fopen(rec->log_path, "a");
    if (f != NULL) {
        ok = fprintf(f, "interpreter %lld: %s\n", rec->interp_id,
                     pyfini_phase_name(pyfini_current_phase())) > 0;
        ok = (fclose(f) == 0) && ok;
    }
    free(rec);
    return ok ? 0 : -1;        /* non-zero: pyfini reports it on stderr */
}

/* Py_mod_exec: once per interpreter that imports the module. */
static int consumer_exec(PyObject *module)
{
    const char *path = getenv("PYFINI_CONSUMER_LOG");
    if (path == NULL || path[0] == '\0') {
        PyErr_SetString(PyExc_RuntimeError, "PYFINI_CONSUMER_LOG is not set");
        return -1;
    }
    if (PyModule_AddStringConstant(module, "built_for", PY_VERSION CONSUMER_BUILD) < 0 ||
        PyModule_AddIntConstant(module, "pyfini_version", PYFINI_VERSION_HEX) < 0) {
        return -1;
    }
    long long id = (long long)PyInterpreterState_GetID(PyInterpreterState_Get());
    if (id < 0) {
        return -1;
    }
    size_t n = strlen(path) + 1;
    consumer_record *rec = (consumer_record *)malloc(sizeof *rec + n);
    if (rec == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    rec->interp_id = id;
    memcpy(rec->log_path, path, n);
    if (pyfini_atexit(consumer_post_shutdown, rec, PYFINI_POST_SHUTDOWN) < 0) {
        free(rec);             /* exception set by pyfini */
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot consumer_slots[] = {
    {Py_mod_exec, (void *)consumer_exec},
#if PY_VERSION_HEX >= 0x030C0000
    /* no global state: loads in isolated interpreters (own GIL) */
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef consumer_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pyfini_consumer",
    .m_doc = "records that its pyfini POST_SHUTDOWN callback ran",
    .m_size = 0,
    .m_slots = consumer_slots,
};

PyMODINIT_FUNC PyInit_pyfini_consumer(void)
{
    return PyModuleDef_Init(&consumer_def);
}
