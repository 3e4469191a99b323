/* consumer_host.c - the embedding side of the consumer tests: imports the
 * module pyfini_consumer built by one consumer project into a fresh
 * sub-interpreter, ends that interpreter and checks that the module's
 * POST_SHUTDOWN callback ran for it (and not before).
 *
 * usage: consumer_host legacy|isolated MODULE_DIR LOG_FILE
 *   legacy    Py_NewInterpreter()
 *   isolated  Py_NewInterpreterFromConfig() with its own GIL and obmalloc
 *             (CPython 3.12+; on 3.11 it says so and exits 77)
 * Exit status: 0 the callback ran, 1 it did not or something failed (said on
 * stderr), 2 usage, 77 the kind does not exist on this CPython.
 * One run per process: each ends an interpreter.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef Py_DEBUG
#  define HOST_BUILD " debug"
#else
#  define HOST_BUILD " release"
#endif

static const char *kind;

static int fail(const char *what)
{
    fprintf(stderr, "consumer_host %s on CPython %s: %s\n", kind, PY_VERSION, what);
    return 1;
}

/* Whole contents of the log (static buffer; the log holds a few lines). */
static const char *read_log(const char *path)
{
    static char buf[4096];
    size_t n = 0;
    FILE *f = fopen(path, "r");
    if (f != NULL) {
        n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
    }
    buf[n] = '\0';
    return buf;
}

/* Imports the module in the current (sub-)interpreter and checks it was
   compiled for this CPython. 0 or -1 (said on stderr). */
static int import_module(const char *dir)
{
    PyObject *sys_path = PySys_GetObject("path");          /* borrowed */
    PyObject *d = PyUnicode_DecodeFSDefault(dir);
    if (sys_path == NULL || d == NULL || PyList_Insert(sys_path, 0, d) < 0) {
        Py_XDECREF(d);
        PyErr_Print();
        return -1;
    }
    Py_DECREF(d);
    PyObject *mod = PyImport_ImportModule("pyfini_consumer");
    if (mod == NULL) {
        PyErr_Print();
        return -1;
    }
    PyObject *file = PyObject_GetAttrString(mod, "__file__");
    PyObject *built = PyObject_GetAttrString(mod, "built_for");
    const char *b = built != NULL ? PyUnicode_AsUTF8(built) : NULL;
    int rc = 0;
    if (file == NULL || b == NULL) {
        PyErr_Print();
        rc = -1;
    } else if (strcmp(b, PY_VERSION HOST_BUILD) != 0) {
        fprintf(stderr, "consumer_host: %s was compiled for CPython %s, this is %s\n",
                PyUnicode_AsUTF8(file), b, PY_VERSION HOST_BUILD);
        rc = -1;
    } else {
        printf("imported %s (built for %s)\n", PyUnicode_AsUTF8(file), b);
    }
    Py_XDECREF(file);
    Py_XDECREF(built);
    Py_DECREF(mod);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 4 || (strcmp(argv[1], "legacy") != 0 && strcmp(argv[1], "isolated") != 0)) {
        fprintf(stderr, "usage: consumer_host legacy|isolated MODULE_DIR LOG_FILE\n");
        return 2;
    }
    kind = argv[1];
    const char *dir = argv[2], *log = argv[3];
#if PY_VERSION_HEX < 0x030C0000
    if (strcmp(kind, "isolated") == 0) {
        printf("consumer_host: no isolated sub-interpreter on CPython %s "
               "(Py_NewInterpreterFromConfig exists from 3.12 on)\n", PY_VERSION);
        return 77;
    }
#endif
    FILE *f = fopen(log, "w");                  /* empty log */
    if (f == NULL || fclose(f) != 0 || setenv("PYFINI_CONSUMER_LOG", log, 1) != 0) {
        perror(log);
        return 1;
    }

    Py_InitializeEx(0);
    PyThreadState *main_ts = PyThreadState_Get();
    PyThreadState *sub = NULL;
    if (strcmp(kind, "legacy") == 0) {
        sub = Py_NewInterpreter();
    }
#if PY_VERSION_HEX >= 0x030C0000
    else {
        /* own GIL and own obmalloc (use_main_obmalloc 0), no fork, exec or daemon threads */
        PyInterpreterConfig config = {
            .allow_threads = 1, .check_multi_interp_extensions = 1, .gil = PyInterpreterConfig_OWN_GIL};
        PyStatus status = Py_NewInterpreterFromConfig(&sub, &config);
        if (PyStatus_Exception(status)) {
            sub = NULL;
        }
    }
#endif
    if (sub == NULL) {
        return fail("could not create the sub-interpreter");
    }
    long long id = (long long)PyInterpreterState_GetID(PyThreadState_GetInterpreter(sub));
    char expected[64];
    snprintf(expected, sizeof expected, "interpreter %lld: PYFINI_POST_SHUTDOWN\n", id);

    if (import_module(dir) < 0) {
        return fail("importing pyfini_consumer failed");
    }
    if (strstr(read_log(log), expected) != NULL) {
        return fail("the POST_SHUTDOWN callback ran while the interpreter was alive");
    }
    Py_EndInterpreter(sub);
    PyThreadState_Swap(main_ts);

    const char *text = read_log(log);
    if (strcmp(text, expected) != 0) {
        fprintf(stderr, "log %s holds:\n%s(end of log); expected exactly:\n%s", log, text, expected);
        return fail("the module's POST_SHUTDOWN callback did not run once when its interpreter ended");
    }
    printf("%s sub-interpreter %lld ended: POST_SHUTDOWN callback ran\n", kind, id);
    if (Py_FinalizeEx() < 0) {
        return fail("Py_FinalizeEx failed");
    }
    return 0;
}
