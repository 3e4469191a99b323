/* bench/pybind11_lookups.cpp - pybind11 3.x's real detail::get_internals()
 * in a shared object, after pybind11 has seen a sub-interpreter (its
 * per-interpreter path: a thread-local interpreter check in front of the
 * state dict). Built only where pybind11 3.x headers exist (the sid tree). */
#include <pybind11/embed.h>
#include <pybind11/subinterpreter.h>
#include <cstdint>
#include "lookups.h"

namespace py = pybind11;
static volatile std::uintptr_t pb11_sink;

__attribute__((noinline)) static void *lookup_pybind11() { return &py::detail::get_internals(); }

/* ns per lookup of one timed batch of n lookups; -1 on failure. GIL held,
   main interpreter. The first call lets pybind11 see a sub-interpreter. */
extern "C" double bench_pybind11_internals(long n)
{
    static bool seen_sub = false;
    if (!seen_sub) {
        try {
            lookup_pybind11();
            {
                py::scoped_subinterpreter sub;   /* pybind11 has now seen a sub-interpreter */
                lookup_pybind11();
            }
            lookup_pybind11();
        } catch (const std::exception &e) {
            std::fprintf(stderr, "pybind11: %s\n", e.what());
            return -1;
        }
        seen_sub = true;
    }
    std::uintptr_t acc = 0;
    double t0 = bench_now();
    for (long i = 0; i < n; i++) {
        acc += reinterpret_cast<std::uintptr_t>(lookup_pybind11());
    }
    double dt = bench_now() - t0;
    if (acc == 1) {   /* keep the loads */
        pb11_sink = acc;
    }
    return dt / static_cast<double>(n) * 1e9;
}
