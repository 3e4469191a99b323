/* bench_bare_loop.c - the reference for pyfini-leakcheck's overhead: a plain
 * create/end loop of interpreters with no meter and no allocator wrapper.
 * usage: pyfini-leakcheck-bare-loop legacy|isolated CYCLES [MODULE]  */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interp_configs.h"

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s legacy|isolated CYCLES [MODULE]\n", argv[0]);
        return 2;
    }
    const interp_config *ic = &interp_configs[strcmp(argv[1], "isolated") == 0 ? INTERP_ISOLATED : INTERP_LEGACY];
    long cycles = atol(argv[2]);
    const char *module = argc > 3 ? argv[3] : NULL;
    if (!interp_config_available(ic)) {
        fprintf(stderr, "isolated interpreters need CPython 3.12+\n");
        return 2;
    }
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.parse_argv = 0;
    config.install_signal_handlers = 0;
    PyStatus st = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(st)) return 3;
    PyThreadState *main_ts = PyThreadState_Get();
    for (long i = 0; i < cycles; i++) {
        PyThreadState *ts = NULL;
        if (PyStatus_Exception(interp_config_create(ic, &ts)) || !ts) return 3;
        if (module) {
            PyObject *m = PyImport_ImportModule(module);
            if (!m) return 3;
            Py_DECREF(m);
        }
        Py_EndInterpreter(ts);
        PyThreadState_Swap(main_ts);
    }
    return 0;
}
