/* docs/examples/quickstart.c - README.md "Quick start": an extension module
 * whose per-interpreter state is freed at POST_SHUTDOWN. Run: the module is
 * imported in a sub-interpreter, which is then ended. */
/* docs: begin quickstart */
#include <Python.h>
#include "pyfini.h"          /* vendored: copy include/pyfini.h into your project */

typedef struct { PyObject *cache; char *buffer; } mylib_state;

static int mylib_free(void *arg)          /* POST_SHUTDOWN: after the last GC */
{
    mylib_state *st = arg;
    Py_CLEAR(st->cache);                  /* Py_DECREF of what we own is allowed */
    free(st->buffer);
    free(st);
    printf("mylib: state freed\n");
    return 0;                             /* non-zero is reported on stderr */
}

static int mylib_exec(PyObject *module)   /* Py_mod_exec: runs once per interpreter */
{
    (void)module;
    mylib_state *st = calloc(1, sizeof *st);
    if (st == NULL) { PyErr_NoMemory(); return -1; }
    st->cache = PyDict_New();
    if (pyfini_atexit(mylib_free, st, PYFINI_POST_SHUTDOWN) < 0) {   /* exception set */
        Py_XDECREF(st->cache); free(st); return -1;
    }
    return 0;
}
/* docs: end quickstart */

#include "example.h"

static PyModuleDef_Slot mylib_slots[] = {
    {Py_mod_exec, (void *)mylib_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL}};
static struct PyModuleDef mylib_module = {PyModuleDef_HEAD_INIT, "mylib", NULL, 0, NULL,
                                          mylib_slots, NULL, NULL, NULL};
static PyObject *PyInit_mylib(void) { return PyModuleDef_Init(&mylib_module); }

static int body(void)
{
    PyObject *m = PyImport_ImportModule("mylib");
    printf("mylib imported\n");
    Py_XDECREF(m);
    return m ? 0 : -1;
}

int main(void)
{
    PyImport_AppendInittab("mylib", PyInit_mylib);
    return example_run_in_subinterpreter(body);
}
