/* tests/test_copies.c - several copies of pyfini.h in one process share one
 * registry per interpreter: one LIFO order per phase, one POST_SHUTDOWN hook,
 * one Py_AtExit slot. Two shared objects (tests/copy.c built as copy_a and
 * copy_b, loaded with RTLD_LOCAL like extension modules) plus this program's
 * own copy. Each test is its own process.
 */
#include <Python.h>
#include <check.h>
#include <dlfcn.h>
#include "pyfini.h"
#include "harness.h"

#ifndef COPY_DIR
#  error "COPY_DIR must name the folder of libcopy_a.so and libcopy_b.so"
#endif

typedef struct {
    void (*set_recorder)(void (*)(const char *, const char *));
    int (*reg)(const char *, int);
    int (*cancel)(pyfini_callback, const char *, int);
    pyfini_callback (*callback)(void);
    int (*watch_phase)(int);
    int (*seen_phase)(int);
    void *(*state)(void);
    int (*state_inits)(void);
} copy_api;

static void record_from(const char *copy, const char *t) { ev_add("%s:%s", copy, t); }

static copy_api load_copy(const char *name)
{
    char path[1024], sym[64];
    snprintf(path, sizeof path, "%s/libcopy_%s.so", COPY_DIR, name);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    ck_assert_msg(h != NULL, "dlopen %s: %s", path, dlerror());
    copy_api api;
#define LOAD(field, s)                                                            \
    snprintf(sym, sizeof sym, "copy_%s_%s", name, s);                             \
    *(void **)&api.field = dlsym(h, sym);                                         \
    ck_assert_msg(api.field != NULL, "dlsym %s", sym);
    LOAD(set_recorder, "set_recorder");
    LOAD(reg, "register");
    LOAD(cancel, "cancel");
    LOAD(callback, "callback");
    LOAD(watch_phase, "watch_phase");
    LOAD(seen_phase, "seen_phase");
    LOAD(state, "state");
    LOAD(state_inits, "state_inits");
#undef LOAD
    api.set_recorder(record_from);
    return api;
}

static int dummy_runs;
static void dummy_atexit(void) { dummy_runs++; }

int host_cb(void *arg);
int host_cb(void *arg)
{
    ev_add("host:%s", (const char *)arg);
    return 0;
}

/* Interleave the three copies in every phase of the current interpreter. */
static void interleave(copy_api *a, copy_api *b, const char *who)
{
    for (int p = 1; p <= 4; p++) {
        char t[64];
        for (int i = 1; i <= 2; i++) {
            snprintf(t, sizeof t, "%s %s %d", who, pyfini_phase_name(p), i);
            ck_assert_int_eq(a->reg(tag(t), p), 0);
            ck_assert_int_eq(b->reg(tag(t), p), 0);
            ck_assert_int_eq(pyfini_atexit(host_cb, tag(t), (pyfini_phase)p), 0);
        }
    }
}

static void check_interleaved(const char *who)
{
    for (int p = 1; p <= 4; p++) {
        char s[6][96];
        const char *n = pyfini_phase_name(p);
        snprintf(s[0], sizeof s[0], "host:%s %s 2", who, n);
        snprintf(s[1], sizeof s[1], "b:%s %s 2", who, n);
        snprintf(s[2], sizeof s[2], "a:%s %s 2", who, n);
        snprintf(s[3], sizeof s[3], "host:%s %s 1", who, n);
        snprintf(s[4], sizeof s[4], "b:%s %s 1", who, n);
        snprintf(s[5], sizeof s[5], "a:%s %s 1", who, n);
        EV_ORDER(s[0], s[1], s[2], s[3], s[4], s[5]);
        for (int i = 0; i < 6; i++) {
            ck_assert_int_eq(ev_count(s[i]), 1);
        }
    }
}

START_TEST(test_three_copies_share_one_registry)
{
    copy_api a = load_copy("a"), b = load_copy("b");
    harness_init();
    for (int i = 0; i < 31; i++) {
        ck_assert_int_eq(Py_AtExit(dummy_atexit), 0);
    }
    interleave(&a, &b, "main");
    PyThreadState *main_ts = PyThreadState_Get();
    PyThreadState *sub = new_sub(SUB_ISOLATED);
    if (sub == NULL) {
        sub = new_sub(SUB_LEGACY);
    }
    interleave(&a, &b, "sub");
    Py_EndInterpreter(sub);
    PyThreadState_Swap(main_ts);
    ev_add("sub ended");
    /* one Py_AtExit slot for all three copies: 31 dummies + pyfini's one
       fill CPython's 32 */
    ck_assert_int_eq(Py_AtExit(dummy_atexit), -1);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    check_interleaved("main");
    check_interleaved("sub");
    EV_ORDER("b:sub PYFINI_POST_SHUTDOWN 1", "sub ended", "host:sub PYFINI_RUNTIME_SHUTDOWN 2");
    ck_assert_int_eq(dummy_runs, 31);
}
END_TEST

START_TEST(test_cancel_across_copies)
{
    copy_api a = load_copy("a"), b = load_copy("b");
    harness_init();
    for (int p = 1; p <= 4; p++) {
        ck_assert_int_eq(b.reg(tag("victim"), p), 0);
        /* copy a cancels what copy b registered, and the host what a did */
        ck_assert_int_eq(a.cancel(b.callback(), tag("victim"), p), 1);
        ck_assert_int_eq(a.reg(tag("victim2"), p), 0);
        ck_assert_int_eq(pyfini_atexit_cancel(a.callback(), tag("victim2"), (pyfini_phase)p), 1);
        ck_assert_int_eq(b.cancel(NULL, tag("victim"), p), 0);
    }
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    ck_assert_msg(strstr(ev_text(), "victim") == NULL, "%s", ev_text());
}
END_TEST

START_TEST(test_phase_seen_by_every_copy)
{
    copy_api a = load_copy("a"), b = load_copy("b");
    harness_init();
    for (int p = 1; p <= 3; p++) {
        ck_assert_int_eq(a.watch_phase(p), 0);
        ck_assert_int_eq(b.watch_phase(p), 0);
    }
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    for (int p = 1; p <= 3; p++) {
        ck_assert_int_eq(a.seen_phase(p), p);
        ck_assert_int_eq(b.seen_phase(p), p);
    }
}
END_TEST

static const pyfini_state_def host_state_def = {"pyfini.test.shared", 64, NULL, NULL};

START_TEST(test_same_state_from_every_copy)
{
    copy_api a = load_copy("a"), b = load_copy("b");
    harness_init();
    void *pa = a.state();
    ck_assert_ptr_nonnull(pa);
    ck_assert_ptr_eq(b.state(), pa);
    ck_assert_ptr_eq(pyfini_state(&host_state_def), pa);
    ck_assert_ptr_eq(pyfini_state_find(&host_state_def), pa);
    ck_assert_int_eq(a.state_inits() + b.state_inits(), 1);
    PyThreadState *main_ts = PyThreadState_Get();
    PyThreadState *sub = new_sub(SUB_LEGACY);
    void *sb = b.state();
    ck_assert_ptr_ne(sb, pa);
    ck_assert_ptr_eq(a.state(), sb);
    ck_assert_int_eq(a.state_inits() + b.state_inits(), 2);
    Py_EndInterpreter(sub);
    PyThreadState_Swap(main_ts);
    /* the caches of every copy dropped the ended interpreter's state */
    ck_assert_ptr_eq(a.state(), pa);
    ck_assert_ptr_eq(b.state(), pa);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
}
END_TEST

static Suite *copies_suite(void)
{
    Suite *s = suite_create("copies");
    TCase *tc = tcase_create("copies");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_three_copies_share_one_registry);
    tcase_add_test(tc, test_cancel_across_copies);
    tcase_add_test(tc, test_phase_seen_by_every_copy);
    tcase_add_test(tc, test_same_state_from_every_copy);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return run_suite(copies_suite()); }
