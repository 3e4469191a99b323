/* tests/node.h - a small GC heap type for the tests: instances hold one
 * reference (`ref`, to make cycles) and support weak references (which
 * pyfini_track needs). node_hook, if set, runs in tp_traverse and tp_clear.
 */
#ifndef PYFINI_TEST_NODE_H
#define PYFINI_TEST_NODE_H
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *ref;
    PyObject *weakreflist;
} node_object;

static void (*node_hook)(const char *where);

static int node_traverse(PyObject *self, visitproc visit, void *arg)
{
    if (node_hook != NULL) {
        node_hook("traverse");
    }
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((node_object *)self)->ref);
    return 0;
}

static int node_clear(PyObject *self)
{
    if (node_hook != NULL) {
        node_hook("clear");
    }
    Py_CLEAR(((node_object *)self)->ref);
    return 0;
}

static void node_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (node_hook != NULL) {
        node_hook("dealloc");
    }
    if (((node_object *)self)->weakreflist != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    Py_CLEAR(((node_object *)self)->ref);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyMemberDef node_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(node_object, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL}};

static PyType_Slot node_slots[] = {
    {Py_tp_members, (void *)node_members},
    {Py_tp_dealloc, (void *)node_dealloc},
    {Py_tp_traverse, (void *)node_traverse},
    {Py_tp_clear, (void *)node_clear},
    {0, NULL}};

static PyType_Spec node_spec = {"pyfini_test.Node", sizeof(node_object), 0,
                                Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
                                node_slots};

static inline PyObject *node_new(PyObject *type)
{
    return PyType_GenericAlloc((PyTypeObject *)type, 0);
}
#endif
