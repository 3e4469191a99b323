/* docs/examples/state.c - README.md and docs/state.md: a binding library's
 * per-interpreter "internals" on pyfini_state, with a GC type whose
 * tp_dealloc reads them while the interpreter's last garbage collection
 * runs. Run: a Node in a reference cycle is parked in the
 * interpreter state dict (so that only the last GC frees it), then the
 * sub-interpreter is ended. Built twice: with EXAMPLE_LEAK=1 the program
 * forgets three Nodes (docs/leak-report.md shows the report). */
#include <Python.h>
#include <structmember.h>
#include "pyfini.h"

typedef struct { PyObject_HEAD PyObject *ref; PyObject *weakreflist; } node;
static int node_traverse(PyObject *self, visitproc visit, void *arg);
static int node_clear(PyObject *self);
static void node_dealloc(PyObject *self);
static PyMemberDef node_members[] = {   /* instances are weak-referenceable: trackable */
    {"__weaklistoffset__", T_PYSSIZET, offsetof(node, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL}};
static PyType_Slot node_slots[] = {
    {Py_tp_traverse, (void *)node_traverse}, {Py_tp_clear, (void *)node_clear},
    {Py_tp_dealloc, (void *)node_dealloc}, {Py_tp_members, (void *)node_members}, {0, NULL}};
static PyType_Spec mylib_base_spec = {"mylib.Node", sizeof(node), 0,
                                      Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, node_slots};

/* docs: begin internals */
typedef struct { PyObject *base_type; Py_ssize_t live_nodes; } internals;   /* zero-filled by pyfini */
static const pyfini_state_def internals_def;         /* static storage, never changed */

static int internals_init(void *p)                   /* once per interpreter, GIL held */
{
    internals *in = p;
    in->base_type = PyType_FromSpec(&mylib_base_spec);
    if (in->base_type == NULL) return -1;            /* exception propagates */
    return pyfini_track(&internals_def, in->base_type);   /* reported if it outlives us;
                                                     track instances too (weak-referenceable) */
}
static void internals_clear(void *p)                 /* POST_SHUTDOWN, after the last GC */
{
    internals *in = p;
    printf("mylib: internals cleared, %zd Nodes alive\n", in->live_nodes);
    Py_CLEAR(in->base_type);                         /* pyfini breaks the type's own cycle */
}
static const pyfini_state_def internals_def = {
    "mylib.internals.v3", sizeof(internals), internals_init, internals_clear };

static internals *get_internals(void)                /* creates them on first use */
{
    return pyfini_state(&internals_def);             /* NULL + exception on failure */
}
/* docs: end internals */

static int node_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((node *)self)->ref);
    return 0;
}

static int node_clear(PyObject *self)
{
    Py_CLEAR(((node *)self)->ref);
    return 0;
}

static PyObject *node_new(internals *in)
{
    PyObject *self = PyType_GenericAlloc((PyTypeObject *)in->base_type, 0);
    if (self != NULL) {
        in->live_nodes++;                            /* the library registers its instances */
    }
    return self;
}

/* docs: begin dealloc */
static void node_dealloc(PyObject *self)             /* also runs inside the last GC */
{
    internals *in = pyfini_state_find(&internals_def);   /* never creates, never waits */
    if (in != NULL) {
        in->live_nodes--;                            /* safe: freed after the last GC */
    }
    printf("mylib: Node deallocated, internals %s\n", in ? "still there" : "gone");
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (((node *)self)->weakreflist != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    Py_CLEAR(((node *)self)->ref);
    tp->tp_free(self);
    Py_DECREF(tp);                                   /* instances of a heap type own it */
}
/* docs: end dealloc */

#include "example.h"

static int body(void)
{
    internals *in = get_internals();
    if (in == NULL) {
        return -1;
    }
    printf("internals %s on the second lookup\n", get_internals() == in ? "the same" : "NOT the same");
    /* a Node in a cycle with itself, kept by the state dict until it is cleared */
    PyObject *n = node_new(in);
    if (n == NULL) {
        return -1;
    }
    ((node *)n)->ref = Py_NewRef(n);
    PyObject *dict = PyInterpreterState_GetDict(PyInterpreterState_Get());
    int rc = PyDict_SetItemString(dict, "mylib.example.cycle", n);
    Py_DECREF(n);
#ifdef EXAMPLE_LEAK
    for (int i = 0; i < 3 && rc == 0; i++) {   /* three Nodes nobody releases */
        PyObject *leaked = node_new(in);
        rc = leaked ? pyfini_track(&internals_def, leaked) : -1;
    }
#endif
    return rc;
}

int main(void)
{
    return example_run_in_subinterpreter(body);
}
