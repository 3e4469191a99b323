/* examples/phases_demo.c - pyfini's four phases, in the main interpreter and
 * in an isolated sub-interpreter (own GIL, own obmalloc; legacy on 3.11).
 * Prints each callback as it runs, so the order can be read off.
 */
#include <Python.h>
#include "pyfini.h"

static int step;

static int announce(void *arg)
{
    /* no C API here: RUNTIME_SHUTDOWN callbacks run after the runtime is gone */
    printf("  %2d. %s\n", ++step, (const char *)arg);
    fflush(stdout);
    return 0;
}

static void register_all(const char *who)
{
    static char names[2][4][80];
    int w = strcmp(who, "main") == 0 ? 0 : 1;
    for (int p = PYFINI_PRE_SHUTDOWN; p <= PYFINI_RUNTIME_SHUTDOWN; p++) {
        snprintf(names[w][p - 1], sizeof names[w][p - 1], "%-4s interpreter  %s", who,
                 pyfini_phase_name(p));
        if (pyfini_atexit(announce, names[w][p - 1], (pyfini_phase)p) < 0) {
            PyErr_Print();
            exit(1);
        }
    }
    char code[256];
    snprintf(code, sizeof code,
             "import atexit\n"
             "atexit.register(print, '      (%s interpreter: a Python atexit callback)')\n", who);
    PyRun_SimpleString(code);
}

int main(void)
{
    Py_Initialize();
    printf("pyfini %d.%d.%d on CPython %s\n", PYFINI_VERSION_MAJOR, PYFINI_VERSION_MINOR,
           PYFINI_VERSION_PATCH, PY_VERSION);
    register_all("main");

    PyThreadState *main_ts = PyThreadState_Get();
    PyThreadState *sub = NULL;
    const char *kind = "legacy (Py_NewInterpreter)";
#if PY_VERSION_HEX >= 0x030C0000
    PyInterpreterConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.use_main_obmalloc = 0;
    cfg.allow_threads = 1;
    cfg.check_multi_interp_extensions = 1;
    cfg.gil = PyInterpreterConfig_OWN_GIL;
    PyStatus st = Py_NewInterpreterFromConfig(&sub, &cfg);
    if (PyStatus_Exception(st)) {
        fprintf(stderr, "Py_NewInterpreterFromConfig: %s\n", st.err_msg);
        return 1;
    }
    kind = "isolated (own GIL, own obmalloc)";
#else
    sub = Py_NewInterpreter();
#endif
    register_all("sub");
    printf("Ending the %s sub-interpreter %lld:\n", kind,
           (long long)PyInterpreterState_GetID(PyInterpreterState_Get()));
    fflush(stdout);
    Py_EndInterpreter(sub);
    PyThreadState_Swap(main_ts);
    printf("Finalizing the main interpreter:\n");
    fflush(stdout);
    int rc = Py_FinalizeEx();
    printf("Done (Py_FinalizeEx returned %d). The sub-interpreter's RUNTIME_SHUTDOWN callback\n"
           "ran with the main one's: that phase is process-wide.\n", rc);
    return rc == 0 ? 0 : 1;
}
