/* tests/compile_check.c - pyfini.h under several language standards and
 * stricter warnings (-Wpedantic -Wshadow), in C and (through
 * compile_check.cpp) C++. Compiled only; uses every public name.
 */
#include <Python.h>
#include "pyfini.h"

/* The per-copy state's storage (pyfini.h, section 3): shared by every file
   of one shared object with GCC/Clang on ELF, one per file where the
   fallback is forced (PYFINI__PER_UNIT_STATE, test builds only). */
#if defined(PYFINI__PER_UNIT_STATE) == PYFINI__SHARED_STATE
#  error "PYFINI__SHARED_STATE does not match PYFINI__PER_UNIT_STATE"
#endif

static int cb(void *arg) { return arg != NULL; }

static void mark(void *state) { (void)state; }
static const pyfini_state_def def = {"pyfini.compile_check", 8, NULL, mark};

int pyfini_compile_check(void);
int pyfini_compile_check(void)
{
    int rc = pyfini_atexit(cb, NULL, PYFINI_PRE_SHUTDOWN);
    rc += pyfini_atexit_cancel(cb, NULL, PYFINI_USER);
    rc += pyfini_current_phase();
    rc += pyfini_phase_name(PYFINI_POST_SHUTDOWN) != NULL;
    rc += pyfini_last_error() != NULL;
    rc += pyfini_state(&def) != NULL;
    rc += pyfini_state_find(&def) != NULL;
    rc += pyfini_track(&def, Py_None);
    rc += pyfini_state_leak_warnings(&def, 0);
    rc += PYFINI_VERSION_HEX + PYFINI_ABI_VERSION + PYFINI_RUNNING + PYFINI_RUNTIME_SHUTDOWN;
    return rc;
}
