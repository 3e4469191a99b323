// tests/pybind11/test_pybind11.cpp - pyfini's pybind11 adapter
// (include/pyfini_pybind11.h) on real interpreters, one process per test
// (Check, fork mode).
//
// Modules (tests/pybind11/pb11_mod.cpp, each its own shared object with its
// own module-local internals) attach; with PB11_ATTACH=0 at import they are
// plain pybind11, with PB11_CONTROL=1 they free the internals in the state-dict
// capsule's destructor (the control).
//
// The pybind11 3.1 internals the adapter relies on, each pinned here by name:
//   detail/internals.h
//   - internals::instance_base, ::static_property_type, ::default_metaclass,
//     local_internals::function_record_py_type: types and strong references
//     (static_asserts below; pin_capsules; test_*_zero_loss: freed -> 0 B)
//   - internals::tstate (thread_specific_storage: a TSS key freed only by
//     ~internals): test_isolated_two_modules_cycles goes past ~1,010 keys
//   - the state-dict capsules under PYBIND11_INTERNALS_ID and
//     PYBIND11_MODULE_LOCAL_ID + address, payload new std::unique_ptr<...>,
//     destructor NULL: pin_capsules
//   - internals_pp_manager::get_pp() / unref() and the private
//     pps_have_created_content_ / pp_set_mutex_: pin_created_set (and the
//     adapter does not compile if they move)
//   - the thread_local last-interpreter cache keyed on the address
//     (internals_pp_manager::last_istate_tls) and the fetch hook a cache miss
//     calls (on_fetch_): test_second_thread_release_thread, _c_api,
//     _scoped_activate (subinterpreter.h: ~subinterpreter_scoped_activate
//     fills the cache again as it leaves)
//   - a cache miss during the last GC reads the state dict:
//     test_ending_thread_cache_elsewhere (the adapter's USER priming)
//   detail/class.h
//   - pybind11_meta_dealloc without Py_DECREF of the metaclass:
//     pin_metaclass_refcount_plain (+1 per dead class) and
//     test_metaclass_refcount_repaired (0)
//   subinterpreter.h / embed.h
//   - ~subinterpreter and finalize_interpreter call destroy() after the end:
//     test_scoped_subinterpreter_zero_loss, test_main_finalize
#include <Python.h>

#include <pybind11/embed.h>
#include <pybind11/subinterpreter.h>

#include "pyfini_pybind11.h"

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>

extern "C" {
#include "lc_alloc.h"   // leakcheck's allocator meter: CPython's allocators, each block once
}

// after every C++ header: check.h defines a macro `fail`
#include <check.h>
#include "../harness.h"   // run(), new_sub(), SKIP_TEST, run_suite()

namespace py = pybind11;
namespace pbd = pybind11::detail;

#ifndef MOD_DIR
#error "MOD_DIR must name the folder of the test modules"
#endif

// ---- pins at compile time: the members the adapter reads and clears ------
static_assert(std::is_same<decltype(pbd::internals::instance_base), PyObject *>::value,
              "pybind11 internals::instance_base moved");
static_assert(std::is_same<decltype(pbd::internals::static_property_type), PyTypeObject *>::value,
              "pybind11 internals::static_property_type moved");
static_assert(std::is_same<decltype(pbd::internals::default_metaclass), PyTypeObject *>::value,
              "pybind11 internals::default_metaclass moved");
static_assert(std::is_same<decltype(pbd::internals::tstate),
                           pybind11::thread_specific_storage<PyThreadState>>::value,
              "pybind11 internals::tstate (the TSS key) moved");
static_assert(std::is_same<decltype(pbd::local_internals::function_record_py_type), PyTypeObject *>::value,
              "pybind11 local_internals::function_record_py_type moved");
static_assert(std::is_same<decltype(pbd::get_internals_pp_manager().get_pp()),
                           std::unique_ptr<pbd::internals> *>::value,
              "pybind11 internals_pp_manager::get_pp() changed");

// ---- helpers -------------------------------------------------------------

static int env_int(const char *name, int dflt)
{
    const char *v = std::getenv(name);
    return v != nullptr && *v != '\0' ? std::atoi(v) : dflt;
}

// Cycle counts: halved in the slower builds (ASan, debug CPython) to keep
// the suite's time modest; the TSS test (test_isolated_two_modules_cycles)
// goes past the ~1,010 TSS keys in the plain release builds only.
#if defined(__SANITIZE_ADDRESS__) || defined(Py_DEBUG)
static const int slow_build = 1;
#else
static const int slow_build = 0;
#endif
static int scaled(int n) { return slow_build ? n / 2 : n; }

static void init_main(bool meter)
{
    setenv("PYTHONPATH", MOD_DIR, 1);
    setenv("PYTHONHASHSEED", "0", 1);
    if (meter) {
        lc_alloc_install(0);
    }
    Py_InitializeEx(0);
}

static PyThreadState *new_isolated() { return new_sub(SUB_ISOLATED); }

// one isolated interpreter: create, run code, end (from and back to main)
static void cycle_isolated(const char *code)
{
    PyThreadState *main_ts = PyThreadState_Get();
    PyThreadState *ts = new_isolated();
    if (code != nullptr) {
        run(code);
    }
    Py_EndInterpreter(ts);
    PyThreadState_Swap(main_ts);
}

static void cycle_legacy(const char *code)
{
    PyThreadState *main_ts = PyThreadState_Get();
    PyThreadState *ts = Py_NewInterpreter();
    ck_assert_ptr_nonnull(ts);
    run(code);
    Py_EndInterpreter(ts);
    PyThreadState_Swap(main_ts);
}

// bytes held through CPython's three allocators gained over n cycles after
// `warm` warm-up cycles
template <typename F>
static long long python_bytes_over(int warm, int n, F cycle)
{
    for (int i = 0; i < warm; i++) {
        cycle();
    }
    long long before = lc_alloc_bytes();
    for (int i = 0; i < n; i++) {
        cycle();
    }
    return lc_alloc_bytes() - before;
}

// The exact meter's verdict: what subject cycles keep per cycle must not
// exceed what bare cycles of the same kind keep (CPython 3.13 loses memory in
// bare cycles, 3.14+ none). Bare cycles: at most 200. CPython 3.13 also keeps
// a few objects of every import for good (leakcheck/README.md: `--import
// _json` +106 B, 2 objects per isolated cycle; here pb11_a +59 B, 1 object):
// there up to 512 B per cycle beyond bare are allowed - far from the 1.7 MB
// of abandoned arenas (3.13 abandons them in bare cycles already).
#if PY_VERSION_HEX < 0x030E0000
static const long long allowed_per_cycle = 512;
#else
static const long long allowed_per_cycle = 0;
#endif
template <typename S, typename B>
static void assert_zero_excess(const char *what, int warm, int n, S subject, B bare)
{
    // each side over two halves, the smaller half doubled: a one-time growth
    // (seen with concurrent.interpreters: 207,520 B once, at a varying cycle,
    // with or without pybind11) lands in one half only; a loss per cycle
    // shows in both
    int nb = n < 200 ? n : 200;
    long long b1 = python_bytes_over(warm, nb / 2, bare), b2 = python_bytes_over(0, nb / 2, bare);
    long long s1 = python_bytes_over(warm, n / 2, subject), s2 = python_bytes_over(0, n / 2, subject);
    long long b = 2 * (b1 < b2 ? b1 : b2), s = 2 * (s1 < s2 ? s1 : s2);
    double excess = (double)s / n - (double)b / nb;
    std::printf("NOTE %s on CPython %s: %d cycles keep %lld + %lld B in CPython's allocators (%d bare "
                "cycles %lld + %lld B): %+.1f B per cycle beyond bare (allowed %lld)\n",
                what, PY_VERSION, n, s1, s2, nb, b1, b2, excess, allowed_per_cycle);
    std::fflush(stdout);
    ck_assert_msg(s * nb <= b * n + allowed_per_cycle * n * nb,
                  "%s: %lld B kept over %d cycles, %+.1f B per cycle more than %d bare cycles (%lld B)",
                  what, s, n, excess, nb, b);
}

static long module_counter(const char *mod, const char *fn)
{
    std::string path = std::string(MOD_DIR) + "/" + mod + ".so";
    void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    ck_assert_msg(h != nullptr, "%s is not loaded", path.c_str());
    auto f = reinterpret_cast<long (*)()>(dlsym(h, (std::string(mod) + fn).c_str()));
    ck_assert_ptr_nonnull(reinterpret_cast<void *>(f));
    long v = f();
    dlclose(h);
    return v;
}

static void assert_gc_casts_ok(const char *mod)
{
    long casts = module_counter(mod, "_gc_casts");
    long failures = module_counter(mod, "_gc_cast_failures");
    ck_assert_msg(casts > 0, "%s: no py::cast ran in tp_traverse/tp_clear", mod);
    ck_assert_msg(failures == 0, "%s: %ld casts in tp_traverse/tp_clear failed", mod, failures);
}

static const char *two_modules_code =
    "import pb11_a, pb11_b\n"
    "pb11_a.cycles_for_last_gc(3)\n"
    "pb11_b.cycles_for_last_gc(3)\n"
    "n = pb11_a.Node(); n.link = pb11_b.Node(); n.link.link = n\n"
    "assert pb11_a.add(1, 2) == 3 and pb11_b.add(2, 3) == 5\n";

// ---- raw isolated interpreters: two modules, last-GC casts, 1,100 cycles ----

START_TEST(test_isolated_two_modules_cycles)
{
    // Py_NewInterpreterFromConfig (own GIL, own obmalloc); two shared objects,
    // each with its own local internals; Node cycles only the last GC frees,
    // whose tp_traverse/tp_clear py::cast (pybind11's reverted case); 1,100
    // cycles: past the ~1,010 TSS keys that plain pybind11 leaks.
    init_main(true);
    // 1,100: past the TSS keys with a margin (CI time: 2,000 with
    // PYFINI_PB11_CYCLES=2000). Under AddressSanitizer (about 3x slower) 300:
    // that build looks for memory errors; every plain 3.14+ row goes past
    // the TSS keys (CI time)
#if defined(__SANITIZE_ADDRESS__) || defined(Py_DEBUG)
    // the debug builds too (CI time: 2 x 1,100 isolated cycles took most of
    // 3.14.10d's 154 s here); their release builds go past the TSS keys
    const int least = 300;
    std::printf("NOTE test_isolated_two_modules_cycles: %s build, %d cycles by default (the plain release builds "
                "run 1,100, past the ~1,010 TSS keys)\n", slow_build ? "ASan or debug" : "this", least);
#else
    const int least = 1100;
#endif
    int n = env_int("PYFINI_PB11_CYCLES", least);
    ck_assert_int_ge(n, least);
    assert_zero_excess(
        "test_isolated_two_modules_cycles", 20, n, [] { cycle_isolated(two_modules_code); },
        [] { cycle_isolated("pass"); });
    assert_gc_casts_ok("pb11_a");
    assert_gc_casts_ok("pb11_b");
    ck_assert_int_eq(Py_FinalizeEx(), 0);
}
END_TEST

// ---- the ending thread's cache points at another interpreter ------------

START_TEST(test_ending_thread_cache_elsewhere)
{
    // The thread uses pb11_a in the sub-interpreter, then in the main one
    // (its pybind11 cache now names main), then ends the sub-interpreter
    // without a pybind11 call: without the adapter's USER priming the last
    // GC's casts would miss the cache and read the cleared state dict.
    init_main(true);
    run("import pb11_a");
    auto cycle = [] {
        PyThreadState *main_ts = PyThreadState_Get();
        PyThreadState *ts = new_isolated();
        run("import pb11_a\npb11_a.cycles_for_last_gc(4)\n");
        PyThreadState_Swap(main_ts);
        run("pb11_a.Node().value = 1");
        PyThreadState_Swap(ts);
        Py_EndInterpreter(ts);
        PyThreadState_Swap(main_ts);
    };
    assert_zero_excess("test_ending_thread_cache_elsewhere", 5, scaled(100), cycle,
                       [] { cycle_isolated("pass"); });
    assert_gc_casts_ok("pb11_a");
    ck_assert_int_eq(Py_FinalizeEx(), 0);
}
END_TEST

// ---- py::scoped_subinterpreter -----------------------------------------

START_TEST(test_scoped_subinterpreter_zero_loss)
{
    // pybind11's own sub-interpreter class (own GIL, own obmalloc): the
    // program attaches right after entering; ~subinterpreter's destroy()
    // after Py_EndInterpreter then finds nothing left to free twice.
    init_main(true);
    assert_zero_excess(
        "test_scoped_subinterpreter_zero_loss", 5, scaled(100),
        [] {
            py::scoped_subinterpreter ssi;
            pyfini_pybind11::attach();
            py::module_ a = py::module_::import("pb11_a");
            a.attr("cycles_for_last_gc")(3);
            ck_assert_int_eq(a.attr("add")(2, 2).cast<int>(), 4);
        },
        [] { cycle_isolated(nullptr); });
    assert_gc_casts_ok("pb11_a");
    ck_assert_int_eq(Py_FinalizeEx(), 0);
}
END_TEST

START_TEST(test_scoped_subinterpreter_program_not_attached)
{
    // Rule 1 not kept by the program: the adapter notices the unattached
    // shared object at USER, drops its type reference and leaves the shared
    // internals' holder to ~subinterpreter's destroy(): no double free, and
    // CPython's allocators keep nothing.
    init_main(true);
    assert_zero_excess(
        "test_scoped_subinterpreter_program_not_attached", 5, scaled(100),
        [] {
            py::scoped_subinterpreter ssi;
            py::module_::import("pb11_a").attr("cycles_for_last_gc")(2);
        },
        [] { cycle_isolated(nullptr); });
    ck_assert_int_eq(Py_FinalizeEx(), 0);
}
END_TEST

// ---- concurrent.interpreters from Python --------------------------------

START_TEST(test_concurrent_interpreters)
{
    // interpreters made from Python: concurrent.interpreters (3.14+), its
    // low-level module _interpreters on 3.13. 300 warm-up cycles: on 3.14.10
    // something of the interpreters machinery grows once by 207,520 B
    // between about cycle 110 and 250 (with pybind11 or without), then stays.
    init_main(true);
#if PY_VERSION_HEX >= 0x030E0000
    run("from concurrent import interpreters\n"
        "def cycle(code):\n"
        "    it = interpreters.create()\n"
        "    it.exec(code)\n"
        "    it.close()\n");
#else
    run("import _interpreters\n"
        "def cycle(code):\n"
        "    i = _interpreters.create()\n"
        "    _interpreters.exec(i, code)\n"
        "    _interpreters.destroy(i)\n");
#endif
    assert_zero_excess(
        "test_concurrent_interpreters", 300, scaled(100),
        [] { run("cycle('import pb11_a, pb11_b\\npb11_a.cycles_for_last_gc(2)\\npb11_b.cycles_for_last_gc(2)')"); },
        [] { run("cycle('pass')"); });
    assert_gc_casts_ok("pb11_a");
    ck_assert_int_eq(Py_FinalizeEx(), 0);
}
END_TEST

// ---- legacy sub-interpreters ---------------------------------------------

START_TEST(test_legacy)
{
    init_main(true);
    assert_zero_excess("test_legacy", 5, scaled(100), [] { cycle_legacy(two_modules_code); },
                       [] { cycle_legacy("pass"); });
    assert_gc_casts_ok("pb11_a");
    ck_assert_int_eq(Py_FinalizeEx(), 0);
}
END_TEST

// ---- the main interpreter through Py_FinalizeEx --------------------------

static long long main_round(bool modules)
{
    Py_InitializeEx(0);
    if (modules) {
        run(two_modules_code);
    }
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    return lc_alloc_bytes();
}

START_TEST(test_main_finalize)
{
    // Py_FinalizeEx ends the main interpreter: the adapter frees the
    // internals at its POST_SHUTDOWN; a new Py_Initialize gets new ones.
    // Rounds 3..6 must keep what bare rounds keep.
    setenv("PYTHONPATH", MOD_DIR, 1);
    lc_alloc_install(0);
    for (int i = 0; i < 2; i++) {
        main_round(true);
        main_round(false);
    }
    long long b0 = main_round(false), b1 = b0;
    for (int i = 0; i < 4; i++) {
        b1 = main_round(false);
    }
    long long s0 = main_round(true), s1 = s0;
    for (int i = 0; i < 4; i++) {
        s1 = main_round(true);
    }
    std::printf("NOTE test_main_finalize on CPython %s: 4 rounds keep %lld B (bare %lld B)\n", PY_VERSION,
                s1 - s0, b1 - b0);
    ck_assert_msg(s1 - s0 <= b1 - b0, "Py_FinalizeEx rounds with pybind11 keep %lld B beyond bare rounds",
                  (s1 - s0) - (b1 - b0));
    assert_gc_casts_ok("pb11_a");
}
END_TEST

START_TEST(test_scoped_interpreter)
{
    // pybind11's embed.h: finalize_interpreter() destroy()s after
    // Py_Finalize; the program attached, so nothing is freed twice.
    setenv("PYTHONPATH", MOD_DIR, 1);
    for (int i = 0; i < 3; i++) {
        py::scoped_interpreter guard{false};
        pyfini_pybind11::attach();
        py::module_::import("pb11_a").attr("cycles_for_last_gc")(3);
    }
    assert_gc_casts_ok("pb11_a");
}
END_TEST

// ---- the metaclass reference count ---------------------------------------

static const char *dead_classes_code =
    "import gc, sys\n"
    "M = type(mod.Node)\n"
    "gc.collect()\n"
    "r0 = sys.getrefcount(M)\n"
    "for i in range(10):\n"
    "    class Sub(mod.Node):\n"
    "        pass\n"
    "    del Sub\n"
    "    gc.collect()\n"
    "grown = sys.getrefcount(M) - r0\n";

static long metaclass_growth(const char *mod)
{
    init_main(false);
    run((std::string("import ") + mod + " as mod\n" + dead_classes_code).c_str());
    PyObject *m = PyImport_AddModule("__main__");
    PyObject *g = PyObject_GetAttrString(m, "grown");
    ck_assert_ptr_nonnull(g);
    long grown = PyLong_AsLong(g);
    Py_DECREF(g);
    return grown;
}

START_TEST(pin_metaclass_refcount_plain)
{
    // detail/class.h pybind11_meta_dealloc: PyType_Type.tp_dealloc without
    // Py_DECREF of the metaclass - one reference lost per dead class.
    setenv("PB11_ATTACH", "0", 1);
    ck_assert_int_eq(metaclass_growth("pb11_a"), 10);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
}
END_TEST

START_TEST(test_metaclass_refcount_repaired)
{
    ck_assert_int_eq(metaclass_growth("pb11_a"), 0);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
}
END_TEST

// ---- pins of the capsules and the created set ---------------------------

START_TEST(pin_capsules)
{
    // detail/internals.h atomic_get_or_create_in_state_dict with dtor NULL:
    // the capsule of PYBIND11_INTERNALS_ID and of this object's
    // PYBIND11_MODULE_LOCAL_ID key have no destructor; their payload is the
    // pointer-to-pointer get_pp() returns.
    init_main(false);
    {
        py::gil_scoped_acquire gil;
        pbd::get_internals();
        pbd::get_local_internals();
        PyObject *cap = pbd::get_internals_capsule();
        ck_assert_ptr_nonnull(cap);
        ck_assert_ptr_null(reinterpret_cast<void *>(PyCapsule_GetDestructor(cap)));
        ck_assert_ptr_eq(PyCapsule_GetPointer(cap, nullptr), pbd::get_internals_pp_manager().get_pp());
        PyObject *lcap = pbd::get_local_internals_capsule();
        ck_assert_ptr_nonnull(lcap);
        ck_assert_ptr_null(reinterpret_cast<void *>(PyCapsule_GetDestructor(lcap)));
        ck_assert_ptr_eq(PyCapsule_GetPointer(lcap, nullptr), pbd::get_local_internals_pp_manager().get_pp());
        ck_assert(std::strncmp(pbd::get_local_internals_key().c_str(), PYBIND11_MODULE_LOCAL_ID,
                               std::strlen(PYBIND11_MODULE_LOCAL_ID)) == 0);
        ck_assert_ptr_nonnull(pbd::get_internals().instance_base);
        ck_assert_ptr_nonnull(pbd::get_internals().default_metaclass);
        ck_assert_ptr_nonnull(pbd::get_internals().static_property_type);
        ck_assert(Py_TYPE(pbd::get_internals().instance_base) == pbd::get_internals().default_metaclass);
    }
    ck_assert_int_eq(Py_FinalizeEx(), 0);
}
END_TEST

START_TEST(pin_created_set)
{
    // internals_pp_manager::pps_have_created_content_ (private, reached by
    // the adapter): the creator's set holds the pointer-to-pointer.
    init_main(false);
    {
        auto &mgr = pbd::get_internals_pp_manager();
        pbd::get_internals();
        auto *pp = mgr.get_pp();
        ck_assert(pyfini_pybind11::detail::pp_created_here(mgr, pp));
        auto &lmgr = pbd::get_local_internals_pp_manager();
        pbd::get_local_internals();
        ck_assert(pyfini_pybind11::detail::pp_created_here(lmgr, lmgr.get_pp()));
    }
    ck_assert_int_eq(Py_FinalizeEx(), 0);
}
END_TEST


// ---- pins of what the adapter repairs (tests/pybind11/features, plain) ---

// Python code run in the main interpreter with pb11_features imported with
// the given features; returns the int it leaves in `result`.
static long features_result(const char *features, bool attach, const char *code)
{
    setenv("PB11_FEATURES", features, 1);
    setenv("PB11_ATTACH", attach ? "1" : "0", 1);
    init_main(false);
    run("import gc, sys, weakref\nimport pb11_features as m\n");
    run(code);
    PyObject *main_dict = PyModule_GetDict(PyImport_AddModule("__main__"));
    PyObject *r = PyDict_GetItemString(main_dict, "result");
    ck_assert_ptr_nonnull(r);
    long v = PyLong_AsLong(r);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    return v;
}

// references a new-and-dropped pybind11_static_property instance leaves on
// its type (detail/class.h make_static_property_type: it inherits CPython's
// property_dealloc, which gives back no reference of a heap type)
static const char static_property_code[] =
    "t = type(vars(m.Config)['level'])\n"
    "gc.collect(); before = sys.getrefcount(t)\n"
    "for i in range(10):\n"
    "    p = t(None); p.__doc__ = 'd'; del p\n"
    "gc.collect(); result = sys.getrefcount(t) - before\n";

START_TEST(pin_static_property_dealloc)
{
    ck_assert_int_eq(features_result("statics", false, static_property_code), 10);
}
END_TEST

START_TEST(test_static_property_dealloc_repaired)
{
    ck_assert_int_eq(features_result("statics", true, static_property_code), 0);
}
END_TEST

START_TEST(pin_enum_cycle)
{
    // pybind11 instances are not tracked by the GC (instance_base has no
    // Py_TPFLAGS_HAVE_GC) and py::enum_ keeps its values in its own dict: a
    // cycle of class and values the last GC cannot free (pyfini_pybind11.h
    // break_class_cycles)
    ck_assert_int_eq(features_result("enums", false,
                                     "result = (not gc.is_tracked(m.Color.red)) + (vars(m.Color)['red'] is m.Color.red)"
                                     " + (type(m.Color.red) is m.Color)\n"),
                     3);
}
END_TEST

START_TEST(pin_def_submodule_leak)
{
    // pybind11.h module_::def_submodule keeps the new reference of
    // PyModule_GetFilenameObject() in a handle: 1 reference lost per call
    // (the adapter's own probe, which the adapter gives back by)
    init_main(false);
    ck_assert_int_eq(pyfini_pybind11::detail::def_submodule_leak_per_call(), 1);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
}
END_TEST

START_TEST(test_def_submodule_give_back)
{
    // give_back_def_submodule_refs: one reference per submodule OBJECT
    // (pb11_features.sub and .sub.deeper: 2), none for the same submodule
    // under a second sys.modules name nor for a bare module holding the
    // parent's very __file__ that def_submodule did not make, and nothing
    // more when called again (at_user calls it at Py_FinalizeEx). Before:
    // 4 given back, a negative reference count (Fatal Python error in a
    // debug build; repro/atk.cpp submodule_alias, fake_sub)
    setenv("PB11_FEATURES", "submodules", 1);
    setenv("PB11_ATTACH", "1", 1);
    init_main(false);
    run("import sys, types\nimport pb11_features as m\nf = m.__file__\n"
        "sys.modules['pb11_features.sub_alias'] = m.sub\n"
        "fake = types.ModuleType('pb11_features.fake'); fake.__file__ = f\n"
        "sys.modules['pb11_features.fake'] = fake; del fake\n");
    PyObject *f = PyDict_GetItemString(PyModule_GetDict(PyImport_AddModule("__main__")), "f");
    ck_assert_ptr_nonnull(f);
    auto *rec = pyfini_pybind11::detail::find_rec();
    ck_assert_ptr_nonnull(rec);
    Py_ssize_t before = Py_REFCNT(f);
    pyfini_pybind11::detail::give_back_def_submodule_refs(rec);
    Py_ssize_t mid = Py_REFCNT(f);
    pyfini_pybind11::detail::give_back_def_submodule_refs(rec);
    ck_assert_int_eq(before - mid, 2);
    ck_assert_int_eq(Py_REFCNT(f), mid);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
}
END_TEST

START_TEST(pin_type_cache_weakref)
{
    // pybind11.h all_type_info_get_cache(): a cast looks up a plain type
    // (here `object`, a static type that never dies) and leaves a weak
    // reference to it whose callback is a pybind11 function, released on
    // purpose (freed only by the callback)
    ck_assert_int_eq(features_result("inheritance", false,
                                     "try:\n    m.sum_base2(object())\nexcept TypeError:\n    pass\n"
                                     "result = sum(1 for w in weakref.getweakrefs(object) if w.__callback__ is not None"
                                     " and 'function_record' in type(getattr(w.__callback__, '__self__', None)).__name__)\n"),
                     1);
}
END_TEST

START_TEST(pin_scopeless_class_reference)
{
    // detail/class.h make_new_python_type: a class made without a scope (the
    // iterator state class py::make_iterator makes on first use) keeps a
    // reference "alive forever"; pybind11 sets no __module__ on it
    ck_assert_int_eq(features_result("iterators", false,
                                     "it = iter(m.Bag()); t = type(it); del it; gc.collect()\n"
                                     "result = ('__module__' not in vars(t)) + (sys.getrefcount(t) - 2 >= 2)\n"),
                     2);
}
END_TEST

// ---- a second thread that used an ended interpreter ----------------------

// pybind11's per-thread cache key, internals_pp_manager::last_istate_tls()
// (a private static function returning the thread_local last interpreter):
// reached like the adapter reaches the created set (explicit instantiation).
namespace {
using key_fn = PyInterpreterState *&(*)();
struct key_tag { friend key_fn key_of(key_tag); };
template <key_fn F> struct key_access { friend key_fn key_of(key_tag) { return F; } };
template struct key_access<&pyfini_pybind11::detail::shared_manager::last_istate_tls>;
}  // namespace

// How the worker enters each interpreter and uses pybind11 there.
enum class entry_mode {
    raw_release,    // C API thread state; pyfini_pybind11::release_thread() before leaving
    raw,            // C API thread state; nothing of pyfini's
    scoped,         // py::subinterpreter_scoped_activate, py::gil_scoped_release/acquire inside
};

struct handoff {
    std::mutex mu;
    std::condition_variable cv;
    PyInterpreterState *interp = nullptr;
    int turn = 0;   // 1: the worker's turn, 2: done
    bool stop = false;
    int stale = 0;  // pybind11 cache hits that named another interpreter's internals
    py::subinterpreter si;   // the current interpreter, not owned (entry_mode::scoped)
};

// What the worker runs in each interpreter: the program's pybind11 and
// pb11_a's, each checked against the interpreter it is in.
static void worker_uses_pybind11(PyInterpreterState *interp)
{
    py::int_ one(1);
    ck_assert_int_eq(pbd::get_internals().istate == interp, 1);
    run("import pb11_a\nx = pb11_a.Node(); x.value = pb11_a.add(1, 2)\nassert x.value == 3\n");
}

// The worker: enters each interpreter with a new thread state. Before its
// first pybind11 call there, the program's pybind11 cache key on this thread
// must not already name this interpreter: if it does, it was made in an
// ended interpreter at the same address, and get_pp() would return that
// interpreter's freed internals without looking at the state dict (a stale
// hit; counted, then the cache is dropped instead of being used).
static void worker(handoff *h, entry_mode mode)
{
    std::unique_lock<std::mutex> lock(h->mu);
    for (;;) {
        h->cv.wait(lock, [h] { return h->turn == 1 || h->stop; });
        if (h->stop) {
            return;
        }
        if (key_of(key_tag{})() == h->interp) {
            h->stale++;
            pbd::get_internals_pp_manager().unref();   // recover without touching it
        }
        if (mode == entry_mode::scoped) {
            // pybind11's own helpers: its destructor fills the cache again
            // as it leaves (get_internals().tstate.reset())
            py::subinterpreter_scoped_activate activate(h->si);
            worker_uses_pybind11(h->interp);
            {
                py::gil_scoped_release release;
                py::gil_scoped_acquire acquire;
                ck_assert_int_eq(py::cast<int>(py::eval("40 + 2")), 42);
            }
        } else {
            PyThreadState *ts = PyThreadState_New(h->interp);
            PyEval_RestoreThread(ts);
            worker_uses_pybind11(h->interp);
            if (mode == entry_mode::raw_release) {
                pyfini_pybind11::release_thread();
            }
            PyThreadState_Clear(ts);
            PyThreadState_DeleteCurrent();
        }
        h->turn = 2;
        h->cv.notify_all();
    }
}

// Returns how many interpreters landed at the previous one's address; *stale:
// the worker's stale cache hits.
static int second_thread_cycles(int n, entry_mode mode, int *stale)
{
    init_main(false);
    handoff h;
    std::thread t(worker, &h, mode);
    PyThreadState *main_ts = PyThreadState_Get();
    PyInterpreterState *prev = nullptr;
    int reused = 0;
    for (int i = 0; i < n; i++) {
        PyThreadState *ts = new_isolated();
        pyfini_pybind11::attach();   // the program's own pybind11 (rule 1)
        run("import pb11_a\npb11_a.cycles_for_last_gc(1)\n");
        reused += ts->interp == prev;
        prev = ts->interp;
        h.si = py::subinterpreter::current();
        PyEval_SaveThread();
        {
            std::unique_lock<std::mutex> lock(h.mu);
            h.interp = prev;
            h.turn = 1;
            h.cv.notify_all();
            h.cv.wait(lock, [&h] { return h.turn == 2; });
        }
        PyEval_RestoreThread(ts);
        Py_EndInterpreter(ts);
        PyThreadState_Swap(main_ts);
    }
    {
        std::unique_lock<std::mutex> lock(h.mu);
        h.stop = true;
        h.cv.notify_all();
    }
    Py_BEGIN_ALLOW_THREADS
    t.join();
    Py_END_ALLOW_THREADS
    *stale = h.stale;
    return reused;
}

// AddressSanitizer's quarantine keeps freed memory from being reused, so no
// interpreter lands at an ended one's address there (measured: 0 of 100 with
// any quarantine, 99 of 100 without one - and then no use after free is
// detectable either): test_pybind11_threads_asan runs these three with
// ASAN_OPTIONS=quarantine_size_mb=0 (tests/pybind11/CMakeLists.txt).
static void second_thread_test(const char *name, entry_mode mode)
{
    // A worker thread uses pybind11 (the program's and pb11_a's) in each of n
    // interpreters that the main thread creates and ends; the next one lands
    // at the ended one's address nearly every time (counted). Before its first
    // pybind11 call there, pybind11's thread_local cache key of the worker must
    // not name it: that would be the ended interpreter's freed internals
    // (pybind11's get_pp(); the adapter drops every thread's key of an ended
    // interpreter, include/pyfini_pybind11.h "every thread's caches").
#if defined(__SANITIZE_ADDRESS__)
    const char *asan = std::getenv("ASAN_OPTIONS");
    if (asan == nullptr || std::strstr(asan, "quarantine_size_mb=0") == nullptr) {
        SKIP_TEST("needs ASAN_OPTIONS=quarantine_size_mb=0 for the address reuse: test_pybind11_threads_asan runs it");
    }
#endif
    int stale = 0;
    int n = 300;
    int reused = second_thread_cycles(n, mode, &stale);
    std::printf("NOTE %s on CPython %s: %d of %d interpreters at the ended one's address, "
                "%d stale cache hits\n", name, PY_VERSION, reused, n, stale);
    ck_assert_int_eq(stale, 0);
    ck_assert_msg(reused > 0, "no interpreter landed at an ended one's address: the test proves nothing "
                              "(under ASan: quarantine_size_mb=0 is needed)");
    ck_assert_int_eq(Py_FinalizeEx(), 0);
}

START_TEST(test_second_thread_release_thread)
{
    // the old rule 2 (release_thread() before leaving): still correct
    second_thread_test("test_second_thread_release_thread", entry_mode::raw_release);
}
END_TEST

START_TEST(test_second_thread_c_api)
{
    // no rule: a C API thread state, nothing of pyfini's on the worker
    second_thread_test("test_second_thread_c_api", entry_mode::raw);
}
END_TEST

START_TEST(test_second_thread_scoped_activate)
{
    // pybind11's own helpers: py::subinterpreter_scoped_activate (whose
    // destructor fills the cache again after any call of the user's),
    // py::gil_scoped_release / py::gil_scoped_acquire inside it
    second_thread_test("test_second_thread_scoped_activate", entry_mode::scoped);
}
END_TEST

// Run fn in a child process whose stderr goes to a temporary file; returns
// what it wrote and its wait status.
template <typename F>
static std::string in_child(F fn, int *status)
{
    FILE *log = std::tmpfile();
    ck_assert_ptr_nonnull(log);
    std::fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fileno(log), 2);
        fn();
        _exit(0);
    }
    ck_assert_int_eq(waitpid(pid, status, 0), pid);
    std::string out;
    std::rewind(log);
    for (int c; (c = std::fgetc(log)) != EOF;) {
        out.push_back(static_cast<char>(c));
    }
    std::fclose(log);
    return out;
}

// ---- the control: internals freed in a capsule destructor ---------------

START_TEST(control_capsule_destructor_is_use_after_free)
{
    // PB11_CONTROL=1: pb11_a frees the internals from the state-dict capsule's destructor
    // (the timing of pybind11 PR 5958): the last GC runs after the state dict
    // is cleared, and its tp_traverse casts read the freed internals.
#if !defined(__SANITIZE_ADDRESS__)
    SKIP_TEST("needs the AddressSanitizer build to observe the use after free (make test runs it)");
#else
    int status = 0;
    std::string out = in_child(
        [] {
            setenv("PB11_CONTROL", "1", 1);
            init_main(false);
            run("import pb11_a\npb11_a.cycles_for_last_gc(3)\n");
            Py_FinalizeEx();
        },
        &status);
    ck_assert_msg(out.find("heap-use-after-free") != std::string::npos,
                  "ASan did not report a use after free; the child said:\n%.4000s", out.c_str());
    ck_assert_msg(out.find("node_traverse") != std::string::npos || out.find("node_clear") != std::string::npos,
                  "the use after free is not in tp_traverse/tp_clear:\n%.4000s", out.c_str());
    ck_assert(!(WIFEXITED(status) && WEXITSTATUS(status) == 0));
#endif
}
END_TEST

int main(int argc, char **argv)
{
    // argv[1], if given: run only the tests whose name contains it
    struct entry {
        const char *name;
        const TTest *test;
    };
#define ENTRY(t) {#t, t}
    const entry all[] = {
        ENTRY(pin_capsules),
        ENTRY(pin_created_set),
        ENTRY(pin_metaclass_refcount_plain),
        ENTRY(test_metaclass_refcount_repaired),
        ENTRY(pin_static_property_dealloc),
        ENTRY(test_static_property_dealloc_repaired),
        ENTRY(pin_enum_cycle),
        ENTRY(pin_def_submodule_leak),
        ENTRY(test_def_submodule_give_back),
        ENTRY(pin_type_cache_weakref),
        ENTRY(pin_scopeless_class_reference),
        ENTRY(test_isolated_two_modules_cycles),
        ENTRY(test_ending_thread_cache_elsewhere),
        ENTRY(test_scoped_subinterpreter_zero_loss),
        ENTRY(test_scoped_subinterpreter_program_not_attached),
        ENTRY(test_concurrent_interpreters),
        ENTRY(test_legacy),
        ENTRY(test_main_finalize),
        ENTRY(test_scoped_interpreter),
        ENTRY(test_second_thread_release_thread),
        ENTRY(test_second_thread_c_api),
        ENTRY(test_second_thread_scoped_activate),
        ENTRY(control_capsule_destructor_is_use_after_free),
    };
#undef ENTRY
    Suite *s = suite_create("pybind11");
    TCase *tc = tcase_create("pybind11");
    tcase_set_timeout(tc, 600);
    for (const entry &e : all) {
        if (argc < 2 || std::strstr(e.name, argv[1]) != nullptr) {
            tcase_add_test(tc, e.test);
        }
    }
    suite_add_tcase(s, tc);
    std::printf("pybind11 %d.%d.%d\n", PYBIND11_VERSION_MAJOR, PYBIND11_VERSION_MINOR,
                PYBIND11_VERSION_PATCH);
    return run_suite(s);
}
