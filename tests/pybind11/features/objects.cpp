// tests/pybind11/features/objects.cpp - callables, lifetimes, objects,
// call_once storage, submodules, a pybind11 module importing another.
#include <pybind11/functional.h>
#include <pybind11/gil_safe_call_once.h>

#include "features.h"

#include <functional>
#include <string>

namespace {
struct Owner {
    py::object held;
};
struct Child {
    int v = 9;
};
struct Parent {
    Child child;
};
struct Listener {
    std::function<int(int)> cb;
};
}  // namespace

void bind_callables(py::module_ &m)
{
    m.def("apply", [](const std::function<int(int)> &f, int x) { return f(x); });
    m.def("make_adder", [](int n) { return std::function<int(int)>([n](int x) { return x + n; }); });
    py::class_<Listener>(m, "Listener")
        .def(py::init<>())
        .def("set", [](Listener &l, std::function<int(int)> f) { l.cb = std::move(f); })
        .def("fire", [](Listener &l, int x) { return l.cb ? l.cb(x) : -1; });
}

void bind_objects(py::module_ &m)
{
    py::class_<Child>(m, "Child").def(py::init<>()).def_readwrite("v", &Child::v);
    py::class_<Parent>(m, "Parent")
        .def(py::init<>())
        .def("get_child", [](Parent &p) -> Child & { return p.child; }, py::return_value_policy::reference_internal)
        .def("copy_child", [](Parent &p) { return p.child; }, py::return_value_policy::copy)
        .def("take", [](Parent &, py::object o) { return o; }, py::keep_alive<1, 2>());
    py::class_<Owner>(m, "Owner").def(py::init<>()).def_readwrite("held", &Owner::held);
    m.def("capsule", []() {
        return py::capsule(new int(42), "pb11_features.int", [](void *p) { delete static_cast<int *>(p); });
    });
    m.def("capsule_value", [](py::capsule c) { return *c.get_pointer<int>(); });
    m.def("weak", [](py::object o, py::function cb) { return py::weakref(o, cb); });
    m.def("with_defaults", [](py::list l, py::dict d, py::tuple t) { return py::len(l) + py::len(d) + py::len(t); },
          py::arg("l") = py::list(), py::arg("d") = py::dict(), py::arg("t") = py::make_tuple(1, 2, 3));
    m.def("decimal_module", []() {
        PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<py::object> storage;
        return storage.call_once_and_store_result([]() { return py::module_::import("json"); }).get_stored();
    });
}

void bind_submodules(py::module_ &m)
{
    py::module_ sub = m.def_submodule("sub", "a submodule");
    sub.def("f", []() { return 1; });
    py::module_ deeper = sub.def_submodule("deeper");
    deeper.def("g", []() { return 2; });
    // a pybind11 module that imports another pybind11 module (the test's pb11_a)
    m.def("import_other", []() { return py::module_::import("pb11_a").attr("add")(2, 3); });
}
