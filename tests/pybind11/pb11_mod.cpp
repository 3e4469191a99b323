// tests/pybind11/pb11_mod.cpp - a pybind11 extension module for the adapter's
// tests, built twice (MODNAME pb11_a, pb11_b): each copy is its own shared
// object with its own module-local internals. Both call
// pyfini_pybind11::attach() in every interpreter unless the environment says
// otherwise when the module is imported:
//   PB11_ATTACH=0   plain pybind11 (the "before" of the leak check, the pins)
//   PB11_CONTROL=1  plain pybind11 whose internals are freed in the state-dict
//                   capsule's destructor (the control: a use after free)
//
// Node: a class whose tp_traverse and tp_clear py::cast the object (pybind11's
// reverted case, PR 5958 / 5972): when the last GC of an interpreter frees a
// cycle of Nodes, the casts look up the internals.
#include <pybind11/pybind11.h>

#include "pyfini_pybind11.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace py = pybind11;

#ifndef MODNAME
#error "MODNAME must be defined"
#endif

namespace {

struct Node {
    py::object link;
    int value = 0;
};

// casts made from tp_traverse/tp_clear, and casts that failed (process-wide)
std::atomic<long> gc_casts{0};
std::atomic<long> gc_cast_failures{0};

Node *node_of(PyObject *self)
{
    if (!py::detail::is_holder_constructed(self)) {
        return nullptr;
    }
    try {
        Node &n = py::cast<Node &>(py::handle(self));
        gc_casts++;
        return &n;
    } catch (...) {
        gc_cast_failures++;
        return nullptr;
    }
}

int node_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    if (Node *n = node_of(self)) {
        Py_VISIT(n->link.ptr());
    }
    return 0;
}

int node_clear(PyObject *self)
{
    if (Node *n = node_of(self)) {
        n->link = py::none();
    }
    return 0;
}

// The control: free the shared internals when the state dict's capsule dies,
// leaving pybind11's pointer to them in place (the timing of PR 5958, without
// its re-creation) - the last GC runs after that.
void control_free_internals(PyObject *capsule)
{
    auto *pp = static_cast<std::unique_ptr<py::detail::internals> *>(PyCapsule_GetPointer(capsule, nullptr));
    if (pp != nullptr) {
        delete pp->get();
    }
}

bool env_is(const char *name, const char *value)
{
    const char *v = std::getenv(name);
    return v != nullptr && std::strcmp(v, value) == 0;
}

}  // namespace

#define PB11_CAT2(a, b) a##b
#define PB11_CAT(a, b) PB11_CAT2(a, b)
extern "C" __attribute__((visibility("default"))) long PB11_CAT(MODNAME, _gc_casts)()
{
    return gc_casts.load();
}
extern "C" __attribute__((visibility("default"))) long PB11_CAT(MODNAME, _gc_cast_failures)()
{
    return gc_cast_failures.load();
}

PYBIND11_MODULE(MODNAME, m, py::mod_gil_not_used(), py::multiple_interpreters::per_interpreter_gil())
{
    bool control = env_is("PB11_CONTROL", "1");
    bool adapter = !control && !env_is("PB11_ATTACH", "0");
    if (adapter) {
        pyfini_pybind11::attach();
        pyfini_pybind11::attach();   // idempotent
    }
    if (control && PyCapsule_SetDestructor(py::detail::get_internals_capsule(), control_free_internals) < 0) {
        throw py::error_already_set();
    }
    py::class_<Node>(m, "Node", py::dynamic_attr(), py::custom_type_setup([](PyHeapTypeObject *ht) {
                         PyTypeObject *t = &ht->ht_type;
                         t->tp_flags |= Py_TPFLAGS_HAVE_GC;
                         t->tp_traverse = node_traverse;
                         t->tp_clear = node_clear;
                     }))
        .def(py::init<>())
        .def_readwrite("link", &Node::link)
        .def_readwrite("value", &Node::value);
    m.def("add", [](int a, int b) { return a + b; });
    // n two-Node cycles kept alive by the interpreter's state dict: only the
    // last GC (after the state dict's clear) frees them
    m.def("cycles_for_last_gc", [](int n) {
        py::list keep;
        for (int i = 0; i < n; i++) {
            py::object a = py::cast(Node{}), b = py::cast(Node{});
            a.attr("link") = b;
            b.attr("link") = a;
            keep.append(a);
        }
        PyObject *sd = PyInterpreterState_GetDict(PyInterpreterState_Get());
        if (sd == nullptr || PyDict_SetItemString(sd, "pb11_test_cycles_" PYBIND11_TOSTRING(MODNAME),
                                                  keep.ptr()) < 0) {
            throw py::error_already_set();
        }
    });
    m.attr("adapter") = py::bool_(adapter);
}
