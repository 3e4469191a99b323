/* docs/examples/failure.c - docs/leak-report.md: what pyfini prints when a
 * callback fails. The callbacks are exported (the program is linked with
 * -rdynamic) so that dladdr() can name them. */
#include <Python.h>
#include "pyfini.h"

/* docs: begin failure */
int mylib_flush(void *arg)         /* fails by its return value */
{
    (void)arg;
    return -1;
}

int mylib_stop_workers(void *arg)  /* PRE_SHUTDOWN and USER may also fail by raising */
{
    (void)arg;
    PyErr_SetString(PyExc_RuntimeError, "a worker did not stop");
    return -1;
}
/* docs: end failure */

#include "example.h"

static int body(void)
{
    if (pyfini_atexit(mylib_flush, NULL, PYFINI_POST_SHUTDOWN) < 0 ||
        pyfini_atexit(mylib_stop_workers, NULL, PYFINI_PRE_SHUTDOWN) < 0) {
        return -1;
    }
    return 0;
}

int main(void)
{
    return example_run_in_subinterpreter(body);
}
