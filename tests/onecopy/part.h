/* tests/onecopy/part.h - one file of a module made of several files that
 * each include pyfini.h, as a pybind11/nanobind extension of tens of files
 * does. part1.c, part2.c, part3.c (and the .cpp ones, C++17) define PART and
 * include this; tests/CMakeLists.txt links three of them into one shared
 * object per module (MOD: c_a, c_b, cxx, mixed), which test_one_copy loads
 * with dlopen(RTLD_LOCAL) like an extension module. Every function is
 * exported as onecopy_<MOD>_p<PART>_<what>, so the test can call pyfini
 * through each file of each module. The state def and the recorder are
 * the module's own (hidden, defined in part 1), as a real module keeps one
 * def in one file.
 */
#include <Python.h>
#include "pyfini.h"

#if !defined(MOD) || !defined(PART)
#  error "define MOD (the module) and PART (1, 2 or 3)"
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define OC_CAT2(a, b) a##b
#define OC_CAT(a, b) OC_CAT2(a, b)
/* onecopy_<MOD>_<x>: the module's own (hidden) */
#define OC_MOD(x) OC_CAT(OC_CAT(onecopy_, MOD), OC_CAT(_, x))
/* onecopy_<MOD>_p<PART>_<x>: exported, one per file */
#define OC_API(x) OC_CAT(OC_MOD(OC_CAT(p, PART)), OC_CAT(_, x))
#define OC_STR2(x) #x
#define OC_STR(x) OC_STR2(x)
#define OC_HIDDEN __attribute__((visibility("hidden")))

/* the module's one state def and the test's recorder */
typedef void (*oc_recorder)(const char *who, const char *what);
OC_HIDDEN extern const pyfini_state_def OC_MOD(def);
OC_HIDDEN extern oc_recorder OC_MOD(recorder);
#if PART == 1
const pyfini_state_def OC_MOD(def) = {"pyfini.test.onecopy", 32, NULL, NULL};
oc_recorder OC_MOD(recorder) = NULL;   /* hidden: declared so above */
#endif

/* "c_a.2": this file of this module, in events */
static const char oc_who[] = OC_STR(MOD) "." OC_STR(PART);

/* ---- what pyfini keeps per copy, as this file sees it ---- */

void *OC_API(copy)(void);
void *OC_API(copy)(void) { return &PYFINI__COPY; }

void *OC_API(thread)(void);
void *OC_API(thread)(void) { return &PYFINI__THREAD; }

int OC_API(shared)(void);
int OC_API(shared)(void) { return PYFINI__SHARED_STATE; }

void *OC_API(state)(void);
void *OC_API(state)(void) { return pyfini_state(&OC_MOD(def)); }

/* 1 if a pyfini_state of the module's def from this file would hit the
   table: one of the pair's two entries (pyfini__hit_fill: the second when
   the first holds another current pair, e.g. the main interpreter's for the
   same def) holds it at the current epoch (what pyfini__state_access and
   pyfini__state_miss compare) */
static int oc_hit_entry(const pyfini__hit_entry *e, const pyfini_state_def *def,
                        PyInterpreterState *interp)
{
    return e->def == def && e->interp == interp && e->epoch == PYFINI__COPY.epoch &&
           e->data != NULL;
}

int OC_API(hit)(void);
int OC_API(hit)(void)
{
    const pyfini_state_def *def = &OC_MOD(def);
    PyInterpreterState *interp = PyThreadState_Get()->interp;
    unsigned i = pyfini__hit_index(def, interp);
    return oc_hit_entry(&PYFINI__COPY.hits[i], def, interp) ||
           oc_hit_entry(&PYFINI__COPY.hits[PYFINI__HIT_WAY2(i)], def, interp);
}

/* 1 if this thread's state cache, as this file sees it, holds the pair */
int OC_API(cached)(void);
int OC_API(cached)(void)
{
    PyInterpreterState *interp = PyThreadState_Get()->interp;
    for (unsigned i = 0; i < PYFINI__CACHE_SLOTS; i++) {
        const pyfini__cache_slot *c = &PYFINI__THREAD.cache[i];
        if (c->def == &OC_MOD(def) && c->interp == interp && c->data != NULL) {
            return 1;
        }
    }
    return 0;
}

const char *OC_API(last_error)(void);
const char *OC_API(last_error)(void) { return pyfini_last_error(); }

/* ---- callbacks ---- */

static int oc_noop(void *arg)
{
    (void)arg;
    return 0;
}

/* A failing pyfini call from this file: an unknown phase (`bad`: 0 or 5-7,
   inside the enum's range for C++). With
   a thread state it fails with ValueError, cleared here; without one (the
   RUNTIME_SHUTDOWN phase) it fails with no exception. Returns its result. */
static int oc_fail(int bad)
{
    int rc = pyfini_atexit(oc_noop, NULL, (pyfini_phase)bad);
    const char *e = pyfini_last_error();
    if (e != NULL && strstr(e, "unknown phase") != NULL) {
        PyErr_Clear();   /* the ValueError (only raised with a thread state) */
    }
    return rc;
}

int OC_API(fail_call)(int bad);
int OC_API(fail_call)(int bad) { return oc_fail(bad); }

/* kind of a registered callback */
enum { OC_RECORD = 0, OC_FAIL = 1, OC_READ_ERROR = 2 };
typedef struct {
    int kind, phase;
    const char *tag;
} oc_reg;
static oc_reg oc_regs[64];
static int oc_nregs;

static int oc_cb(void *arg)
{
    const oc_reg *r = (const oc_reg *)arg;
    char what[400];
    if (r->kind == OC_FAIL) {
        static const int bad[5] = {0, 5, 6, 7, 0};   /* per phase */
        int rc = oc_fail(bad[r->phase]);
        const char *e = pyfini_last_error();
        snprintf(what, sizeof what, "%s fail %d made [%s]", r->tag, rc, e ? e : "(null)");
    } else if (r->kind == OC_READ_ERROR) {
        const char *e = pyfini_last_error();
        snprintf(what, sizeof what, "%s read [%s]", r->tag, e ? e : "(null)");
    } else {
        snprintf(what, sizeof what, "%s", r->tag);
    }
    OC_MOD(recorder)(oc_who, what);
    return 0;
}

void OC_API(set_recorder)(oc_recorder rec);
void OC_API(set_recorder)(oc_recorder rec) { OC_MOD(recorder) = rec; }

/* register a callback of `kind` from this file; tag must live on */
int OC_API(reg)(int kind, int phase, const char *tag);
int OC_API(reg)(int kind, int phase, const char *tag)
{
    if (oc_nregs == (int)(sizeof oc_regs / sizeof oc_regs[0])) {
        return -2;
    }
    oc_reg *r = &oc_regs[oc_nregs++];
    r->kind = kind;
    r->phase = phase;
    r->tag = tag;
    return pyfini_atexit(oc_cb, r, (pyfini_phase)phase);
}

#ifdef __cplusplus
}  /* extern "C" */
#endif
