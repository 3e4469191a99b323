// tests/pybind11/features/classes.cpp - holders, trampolines, inheritance,
// buffers, pickling.
#include <pybind11/stl.h>
#include <pybind11/trampoline_self_life_support.h>

#include "features.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {
struct Shared {
    int v = 1;
};
struct Smart {
    std::string s = "smart";
};
struct Animal {
    virtual ~Animal() = default;
    virtual std::string speak() const { return "..."; }
    virtual int legs() const = 0;
};
struct PyAnimal : Animal, py::trampoline_self_life_support {
    using Animal::Animal;
    std::string speak() const override { PYBIND11_OVERRIDE(std::string, Animal, speak); }
    int legs() const override { PYBIND11_OVERRIDE_PURE(int, Animal, legs); }
};
struct Shape {
    virtual ~Shape() = default;
    virtual double area() const { return 0; }
};
struct PyShape : Shape {
    using Shape::Shape;
    double area() const override { PYBIND11_OVERRIDE_NAME(double, Shape, "area", area); }
};
struct Base1 {
    int a = 1;
    virtual ~Base1() = default;
};
struct Base2 {
    int b = 2;
    virtual ~Base2() = default;
};
struct Both : Base1, Base2 {
    int c = 3;
};
struct Final {
    int f = 4;
};
struct Open {};
struct Local {
    int l = 5;
};
struct TypeMeta {
    int t = 6;
};
struct Matrix {
    std::vector<float> data = std::vector<float>(6, 1.5f);
};
struct Pickled {
    std::string value;
    int extra = 0;
};
struct Made {
    int v;
    explicit Made(int x) : v(x) {}
};
}  // namespace

void bind_holders(py::module_ &m)
{
    py::class_<Shared, std::shared_ptr<Shared>>(m, "Shared").def(py::init<>()).def_readwrite("v", &Shared::v);
    py::classh<Smart>(m, "Smart").def(py::init<>()).def_readwrite("s", &Smart::s);
    m.def("make_shared", []() { return std::make_shared<Shared>(); });
    m.def("make_unique_smart", []() { return std::unique_ptr<Smart>(new Smart{"unique"}); });
    m.def("consume_smart", [](std::unique_ptr<Smart> p) { return p->s; });
}

void bind_trampolines(py::module_ &m)
{
    py::classh<Animal, PyAnimal>(m, "Animal")
        .def(py::init<>())
        .def("speak", &Animal::speak)
        .def("legs", &Animal::legs);
    m.def("describe", [](const Animal &a) { return a.speak() + ":" + std::to_string(a.legs()); });
    m.def("keep_animal", [](std::shared_ptr<Animal> a) { return a->legs(); });
    py::class_<Shape, PyShape, std::shared_ptr<Shape>>(m, "Shape").def(py::init<>()).def("area", &Shape::area);
    m.def("total_area", [](const std::vector<std::shared_ptr<Shape>> &v) {
        double t = 0;
        for (auto &s : v) {
            t += s->area();
        }
        return t;
    });
}

void bind_inheritance(py::module_ &m)
{
    py::class_<Base1>(m, "Base1").def(py::init<>()).def_readwrite("a", &Base1::a);
    py::class_<Base2>(m, "Base2").def(py::init<>()).def_readwrite("b", &Base2::b);
    py::class_<Both, Base1, Base2>(m, "Both", py::multiple_inheritance(), py::dynamic_attr())
        .def(py::init<>())
        .def_readwrite("c", &Both::c);
    m.def("sum_base2", [](const Base2 &b) { return b.b; });
    py::class_<Final>(m, "Final", py::is_final()).def(py::init<>()).def_readwrite("f", &Final::f);
    py::class_<Open>(m, "Open", py::dynamic_attr()).def(py::init<>());
    py::class_<Local>(m, "Local", py::module_local()).def(py::init<>()).def_readwrite("l", &Local::l);
    // another metatype than pybind11's: CPython's type_dealloc frees the class
    // (pybind11_meta_dealloc never runs for it)
    py::class_<TypeMeta>(m, "TypeMeta", py::metaclass(reinterpret_cast<PyObject *>(&PyType_Type)))
        .def(py::init<>())
        .def_readwrite("t", &TypeMeta::t);
}

void bind_buffers(py::module_ &m)
{
    py::class_<Matrix>(m, "Matrix", py::buffer_protocol())
        .def(py::init<>())
        .def_buffer([](Matrix &mx) {
            return py::buffer_info(mx.data.data(), sizeof(float), py::format_descriptor<float>::format(), 2,
                                   {2, 3}, {sizeof(float) * 3, sizeof(float)});
        });
    m.def("view", [](Matrix &mx) {
        return py::memoryview::from_buffer(mx.data.data(), {static_cast<py::ssize_t>(mx.data.size())},
                                           {static_cast<py::ssize_t>(sizeof(float))});
    }, py::keep_alive<0, 1>());
    m.def("buffer_sum", [](py::buffer b) {
        py::buffer_info info = b.request();
        if (info.format != py::format_descriptor<float>::format()) {
            throw py::type_error("buffer_sum: floats only");
        }
        double t = 0;
        auto *p = static_cast<float *>(info.ptr);
        for (py::ssize_t i = 0; i < info.size; i++) {
            t += p[i];
        }
        return t;
    });
}

void bind_pickle(py::module_ &m)
{
    py::class_<Pickled>(m, "Pickled", py::dynamic_attr())
        .def(py::init<std::string>())
        .def_readwrite("value", &Pickled::value)
        .def(py::pickle([](const Pickled &p) { return py::make_tuple(p.value, p.extra); },
                        [](const py::tuple &t) {
                            Pickled p{t[0].cast<std::string>(), t[1].cast<int>()};
                            return p;
                        }));
    py::class_<Made>(m, "Made")
        .def(py::init([](int x) { return std::unique_ptr<Made>(new Made(x)); }))
        .def(py::init([](std::string s) { return Made(static_cast<int>(s.size())); }))
        .def_readonly("v", &Made::v);
}
