// tests/pybind11/features/exceptions.cpp - exceptions and translators.
#include "features.h"

#include <stdexcept>
#include <string>

namespace {
struct MyError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
struct OtherError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
struct TranslatedError {
    std::string what;
};
struct LocalError {
    int code;
};
}  // namespace

void bind_exceptions(py::module_ &m)
{
    // a py::exception<T> object held by the module (a static one would outlive
    // the interpreter: not something a multi-interpreter module can do)
    m.attr("PlainError") = py::exception<TranslatedError>(m, "PlainErrorType");
    py::register_exception<MyError>(m, "MyError");
    py::register_exception<OtherError>(m, "OtherError", PyExc_ValueError);
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) {
                std::rethrow_exception(p);
            }
        } catch (const TranslatedError &e) {
            PyErr_SetString(PyExc_KeyError, e.what.c_str());
        }
    });
    py::register_local_exception_translator([](std::exception_ptr p) {
        try {
            if (p) {
                std::rethrow_exception(p);
            }
        } catch (const LocalError &e) {
            PyErr_SetString(PyExc_OSError, std::to_string(e.code).c_str());
        }
    });
    m.def("raise_my", []() { throw MyError("mine"); });
    m.def("raise_other", []() { throw OtherError("other"); });
    m.def("raise_translated", []() { throw TranslatedError{"translated"}; });
    m.def("raise_local", []() { throw LocalError{7}; });
    m.def("raise_std", []() { throw std::out_of_range("range"); });
    m.def("call_and_catch", [](py::function f) {
        try {
            f();
        } catch (py::error_already_set &e) {
            return std::string(e.what());
        }
        return std::string("no exception");
    });
}
