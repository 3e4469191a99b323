# cython: language_level=3, subinterpreters_compatible=own_gil
"""_pyfini_cystate - a Cython 3.1 module that keeps C-level state per
interpreter with pyfini_state and frees its block at POST_SHUTDOWN
(tests/cython; shown in docs/porting.md, "Cython").

Compiled with -DCYTHON_USE_MODULE_STATE=1: Cython 3.1 emits the
Py_mod_multiple_interpreters slot (here Py_MOD_PER_INTERPRETER_GIL_SUPPORTED,
from subinterpreters_compatible=own_gil) only with its module state;
without it the module refuses a second interpreter ("Interpreter change
detected"). Built twice: _pyfini_cystate frees its block at POST_SHUTDOWN;
_pyfini_cystate_leak (CYSTATE_LEAK=1) never does (the control: the checker
must see it)."""
from libc.stdlib cimport malloc, free
# docs: begin cimport
from pyfini cimport pyfini_atexit, pyfini_state, pyfini_state_def, PYFINI_POST_SHUTDOWN

cdef extern from *:
    """
    #include <stdatomic.h>
    typedef struct cystate { long uses; long *block; } cystate;
    /* static storage, never changed: pyfini knows a state by its def */
    static const pyfini_state_def cystate_def = {"pyfini.test.cython.cystate", sizeof(cystate), NULL, NULL};
    static atomic_long cystate_live;   /* blocks not freed yet, in all interpreters */
    static long cystate_live_add(long d) { return atomic_fetch_add(&cystate_live, d) + d; }
    #ifndef CYSTATE_LEAK
    #define CYSTATE_LEAK 0
    #endif
    """
    ctypedef struct cystate:
        long uses
        long *block
    const pyfini_state_def cystate_def
    long cystate_live_add(long d) noexcept nogil
    const int CYSTATE_LEAK


cdef int free_block(void *arg) noexcept nogil:
    # POST_SHUTDOWN: after the interpreter's last garbage collection
    cdef cystate *st = <cystate *>arg
    if st.block != NULL:
        free(st.block)
        st.block = NULL
        cystate_live_add(-1)
    return 0


cdef cystate *get_state() except NULL:
    # this interpreter's state: created zero-filled on first use
    cdef cystate *st = <cystate *>pyfini_state(&cystate_def)
    if st.block == NULL:
        if not CYSTATE_LEAK:
            pyfini_atexit(free_block, st, PYFINI_POST_SHUTDOWN)
        st.block = <long *>malloc(64 * sizeof(long))
        if st.block == NULL:
            raise MemoryError()
        cystate_live_add(1)
    return st
# docs: end cimport


def use():
    """Count one use in this interpreter's state; the count."""
    cdef cystate *st = get_state()
    st.uses += 1
    st.block[0] = st.uses
    return st.uses


def live_blocks():
    """Blocks allocated and not yet freed, in all interpreters of the process."""
    return cystate_live_add(0)
