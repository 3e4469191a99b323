// docs/examples/pybind11_mymod.cpp - README.md and docs/pybind11.md: a
// pybind11 module with pyfini's adapter. Built by tests/pybind11 (pybind11
// 3.1, plain build of CPython 3.14 only: pybind11 is slow to compile) and
// imported in an isolated sub-interpreter by docs/examples/pybind11_host.c.
// docs: begin module
#include <pybind11/pybind11.h>
#include "pyfini_pybind11.h"            // vendored with pyfini.h
namespace py = pybind11;

PYBIND11_MODULE(mymod, m, py::multiple_interpreters::per_interpreter_gil()) {
    pyfini_pybind11::attach();          // first statement; throws py::error_already_set on failure
    m.def("add", [](int a, int b) { return a + b; });
}
// docs: end module
