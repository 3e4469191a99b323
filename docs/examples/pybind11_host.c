/* docs/examples/pybind11_host.c - imports docs/examples/pybind11_mymod.cpp
 * (on PYTHONPATH) in a sub-interpreter, calls it and ends the interpreter:
 * the adapter frees pybind11's internals at POST_SHUTDOWN, silently. */
#include <Python.h>
#include "example.h"

static int body(void)
{
    return PyRun_SimpleString("import mymod\n"
                              "print('mymod.add(2, 3) =', mymod.add(2, 3), flush=True)\n");
}

int main(void)
{
    return example_run_in_subinterpreter(body);
}
