// tests/test_cxx.cpp - pyfini.h in a C++17 translation unit (binding
// libraries are C++), with PYFINI_IMPLEMENTATION defined as stb-style users
// do. Registers C++ callbacks in all four phases and checks their order.
#include <Python.h>
#include <check.h>
#define PYFINI_IMPLEMENTATION
#include "pyfini.h"

#include <string>
#include <vector>

static std::vector<std::string> *events = new std::vector<std::string>();  // outlives exit

namespace {
struct Internals {
    std::string name;
    PyObject *owned = nullptr;  // released in POST_SHUTDOWN
};
}  // namespace

START_TEST(test_cxx_four_phases)
{
    Py_Initialize();
    static Internals internals{"mylib", nullptr};
    internals.owned = PyList_New(0);
    auto record = [](void *arg) -> int {
        events->push_back(static_cast<const char *>(arg));
        return 0;
    };
    const char *names[] = {"", "PRE", "USER", "POST", "RUNTIME"};
    for (int p = PYFINI_PRE_SHUTDOWN; p <= PYFINI_RUNTIME_SHUTDOWN; p++) {
        ck_assert_int_eq(pyfini_atexit(record, const_cast<char *>(names[p]),
                                       static_cast<pyfini_phase>(p)), 0);
    }
    ck_assert_int_eq(pyfini_atexit(
                         [](void *arg) -> int {
                             auto *in = static_cast<Internals *>(arg);
                             Py_CLEAR(in->owned);  // allowed after the last GC
                             events->push_back("released " + in->name);
                             return 0;
                         },
                         &internals, PYFINI_POST_SHUTDOWN),
                     0);
    ck_assert_int_eq(pyfini_current_phase(), PYFINI_RUNNING);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    std::vector<std::string> want = {"PRE", "USER", "released mylib", "POST", "RUNTIME"};
    ck_assert_int_eq(static_cast<int>(events->size()), static_cast<int>(want.size()));
    for (size_t i = 0; i < want.size(); i++) {
        ck_assert_str_eq((*events)[i].c_str(), want[i].c_str());
    }
    ck_assert_ptr_null(internals.owned);
}
END_TEST

int main()
{
    Suite *s = suite_create("cxx");
    TCase *tc = tcase_create("cxx");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_cxx_four_phases);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_FORK);
    std::printf("CPython %s, C++ %ld\n", PY_VERSION, static_cast<long>(__cplusplus));
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
