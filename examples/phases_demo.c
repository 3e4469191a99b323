/* examples/phases_demo.c - pyfini's four phases, in the main interpreter and
 * in an isolated sub-interpreter (own GIL, own obmalloc; legacy on 3.11).
 * Prints each callback as it runs, so the order can be read off.
 */
#include <Python.h>
#include "pyfini.h"
#include "interp_configs.h"

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
    /* an isolated sub-interpreter where CPython has one (3.12+), else legacy */
    const interp_config *c = &interp_configs[INTERP_ISOLATED];
    if (!interp_config_available(c)) {
        c = &interp_configs[INTERP_LEGACY];
    }
    PyStatus st = interp_config_create(c, &sub);
    if (PyStatus_Exception(st)) {
        fprintf(stderr, "%s: %s\n", c->legacy ? "Py_NewInterpreter" : "Py_NewInterpreterFromConfig",
                st.err_msg);
        return 1;
    }
    const char *kind = c->legacy ? "legacy (Py_NewInterpreter)" : "isolated (own GIL, own obmalloc)";
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
