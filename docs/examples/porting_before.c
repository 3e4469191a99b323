/* docs/examples/porting_before.c - docs/porting.md "before": internals kept
 * in a capsule in the interpreter state dict, the way binding libraries did
 * it without pyfini. It works in this run; docs/porting.md says where it
 * breaks. */
#include <Python.h>

static PyType_Slot base_slots[] = {{0, NULL}};
static PyType_Spec mylib_base_spec = {"mylib.Base", sizeof(PyObject), 0, Py_TPFLAGS_DEFAULT,
                                      base_slots};

/* docs: begin before */
typedef struct { PyObject *base_type; } internals;
#define INTERNALS_KEY "mylib.internals.v3"

static void internals_free(PyObject *capsule)    /* the state dict is cleared: BEFORE the last GC */
{
    internals *in = PyCapsule_GetPointer(capsule, INTERNALS_KEY);
    Py_XDECREF(in->base_type);
    free(in);
    printf("mylib: internals freed\n");
}

static internals *get_internals(void)            /* a dict lookup on every call */
{
    PyObject *dict = PyInterpreterState_GetDict(PyInterpreterState_Get());
    PyObject *cap = dict ? PyDict_GetItemString(dict, INTERNALS_KEY) : NULL;   /* borrowed */
    if (cap != NULL) return PyCapsule_GetPointer(cap, INTERNALS_KEY);
    internals *in = calloc(1, sizeof *in);
    if (in == NULL) { PyErr_NoMemory(); return NULL; }
    in->base_type = PyType_FromSpec(&mylib_base_spec);   /* may run Python: may switch threads */
    cap = in->base_type ? PyCapsule_New(in, INTERNALS_KEY, internals_free) : NULL;
    if (cap == NULL) { Py_XDECREF(in->base_type); free(in); return NULL; }
    int rc = PyDict_SetItemString(dict, INTERNALS_KEY, cap);   /* last writer wins */
    Py_DECREF(cap);                              /* on failure this frees `in` */
    return rc == 0 ? in : NULL;
}
/* docs: end before */

#include "example.h"

static int body(void)
{
    internals *in = get_internals();
    if (in == NULL) {
        return -1;
    }
    printf("internals %s on the second lookup\n", get_internals() == in ? "the same" : "NOT the same");
    return 0;
}

int main(void)
{
    return example_run_in_subinterpreter(body);
}
