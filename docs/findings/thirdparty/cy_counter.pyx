# cython: language_level=3
# cy_counter.pyx - a minimal Cython 3.1 module for pyfini-leakcheck's
# third-party scan (docs/findings/third-party.md): a function and a cdef class.
# Built three times by CMakeLists.txt: as is, with the directive
# subinterpreters_compatible=own_gil, and with that directive plus
# CYTHON_USE_MODULE_STATE=1 (Cython emits the Py_mod_multiple_interpreters
# slot only then).

cdef class Counter:
    cdef public long n

    def add(self, long k):
        self.n += k


def add(long a, long b):
    return a + b
