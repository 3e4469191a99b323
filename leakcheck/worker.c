/* worker.c - pyfini-leakcheck's worker: embeds one CPython, runs interpreter
 * cycles and reports a reading of every meter after each cycle.
 *
 * Started by the driver (driver.c), never by hand: it writes records (see
 * lc_protocol.h) to file descriptor LC_RECORD_FD.  A crash of this process is
 * a finding the driver reports; bad input is reported with an E record and
 * exit status 2.
 *
 * usage: pyfini-leakcheck-worker [--config NAME] [--import MOD]... [--code SRC]
 *            [--file F] [--cycles N] [--warmup W] [--block K] [--no-baseline] [--where]
 *            [--list-extensions]
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
/* AddressSanitizer's allocator replaces malloc, and mallinfo2() does not see
 * it; it counts the bytes itself (declared in sanitizer/allocator_interface.h,
 * which gcc does not install everywhere) */
size_t __sanitizer_get_current_allocated_bytes(void);
#define LC_SANITIZER_MALLOC 1
#endif

#include "lc_alloc.h"
#include "lc_protocol.h"
#include "lc_symbols.h"
#include "lc_util.h"

#ifndef LC_PYTHON_EXECUTABLE
#define LC_PYTHON_EXECUTABLE ""
#endif

enum lc_config { LC_CFG_LEGACY, LC_CFG_ISOLATED, LC_CFG_OWN_OBMALLOC, LC_CFG_SHARED_OBMALLOC };
static const char *const lc_config_names[] = {"legacy", "isolated", "own-obmalloc", "shared-obmalloc"};

#define LC_MAX_IMPORTS 64
static struct {
    enum lc_config config;
    const char *imports[LC_MAX_IMPORTS];
    int nimports;
    const char *code;
    const char *file;
    char *file_src;
    long cycles, warmup, block;
    int baseline, where, list_extensions, no_wrapper;
} opt = {.cycles = 100, .warmup = 10, .block = 1, .baseline = 1};

static PyThreadState *main_tstate;
static PyObject *gettotalrefcount;   /* sys.gettotalrefcount on debug builds */
static int statm_fd = -1;
static long page_size;

/* --- records ------------------------------------------------------------- */
static void rec(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void rec(const char *fmt, ...)
{
    char buf[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
    for (int i = 0; i < n; i++)
        if (buf[i] == '\n' || buf[i] == '\r') buf[i] = ' ';
    buf[n++] = '\n';
    for (int off = 0; off < n;) {
        ssize_t w = write(LC_RECORD_FD, buf + off, (size_t)(n - off));
        if (w < 0) {
            if (errno == EINTR) continue;
            _exit(4);   /* the driver is gone */
        }
        off += (int)w;
    }
}

static void fail(const char *kind, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void fail(const char *kind, const char *fmt, ...)
{
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rec("E %s %s", kind, msg);
    _exit(2);
}

/* --- meters -------------------------------------------------------------- */
static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t read_rss(void)
{
    char buf[128];
    ssize_t n = pread(statm_fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return -1;
    buf[n] = 0;
    long size, resident;
    if (sscanf(buf, "%ld %ld", &size, &resident) != 2) return -1;
    return (int64_t)resident * page_size;
}

static int64_t count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int64_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n - 1;   /* the directory's own descriptor */
}

static int64_t malloc_in_use(void)
{
#ifdef LC_SANITIZER_MALLOC
    return (int64_t)__sanitizer_get_current_allocated_bytes();
#else
    struct mallinfo2 mi = mallinfo2();
    return (int64_t)(mi.uordblks + mi.hblkhd);
#endif
}

static int64_t total_refcount(void)
{
    if (!gettotalrefcount) return -1;
    PyObject *r = PyObject_CallNoArgs(gettotalrefcount);
    if (!r) {
        PyErr_Clear();
        return -1;
    }
    int64_t v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return v;
}

static void reading(int64_t v[LC_NVALUES])
{
    int64_t bytes[LC_NDOMAINS], blocks[LC_NDOMAINS];
    v[LC_V_FDS] = count_fds();
    v[LC_V_REFS] = total_refcount();
    v[LC_V_RSS] = read_rss();
    v[LC_V_MALLOC] = malloc_in_use();
    lc_alloc_totals(bytes, blocks);
    v[LC_V_PY_RAW] = bytes[LC_DOMAIN_RAW];
    v[LC_V_PY_MEM] = bytes[LC_DOMAIN_MEM];
    v[LC_V_PY_OBJ] = bytes[LC_DOMAIN_OBJ];
    v[LC_V_PY_OBMALLOC] = bytes[LC_DOMAIN_OBMALLOC];
    v[LC_V_PY] = bytes[0] + bytes[1] + bytes[2] + bytes[3];
    v[LC_V_BLOCKS] = blocks[0] + blocks[1] + blocks[2] + blocks[3];
    if (opt.no_wrapper)
        v[LC_V_PY] = v[LC_V_PY_RAW] = v[LC_V_PY_MEM] = v[LC_V_PY_OBJ] = v[LC_V_PY_OBMALLOC] = v[LC_V_BLOCKS] = -1;
}

static void rec_values(const char *head, const int64_t v[LC_NVALUES])
{
    char buf[512];
    int n = snprintf(buf, sizeof buf, "%s", head);
    for (int i = 0; i < LC_NVALUES && n < (int)sizeof buf; i++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, " %" PRId64, v[i]);
    rec("%s", buf);
}

/* --- Python errors ------------------------------------------------------- */
/* Describe the pending exception as "Type: message (file, line N)" and clear it. */
static void describe_exception(char *out, size_t n)
{
    PyObject *exc;
#if PY_VERSION_HEX >= 0x030C0000
    exc = PyErr_GetRaisedException();
#else
    PyObject *type, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    if (exc && tb) PyException_SetTraceback(exc, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
#endif
    if (!exc) {
        snprintf(out, n, "unknown error");
        return;
    }
    const char *msg = NULL;
    PyObject *s = PyObject_Str(exc);
    if (s) msg = PyUnicode_AsUTF8(s);
    if (!msg) PyErr_Clear();
    char loc[700] = "";
    PyObject *tb2 = PyException_GetTraceback(exc);
    while (tb2 && tb2 != Py_None) {
        PyObject *next = PyObject_GetAttrString(tb2, "tb_next");
        if (!next || next == Py_None) {
            Py_XDECREF(next);
            PyErr_Clear();
            break;
        }
        Py_DECREF(tb2);
        tb2 = next;
    }
    if (tb2 && tb2 != Py_None && !PyObject_TypeCheck(exc, (PyTypeObject *)PyExc_SyntaxError)) {
        PyObject *lineno = PyObject_GetAttrString(tb2, "tb_lineno");
        PyObject *fname = NULL;
        PyObject *frame = PyObject_GetAttrString(tb2, "tb_frame");
        if (frame) {
            PyObject *code = PyObject_GetAttrString(frame, "f_code");
            if (code) fname = PyObject_GetAttrString(code, "co_filename");
            Py_XDECREF(code);
        }
        const char *f = fname ? PyUnicode_AsUTF8(fname) : NULL;
        if (f && lineno) snprintf(loc, sizeof loc, " (%s, line %ld)", f, PyLong_AsLong(lineno));
        Py_XDECREF(lineno);
        Py_XDECREF(fname);
        Py_XDECREF(frame);
        PyErr_Clear();
    }
    Py_XDECREF(tb2);
    snprintf(out, n, "%s: %s%s", Py_TYPE(exc)->tp_name, msg ? msg : "(no message)", loc);
    Py_XDECREF(s);
    Py_DECREF(exc);
    PyErr_Clear();
}

/* --- the subject --------------------------------------------------------- */
static int run_code(const char *src, const char *filename, char *err, size_t n)
{
    PyObject *co = Py_CompileString(src, filename, Py_file_input);
    if (!co) goto fail;
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *mainmod = PyImport_AddModuleRef("__main__");   /* 3.13+: strong reference */
#else
    PyObject *mainmod = PyImport_AddModule("__main__");      /* borrowed */
    Py_XINCREF(mainmod);
#endif
    if (!mainmod) {
        Py_DECREF(co);
        goto fail;
    }
    PyObject *globals = PyModule_GetDict(mainmod);
    PyObject *r = PyEval_EvalCode(co, globals, globals);
    Py_DECREF(mainmod);
    Py_DECREF(co);
    if (!r) goto fail;
    Py_DECREF(r);
    return 0;
fail:
    describe_exception(err, n);
    return -1;
}

/* Runs in the cycle's interpreter. */
static int run_subject(char *err, size_t n)
{
    for (int i = 0; i < opt.nimports; i++) {
        PyObject *m = PyImport_ImportModule(opt.imports[i]);
        if (!m) {
            char d[3000];
            describe_exception(d, sizeof d);
            snprintf(err, n, "import %s: %s", opt.imports[i], d);
            return -1;
        }
        Py_DECREF(m);
    }
    if (opt.code && run_code(opt.code, "<--code>", err, n) < 0) return -1;
    if (opt.file_src && run_code(opt.file_src, opt.file, err, n) < 0) return -1;
    return 0;
}

static int has_subject(void)
{
    return opt.nimports > 0 || opt.code || opt.file;
}

/* Before any cycle, in the main interpreter: syntax of --code/--file and
 * whether each imported module can be found at all. */
static void precheck_subject(void)
{
    char err[4096];
    for (int i = 0; i < 2; i++) {
        const char *src = i ? opt.file_src : opt.code;
        const char *name = i ? opt.file : "<--code>";
        if (!src) continue;
        PyObject *co = Py_CompileString(src, name, Py_file_input);
        if (!co) {
            describe_exception(err, sizeof err);
            fail("usage", "%s does not compile: %s", i ? opt.file : "--code", err);
        }
        Py_DECREF(co);
    }
    if (opt.nimports == 0) return;
    PyObject *util = PyImport_ImportModule("importlib.util");
    if (!util) {
        describe_exception(err, sizeof err);
        fail("internal", "importlib.util: %s", err);
    }
    for (int i = 0; i < opt.nimports; i++) {
        char top[256];
        lc_scopy(top, sizeof top, opt.imports[i]);
        char *dot = strchr(top, '.');
        if (dot) *dot = 0;
        PyObject *spec = PyObject_CallMethod(util, "find_spec", "s", top);
        if (!spec) {
            describe_exception(err, sizeof err);
            fail("usage", "--import %s: %s", opt.imports[i], err);
        }
        int missing = spec == Py_None;
        Py_DECREF(spec);
        if (missing) fail("usage", "--import %s: no module named '%s' on this Python's sys.path", opt.imports[i], top);
    }
    Py_DECREF(util);
}

/* --- one cycle ----------------------------------------------------------- */
static void new_interpreter(PyThreadState **ts)
{
    if (opt.config == LC_CFG_LEGACY) {
        *ts = Py_NewInterpreter();
        if (!*ts) {
            char err[2048] = "Py_NewInterpreter() returned NULL";
            if (PyErr_Occurred()) describe_exception(err, sizeof err);
            fail("config", "cannot create a legacy interpreter: %s", err);
        }
        return;
    }
#if PY_VERSION_HEX >= 0x030C0000
    PyInterpreterConfig c = {
        .use_main_obmalloc = 0,
        .allow_fork = 0,
        .allow_exec = 0,
        .allow_threads = 1,
        .allow_daemon_threads = 0,
        .check_multi_interp_extensions = 1,
        .gil = PyInterpreterConfig_OWN_GIL,
    };
    if (opt.config == LC_CFG_OWN_OBMALLOC) c.gil = PyInterpreterConfig_SHARED_GIL;
    if (opt.config == LC_CFG_SHARED_OBMALLOC) {
        c.use_main_obmalloc = 1;
        c.gil = PyInterpreterConfig_SHARED_GIL;
    }
    PyStatus st = Py_NewInterpreterFromConfig(ts, &c);
    if (PyStatus_Exception(st))
        fail("config", "cannot create a %s interpreter: %s%s%s", lc_config_names[opt.config],
             st.func ? st.func : "", st.func ? ": " : "", st.err_msg ? st.err_msg : "(no message)");
#else
    fail("usage", "config '%s' needs CPython 3.12 or newer", lc_config_names[opt.config]);
#endif
}

static int uses_own_obmalloc(void)
{
    return opt.config == LC_CFG_ISOLATED || opt.config == LC_CFG_OWN_OBMALLOC;
}

static void cycle(long seq, int subject, long round, int judged)
{
    char err[4096];
    int64_t v[LC_NVALUES];
    PyThreadState *ts = NULL;
    rec("B %ld %c %ld %d", seq, subject ? 'S' : 'B', round, judged);
    if (opt.where) lc_alloc_recheck_tracemalloc();
    int where_obm = opt.where && uses_own_obmalloc();
    if (where_obm) lc_alloc_obm_begin(PyThreadState_GetInterpreter(main_tstate), (uint32_t)seq);
    if (judged) lc_alloc_set_recording(subject || !has_subject() ? 1 : 2);
    int64_t t0 = now_ns();
    new_interpreter(&ts);
    int rc = subject ? run_subject(err, sizeof err) : 0;
    Py_EndInterpreter(ts);
    int64_t t1 = now_ns();
    lc_alloc_set_recording(0);
    int64_t obm = where_obm ? lc_alloc_obm_end() : -1;
    PyThreadState_Swap(main_tstate);
    if (rc < 0) fail("subject", "the subject failed in cycle %ld (%s interpreter): %s", seq, lc_config_names[opt.config], err);
    reading(v);
    v[LC_V_TIME_NS] = t1 - t0;
    char head[64];
    snprintf(head, sizeof head, "C %ld %c %ld %d", seq, subject ? 'S' : 'B', round, judged);
    rec_values(head, v);
    if (obm >= 0) rec("O %ld %" PRId64, seq, obm);
}

/* --- --where ------------------------------------------------------------- */
typedef struct site_row {
    uint32_t id;
    lc_site_info info;
    double excess;   /* bytes per cycle beyond the bare cycles' */
} site_row;

typedef struct site_list {
    site_row *rows;
    size_t n, cap;
    long n_subject, n_bare;
} site_list;

static void collect_site(uint32_t id, const lc_site_info *info, void *arg)
{
    site_list *l = arg;
    double ex = l->n_subject ? (double)info->bytes[0] / (double)l->n_subject : 0;
    if (l->n_bare) ex -= (double)info->bytes[1] / (double)l->n_bare;
    if (ex <= 0) return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
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
#define LC_PY_FRAMES 8
typedef PyObject *(*lc_get_traceback_fn)(unsigned int domain, uintptr_t ptr);
static lc_get_traceback_fn py_traceback;

static void start_tracemalloc(void)
{
#if PY_VERSION_HEX < 0x030C0000
    rec("I where_python unavailable on CPython %s: tracemalloc deadlocks in Py_NewInterpreter() "
        "(its PyMem_RawMalloc hook calls PyGILState_Ensure)", PY_VERSION);
#elif PY_VERSION_HEX >= 0x030E0000
    /* tracemalloc keeps a reference to the file name (an interned string) of
       every frame it records; an interpreter with its own obmalloc frees its
       interned strings when it ends (3.14+), and the next lookup in
       tracemalloc's file-name table reads freed memory. Any cycle may create
       such an interpreter (the config, or the subject through
       concurrent.interpreters), and a PySys_AddAuditHook hook saw no
       cpython.PyInterpreterState_New event for it (tried on 3.14.10 and
       3.15.2): no safe moment to stop tracemalloc. */
    rec("I where_python unavailable on CPython %s: tracemalloc keeps references to the file names of the "
        "interpreters it traced, and on 3.14+ an interpreter with its own obmalloc frees them when it ends "
        "(the next lookup reads freed memory)", PY_VERSION);
#else
    lc_get_traceback_fn fn;
    *(void **)&fn = dlsym(RTLD_DEFAULT, "_PyTraceMalloc_GetTraceback");
    if (!fn) {
        rec("I where_python unavailable: CPython %s does not export _PyTraceMalloc_GetTraceback", PY_VERSION);
        return;
    }
    PyObject *m = PyImport_ImportModule("_tracemalloc");
    PyObject *r = m ? PyObject_CallMethod(m, "start", "i", LC_PY_FRAMES) : NULL;
    Py_XDECREF(m);
    if (!r) {
        char err[1000];
        describe_exception(err, sizeof err);
        rec("I where_python unavailable: _tracemalloc.start() failed: %s", err);
        return;
    }
    Py_DECREF(r);
    lc_alloc_over_tracemalloc();
    py_traceback = fn;
    rec("I where_python tracemalloc, %d frames", LC_PY_FRAMES);
#endif
}

static int importlib_frame(const char *file)
{
    return strncmp(file, "<frozen importlib._bootstrap", 28) == 0;
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

/* "P id k text" records: the Python traceback (innermost first) of the first
 * of the site's sample blocks tracemalloc knows; runs of import machinery
 * frames are folded into one line. */
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
        int k = 0, folded = 0;
        Py_ssize_t n = PyTuple_GET_SIZE(tb);
        for (Py_ssize_t j = 0; j < n && k < 8; j++) {
            const char *file = traceback_frame(tb, j, &line);
            if (importlib_frame(file)) {
                folded++;
                if (j + 1 < n) continue;
            }
            if (folded) {
                rec("P %u %d (import machinery, %d frame%s)", id, k++, folded, folded == 1 ? "" : "s");
                folded = 0;
                if (importlib_frame(file)) continue;
            }
            if (k < 8) rec("P %u %d %s:%ld", id, k++, file, line);
        }
        if (n >= LC_PY_FRAMES && k < 9)
            rec("P %u %d ... (tracemalloc keeps %d frames: outer ones may be cut)", id, k, LC_PY_FRAMES);
        Py_DECREF(tb);
        return;
    }
    rec("P %u 0 (none: %s)", id,
        !sampled ? "the site's sampled blocks were all freed"
        : untraced == sampled ? "not traced (tracemalloc was stopped or its traces cleared)"
                              : "no Python frame was running (allocated from C)");
}

/* Allocator entry points are not the interesting frame: skip them. */
static int allocator_frame(const lc_frame *f, const char *self_object)
{
    static const char *const prefixes[] = {
        "PyMem_RawMalloc", "PyMem_RawCalloc", "PyMem_RawRealloc", "PyMem_Malloc", "PyMem_Calloc",
        "PyMem_Realloc", "PyObject_Malloc", "PyObject_Calloc", "PyObject_Realloc", "_PyMem_",
        "_PyObject_Malloc", "_PyObject_Calloc", "_PyObject_Realloc", "pymalloc_", "tracemalloc_", NULL};
    if (self_object[0] && strcmp(f->object, self_object) == 0) return 1;
    for (int i = 0; prefixes[i]; i++)
        if (strncmp(f->function, prefixes[i], strlen(prefixes[i])) == 0) return 1;
    return 0;
}

static void report_where(long n_subject, long n_bare)
{
    static const char *const dom[] = {"raw", "mem", "obj", "obmalloc"};
    site_list l = {.n_subject = n_subject, .n_bare = n_bare};
    lc_alloc_foreach_site(collect_site, &l);
    qsort(l.rows, l.n, sizeof *l.rows, cmp_excess);
    if (lc_symbols_open() < 0) rec("I where_symbols unavailable: %s", lc_symbols_error());
    char self_object[128] = "";
    {
        char exe[1024];
        ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (k > 0) {
            exe[k] = 0;
            const char *slash = strrchr(exe, '/');
            snprintf(self_object, sizeof self_object, "%.127s", slash ? slash + 1 : exe);
        }
    }
    int shown[LC_NDOMAINS] = {0};
    for (size_t i = 0; i < l.n; i++) {
        site_row *r = &l.rows[i];
        if (shown[r->info.domain] >= 10) continue;
        shown[r->info.domain]++;
        rec("W %u %s %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64, r->id, dom[r->info.domain],
            r->info.bytes[0], r->info.blocks[0], r->info.bytes[1], r->info.blocks[1]);
        /* The wrappers' own frames (this program) come first; tracemalloc's
           hook sits between the outer and the inner wrapper, and without
           libpython's symbols it has no name: everything up to the last
           frame of this program among the first few is allocator. */
        int first = 0;
        for (int j = 0; j < r->info.nframes && j < 6; j++) {
            lc_frame f;
            lc_symbolise(r->info.frames[j], &f);
            if (self_object[0] && strcmp(f.object, self_object) == 0 && strncmp(f.function, "lc_tmhook_", 10) == 0)
                first = j + 1;
        }
        int k = 0, skipping = 1;
        for (int j = first; j < r->info.nframes && k < 12; j++) {
            lc_frame f;
            lc_symbolise(r->info.frames[j], &f);
            if (skipping && allocator_frame(&f, self_object)) continue;
            skipping = 0;
            char obj[140] = "";
            if (f.object[0]) snprintf(obj, sizeof obj, " [%.127s]", f.object);
            if (f.file[0]) {
                const char *base = strrchr(f.file, '/');
                rec("F %u %d %s (%s:%d)%s", r->id, k, f.function, base ? base + 1 : f.file, f.line, obj);
            } else {
                rec("F %u %d %s%s", r->id, k, f.function, obj);
            }
            k++;
        }
        if (py_traceback) report_python_lines(r->id, &r->info);
    }
    lc_symbols_close();
    free(l.rows);
}

/* --- --list-extensions ---------------------------------------------------- */
static const char list_extensions_src[] =
    "def _lc_list():\n"
    "    import sys, os, importlib.machinery as m\n"
    "    sufs = sorted(m.EXTENSION_SUFFIXES, key=len, reverse=True)\n"
    "    out = {}\n"
    "    def add(name, path):\n"
    "        if all(p.isidentifier() for p in name.split('.')):\n"
    "            out.setdefault(name, path)\n"
    "    for entry in sys.path:\n"
    "        if not os.path.isdir(entry):\n"
    "            continue\n"
    "        base = os.path.basename(entry)\n"
    "        if base == 'lib-dynload':\n"
    "            for f in sorted(os.listdir(entry)):\n"
    "                for s in sufs:\n"
    "                    if f.endswith(s):\n"
    "                        add(f[:-len(s)], os.path.join(entry, f))\n"
    "                        break\n"
    "        elif base in ('site-packages', 'dist-packages'):\n"
    "            for root, dirs, files in os.walk(entry):\n"
    "                rel = os.path.relpath(root, entry)\n"
    "                parts = [] if rel == '.' else rel.split(os.sep)\n"
    "                if not all(p.isidentifier() for p in parts):\n"
    "                    dirs[:] = []\n"
    "                    continue\n"
    "                dirs.sort()\n"
    "                for f in sorted(files):\n"
    "                    for s in sufs:\n"
    "                        if f.endswith(s):\n"
    "                            add('.'.join(parts + [f[:-len(s)]]), os.path.join(root, f))\n"
    "                            break\n"
    "    return sorted(out.items())\n";

static void list_extensions(void)
{
    char err[4096];
    PyObject *d = PyDict_New();
    if (!d) goto fail;
    PyDict_SetItemString(d, "__builtins__", PyEval_GetBuiltins());
    PyObject *r = PyRun_String(list_extensions_src, Py_file_input, d, d);
    if (!r) goto fail;
    Py_DECREF(r);
    PyObject *fn = PyDict_GetItemString(d, "_lc_list");
    PyObject *items = fn ? PyObject_CallNoArgs(fn) : NULL;
    if (!items) goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *t = PyList_GET_ITEM(items, i);
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(t, 0));
        const char *path = PyUnicode_AsUTF8(PyTuple_GET_ITEM(t, 1));
        if (name && path) rec("X %s %s", name, path);
        else PyErr_Clear();
    }
    Py_DECREF(items);
    Py_DECREF(d);
    return;
fail:
    describe_exception(err, sizeof err);
    fail("internal", "listing extension modules: %s", err);
}

/* --- start-up ------------------------------------------------------------ */
static long parse_count(const char *opt_name, const char *s, long min)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < min) fail("usage", "%s needs an integer >= %ld, not '%s'", opt_name, min, s);
    return v;
}

static void parse_args(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VAL()                                              \
    do {                                                        \
        if (!val) fail("usage", "option %s needs a value", a);  \
        i++;                                                    \
    } while (0)
        if (!strcmp(a, "--config")) {
            NEED_VAL();
            int found = 0;
            for (int c = 0; c < 4; c++)
                if (!strcmp(val, lc_config_names[c])) {
                    opt.config = (enum lc_config)c;
                    found = 1;
                }
            if (!found) fail("usage", "unknown config '%s' (legacy, isolated, own-obmalloc, shared-obmalloc)", val);
        } else if (!strcmp(a, "--import")) {
            NEED_VAL();
            if (opt.nimports == LC_MAX_IMPORTS) fail("usage", "at most %d --import options", LC_MAX_IMPORTS);
            opt.imports[opt.nimports++] = val;
        } else if (!strcmp(a, "--code")) {
            NEED_VAL();
            opt.code = val;
        } else if (!strcmp(a, "--file")) {
            NEED_VAL();
            opt.file = val;
        } else if (!strcmp(a, "--cycles")) {
            NEED_VAL();
            opt.cycles = parse_count(a, val, 1);
        } else if (!strcmp(a, "--warmup")) {
            NEED_VAL();
            opt.warmup = parse_count(a, val, 0);
        } else if (!strcmp(a, "--block")) {
            NEED_VAL();
            opt.block = parse_count(a, val, 1);
        } else if (!strcmp(a, "--no-baseline")) {
            opt.baseline = 0;
        } else if (!strcmp(a, "--no-allocator-wrapper")) {
            opt.no_wrapper = 1;
        } else if (!strcmp(a, "--where")) {
            opt.where = 1;
        } else if (!strcmp(a, "--list-extensions")) {
            opt.list_extensions = 1;
        } else {
            fail("usage", "unknown worker option '%s'", a);
        }
#undef NEED_VAL
    }
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail("usage", "--file %s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) fail("internal", "out of memory reading %s", path);
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        cap *= 2;
        buf = realloc(buf, cap);
    }
    if (ferror(f)) fail("usage", "--file %s: read error", path);
    fclose(f);
    buf[n] = 0;
    return buf;
}

static void init_python(void)
{
    /* Anything that would replace the allocators after lc_alloc_install(). */
    static const char *const env[] = {"PYTHONMALLOC", "PYTHONDEVMODE", "PYTHONTRACEMALLOC", "PYTHONMALLOCSTATS"};
    for (size_t i = 0; i < sizeof env / sizeof *env; i++)
        if (getenv(env[i])) {
            rec("I ignored_environment %s", env[i]);
            unsetenv(env[i]);
        }
    if (!opt.no_wrapper) lc_alloc_install(opt.where);

    PyPreConfig pre;
    PyPreConfig_InitPythonConfig(&pre);
    pre.allocator = PYMEM_ALLOCATOR_NOT_SET;
    pre.dev_mode = 0;
    PyStatus st = Py_PreInitialize(&pre);
    if (PyStatus_Exception(st)) fail("internal", "Py_PreInitialize: %s", st.err_msg ? st.err_msg : "?");

    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.parse_argv = 0;
    config.install_signal_handlers = 0;
    config.use_hash_seed = 1;
    config.hash_seed = 0;
    config.dev_mode = 0;
    config.tracemalloc = 0;
    config.buffered_stdio = 0;
    const char *exe = LC_PYTHON_EXECUTABLE;
    if (exe[0] && access(exe, X_OK) == 0) {
        st = PyConfig_SetBytesString(&config, &config.program_name, exe);
        if (PyStatus_Exception(st)) fail("internal", "PyConfig: %s", st.err_msg ? st.err_msg : "?");
    }
    st = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(st)) fail("internal", "Py_InitializeFromConfig: %s", st.err_msg ? st.err_msg : "?");
    main_tstate = PyThreadState_Get();
}

static void report_info(void)
{
    rec("I version %s", PY_VERSION);
    rec("I hexversion 0x%08lx", (unsigned long)PY_VERSION_HEX);
#ifdef Py_DEBUG
    rec("I debug 1");
#else
    rec("I debug 0");
#endif
    PyObject *o = PySys_GetObject("abiflags");   /* borrowed */
    const char *s = o ? PyUnicode_AsUTF8(o) : NULL;
    rec("I abiflags %s", s ? s : "");
    PyErr_Clear();
    o = PySys_GetObject("executable");
    s = o ? PyUnicode_AsUTF8(o) : NULL;
    rec("I executable %s", s ? s : "");
    PyErr_Clear();
    rec("I compiler %s", Py_GetCompiler());
#if PY_VERSION_HEX >= 0x030C0000
    rec("I configs legacy isolated own-obmalloc shared-obmalloc");
#else
    rec("I configs legacy");
#endif
    rec("A rss 1 /proc/self/statm");
#ifdef LC_SANITIZER_MALLOC
    rec("A malloc 1 sanitizer allocator (requested bytes; mallinfo2 does not work under AddressSanitizer)");
#else
    rec("A malloc 1 mallinfo2");
#endif
    if (opt.no_wrapper) {
        rec("A py 0 --no-allocator-wrapper: Python's allocators are not wrapped");
        rec("A blocks 0 --no-allocator-wrapper: Python's allocators are not wrapped");
    } else {
        rec("A py 1 PyMem_SetAllocator wrapper");
        rec("A blocks 1 PyMem_SetAllocator wrapper");
    }
    PyObject *g = PySys_GetObject("gettotalrefcount");
    if (g) {
        Py_INCREF(g);
        gettotalrefcount = g;
        rec("A refs 1 sys.gettotalrefcount");
    } else {
        rec("A refs 0 not a debug build (Py_REF_DEBUG): sys.gettotalrefcount() does not exist");
    }
    rec("A fds %d /proc/self/fd", count_fds() >= 0);
}

int main(int argc, char **argv)
{
    if (fcntl(LC_RECORD_FD, F_GETFD) < 0) {
        fprintf(stderr, "pyfini-leakcheck-worker: started by pyfini-leakcheck only (no record descriptor %d)\n",
                LC_RECORD_FD);
        return 2;
    }
    page_size = sysconf(_SC_PAGESIZE);
    statm_fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    parse_args(argc, argv);
    if (opt.where && opt.no_wrapper) fail("usage", "--where needs the allocator wrapper (drop --no-allocator-wrapper)");
    if (opt.file) opt.file_src = read_file(opt.file);
#if PY_VERSION_HEX < 0x030C0000
    if (opt.config != LC_CFG_LEGACY)
        fail("usage", "config '%s' needs CPython 3.12 or newer: CPython %s has only legacy interpreters "
             "(Py_NewInterpreter)", lc_config_names[opt.config], PY_VERSION);
#endif
    init_python();
    report_info();
    if (opt.where) start_tracemalloc();
    if (opt.list_extensions) {
        list_extensions();
        rec("D");
        _exit(0);
    }
    precheck_subject();

    int64_t v[LC_NVALUES];
    reading(v);
    v[LC_V_TIME_NS] = 0;
    rec_values("R 0 -", v);

    long seq = 0, n_subject = 0, n_bare = 0;
    int subject = has_subject();
    int paired = subject && opt.baseline;
    /* warm-up: alternate subject and bare cycles; judged: blocks of opt.block
     * subject cycles, then as many bare cycles (each block's growth of a
     * noisy meter then telescopes: see lc_stats.h).  cycle() is called from
     * one place only, so that --where sees the same call stacks in subject
     * and bare cycles. */
    long total = (opt.warmup + opt.cycles) * (paired ? 2 : 1);
    for (long i = 0, done = 0, in_block = 0, k = 0; i < total; i++) {
        int subj, judged;
        long round;
        if (i < opt.warmup * (paired ? 2 : 1)) {
            judged = 0;
            round = paired ? i / 2 : i;
            subj = paired ? (i % 2 == 0) : subject;
        } else {
            judged = 1;
            if (!paired) {
                round = opt.warmup + done++;
                subj = subject;
            } else {
                if (in_block == 0) {
                    k = opt.block < opt.cycles - done ? opt.block : opt.cycles - done;
                }
                subj = in_block < k;
                round = opt.warmup + done + (in_block % k);
                if (++in_block == 2 * k) {
                    done += k;
                    in_block = 0;
                }
            }
        }
        cycle(++seq, subj, round, judged);
        if (judged) {
            if (subj || !subject) n_subject++;
            else n_bare++;
        }
    }
    if (opt.where) report_where(n_subject, n_bare);
    rec("D");
    /* No Py_FinalizeEx(): what the cycles left behind is what was measured,
     * and finalizing it can only add noise (or crash on old versions). */
    _exit(0);
}
