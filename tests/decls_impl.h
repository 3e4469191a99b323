/* tests/decls_impl.h - what decls_impl.c (the definitions of test_decls)
 * offers to the PYFINI_DECLS_ONLY translation unit. */
#ifndef PYFINI_TEST_DECLS_IMPL_H
#define PYFINI_TEST_DECLS_IMPL_H

/* pyfini_state(def), called from the translation unit with the definitions */
void *decls_impl_state(const pyfini_state_def *def);

/* PYFINI_REGISTRY_KEY and the private capsule names and keys, as derived
   from PYFINI_ABI_VERSION */
#define DECLS_IMPL_NNAMES 6
extern const char *const decls_impl_abi_names[DECLS_IMPL_NNAMES];

#endif
