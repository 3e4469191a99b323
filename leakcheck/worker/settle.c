/* settle.c - CPython 3.11: the tables an interpreter shares with the main
 * one, brought to the size their contents give them before each reading.
 *
 * On 3.11 every static type (object, int, Exception, ...) is one object for
 * all interpreters, and so is its tp_subclasses dict: a class created in a
 * cycle's interpreter is added to its bases' dicts and removed when it dies,
 * which leaves a dummy entry.  When the dummies fill the table, the next
 * insertion resizes it to 3 times the entries in use AT THAT MOMENT
 * (dictobject.c, insertion_resize), so whether object's dict has 1,024 or
 * 2,048 slots after a cycle (18,440 bytes apart) depends on when in the
 * cycle it filled up.  That made the exact py and heap meters step by
 * +-1.1 kB and +-18.4 kB between cycles (3.11.7, bare legacy cycles).
 *
 * After each cycle, in the main interpreter, every such dict that a cycle
 * left with another size or count than it had when settled is copied into a
 * fresh one (dict_merge sizes it for its entries: the smallest table that
 * holds them, as a dict built by inserting them would be) and takes the old
 * one's place: the reading then depends only on what the dict holds.  The
 * copy holds the same weak references under the same keys; nothing else
 * holds the dict (type.__subclasses__() builds a list).  3.12 moved these
 * dicts of static builtin types into each interpreter (which frees them at
 * its end), so this is 3.11 only.  Pinned by leakcheck.verdict_rule (the
 * clean subject's py is exactly 0 on 3.11). */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

#include "worker.h"

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define WK_SETTLE 1
#else
#define WK_SETTLE 0
#endif

#if WK_SETTLE
/* What each rebuilt dict looked like right after its rebuild: a dict that
 * still has that size and count has the bytes it had then (no resize since,
 * or one to the same size), so it is left alone - rebuilding every static
 * type's dict after every cycle cost about 20 % more CPU per bare cycle
 * (3.11.7); settling as it is adds 1.2 % to the worker's instructions
 * (cachegrind, bare legacy, 2 + 20 cycles: 3,027.2 M -> 3,063.3 M). */
typedef struct wk_settled {
    PyTypeObject *type;
    PyObject *dict;
    Py_ssize_t size, count;
} wk_settled;
#define WK_SETTLED_CAP 8192   /* a power of two; static types: a few hundred */
static wk_settled settled[WK_SETTLED_CAP];

static wk_settled *settled_slot(PyTypeObject *t)
{
    size_t h = ((uintptr_t)t >> 4) * 0x9e3779b97f4a7c15u;
    for (size_t i = 0; i < WK_SETTLED_CAP; i++) {
        wk_settled *e = &settled[(h + i) & (WK_SETTLED_CAP - 1)];
        if (e->type == t || e->type == NULL) return e;
    }
    return NULL;   /* full: the dict is rebuilt every time */
}

/* Rebuild t's tp_subclasses (when it is not as it was left) and those of
 * its static subclasses; -1 on an error (a Python exception set). */
static int settle_type(PyTypeObject *t, int depth)
{
    PyObject *old = t->tp_subclasses;
    if (!old || !PyDict_Check(old) || depth > 64) return 0;
    wk_settled *e = settled_slot(t);
    Py_ssize_t size = _PyDict_SizeOf((PyDictObject *)old), count = PyDict_GET_SIZE(old);
    if (!e || e->dict != old || e->size != size || e->count != count) {
        PyObject *fresh = PyDict_New();
        if (!fresh || PyDict_Update(fresh, old) < 0) {
            Py_XDECREF(fresh);
            return -1;
        }
        t->tp_subclasses = fresh;
        Py_DECREF(old);
        if (e) *e = (wk_settled){t, fresh, _PyDict_SizeOf((PyDictObject *)fresh), PyDict_GET_SIZE(fresh)};
    }
    /* the static subclasses (a heap type's subclasses are its own
       interpreter's; a static type never derives from a heap type) */
    Py_ssize_t pos = 0;
    PyObject *key, *ref;
    while (PyDict_Next(t->tp_subclasses, &pos, &key, &ref)) {
        PyObject *sub = PyWeakref_GET_OBJECT(ref);   /* borrowed; Py_None when dead */
        if (!PyType_Check(sub) || (((PyTypeObject *)sub)->tp_flags & Py_TPFLAGS_HEAPTYPE)) continue;
        if (settle_type((PyTypeObject *)sub, depth + 1) < 0) return -1;
    }
    return 0;
}

/* --- the interned strings' dict ------------------------------------------
 * 3.11 keeps it in a static variable of unicodeobject.c ("interned"), one
 * dict for all interpreters: the names of every module a cycle imports are
 * interned there and deleted when they die (dummies again), so it resizes
 * every few cycles, and its size after a resize (3 x the strings interned at
 * that moment) moved py and heap by +-207 kB (3.11.7, bare legacy cycles).
 * No API gives the dict: it is found once, among the pointers stored in
 * libpython's writable segments, as the one dict that maps a freshly
 * interned probe string to itself; then, after each cycle whose end left it
 * another size or count than the last settled one, it is emptied and filled
 * again from a copy (dict_merge sizes it for its entries).  Its references
 * to the strings are not counted in their reference counts (3.11:
 * PyUnicode_InternInPlace takes 2 off): the copy adds 2 to each, the clear
 * takes them off, the refill adds 2 and the copy's end takes those off, so
 * each string ends with the count it had, never below it in between. */
typedef struct wk_range {
    uintptr_t lo, hi;
} wk_range;
#define WK_MAX_RANGES 4096
static wk_range readable[WK_MAX_RANGES];
static int nreadable;

static void read_maps(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    nreadable = 0;
    while (f && fgets(line, sizeof line, f) && nreadable < WK_MAX_RANGES) {
        unsigned long lo, hi;
        char perm[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perm) == 3 && perm[0] == 'r')
            readable[nreadable++] = (wk_range){lo, hi};
    }
    if (f) fclose(f);
}

static int is_readable(uintptr_t p, size_t n)
{
    for (int i = 0; i < nreadable; i++)
        if (p >= readable[i].lo && p + n <= readable[i].hi) return 1;
    return 0;
}

typedef struct wk_find {
    uintptr_t base;       /* libpython's load address */
    PyObject *probe;      /* a freshly interned string */
    PyObject *found;
} wk_find;

/* It reads words of libpython's data as pointers and looks at what they
   point to: raw reads on purpose, kept out of AddressSanitizer's
   instrumentation (a word pointing into ASan's own shadow memory is
   readable, but ASan's check of that read faults in the shadow gap: every
   3.11 run of the ASan build crashed in its first cycle). */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((no_sanitize_address))
#endif
static int find_in_object(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    wk_find *w = arg;
    if (info->dlpi_addr != w->base || w->found) return 0;
    for (int i = 0; i < info->dlpi_phnum && !w->found; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_W)) continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        for (uintptr_t a = (lo + 7) & ~(uintptr_t)7; a + sizeof(void *) <= hi && !w->found; a += sizeof(void *)) {
            uintptr_t v = *(const uintptr_t *)a;
            if (!v || (v & 7) || !is_readable(v, sizeof(PyDictObject))) continue;
            PyObject *o = (PyObject *)v;
            /* the fields themselves: Py_TYPE() & co are functions that an
               unoptimised build keeps out of line, instrumented */
            if (o->ob_type != &PyDict_Type || o->ob_refcnt <= 0 || ((PyDictObject *)o)->ma_used < 16) continue;
            if (PyDict_GetItemWithError(o, w->probe) == w->probe) w->found = o;
            PyErr_Clear();
        }
    }
    return w->found != NULL;
}

static PyObject *interned;          /* borrowed: CPython's */
static int interned_searched;
static Py_ssize_t settled_size = -1, settled_count = -1;

static void find_interned(void)
{
    interned_searched = 1;
    Dl_info di;
    /* a function's address: a data symbol (PyDict_Type) may be the
       executable's copy (copy relocation) */
    if (!dladdr((void *)(uintptr_t)&PyUnicode_InternInPlace, &di)) return;
    PyObject *probe = PyUnicode_FromString("pyfini-leakcheck: where is the dict of interned strings?");
    if (!probe) {
        PyErr_Clear();
        return;
    }
    PyUnicode_InternInPlace(&probe);
    read_maps();
    wk_find w = {(uintptr_t)di.dli_fbase, probe, NULL};
    dl_iterate_phdr(find_in_object, &w);
    Py_DECREF(probe);   /* its end takes it out of the dict again */
    interned = w.found;
}

static int settle_interned(void)
{
    if (!interned_searched) find_interned();
    if (!interned) return 0;
    Py_ssize_t size = _PyDict_SizeOf((PyDictObject *)interned), count = PyDict_GET_SIZE(interned);
    if (size == settled_size && count == settled_count) return 0;
    PyObject *copy = PyDict_Copy(interned);
    if (!copy) return -1;
    PyDict_Clear(interned);
    int rc = PyDict_Update(interned, copy);
    Py_DECREF(copy);
    settled_size = _PyDict_SizeOf((PyDictObject *)interned);
    settled_count = PyDict_GET_SIZE(interned);
    return rc;
}
#endif

int wk_settle_available(void) { return WK_SETTLE; }

void wk_settle_shared(void)
{
#if WK_SETTLE
    char err[256];
    if (settle_type(&PyBaseObject_Type, 0) < 0) {
        wk_describe_exception(err, sizeof err);
        wk_fail(LC_ERR_INTERNAL, 0, "rebuilding the static types' subclass tables: %s", err);
    }
    if (settle_interned() < 0) {
        wk_describe_exception(err, sizeof err);
        wk_fail(LC_ERR_INTERNAL, 0, "settling the dict of interned strings: %s", err);
    }
#endif
}

int wk_settle_found_interned(void)
{
#if WK_SETTLE
    return interned != NULL;
#else
    return 0;
#endif
}
