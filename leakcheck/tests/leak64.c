/* leak64.c - test extension modules for pyfini-leakcheck.
 *
 * Built three times:
 *   _pyfini_leak64    (LC_LEAK=1) every import (in every interpreter)
 *                     allocates 64 bytes with PyMem_RawMalloc (malloc on
 *                     release builds) in its exec slot, leak64_exec(), and
 *                     never frees them.
 *   _pyfini_noleak64  (LC_LEAK=0) the same allocation, kept in the module
 *                     state and freed when the module is freed
 *                     (noleak64_free()).
 *   _pyfini_keep      (LC_LEAK=2) no allocation of its own; keep(obj) takes a
 *                     reference to obj that is never given back, so a Python
 *                     object made by the subject outlives its interpreter
 *                     (tests --where's Python lines). A separate module:
 *                     a method's interned name alone is lost per isolated
 *                     interpreter on 3.12/3.13, which would blur the others.
 * Multi-phase initialisation, so all import in isolated interpreters
 * (3.12+: declared safe for a per-interpreter GIL).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#ifndef LC_LEAK
#error define LC_LEAK to 0, 1 or 2
#endif

typedef struct {
    void *block;   /* 64 bytes from PyMem_RawMalloc */
} leak64_state;

#if LC_LEAK == 1
#define LC_EXEC leak64_exec
#define LC_NAME "_pyfini_leak64"
#define LC_INIT PyInit__pyfini_leak64
#define LC_DOC "pyfini-leakcheck test module: 64 bytes per import, lost"
#elif LC_LEAK == 0
#define LC_EXEC noleak64_exec
#define LC_NAME "_pyfini_noleak64"
#define LC_INIT PyInit__pyfini_noleak64
#define LC_DOC "pyfini-leakcheck test module: 64 bytes per import, freed with the module"
#else
#define LC_NAME "_pyfini_keep"
#define LC_INIT PyInit__pyfini_keep
#define LC_DOC "pyfini-leakcheck test module: keep(obj) leaks one reference to obj"
#endif

#ifdef LC_EXEC
/* not static and not inlined: --where must find this name */
__attribute__((noinline)) int LC_EXEC(PyObject *m);

int LC_EXEC(PyObject *m)
{
    leak64_state *st = PyModule_GetState(m);
    void *p = PyMem_RawMalloc(64);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    memset(p, 0x64, 64);
#if LC_LEAK
    (void)st;   /* the block is lost: nothing refers to it any more */
#else
    st->block = p;
#endif
    return 0;
}
#endif

#if LC_LEAK == 0
static void noleak64_free(void *m)
{
    leak64_state *st = PyModule_GetState((PyObject *)m);
    if (st) {
        PyMem_RawFree(st->block);
        st->block = NULL;
    }
}
#endif

#if LC_LEAK == 2
static PyObject *keep(PyObject *m, PyObject *obj)
{
    (void)m;
    Py_INCREF(obj);   /* never given back */
    Py_RETURN_NONE;
}
static PyMethodDef keep_methods[] = {
    {"keep", keep, METH_O, "keep(obj): leak one reference to obj"},
    {NULL, NULL, 0, NULL},
};
#endif

static PyModuleDef_Slot leak64_slots[] = {
#ifdef LC_EXEC
    {Py_mod_exec, (void *)LC_EXEC},
#endif
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef leak64_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = LC_NAME,
    .m_doc = LC_DOC,
    .m_size = sizeof(leak64_state),
    .m_slots = leak64_slots,
#if LC_LEAK == 0
    .m_free = noleak64_free,
#elif LC_LEAK == 2
    .m_methods = keep_methods,
#endif
};

PyMODINIT_FUNC LC_INIT(void);
PyMODINIT_FUNC LC_INIT(void)
{
    return PyModuleDef_Init(&leak64_def);
}
