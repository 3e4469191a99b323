/* singlephase.c - _pyfini_singlephase: a single-phase extension module
 * (PyModule_Create in PyInit), the kind CPython 3.12+ refuses to import in
 * an interpreter with its own GIL ("ImportError: module _pyfini_singlephase
 * does not support loading in subinterpreters",
 * _PyImport_CheckSubinterpIncompatibleExtensionAllowed in Python/import.c).
 * The refused case of python/tests (the pytest plugin's test project). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static struct PyModuleDef singlephase_def = {
    PyModuleDef_HEAD_INIT, "_pyfini_singlephase", "pyfini test module: single-phase initialisation", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__pyfini_singlephase(void) { return PyModule_Create(&singlephase_def); }
