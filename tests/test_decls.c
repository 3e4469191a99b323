/* tests/test_decls.c - the declarations-only build: PYFINI_FUNC defined
 * empty in both translation units of this program and PYFINI_DECLS_ONLY in
 * this one, so every public function is the one definition emitted by
 * decls_impl.c (external linkage, one per-thread cache, one copy). A
 * callback registered from here runs in each of the four phases, a state
 * is the same block from both units, and the ABI names derived from
 * PYFINI_ABI_VERSION are the strings that copies of pyfini 0.1.0 use.
 */
#include <Python.h>
#include <check.h>
#define PYFINI_FUNC
#define PYFINI_DECLS_ONLY
#include "pyfini.h"
#include "decls_impl.h"

#ifdef PYFINI__FINDER_CAPSULE
#  error "PYFINI_DECLS_ONLY must leave out the implementation"
#endif

static char events[256];

static int record(void *arg)
{
    strncat(events, (const char *)arg, sizeof events - strlen(events) - 1);
    return 0;
}

static const pyfini_state_def decls_def = {"pyfini.test.decls", 16, NULL, NULL};

START_TEST(test_decls_only_callbacks_run)
{
    Py_Initialize();
    ck_assert_int_eq(pyfini_current_phase(), PYFINI_RUNNING);
    const char *names[] = {"", "PRE ", "USER ", "POST ", "RUNTIME"};
    for (int p = PYFINI_PRE_SHUTDOWN; p <= PYFINI_RUNTIME_SHUTDOWN; p++) {
        ck_assert_int_eq(pyfini_atexit(record, (void *)names[p], (pyfini_phase)p), 0);
    }
    /* one copy: the state found here is the one made in the other unit */
    void *here = pyfini_state(&decls_def);
    ck_assert_ptr_nonnull(here);
    ck_assert_ptr_eq(decls_impl_state(&decls_def), here);
    ck_assert_ptr_eq(pyfini_state_find(&decls_def), here);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    ck_assert_str_eq(events, "PRE USER POST RUNTIME");
}
END_TEST

START_TEST(test_decls_abi_names_unchanged)
{
    /* the names of ABI version 1, as pyfini 0.1.0 wrote them literally */
    static const char *const v1[DECLS_IMPL_NNAMES] = {
        "__pyfini_registry_v1__", "pyfini.registry.v1",          "pyfini.post_shutdown.v1",
        "__pyfini_post_shutdown_v1__", "pyfini.entry.v1", "pyfini.opener.v1"};
    ck_assert_int_eq(PYFINI_ABI_VERSION, 1);
    ck_assert_str_eq(PYFINI_REGISTRY_KEY, v1[0]);
    for (int i = 0; i < DECLS_IMPL_NNAMES; i++) {
        ck_assert_str_eq(decls_impl_abi_names[i], v1[i]);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("decls");
    TCase *tc = tcase_create("decls");
    tcase_add_test(tc, test_decls_only_callbacks_run);
    tcase_add_test(tc, test_decls_abi_names_unchanged);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_FORK);
    printf("CPython %s, PYFINI_DECLS_ONLY\n", PY_VERSION);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
