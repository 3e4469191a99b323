// tests/pybind11/features/containers.cpp - STL binders, casters, iterators.
#include <pybind11/stl.h>
#include <pybind11/stl_bind.h>

#include "features.h"

#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace {
struct Bag {
    std::vector<int> items{1, 2, 3};
    std::map<std::string, int> named{{"a", 1}, {"b", 2}};
};
}  // namespace

PYBIND11_MAKE_OPAQUE(std::vector<double>)
PYBIND11_MAKE_OPAQUE(std::map<std::string, double>)

void bind_containers(py::module_ &m)
{
    py::bind_vector<std::vector<double>>(m, "DoubleVector");
    py::bind_map<std::map<std::string, double>>(m, "DoubleMap");
    m.def("sum_vector", [](const std::vector<double> &v) {
        double t = 0;
        for (double x : v) {
            t += x;
        }
        return t;
    });
    m.def("round_trip", [](std::vector<std::string> v, std::map<int, std::set<int>> mp,
                           std::optional<int> o, std::variant<int, std::string> var) {
        return py::make_tuple(v, mp, o, var);
    });
}

void bind_iterators(py::module_ &m)
{
    py::class_<Bag>(m, "Bag")
        .def(py::init<>())
        .def("__iter__", [](const Bag &b) { return py::make_iterator(b.items.begin(), b.items.end()); },
             py::keep_alive<0, 1>())
        .def("keys", [](const Bag &b) { return py::make_key_iterator(b.named.begin(), b.named.end()); },
             py::keep_alive<0, 1>())
        .def("values", [](const Bag &b) { return py::make_value_iterator(b.named.begin(), b.named.end()); },
             py::keep_alive<0, 1>());
}
