// docs/reproducers/metaclass_refcount.cpp - pybind11 3.1: the default
// metaclass gains one reference per dead pybind11 class.
//
// detail/class.h pybind11_meta_dealloc() ends with PyType_Type.tp_dealloc(obj)
// and no Py_DECREF(Py_TYPE(obj)); CPython's subtype_dealloc, which it replaces
// as the metaclass's tp_dealloc, gives back the reference every heap type
// holds on its metatype. So the metaclass (and through it the internals'
// interpreter arenas) can never be freed.
//
// Expected on pybind11 3.1.0: "metaclass references: +100 after 100 dead classes"
// (0 when pybind11 gives the reference back).
#include <pybind11/embed.h>

#include <cstdio>

namespace py = pybind11;

struct Thing {};

PYBIND11_EMBEDDED_MODULE(repro_meta, m) { py::class_<Thing>(m, "Thing").def(py::init<>()); }

int main()
{
    py::scoped_interpreter guard{};
    py::exec(R"(
import gc, sys, repro_meta
meta = type(repro_meta.Thing)
gc.collect()
before = sys.getrefcount(meta)
for i in range(100):
    class Dead(repro_meta.Thing):    # a class whose metaclass is pybind11_type
        pass
    del Dead
    gc.collect()
print(f"metaclass references: {sys.getrefcount(meta) - before:+d} after 100 dead classes")
)");
    return 0;
}
