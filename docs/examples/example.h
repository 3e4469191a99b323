/* docs/examples/example.h - what every program in docs/examples/ shares:
 * run one body in a sub-interpreter (isolated - own GIL, own obmalloc - on
 * CPython 3.12+, legacy on 3.11), end it, finalize CPython.
 *
 * The parts of an example shown in the docs lie between the lines
 * "docs: begin NAME" and "docs: end NAME"; tests/docs/check-docs checks that
 * README.md and the docs/ pages show them byte for byte, and each test docs_example_NAME
 * runs each program and compares its output with docs/examples/NAME.out.
 */
#ifndef PYFINI_DOCS_EXAMPLE_H
#define PYFINI_DOCS_EXAMPLE_H

#include "interp_configs.h"

/* Initialize CPython (after the caller's PyImport_AppendInittab), run
   body() in a new sub-interpreter, end it, finalize. body returns 0 or -1
   with an exception set (printed). The exit status of the program. */
static inline int example_run_in_subinterpreter(int (*body)(void))
{
    setvbuf(stdout, NULL, _IONBF, 0);   /* stdout and stderr in the order written */
    Py_Initialize();
    PyThreadState *main_ts = PyThreadState_Get();
    const interp_config *c = &interp_configs[INTERP_ISOLATED];
    if (!interp_config_available(c)) {
        c = &interp_configs[INTERP_LEGACY];
    }
    PyThreadState *sub = NULL;
    PyStatus st = interp_config_create(c, &sub);
    if (PyStatus_Exception(st)) {
        fprintf(stderr, "cannot create a %s sub-interpreter: %s\n", c->name, st.err_msg);
        return 1;
    }
    int rc = body();
    if (rc < 0) {
        PyErr_Print();
    }
    printf("ending the sub-interpreter\n");
    Py_EndInterpreter(sub);
    PyThreadState_Swap(main_ts);
    printf("sub-interpreter ended\n");
    if (Py_FinalizeEx() < 0) {
        rc = -1;
    }
    return rc < 0 ? 1 : 0;
}

#endif /* PYFINI_DOCS_EXAMPLE_H */
