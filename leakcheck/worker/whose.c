/* whose.c - whose is a --where site's loss: the subject's, CPython's, or
 * unattributed (leakcheck/README.md, "Whose loss").  Conservative: only a
 * site positively shown to be CPython's is excused.
 *
 *  SUBJECT       a C frame of its stack lies in an object that is neither
 *                CPython's (libpython*, an extension module under the
 *                standard library's directory - lib-dynload - outside
 *                site-packages/dist-packages) nor neutral (libc, libm,
 *                libstdc++, libgcc_s, the dynamic loader, this worker: they
 *                run for anyone); an address in no object (dladdr fails)
 *                counts as the subject's too.  Else, with a Python line:
 *                the innermost Python frame's file is neither under the
 *                standard library's directory (again outside site-packages)
 *                nor a frozen module ("<frozen importlib._bootstrap>", ...):
 *                the subject's file, --code's "<string>", a test module;
 *  CPYTHON       every C frame CPython's or neutral, and the innermost
 *                Python frame in the standard library or a frozen module;
 *                or no Python frame ran when it was allocated (a sample
 *                block's tracemalloc traceback is "<unknown>") and the C
 *                stack is whole (not cut at the unwinder's 24 frames, its
 *                outermost frame the worker's or libc's thread start): the
 *                subject's code is nowhere on the stack;
 *                A Python object (domain obj) only when it is of a type
 *                with no free list (unrecycled_object): else unattributed;
 *  UNATTRIBUTED  every C frame CPython's or neutral and no Python line
 *                (3.11, 3.14+: no tracemalloc pass; a site whose sample
 *                blocks went): the driver counts it as the subject's.
 * Needs Python (sys._stdlib_dir, sys.path): called in the main interpreter,
 * after the cycles. */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "lc_util.h"
#include "symbols.h"
#include "whose.h"
#include "worker.h"

#define WK_WHOSE_DIRS 4
#define WK_WHOSE_OBJECTS 512

static char dirs[WK_WHOSE_DIRS][PATH_MAX];   /* CPython's directories (with and without symbolic links) */
static int ndirs;
static struct { void *base; int subject; } objects[WK_WHOSE_OBJECTS];
static int nobjects;
static void *self_base;

static void add_dir(const char *d)
{
    if (!d || !d[0] || ndirs == WK_WHOSE_DIRS) return;
    for (int i = 0; i < ndirs; i++)
        if (!strcmp(dirs[i], d)) return;
    lc_scopy(dirs[ndirs++], PATH_MAX, d);
    char real[PATH_MAX];
    if (ndirs < WK_WHOSE_DIRS && realpath(d, real) && strcmp(real, d)) lc_scopy(dirs[ndirs++], PATH_MAX, real);
}

static void add_dir_of(PyObject *s)
{
    const char *d = s && PyUnicode_Check(s) ? PyUnicode_AsUTF8(s) : NULL;
    if (!d) PyErr_Clear();
    add_dir(d);
}

int wk_whose_open(void)
{
    Dl_info di;
    if (dladdr((void *)&wk_whose_open, &di)) self_base = di.dli_fbase;
    /* sys._stdlib_dir (3.11+) holds the .py files and, in every layout
       seen (pyenv, Debian), lib-dynload; the lib-dynload entry of sys.path
       is added for a layout that keeps it elsewhere */
    add_dir_of(PySys_GetObject("_stdlib_dir"));
    PyObject *path = PySys_GetObject("path");
    for (Py_ssize_t i = 0; path && PyList_Check(path) && i < PyList_GET_SIZE(path); i++) {
        PyObject *e = PyList_GET_ITEM(path, i);
        const char *s = PyUnicode_Check(e) ? PyUnicode_AsUTF8(e) : NULL;
        if (!s) {
            PyErr_Clear();
            continue;
        }
        size_t n = strlen(s);
        if (n >= 12 && !strcmp(s + n - 12, "/lib-dynload")) add_dir(s);
    }
    for (int i = 0; i < ndirs; i++) wk_info("whose_dir", "%s", dirs[i]);
    if (!ndirs) wk_info("whose_unavailable", "sys._stdlib_dir is not set: the standard library's files are unknown");
    return ndirs > 0;
}

static int under(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return !strncmp(path, dir, n) && (path[n] == '/' || !path[n]);
}

/* A file of CPython's: under one of its directories, not in a directory of
 * installed packages below it (site-packages: pip's; dist-packages: Debian's). */
static int cpython_file(const char *path)
{
    if (strstr(path, "/site-packages/") || strstr(path, "/dist-packages/")) return 0;
    for (int i = 0; i < ndirs; i++)
        if (under(path, dirs[i])) return 1;
    char real[PATH_MAX];
    if (path[0] == '/' && realpath(path, real) && strcmp(real, path)) return cpython_file(real);
    return 0;
}

static int neutral_object(const char *base)
{
    static const char *const prefixes[] = {"libc.so", "libc-", "libm.so", "libm-", "libstdc++.so", "libgcc_s.so",
                                           "ld-linux", "ld64.so", "libpthread.so", "libdl.so", "librt.so", NULL};
    for (int i = 0; prefixes[i]; i++)
        if (!strncmp(base, prefixes[i], strlen(prefixes[i]))) return 1;
    return 0;
}

/* 1: the object holding return address ip is the subject's (see the top). */
static int subject_object(void *ip)
{
    Dl_info di;
    /* ip is a return address: the call is the byte before it */
    if (!dladdr((char *)ip - 1, &di) || !di.dli_fbase) return 1;
    if (di.dli_fbase == self_base) return 0;
    for (int i = 0; i < nobjects; i++)
        if (objects[i].base == di.dli_fbase) return objects[i].subject;
    const char *name = di.dli_fname ? di.dli_fname : "";
    const char *slash = strrchr(name, '/');
    const char *base = slash ? slash + 1 : name;
    int subject = !(neutral_object(base) || !strncmp(base, "libpython", 9) || cpython_file(name));
    if (nobjects < WK_WHOSE_OBJECTS) objects[nobjects].base = di.dli_fbase, objects[nobjects++].subject = subject;
    return subject;
}

/* The stack is whole: not cut at the unwinder's limit, and its outermost
 * frame is where every thread starts (this worker's main, libc's clone). */
static int whole_stack(void *const *frames, int nframes, int max_frames)
{
    if (nframes <= 0 || nframes >= max_frames) return 0;
    Dl_info di;
    if (!dladdr((char *)frames[nframes - 1] - 1, &di) || !di.dli_fbase) return 0;
    if (di.dli_fbase == self_base) return 1;
    const char *slash = di.dli_fname ? strrchr(di.dli_fname, '/') : NULL;
    const char *base = slash ? slash + 1 : di.dli_fname ? di.dli_fname : "";
    return !strncmp(base, "libc.so", 7) || !strncmp(base, "libc-", 5);
}

/* An object may change hands without an allocation: CPython's free lists
 * (list, tuple, dict and its keys, float, slice, context, async generator
 * parts; 3.13 more) keep freed objects of their type, whoever allocated
 * them, and hand them to the next caller of the type's constructor.  A
 * list the import machinery allocated with list() and freed can be the one
 * the subject's PyList_New(0) keeps (Debian's 3.13.18: 3 of
 * _pyfini_vm_lists20's 20 lists per import; 3.11.7: all 20).  So an object
 * (domain obj) is positively CPython's only when it is of a type with no
 * free list: one of the first frames past the allocator is a constructor of
 * str, bytes, code objects (looked up with libdw; exported names, so also on
 * a stripped libpython).  Blocks of the raw and mem domains and plain
 * C-heap blocks are not recycled across owners. */
static int unrecycled_object(void *const *frames, int nframes)
{
    static const char *const names[] = {"PyUnicode_", "_PyUnicode_", "unicode_", "PyBytes_", "_PyBytes_",
                                        "PyCode_", "_PyCode_", NULL};
    for (int j = 0; j < nframes && j < 6; j++) {
        lc_frame f;
        if (lc_symbolise(frames[j], &f) < 0) continue;
        for (int i = 0; names[i]; i++)
            if (!strncmp(f.function, names[i], strlen(names[i]))) return 1;
    }
    return 0;
}

int wk_whose_site(int object, void *const *frames, int nframes, int max_frames, const char *pyfile,
                  int no_python_frame)
{
    for (int j = 0; j < nframes; j++)
        if (frames[j] && subject_object(frames[j])) return WK_WHOSE_SUBJECT;
    int cpython = 0;
    if (pyfile) {
        if (!(!strncmp(pyfile, "<frozen ", 8) || cpython_file(pyfile))) return WK_WHOSE_SUBJECT;
        cpython = 1;
    } else {
        cpython = no_python_frame && whole_stack(frames, nframes, max_frames);
    }
    return cpython && (!object || unrecycled_object(frames, nframes)) ? WK_WHOSE_CPYTHON : WK_WHOSE_UNATTRIBUTED;
}

const char *wk_whose_name(int w)
{
    static const char *const names[WK_NWHOSE] = {"subject", "cpython", "unattributed"};
    return w >= 0 && w < WK_NWHOSE ? names[w] : "?";
}
