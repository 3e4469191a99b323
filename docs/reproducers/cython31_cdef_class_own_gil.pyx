# cython: language_level=3
# cython: subinterpreters_compatible=own_gil
# cython31_cdef_class_own_gil.pyx - Cython 3.1.6 (Debian's cython3): a module
# with one empty cdef class, built with CYTHON_USE_MODULE_STATE=1 (without it
# Cython emits no Py_mod_multiple_interpreters slot and the module refuses
# isolated interpreters), crashes the process when a second isolated
# interpreter imports it, after the first one ended. Built and run by
# cython31_cdef_class_own_gil.sh (no pyfini involved).
cdef class C:
    pass
