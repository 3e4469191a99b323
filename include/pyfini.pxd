# pyfini.pxd - Cython declarations of pyfini.h's public API (section 2 of
# pyfini.h; each function's full contract is written there).
#
#     from pyfini cimport pyfini_atexit, PYFINI_POST_SHUTDOWN
#
# Installed beside pyfini.h (P/include), so the directory that finds the
# header finds this file: `cythonize -I include`, `cython -I
# $(pkg-config --variable=includedir pyfini)`, or the include directory of
# CMake's pyfini::pyfini. The C compiler needs the same directory for
# pyfini.h, which every Cython module that cimports this includes (its
# functions are static inline: each module gets its own copy, as in C).
#
# Callbacks (pyfini_callback) are `noexcept nogil`: they run at an
# interpreter's end, where no Python exception can propagate to anyone, and
# the POST_SHUTDOWN and RUNTIME_SHUTDOWN ones run where no Python code may
# run (RUNTIME_SHUTDOWN: no thread state at all). Return 0 on success,
# non-zero on failure (pyfini reports it on stderr). Do not use `with gil`
# in one: it is PyGILState_Ensure(), which is not made for sub-interpreters
# (Cython warns so under subinterpreters_compatible).
#
# The functions that need an attached thread state (all but
# pyfini_phase_name and pyfini_last_error) are declared without nogil, so
# Cython only calls them with the GIL held; their error returns carry a
# Python exception then and are declared as such (`except -1`, `except
# NULL`), so Cython propagates it. pyfini_state_find's NULL means "no such
# state" without an exception, or a bad def with one: `except? NULL`.
#
# Checked by tests/cython (Cython 3.1, CPython 3.13-3.15 in the sid tree).

cdef extern from "pyfini.h":
    enum:
        PYFINI_VERSION_MAJOR
        PYFINI_VERSION_MINOR
        PYFINI_VERSION_PATCH
        PYFINI_VERSION_HEX
        PYFINI_ABI_VERSION
        # pyfini_current_phase() while no phase has begun
        PYFINI_RUNNING

    ctypedef enum pyfini_phase:
        PYFINI_PRE_SHUTDOWN
        PYFINI_USER
        PYFINI_POST_SHUTDOWN
        PYFINI_RUNTIME_SHUTDOWN

    ctypedef int (*pyfini_callback)(void *arg) noexcept nogil

    ctypedef struct pyfini_state_def:
        # unique key, copied; the same name is the same state in every copy
        const char *name
        # bytes, zero-filled
        size_t size
        # optional (NULL): runs once with the GIL held; 0, or -1 with an exception
        int (*init)(void *state) except -1
        # optional (NULL): runs at POST_SHUTDOWN; may Py_DECREF, no Python code
        void (*clear)(void *state) noexcept

    int pyfini_atexit(pyfini_callback func, void *arg, pyfini_phase phase) except -1
    int pyfini_atexit_cancel(pyfini_callback func, void *arg, pyfini_phase phase) except -1
    int pyfini_current_phase() except -1
    const char *pyfini_phase_name(int phase) noexcept nogil
    const char *pyfini_last_error() noexcept nogil

    void *pyfini_state(const pyfini_state_def *state_def) except NULL
    void *pyfini_state_find(const pyfini_state_def *state_def) except? NULL
    int pyfini_track(const pyfini_state_def *state_def, object obj) except -1
    int pyfini_state_leak_warnings(const pyfini_state_def *state_def, int enabled) except -1
