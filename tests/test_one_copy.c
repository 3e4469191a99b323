/* tests/test_one_copy.c - one copy of pyfini is one shared object, not one
 * translation unit (issue 26). Four modules, each made of three files that
 * include pyfini.h (tests/onecopy/part.h: c_a and c_b of three C files, cxx
 * of three C++17 files, mixed of C, C++, C), loaded with dlopen(RTLD_LOCAL)
 * like extension modules. Within a module every file sees one per-copy
 * state (one hit table, one per-thread cache, one last error, one audit
 * hook on CPython 3.11-3.13.1); the modules keep separate ones and still
 * share one registry (one LIFO order per phase). Each test is its own
 * process.
 */
#include <Python.h>
#include <check.h>
#include <dlfcn.h>
#include "pyfini.h"
#include "harness.h"

#ifndef ONECOPY_DIR
#  error "ONECOPY_DIR must name the folder of libonecopy_*.so"
#endif

#define NMODS 4
#define NPARTS 3
static const char *const mod_names[NMODS] = {"c_a", "c_b", "cxx", "mixed"};

typedef struct {
    void *(*copy)(void);
    void *(*thread)(void);
    int (*shared)(void);
    void *(*state)(void);
    int (*hit)(void);
    int (*cached)(void);
    const char *(*last_error)(void);
    int (*fail_call)(int);
    void (*set_recorder)(void (*)(const char *, const char *));
    int (*reg)(int, int, const char *);
} part_api;

/* kinds of part.h's callbacks */
enum { OC_RECORD = 0, OC_FAIL = 1, OC_READ_ERROR = 2 };

static part_api parts[NMODS][NPARTS];

static void record_from(const char *who, const char *what) { ev_add("%s:%s", who, what); }

static void load_modules(void)
{
    for (int m = 0; m < NMODS; m++) {
        char path[1024], sym[96];
        snprintf(path, sizeof path, "%s/libonecopy_%s.so", ONECOPY_DIR, mod_names[m]);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        ck_assert_msg(h != NULL, "dlopen %s: %s", path, dlerror());
        for (int p = 0; p < NPARTS; p++) {
            part_api *a = &parts[m][p];
#define LOAD(field)                                                                      \
    snprintf(sym, sizeof sym, "onecopy_%s_p%d_%s", mod_names[m], p + 1, #field);         \
    *(void **)&a->field = dlsym(h, sym);                                                 \
    ck_assert_msg(a->field != NULL, "dlsym %s", sym);
            LOAD(copy) LOAD(thread) LOAD(shared) LOAD(state) LOAD(hit) LOAD(cached)
            LOAD(last_error) LOAD(fail_call) LOAD(set_recorder) LOAD(reg)
#undef LOAD
        }
        parts[m][0].set_recorder(record_from);
    }
}

/* the "sys.addaudithook" events a Python audit hook added first sees */
static long audit_hooks_added(void)
{
    PyObject *main_dict = PyModule_GetDict(PyImport_AddModule("__main__"));
    PyObject *n = PyRun_String("len(_added)", Py_eval_input, main_dict, main_dict);
    ck_assert_ptr_nonnull(n);
    long v = PyLong_AsLong(n);
    Py_DECREF(n);
    return v;
}

START_TEST(test_one_copy_per_shared_object)
{
    load_modules();
    for (int m = 0; m < NMODS; m++) {
        for (int p = 0; p < NPARTS; p++) {
            ck_assert_int_eq(parts[m][p].shared(), 1);   /* GCC/Clang on ELF */
            /* one per-copy state per module: every file sees the same */
            ck_assert_ptr_eq(parts[m][p].copy(), parts[m][0].copy());
            ck_assert_ptr_eq(parts[m][p].thread(), parts[m][0].thread());
        }
        /* and every module (and this program) its own */
        ck_assert_ptr_ne(parts[m][0].copy(), &PYFINI__COPY);
        ck_assert_ptr_ne(parts[m][0].thread(), &PYFINI__THREAD);
        for (int o = 0; o < m; o++) {
            ck_assert_ptr_ne(parts[m][0].copy(), parts[o][0].copy());
            ck_assert_ptr_ne(parts[m][0].thread(), parts[o][0].thread());
        }
    }
    harness_init();
    /* count the C audit hooks pyfini adds from here on (PySys_AddAuditHook
       raises "sys.addaudithook" to the hooks already there) */
    run("import sys\n"
        "_added = []\n"
        "def _count(event, args):\n"
        "    if event == 'sys.addaudithook':\n"
        "        _added.append(event)\n"
        "sys.addaudithook(_count)\n");
    ck_assert_int_eq(audit_hooks_added(), 0);
    void *data = NULL;
    for (int m = 0; m < NMODS; m++) {
        part_api *a = parts[m];
        /* one hit table per module: nothing filled it yet for this module's def */
        ck_assert_int_eq(a[0].hit() + a[1].hit() + a[2].hit(), 0);
        ck_assert_int_eq(a[0].cached() + a[1].cached() + a[2].cached(), 0);
        void *d = a[0].state();   /* created (m == 0) or found through file 1 */
        ck_assert_ptr_nonnull(d);
        /* a copy's first lookup on 3.11-3.13.1 adds its audit hook, which
           bumps its epoch after the lookup read it: the second fills the
           table for the current epoch */
        ck_assert_ptr_eq(a[0].state(), d);
        if (m == 0) {
            data = d;
        }
        ck_assert_ptr_eq(d, data);   /* one registry: the same state */
        /* a hit through files 2 and 3, and in their thread cache */
        ck_assert_int_eq(a[1].hit(), 1);
        ck_assert_int_eq(a[2].hit(), 1);
        ck_assert_int_eq(a[1].cached(), 1);
        ck_assert_int_eq(a[2].cached(), 1);
        ck_assert_ptr_eq(a[1].state(), d);
        ck_assert_ptr_eq(a[2].state(), d);
        /* one audit hook per module where pyfini adds one (3.11, 3.12,
           3.13.0-3.13.1: pyfini__hit_guarded); none where the exit hook is
           reliable (PyUnstable_AtExit, 3.13.2+, 3.14.0a3+) */
        ck_assert_int_eq(audit_hooks_added(), pyfini__exit_hook_reliable() ? 0 : m + 1);
    }
    /* one last error per module, per thread: a failure in file 1 is the
       last error of files 2 and 3, and of no other module */
    for (int m = 0; m < NMODS; m++) {
        ck_assert_int_eq(parts[m][0].fail_call(m == 0 ? 0 : 4 + m), -1);
    }
    ck_assert_int_eq(PyErr_Occurred() == NULL, 1);
    for (int m = 0; m < NMODS; m++) {
        char want[64];
        snprintf(want, sizeof want, "pyfini: unknown phase %d (expected 1 to 4)", m == 0 ? 0 : 4 + m);
        for (int p = 0; p < NPARTS; p++) {
            const char *e = parts[m][p].last_error();
            ck_assert_msg(e != NULL && strcmp(e, want) == 0, "module %s file %d: last error %s",
                          mod_names[m], p + 1, e ? e : "(null)");
        }
    }
    ck_assert_ptr_null(pyfini_last_error());   /* this program's copy failed nothing */
    /* the same in a sub-interpreter: its own state, filled through file 1,
       a hit through files 2 and 3 */
    PyThreadState *main_ts = PyThreadState_Get();
    PyThreadState *sub = new_sub(SUB_ISOLATED);
    if (sub == NULL) {
        sub = new_sub(SUB_LEGACY);
    }
    ck_assert_ptr_nonnull(sub);
    void *sub_data = parts[0][0].state();
    ck_assert_ptr_nonnull(sub_data);
    ck_assert_ptr_ne(sub_data, data);
    for (int m = 0; m < NMODS; m++) {
        ck_assert_int_eq(parts[m][1].hit(), m == 0);
        ck_assert_ptr_eq(parts[m][0].state(), sub_data);
        ck_assert_int_eq(parts[m][1].hit(), 1);
        ck_assert_int_eq(parts[m][2].hit(), 1);
    }
    Py_EndInterpreter(sub);
    PyThreadState_Swap(main_ts);
    ck_assert_int_eq(audit_hooks_added(), pyfini__exit_hook_reliable() ? 0 : NMODS);
    ck_assert_int_eq(Py_FinalizeEx(), 0);
}
END_TEST

/* Per phase, in every module: file 2 registers a callback that reads the
   last error, file 1 one that fails a pyfini call, file 3 one that records
   - each module after the other, so that the phase runs every module's
   file-3 callback, then every file-1 failure, then every file-2 reading
   (LIFO): file 2 reads its module's failure, not the one another module
   made later. */
START_TEST(test_one_copy_in_every_phase)
{
    load_modules();
    harness_init();
    static const int kinds[NPARTS] = {OC_READ_ERROR, OC_FAIL, OC_RECORD};
    static const int order[NPARTS] = {1, 0, 2};   /* file 2, file 1, file 3 */
    for (int ph = PYFINI_PRE_SHUTDOWN; ph <= PYFINI_RUNTIME_SHUTDOWN; ph++) {
        for (int i = 0; i < NPARTS; i++) {
            for (int m = 0; m < NMODS; m++) {
                ck_assert_int_eq(parts[m][order[i]].reg(kinds[i], ph, tag(pyfini_phase_name(ph))), 0);
            }
        }
    }
    ck_assert_int_eq(Py_FinalizeEx(), 0);
    for (int ph = PYFINI_PRE_SHUTDOWN; ph <= PYFINI_RUNTIME_SHUTDOWN; ph++) {
        const char *name = pyfini_phase_name(ph);
        char first[NMODS][96], fail_line[NMODS][512], read_line[NMODS][512];
        for (int m = 0; m < NMODS; m++) {
            /* file 1's failure: what it made is what file 2 read */
            char fail_at[96];
            snprintf(fail_at, sizeof fail_at, "%s.1:%s fail -1 made [", mod_names[m], name);
            const char *f = strstr(ev_text(), fail_at);
            ck_assert_msg(f != NULL, "%s missing in\n%s", fail_at, ev_text());
            const char *msg = f + strlen(fail_at);
            int len = (int)strcspn(msg, "]");
            snprintf(fail_line[m], sizeof fail_line[m], "%s%.*s]", fail_at, len, msg);
            snprintf(read_line[m], sizeof read_line[m], "%s.2:%s read [%.*s]", mod_names[m], name,
                     len, msg);
            ck_assert_int_eq(ev_count(fail_line[m]), 1);
            ck_assert_msg(ev_count(read_line[m]) == 1, "%s missing in\n%s", read_line[m],
                          ev_text());
            /* with a thread state (PRE, USER, POST) the unknown phase; in
               RUNTIME_SHUTDOWN, where no C API is left, its absence */
            ck_assert_msg(strstr(read_line[m], ph == PYFINI_RUNTIME_SHUTDOWN ? "no thread state"
                                                                            : "unknown phase"),
                          "%s", read_line[m]);
            snprintf(first[m], sizeof first[m], "%s.3:%s", mod_names[m], name);
        }
        /* one LIFO order across the four modules' twelve files */
        EV_ORDER(first[3], first[2], first[1], first[0], fail_line[3], fail_line[2], fail_line[1],
                 fail_line[0], read_line[3], read_line[2], read_line[1], read_line[0]);
    }
}
END_TEST

static Suite *one_copy_suite(void)
{
    Suite *s = suite_create("one_copy");
    TCase *tc = tcase_create("one_copy");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_one_copy_per_shared_object);
    tcase_add_test(tc, test_one_copy_in_every_phase);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return run_suite(one_copy_suite()); }
