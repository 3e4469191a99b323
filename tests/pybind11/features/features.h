// tests/pybind11/features/features.h - the pybind11 3.1 features a real
// module uses, one binding function per feature, spread over several .cpp
// files that each include pyfini_pybind11.h (a multi-file module, as real
// pybind11 modules are). pb11_features.cpp's PYBIND11_MODULE binds the
// features named by PB11_FEATURES at import ("all" or a comma-separated list;
// PB11_ATTACH=0: plain pybind11, the control). exercise.py uses them.
#pragma once
#include <pybind11/pybind11.h>

#include "pyfini_pybind11.h"

namespace py = pybind11;

void bind_enums(py::module_ &m);           // enums_statics.cpp: py::enum_, py::native_enum
void bind_statics(py::module_ &m);         //   def_*_static, a class attr of its own type
void bind_exceptions(py::module_ &m);      // exceptions.cpp: py::exception, register_*
void bind_holders(py::module_ &m);         // classes.cpp: classh, shared_ptr, trampolines, MI, ...
void bind_trampolines(py::module_ &m);
void bind_inheritance(py::module_ &m);     //   multiple inheritance, dynamic_attr, is_final, module_local,
                                           //   py::metaclass
void bind_buffers(py::module_ &m);         //   buffer_protocol, memoryview
void bind_pickle(py::module_ &m);          //   py::pickle, factory constructors
void bind_containers(py::module_ &m);      // containers.cpp: bind_vector/bind_map, STL casters, iterators
void bind_iterators(py::module_ &m);
void bind_callables(py::module_ &m);       // objects.cpp: std::function, keep_alive, policies, capsule,
void bind_objects(py::module_ &m);         //   weakref, default arguments, call_once, submodules, import
void bind_submodules(py::module_ &m);
