/* trackleak.c - test extension module _pyfini_trackleak for pyfini-leakcheck:
 * a module that uses pyfini's state and leaks what it tracks, so that
 * pyfini itself reports the leak on stderr at POST_SHUTDOWN of every
 * interpreter that imported it.
 *
 * Its exec slot makes a class (a heap type, weak-referenceable) and one
 * instance, tracks both with pyfini_track() in the state
 * "pyfini.test.trackleak", and keeps one reference to each that is never
 * given back: "pyfini: leak in interpreter N, state "pyfini.test.trackleak":
 * 2 tracked objects still alive at POST_SHUTDOWN" with a " - type ..." and a
 * " - ... object at" line.  Multi-phase, so it imports in isolated
 * interpreters too.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "pyfini.h"

static const pyfini_state_def trackleak_def = {"pyfini.test.trackleak", 16, NULL, NULL};

static int trackleak_exec(PyObject *m)
{
    (void)m;
    if (!pyfini_state(&trackleak_def)) return -1;
    PyObject *type = PyObject_CallFunction((PyObject *)&PyType_Type, "s(){}", "TrackLeaked");
    if (!type) return -1;
    PyObject *obj = PyObject_CallNoArgs(type);
    if (!obj || pyfini_track(&trackleak_def, type) < 0 || pyfini_track(&trackleak_def, obj) < 0) {
        Py_XDECREF(obj);
        Py_DECREF(type);
        return -1;
    }
    /* the leak: both references are kept, never given back */
    return 0;
}

static PyModuleDef_Slot trackleak_slots[] = {
    {Py_mod_exec, (void *)trackleak_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef trackleak_module = {
    PyModuleDef_HEAD_INIT, "_pyfini_trackleak", "pyfini-leakcheck test module: leaks two objects pyfini tracks",
    0, NULL, trackleak_slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__pyfini_trackleak(void) { return PyModuleDef_Init(&trackleak_module); }
