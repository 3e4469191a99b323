/* subject.c - the subject run in each cycle's interpreter (--import, --code,
 * --file), its checks before the first cycle, Python errors as text, and the
 * list of extension modules for --scan. */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "lc_util.h"
#include "worker.h"

#define LC_LOCATION_MAX 700

/* " (file, line N)" of the innermost frame of exc's traceback, or "". */
static void exception_location(PyObject *exc, char *loc, size_t n)
{
    loc[0] = 0;
    PyObject *tb = PyException_GetTraceback(exc);
    while (tb && tb != Py_None) {
        PyObject *next = PyObject_GetAttrString(tb, "tb_next");
        if (!next || next == Py_None) {
            Py_XDECREF(next);
            PyErr_Clear();
            break;
        }
        Py_DECREF(tb);
        tb = next;
    }
    if (tb && tb != Py_None && !PyObject_TypeCheck(exc, (PyTypeObject *)PyExc_SyntaxError)) {
        PyObject *lineno = PyObject_GetAttrString(tb, "tb_lineno");
        PyObject *fname = NULL;
        PyObject *frame = PyObject_GetAttrString(tb, "tb_frame");
        if (frame) {
            PyObject *code = PyObject_GetAttrString(frame, "f_code");
            if (code) fname = PyObject_GetAttrString(code, "co_filename");
            Py_XDECREF(code);
        }
        const char *f = fname ? PyUnicode_AsUTF8(fname) : NULL;
        if (f && lineno) snprintf(loc, n, " (%s, line %ld)", f, PyLong_AsLong(lineno));
        Py_XDECREF(lineno);
        Py_XDECREF(fname);
        Py_XDECREF(frame);
        PyErr_Clear();
    }
    Py_XDECREF(tb);
}

/* Describe the pending exception as "Type: message (file, line N)" and clear it. */
void wk_describe_exception(char *out, size_t n)
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
    char loc[LC_LOCATION_MAX];
    exception_location(exc, loc, sizeof loc);
    snprintf(out, n, "%s: %s%s", Py_TYPE(exc)->tp_name, msg ? msg : "(no message)", loc);
    Py_XDECREF(s);
    Py_DECREF(exc);
    PyErr_Clear();
}

/* An error text that names the checks by which an interpreter refuses an
 * extension module (CPython's import.c: "does not support loading in
 * subinterpreters"; extensions' own checks word it in these ways too). */
static int names_subinterpreter_check(const char *text)
{
    static const char *const words[] = {"subinterpreter", "sub-interpreter", "per-interpreter GIL",
                                        "isolated interpreter"};
    for (size_t i = 0; i < sizeof words / sizeof *words; i++)
        if (strstr(text, words[i])) return 1;
    return 0;
}

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
    wk_describe_exception(err, n);
    return -1;
}

/* Runs in the cycle's interpreter.  *refused: the error names a
 * sub-interpreter check. */
int wk_run_subject(const wk_request *q, char *err, size_t n, int *refused)
{
    int rc = 0;
    *refused = 0;
    for (int i = 0; i < q->nimports && rc == 0; i++) {
        PyObject *m = PyImport_ImportModule(q->imports[i]);
        if (!m) {
            char d[LC_MESSAGE_MAX];
            wk_describe_exception(d, sizeof d);
            snprintf(err, n, "import %s: %.2999s", q->imports[i], d);
            rc = -1;
        }
        Py_XDECREF(m);
    }
    if (rc == 0 && q->code) rc = run_code(q->code, "<--code>", err, n);
    if (rc == 0 && q->file_src) rc = run_code(q->file_src, q->file, err, n);
    if (rc < 0) *refused = names_subinterpreter_check(err);
    return rc;
}

int wk_compile_subject(const char *src, const char *filename, char *err, size_t n)
{
    PyObject *co = Py_CompileString(src, filename, Py_file_input);
    if (!co) {
        wk_describe_exception(err, n);
        return -1;
    }
    Py_DECREF(co);
    return 0;
}

/* Before any cycle, in the main interpreter: syntax of --code/--file and
 * whether each imported module can be found at all. */
void wk_precheck_subject(const wk_request *q)
{
    char err[LC_MESSAGE_MAX];
    for (int i = 0; i < 2; i++) {
        const char *src = i ? q->file_src : q->code;
        const char *name = i ? q->file : "<--code>";
        if (!src) continue;
        if (wk_compile_subject(src, name, err, sizeof err) < 0)
            wk_fail(LC_ERR_USAGE, 0, "%s does not compile: %s", i ? q->file : "--code", err);
    }
    if (q->nimports == 0) return;
    PyObject *util = PyImport_ImportModule("importlib.util");
    if (!util) {
        wk_describe_exception(err, sizeof err);
        wk_fail(LC_ERR_INTERNAL, 0, "importlib.util: %s", err);
    }
    for (int i = 0; i < q->nimports; i++) {
        char top[256];
        lc_scopy(top, sizeof top, q->imports[i]);
        char *dot = strchr(top, '.');
        if (dot) *dot = 0;
        PyObject *spec = PyObject_CallMethod(util, "find_spec", "s", top);
        if (!spec) {
            wk_describe_exception(err, sizeof err);
            wk_fail(LC_ERR_USAGE, 0, "--import %s: %s", q->imports[i], err);
        }
        int missing = spec == Py_None;
        Py_DECREF(spec);
        if (missing)
            wk_fail(LC_ERR_USAGE, 0, "--import %s: no module named '%s' on this Python's sys.path", q->imports[i], top);
    }
    Py_DECREF(util);
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
    "        if base in ('site-packages', 'dist-packages'):\n"
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
    "        else:  # lib-dynload, PYTHONPATH entries: top level only\n"
    "            for f in sorted(os.listdir(entry)):\n"
    "                for s in sufs:\n"
    "                    if f.endswith(s):\n"
    "                        add(f[:-len(s)], os.path.join(entry, f))\n"
    "                        break\n"
    "    return sorted(out.items())\n";

void wk_list_extensions(void)
{
    char err[LC_MESSAGE_MAX];
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
        if (name && path) {
            lc_line l;
            lc_enc_extension(&l, name, path);
            wk_emit(&l);
        } else {
            PyErr_Clear();
        }
    }
    Py_DECREF(items);
    Py_DECREF(d);
    return;
fail:
    wk_describe_exception(err, sizeof err);
    wk_fail(LC_ERR_INTERNAL, 0, "listing extension modules: %s", err);
}
