// nb_counter.cpp - a minimal nanobind 2.x module for pyfini-leakcheck's
// third-party scan (docs/findings/third-party.md): a function and a class.
#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace {
struct Counter {
    long n = 0;
    void add(long k) { n += k; }
};
}  // namespace

NB_MODULE(_pyfini_nb_counter, m)
{
    m.def("add", [](long a, long b) { return a + b; });
    nb::class_<Counter>(m, "Counter").def(nb::init<>()).def("add", &Counter::add).def_rw("n", &Counter::n);
}
