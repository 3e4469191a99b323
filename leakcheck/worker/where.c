/* where.c - --where: after the judged cycles, the allocation sites still
 * holding bytes beyond the bare cycles', with their C call stacks
 * (symbols.c) and the Python lines tracemalloc recorded for them. */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <inttypes.h>
#include <frameobject.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lc_alloc.h"
#include "lc_heap.h"
#include "lc_util.h"
#include "symbols.h"
#include "whose.h"
#include "worker.h"

#define LC_WRAPPER_SCAN 6        /* first frames searched for the wrappers' own */
#define LC_PY_FRAMES 8           /* frames tracemalloc keeps per traceback */
#define LC_PY_LINES (LC_SITE_PYLINES - 2)   /* Python lines per site, then the "cut" note */
#define LC_SITES_FIRST_CAP 256

typedef struct site_row {
    uint32_t id;
    lc_site_info info;
    double excess;   /* bytes per cycle beyond the bare cycles' */
} site_row;

typedef struct site_list {
    site_row *rows;
    size_t n, cap;
    const lc_schedule *sched;
} site_list;

static void collect_site(uint32_t id, const lc_site_info *info, void *arg)
{
    site_list *l = arg;
    double ex = lc_schedule_excess(l->sched, info->bytes[0], info->bytes[1]);
    if (ex <= 0) return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : LC_SITES_FIRST_CAP;
        site_row *r = realloc(l->rows, cap * sizeof *r);
        if (!r) return;
        l->rows = r;
        l->cap = cap;
    }
    l->rows[l->n++] = (site_row){id, *info, ex};
}

static int cmp_excess(const void *a, const void *b)
{
    const site_row *x = a, *y = b;
    return (x->excess < y->excess) - (x->excess > y->excess);
}

/* --- Python lines (tracemalloc) ------------------------------------------ */
/* tracemalloc is CPython's own record of the Python traceback of every block
 * allocated while it traces. With --where it runs from before the first
 * cycle; _PyTraceMalloc_GetTraceback (exported by 3.11-3.15, not part of the
 * documented API: looked up at run time) gives the traceback of one block. */
typedef PyObject *(*lc_get_traceback_fn)(unsigned int domain, uintptr_t ptr);
static lc_get_traceback_fn py_traceback;

int wk_start_tracemalloc(void)
{
#if PY_VERSION_HEX < 0x030C0000
    wk_info("where_python", "unavailable on CPython %s: tracemalloc deadlocks in Py_NewInterpreter() "
            "(its PyMem_RawMalloc hook calls PyGILState_Ensure)", PY_VERSION);
    return 0;
#elif PY_VERSION_HEX >= 0x030E0000
    /* tracemalloc keeps a reference to the file name (an interned string) of
       every frame it records; an interpreter with its own obmalloc frees its
       interned strings when it ends (3.14+), and the next lookup in
       tracemalloc's file-name table reads freed memory. Any cycle may create
       such an interpreter (the config, or the subject through
       concurrent.interpreters), and a PySys_AddAuditHook hook saw no
       cpython.PyInterpreterState_New event for it (tried on 3.14.10 and
       3.15.2): no safe moment to stop tracemalloc. */
    wk_info("where_python", "unavailable on CPython %s: tracemalloc keeps references to the file names of the "
            "interpreters it traced, and on 3.14+ an interpreter with its own obmalloc frees them when it ends "
            "(the next lookup reads freed memory)", PY_VERSION);
    return 0;
#else
    lc_get_traceback_fn fn;
    *(void **)&fn = dlsym(RTLD_DEFAULT, "_PyTraceMalloc_GetTraceback");
    if (!fn) {
        wk_info("where_python", "unavailable: CPython %s does not export _PyTraceMalloc_GetTraceback", PY_VERSION);
        return 0;
    }
    PyObject *m = PyImport_ImportModule("_tracemalloc");
    PyObject *r = m ? PyObject_CallMethod(m, "start", "i", LC_PY_FRAMES) : NULL;
    Py_XDECREF(m);
    if (!r) {
        char err[1000];
        wk_describe_exception(err, sizeof err);
        wk_info("where_python", "unavailable: _tracemalloc.start() failed: %s", err);
        return 0;
    }
    Py_DECREF(r);
    lc_alloc_over_tracemalloc();
    py_traceback = fn;
    wk_info("where_python", "tracemalloc, %d frames, in %d more cycles after the judged ones (not measured)",
            LC_PY_FRAMES, LC_PY_PASS_CYCLES);
    return 1;
#endif
}

static int importlib_frame(const char *file)
{
    static const char prefix[] = "<frozen importlib._bootstrap";
    return strncmp(file, prefix, sizeof prefix - 1) == 0;
}

/* Frame j of a tracemalloc traceback: (filename, lineno); "?" and -1 when
   unreadable. */
static const char *traceback_frame(PyObject *tb, Py_ssize_t j, long *line)
{
    PyObject *fr = PyTuple_GET_ITEM(tb, j);
    const char *file = NULL;
    *line = -1;
    if (PyTuple_Check(fr) && PyTuple_GET_SIZE(fr) >= 2) {
        file = PyUnicode_AsUTF8(PyTuple_GET_ITEM(fr, 0));
        *line = PyLong_AsLong(PyTuple_GET_ITEM(fr, 1));
    }
    if (!file) file = "?";
    PyErr_Clear();
    return file;
}

static void pyline(uint32_t id, int k, const char *text)
{
    lc_line l;
    lc_enc_pyline(&l, id, k, text);
    wk_emit(&l);
}

/* P records of one traceback (innermost first); runs of import machinery
 * frames are folded into one line. */
static void report_traceback(uint32_t id, PyObject *tb)
{
    int k = 0, folded = 0;
    long line;
    char text[LC_LINE_MAX / 2];
    Py_ssize_t n = PyTuple_GET_SIZE(tb);
    for (Py_ssize_t j = 0; j < n && k < LC_PY_LINES; j++) {
        const char *file = traceback_frame(tb, j, &line);
        if (importlib_frame(file)) {
            folded++;
            if (j + 1 < n) continue;
        }
        if (folded) {
            snprintf(text, sizeof text, "(import machinery, %d frame%s)", folded, folded == 1 ? "" : "s");
            pyline(id, k++, text);
            folded = 0;
            if (importlib_frame(file)) continue;
        }
        snprintf(text, sizeof text, "%s:%ld", file, line);
        if (k < LC_PY_LINES) pyline(id, k++, text);
    }
    snprintf(text, sizeof text, "... (tracemalloc keeps %d frames: outer ones may be cut)", LC_PY_FRAMES);
    if (n >= LC_PY_FRAMES && k <= LC_PY_LINES) pyline(id, k, text);
}

/* The Python traceback of the first of the site's sample blocks tracemalloc
 * knows, or one P record saying why there is none. */
static void report_python_lines(uint32_t id, const lc_site_info *info)
{
    int untraced = 0, sampled = 0;
    for (int i = 0; i < LC_SAMPLES; i++) {
        if (!info->samples[i]) continue;
        sampled++;
        PyObject *tb = py_traceback(0, (uintptr_t)info->samples[i]);
        if (!tb) {
            PyErr_Clear();
            continue;
        }
        untraced += tb == Py_None;   /* tracemalloc stopped, or its traces cleared */
        long line;
        /* (("<unknown>", 0),): traced with no Python frame (allocated from C) */
        if (!PyTuple_Check(tb) || PyTuple_GET_SIZE(tb) == 0 ||
            (PyTuple_GET_SIZE(tb) == 1 && strcmp(traceback_frame(tb, 0, &line), "<unknown>") == 0)) {
            Py_DECREF(tb);
            continue;
        }
        report_traceback(id, tb);
        Py_DECREF(tb);
        return;
    }
    const char *why = !sampled ? "the site's sampled blocks were all freed"
                      : untraced == sampled ? "not traced (tracemalloc was stopped or its traces cleared)"
                                            : "no Python frame was running (allocated from C)";
    char text[300];
    snprintf(text, sizeof text, "(none: %s)", why);
    pyline(id, 0, text);
}

/* --- Python lines of C-heap sites ------------------------------------------ */
/* tracemalloc sees Python's allocators only.  For a plain C-heap block the
 * Python line is the one that called into C code: in the Python-lines pass
 * a C trace function (PyEval_SetTrace, on the cycle interpreter's thread)
 * notes, at each line, call and return event, the innermost frame that is
 * not the import machinery's, as "file:line" - the line being executed, so a
 * C function's line is the line that called it (also a call of a C type or
 * a ctypes function, which makes no call event), and an extension module's
 * Py_mod_exec gets the line of its `import`.  The allocator (lc_heap.c)
 * tags each sample block with the number of that text.  Blocks allocated by
 * a thread the trace function does not run on, or from C code before any
 * Python frame, have none. */
#define LC_PYLOC_MAX 4096
#define LC_PYLOC_TEXT 240
#define LC_PYLOC_INDEX (2 * LC_PYLOC_MAX)   /* power of two */
static char (*pyloc_text)[LC_PYLOC_TEXT];   /* [0]: none; [1..pyloc_n] */
static uint32_t *pyloc_index;               /* open addressing, holds numbers */
static uint32_t pyloc_n;
static int heap_lines;
static pthread_mutex_t pyloc_lock = PTHREAD_MUTEX_INITIALIZER;

int wk_start_heap_lines(void)
{
    if (!lc_heap_available()) return 0;
    lc_heap_own_enter();
    pyloc_text = calloc(LC_PYLOC_MAX + 1, sizeof *pyloc_text);
    pyloc_index = calloc(LC_PYLOC_INDEX, sizeof *pyloc_index);
    lc_heap_own_leave();
    if (!pyloc_text || !pyloc_index) return 0;
    heap_lines = 1;
    return 1;
}

/* The number of text (interned), or 0 when the table is full. */
static uint32_t pyloc_intern(const char *text)
{
    uint64_t h = lc_fnv(LC_FNV_OFFSET, text, strlen(text));
    uint32_t found = 0;
    pthread_mutex_lock(&pyloc_lock);
    for (uint32_t i = (uint32_t)h & (LC_PYLOC_INDEX - 1);; i = (i + 1) & (LC_PYLOC_INDEX - 1)) {
        uint32_t k = pyloc_index[i];
        if (k && strcmp(pyloc_text[k], text) == 0) {
            found = k;
            break;
        }
        if (!k) {
            if (pyloc_n < LC_PYLOC_MAX) {
                found = ++pyloc_n;
                lc_scopy(pyloc_text[found], LC_PYLOC_TEXT, text);
                pyloc_index[i] = found;
            }
            break;
        }
    }
    pthread_mutex_unlock(&pyloc_lock);
    return found;
}

static int pyloc_trace(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg)
{
    (void)obj, (void)arg;
    if (what != PyTrace_CALL && what != PyTrace_LINE && what != PyTrace_RETURN) return 0;
    lc_heap_own_enter();
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    PyFrameObject *f = frame;
    Py_XINCREF(f);
    if (what == PyTrace_RETURN && f) {   /* the caller runs on */
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    uint32_t loc = 0;
    int machinery = 0;
    while (f) {
        PyCodeObject *co = PyFrame_GetCode(f);
        const char *file = PyUnicode_AsUTF8(co->co_filename);
        if (!file) PyErr_Clear();
        if (file && !importlib_frame(file)) {
            char text[LC_PYLOC_TEXT];
            snprintf(text, sizeof text, "%s:%d", file, PyFrame_GetLineNumber(f));
            loc = pyloc_intern(text);
            Py_DECREF(co);
            break;
        }
        machinery = 1;
        Py_DECREF(co);
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(f);
    if (!loc && machinery) loc = pyloc_intern("(only the import machinery's frames: imported from C)");
    lc_heap_set_pyloc(loc);
    PyErr_Restore(et, ev, etb);
    lc_heap_own_leave();
    return 0;
}

void wk_heap_lines_attach(void)
{
    if (!heap_lines) return;
    lc_heap_set_pyloc(0);
    PyEval_SetTrace(pyloc_trace, NULL);
}

void wk_heap_lines_detach(void) { lc_heap_set_pyloc(0); }

/* The Python line of the first of the site's live sample blocks that has
 * one, or one P record saying why there is none. */
static void report_heap_python_lines(uint32_t id, const lc_site_info *info)
{
    int sampled = 0;
    for (int i = 0; i < LC_SAMPLES; i++) {
        if (!info->samples[i]) continue;
        sampled++;
        uint32_t loc = lc_heap_sample_pyloc(info->samples[i]);
        if (loc) {
            pyline(id, 0, pyloc_text[loc]);
            return;
        }
    }
    pyline(id, 0, !sampled ? "(none: no block of the site stayed allocated in the Python-lines pass)"
                           : "(none: no Python frame ran on the allocating thread)");
}

/* --- C frames -------------------------------------------------------------- */
/* Allocator entry points are not the interesting frame: skip them.  C heap:
 * the worker's own malloc & co (this program), libstdc++'s operator new and
 * new[] (every variant: demangled "operator new", or mangled _Znw*, _Zna* when
 * libstdc++'s demangler is absent) and libc's strdup family. */
static int allocator_frame(const lc_frame *f, const char *self_object)
{
    static const char *const prefixes[] = {
        "PyMem_RawMalloc", "PyMem_RawCalloc", "PyMem_RawRealloc", "PyMem_Malloc", "PyMem_Calloc",
        "PyMem_Realloc", "PyObject_Malloc", "PyObject_Calloc", "PyObject_Realloc", "_PyMem_",
        "_PyObject_Malloc", "_PyObject_Calloc", "_PyObject_Realloc", "pymalloc_", "tracemalloc_",
        "_Znw", "_Zna", "operator new", "__strdup", "__strndup", "strdup", "strndup", NULL};
    if (self_object[0] && strcmp(f->object, self_object) == 0) return 1;
    for (int i = 0; prefixes[i]; i++)
        if (strncmp(f->function, prefixes[i], strlen(prefixes[i])) == 0) return 1;
    return 0;
}

/* The file name of this program, as libdw names its object. */
static void self_object_name(char *out, size_t n)
{
    char exe[1024];
    out[0] = 0;
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k <= 0) return;
    exe[k] = 0;
    const char *slash = strrchr(exe, '/');
    lc_scopy(out, n, slash ? slash + 1 : exe);
}

/* F records of one site.  The wrappers' own frames (this program) come
 * first; tracemalloc's hook sits between the outer and the inner wrapper,
 * and without libpython's symbols it has no name: everything up to the last
 * frame of this program among the first few is allocator. */
static void report_frames(const site_row *r, const char *self_object)
{
    static const char hook_prefix[] = "lc_tmhook_";
    int first = 0;
    for (int j = 0; j < r->info.nframes && j < LC_WRAPPER_SCAN; j++) {
        lc_frame f;
        lc_symbolise(r->info.frames[j], &f);
        if (self_object[0] && strcmp(f.object, self_object) == 0
            && strncmp(f.function, hook_prefix, sizeof hook_prefix - 1) == 0)
            first = j + 1;
    }
    int k = 0, skipping = 1;
    for (int j = first; j < r->info.nframes && k < LC_SITE_FRAMES; j++) {
        lc_frame f;
        lc_symbolise(r->info.frames[j], &f);
        if (skipping && allocator_frame(&f, self_object)) continue;
        skipping = 0;
        char obj[140] = "", text[1200];
        if (f.object[0]) snprintf(obj, sizeof obj, " [%.127s]", f.object);
        const char *base = strrchr(f.file, '/');
        if (f.file[0]) snprintf(text, sizeof text, "%s (%s:%d)%s", f.function, base ? base + 1 : f.file, f.line, obj);
        else snprintf(text, sizeof text, "%s%s", f.function, obj);
        lc_line l;
        lc_enc_frame(&l, r->id, k++, text);
        wk_emit(&l);
    }
}

/* --- whose (whose.c) -------------------------------------------------------- */
/* The file of the innermost Python frame of the site's first sample block
 * that has one, into out: 1.  The import machinery's frames count:
 * tracemalloc's own frame 0, or the C-heap line that names only them.
 * 2: no such block, but one allocated while no Python frame ran (C code
 * alone: tracemalloc's "<unknown>"); 0: nothing known. */
static int site_python_file(const lc_site_info *info, char *out, size_t n)
{
    int no_frame = 0;
    for (int i = 0; i < LC_SAMPLES; i++) {
        if (!info->samples[i]) continue;
        if (info->domain == LC_SITE_HEAP) {
            uint32_t loc = heap_lines ? lc_heap_sample_pyloc(info->samples[i]) : 0;
            if (!loc) continue;   /* also a thread the trace function did not see: not "no frame" */
            if (pyloc_text[loc][0] == '(') lc_scopy(out, n, "<frozen importlib._bootstrap>");   /* machinery only */
            else lc_scopy(out, n, pyloc_text[loc]);
            char *colon = strrchr(out, ':');
            if (colon && out[0] != '<') *colon = 0;
            return 1;
        }
        if (!py_traceback) return 0;
        PyObject *tb = py_traceback(0, (uintptr_t)info->samples[i]);
        if (!tb) {
            PyErr_Clear();
            continue;
        }
        long line;
        int found = PyTuple_Check(tb) && PyTuple_GET_SIZE(tb) > 0;
        if (found && PyTuple_GET_SIZE(tb) == 1 && !strcmp(traceback_frame(tb, 0, &line), "<unknown>"))
            found = 0, no_frame = 1;
        if (found) lc_scopy(out, n, traceback_frame(tb, 0, &line));
        Py_DECREF(tb);
        if (found) return 1;
    }
    return no_frame ? 2 : 0;
}

typedef struct whose_total {
    int64_t bytes[2], blocks[2];
    long sites;
} whose_total;

static int site_whose(const lc_site_info *info)
{
    char file[LC_PYLOC_TEXT];
    int have = site_python_file(info, file, sizeof file);
    int w = wk_whose_site(info->domain == LC_DOMAIN_OBJ, info->frames, info->nframes, LC_MAX_FRAMES,
                          have == 1 ? file : NULL, have == 2);
    return w;
}

static void total_site(uint32_t id, const lc_site_info *info, void *arg)
{
    (void)id;
    whose_total(*t)[WK_NWHOSE] = arg;
    if (!info->bytes[0] && !info->bytes[1] && !info->blocks[0] && !info->blocks[1]) return;
    whose_total *w = &t[info->domain][site_whose(info)];
    for (int k = 0; k < 2; k++) w->bytes[k] += info->bytes[k], w->blocks[k] += info->blocks[k];
    w->sites++;
}

/* I records: whose_dir (whose.c), then "whose DOMAIN CLASS SUB_BYTES
 * SUB_BLOCKS BARE_BYTES BARE_BLOCKS SITES" for every domain and class with
 * a site, then "whose_done". */
static void report_whose(const char *const dom[LC_NSITE_DOMAINS], int known)
{
    if (!known) return;
    whose_total t[LC_NSITE_DOMAINS][WK_NWHOSE];
    memset(t, 0, sizeof t);
    lc_alloc_foreach_site(total_site, t);
    for (int d = 0; d < LC_NSITE_DOMAINS; d++)
        for (int c = 0; c < WK_NWHOSE; c++)
            if (t[d][c].sites)
                wk_info("whose", "%s %s %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 " %ld", dom[d], wk_whose_name(c),
                        t[d][c].bytes[0], t[d][c].blocks[0], t[d][c].bytes[1], t[d][c].blocks[1], t[d][c].sites);
    wk_info("whose_done", "1");
}

void wk_report_where(const lc_schedule *s)
{
    static const char *const dom[LC_NSITE_DOMAINS] = {"raw", "mem", "obj", "obmalloc", "heap"};
    site_list l = {.sched = s};
    lc_alloc_foreach_site(collect_site, &l);
    qsort(l.rows, l.n, sizeof *l.rows, cmp_excess);
    if (lc_symbols_open() < 0) wk_info("where_symbols", "unavailable: %s", lc_symbols_error());
    char self_object[128];
    self_object_name(self_object, sizeof self_object);
    int shown[LC_NSITE_DOMAINS] = {0};
    int whose_known = wk_whose_open();
    for (size_t i = 0; i < l.n; i++) {
        site_row *r = &l.rows[i];
        if (shown[r->info.domain]++ >= LC_SITES_PER_DOMAIN) continue;
        lc_line line;
        lc_enc_site(&line, r->id, dom[r->info.domain], r->info.bytes, r->info.blocks);
        wk_emit(&line);
        report_frames(r, self_object);
        if (whose_known) wk_info("whose_site", "%u %s", r->id, wk_whose_name(site_whose(&r->info)));
        if (r->info.domain == LC_SITE_HEAP) {
            if (heap_lines) report_heap_python_lines(r->id, &r->info);
        } else if (py_traceback) {
            report_python_lines(r->id, &r->info);
        }
    }
    report_whose(dom, whose_known);   /* (unrecycled_object: symbols) */
    lc_symbols_close();
    free(l.rows);
}
