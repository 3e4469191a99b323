// docs/reproducers/second_thread.cpp - pybind11 3.1: a thread that used an
// ended sub-interpreter reads freed internals once a new interpreter lands at
// the same address.
//
// detail/internals.h internals_pp_manager::get_pp() caches, per thread, the
// last interpreter's ADDRESS (thread_local last_istate) and its internals
// (thread_local internals_p). ~subinterpreter destroy()s the internals after
// Py_EndInterpreter, but only the ending thread's cache is dropped; the worker
// thread's entry still names the old address. CPython reuses the address for
// the next interpreter in most cycles, the worker's get_internals() hits the
// stale entry and uses freed memory.
//
// The worker checks, before its first pybind11 call in each interpreter,
// whether its cache key already names that interpreter (read through the
// explicit-instantiation rule: the key is private), then calls
// get_internals() and compares the internals' interpreter with the current
// one - a read through the stale pointer, undefined behaviour.
//
// Expected on pybind11 3.1.0: "stale cache hit" in the first cycle that
// reuses an address, then "internals of another interpreter" or a crash
// (measured: SIGSEGV in cycle 2). Under
// AddressSanitizer nothing shows: its quarantine keeps freed memory (the
// interpreter state included) from being reused, so no address repeats.
#include <pybind11/embed.h>
#include <pybind11/subinterpreter.h>

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

namespace py = pybind11;

// the worker's cache key: internals_pp_manager<internals>::last_istate_tls()
namespace {
using key_fn = PyInterpreterState *&(*)();
struct key_tag { friend key_fn key_of(key_tag); };
template <key_fn F> struct key_access { friend key_fn key_of(key_tag) { return F; } };
template struct key_access<&py::detail::internals_pp_manager<py::detail::internals>::last_istate_tls>;
}  // namespace

int main()
{
    py::scoped_interpreter guard{};
    std::mutex mu;
    std::condition_variable cv;
    PyInterpreterState *current_istate = nullptr;
    bool work = false, stop = false;
    std::thread worker([&] {
        std::unique_lock<std::mutex> lock(mu);
        for (;;) {
            cv.wait(lock, [&] { return work || stop; });
            if (stop) {
                return;
            }
            PyThreadState *ts = PyThreadState_New(current_istate);
            PyThreadState_Swap(ts);
            if (key_of(key_tag{})() == current_istate) {
                std::printf("  stale cache hit: the worker's pybind11 cache names this new interpreter\n");
                std::fflush(stdout);
            }
            if (py::detail::get_internals().istate != current_istate) {   // reads through the cache
                std::printf("  internals of another interpreter\n");
            }
            std::fflush(stdout);
            PyThreadState_Clear(ts);
            PyThreadState_DeleteCurrent();
            work = false;
            cv.notify_all();
        }
    });
    void *prev = nullptr;
    py::gil_scoped_release nogil;   // the worker needs the main GIL to create thread states
    for (int i = 1; i <= 300; i++) {
        py::subinterpreter si = py::subinterpreter::create();
        void *addr = nullptr;
        {
            py::subinterpreter_scoped_activate in(si);
            addr = PyInterpreterState_Get();
        }
        if (addr == prev) {
            std::printf("cycle %d: the new interpreter is at the ended one's address %p\n", i, addr);
            std::fflush(stdout);
        }
        prev = addr;
        {
            std::unique_lock<std::mutex> lock(mu);
            current_istate = static_cast<PyInterpreterState *>(addr);
            work = true;
            cv.notify_all();
            cv.wait(lock, [&] { return !work; });
        }
    }   // ~subinterpreter: Py_EndInterpreter, then destroy() of the internals
    {
        std::lock_guard<std::mutex> lock(mu);
        stop = true;
    }
    cv.notify_all();
    worker.join();
    std::printf("300 cycles without a crash\n");
    return 0;
}
