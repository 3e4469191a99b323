/* tests/decls_impl.c - the one translation unit of test_decls that emits
 * pyfini's definitions: PYFINI_FUNC is defined empty (external linkage) and
 * PYFINI_DECLS_ONLY is not, so test_decls.c (PYFINI_DECLS_ONLY) links
 * against the functions defined here. Also exposes the ABI names, which the
 * test pins: copies of older releases find each other by these strings.
 */
#include <Python.h>
#define PYFINI_FUNC
#include "pyfini.h"
#include "decls_impl.h"

void *decls_impl_state(const pyfini_state_def *def) { return pyfini_state(def); }

const char *const decls_impl_abi_names[DECLS_IMPL_NNAMES] = {
    PYFINI_REGISTRY_KEY, PYFINI__FINDER_CAPSULE, PYFINI__POST_CAPSULE,
    PYFINI__POST_KEY,    PYFINI__ENTRY_CAPSULE,  PYFINI__MARKER_CAPSULE};
