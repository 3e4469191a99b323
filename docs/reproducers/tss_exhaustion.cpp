// docs/reproducers/tss_exhaustion.cpp - pybind11 3.1: every interpreter's
// internals take a thread-specific-storage key (internals::tstate, a
// thread_specific_storage) that only ~internals gives back; internals of an
// interpreter made with the C API are never destroyed (their state-dict
// capsule has no destructor), so after about 1,010 such interpreters
// PyThread_tss_create fails and pybind11 stops the program:
//   "thread_specific_storage constructor: could not initialize the TSS key!"
//
// Expected on pybind11 3.1.0 (glibc: PTHREAD_KEYS_MAX 1024): a failure at
// about cycle 1,020 (exit status 1, the message above as an ImportError).
// With pyfini_pybind11::attach() in the module body 2,000 cycles pass
// (tests/pybind11: test_isolated_two_modules_cycles).
#include <pybind11/embed.h>

#include <cstdio>
#include <cstring>

namespace py = pybind11;

PYBIND11_EMBEDDED_MODULE(repro_tss, m, py::multiple_interpreters::per_interpreter_gil())
{
    m.def("f", [] { return 1; });
}

int main()
{
    py::scoped_interpreter guard{};
    PyThreadState *main_ts = PyThreadState_Get();
    for (int i = 1; i <= 2000; i++) {
        PyInterpreterConfig cfg;
        std::memset(&cfg, 0, sizeof cfg);
        cfg.allow_threads = 1;
        cfg.check_multi_interp_extensions = 1;
        cfg.gil = PyInterpreterConfig_OWN_GIL;
        PyThreadState *ts = nullptr;
        if (PyStatus_Exception(Py_NewInterpreterFromConfig(&ts, &cfg))) {
            std::fprintf(stderr, "Py_NewInterpreterFromConfig failed at cycle %d\n", i);
            return 2;
        }
        if (PyRun_SimpleString("import repro_tss; repro_tss.f()") != 0) {
            std::fprintf(stderr, "the import failed at cycle %d\n", i);
            return 1;
        }
        Py_EndInterpreter(ts);
        PyThreadState_Swap(main_ts);
        if (i % 250 == 0) {
            std::printf("%d interpreters created and ended\n", i);
            std::fflush(stdout);
        }
    }
    std::printf("2000 cycles: no TSS key exhaustion\n");
    return 0;
}
