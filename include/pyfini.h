/* pyfini.h - v0.1.0 - exit callbacks for CPython interpreters that come and go
 *
 * Run C code for ONE interpreter at four moments of its end, with a void *
 * argument and no limit on the number of callbacks:
 *
 *   PYFINI_PRE_SHUTDOWN     interpreter intact, other threads still running
 *   PYFINI_USER             together with Python-level atexit callbacks (one LIFO order)
 *   PYFINI_POST_SHUTDOWN    after the interpreter's LAST garbage collection
 *   PYFINI_RUNTIME_SHUTDOWN process-wide, after every interpreter is gone
 *
 * CPython 3.11 to 3.15, main interpreter and sub-interpreters (legacy,
 * isolated with own GIL and own obmalloc, concurrent.interpreters).
 *
 * TABLE OF CONTENTS (section numbers appear in the divider comments below)
 *    1. Options and requirements     PYFINI_FUNC, PYFINI_DECLS_ONLY, PYFINI_CALLOC/FREE
 *    2. Public API                   phases, callbacks, per-interpreter state
 *       ---- implementation (left out under PYFINI_DECLS_ONLY) ----
 *    3. ABI: shared structures       names derived from PYFINI_ABI_VERSION, layouts
 *    4. CPython compatibility        one shim per CPython change, with its release
 *    5. Errors, reports, helpers     last error, failure reports, entry lists
 *    6. The registry                 check / find / create / publish / free
 *    7. PRE_SHUTDOWN                 trigger, marker
 *    8. USER                         trigger, marker
 *    9. PRE_SHUTDOWN and USER entries  their runner: one Python callable per entry
 *   10. POST_SHUTDOWN                trigger, runner, states' end
 *   11. RUNTIME_SHUTDOWN             trigger, runner, the main interpreter's list
 *   12. Registration                 the registry's add / cancel operations
 *   13. Per-interpreter state        create, find, track, the per-thread cache
 *   14. Public definitions           thin wrappers over the sections above
 *
 * USING IT
 *   Copy this one file into your project ("vendor" it, as pythoncapi_compat.h
 *   and pymetabind.h are used) and include it after Python.h:
 *
 *       #include <Python.h>
 *       #include "pyfini.h"
 *
 *   That is all, for one file or many: every file of a shared object (an
 *   extension module of tens of .c/.cpp files) or executable may include it.
 *   By default every function is `static inline` and nothing needs to be
 *   linked. ONE COPY OF PYFINI IS ONE SHARED OBJECT: all files of one shared
 *   object or executable share one per-thread state cache, one hit table,
 *   one last error (pyfini_last_error) and, on CPython 3.11-3.13.1, one audit
 *   hook - weak, hidden symbols with C linkage (section 3, "private per-copy
 *   state"; GCC and Clang on ELF, e.g. Linux; elsewhere, macOS included,
 *   each file is a copy of its own). Defining PYFINI_IMPLEMENTATION before
 *   the include is accepted and changes nothing (stb-style code keeps
 *   working). Several copies in one process - two extension modules that
 *   both vendor pyfini.h, possibly of different pyfini versions - share ONE
 *   registry per interpreter (one LIFO order per phase, one POST_SHUTDOWN
 *   hook) and ONE process-wide Py_AtExit slot: the registry is an
 *   ABI-versioned structure under the key PYFINI_REGISTRY_KEY in the
 *   interpreter state dict, and every copy calls the functions stored in it
 *   by the copy that made it. So a shared object holding a copy must stay
 *   loaded while an interpreter it used is alive (the registry holds its
 *   functions and the address of its state-cache epoch); CPython never
 *   unloads extension modules.
 *
 * COMPILE-TIME OPTIONS (define before including)
 *   PYFINI_FUNC
 *       what stands before each public function (default `static inline`).
 *       To emit the public functions once, with external linkage (e.g. to call
 *       them from another language): define PYFINI_FUNC (empty, or with
 *       attributes such as visibility) in EVERY file that includes pyfini.h,
 *       and PYFINI_DECLS_ONLY in all of them but one.
 *   PYFINI_DECLS_ONLY
 *       declarations only (section 2): this file calls the definitions emitted
 *       by the one file without it. Needs PYFINI_FUNC.
 *   PYFINI_CALLOC(n, size) / PYFINI_FREE(p)
 *       the allocator of pyfini's own records (default calloc/free); it must
 *       return zero-filled memory, as calloc does. Define both or neither, in
 *       every file that includes pyfini.h. It must work without a thread
 *       state: POST_SHUTDOWN and RUNTIME_SHUTDOWN records are freed after the
 *       C API is gone.
 *   PYFINI_NO_AUDIT_HOOK
 *       on CPython 3.11, 3.12 and 3.13.0-3.13.1, do not add the C audit
 *       hook (PySys_AddAuditHook) through which the end of any interpreter
 *       bumps this copy's cache epoch (one hook per copy: per shared object).
 *       A C audit hook is process-wide: every audited event of the process
 *       (open(), compile(), sys._getframe(), import, ...) then calls it
 *       (bench/ measures the cost), and the first
 *       hook of a process also makes CPython build the event's arguments.
 *       Adding it raises "sys.addaudithook" and one "pyfini.audit_hook_probe"
 *       event per runtime initialization, which Python audit hooks see.
 *       Without it a pyfini_state() hit there also checks the interpreter
 *       ID, out of line (slower, see bench/), and after Py_FinalizeEx +
 *       Py_Initialize a main interpreter that leaked both its registry and
 *       its builtins dict is not told apart. No effect on 3.13.2+/3.14+
 *       (PyUnstable_AtExit is used there). Define it alike in every file of
 *       one copy (one shared object).
 *   PYFINI_TEST_FAULTS(site)
 *       TEST BUILDS ONLY (tests/test_faults.c walks it): an expression in
 *       front of every Python object creation and allocating CPython call
 *       pyfini makes (capsules, callables, strings, weak references, dict
 *       stores, imports, method calls, thread states, exit hooks); `site` is a
 *       string literal naming the call. When it is non-zero the call is not
 *       made and fails the way CPython's does on an allocation failure:
 *       MemoryError set and NULL / -1 returned (NULL without an exception
 *       where CPython clears it: PyDict_GetItemString, PyThreadState_New).
 *       pyfini's own records fail through PYFINI_CALLOC returning NULL.
 *       Undefined (the default), every call is compiled exactly as written:
 *       no code, no cost. Define it alike in every file of the test.
 *   PYFINI_IMPLEMENTATION
 *       accepted, no effect (see above).
 *
 * REQUIREMENTS
 *   CPython >= 3.11 with the GIL (free-threaded builds are refused at compile
 *   time), a POSIX system with dladdr() (Linux, macOS).
 *
 * CHANGELOG (newest first)
 *   Unreleased  0.1.0  2026-12-07 one copy = one shared object: the per-copy
 *                      state (hit table, per-thread cache, last error, audit
 *                      hook) is shared by every file of a shared object (weak
 *                      hidden symbols pyfini__copy_layout1/thread_layout1).
 *                      2026-12-03 the hit table: 128 entries, Fibonacci hashing
 *                      of def and interpreter, a second entry per pair (hits that
 *                      always missed: an array of defs, two interpreters' defs).
 *                      2026-12-01 pyfini_state hit: a process-wide seqlock table,
 *                      inlined; the epoch also bumped from PyUnstable_AtExit
 *                      (3.13.2+, 3.14.0a3+), elsewhere from a C audit hook
 *                      ("cpython.PyInterpreterState_Clear"; the ID check stays
 *                      if it is vetoed or with PYFINI_NO_AUDIT_HOOK);
 *                      fork-safe (pthread_atfork). Needs <pthread.h>.
 *                      the header in reading order (sections above);
 *                      PYFINI_FUNC overridable and PYFINI_DECLS_ONLY; every ABI
 *                      name derived from PYFINI_ABI_VERSION; readers check the
 *                      registry's struct_size (ABI version unchanged: same layout).
 *                      first version: four phases, cancel, phase query,
 *                      shared registry between copies, failure reports,
 *                      per-interpreter state.
 *
 * LICENSE
 *   MIT License. Copyright (c) 2026 the pyfini authors.
 *   Permission is hereby granted, free of charge, to any person obtaining a
 *   copy of this software to deal in it without restriction, subject to
 *   including this notice. THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY.
 *   SPDX-License-Identifier: MIT
 */
#ifndef PYFINI_H
#define PYFINI_H

/* ======================================================================== */
/* 1. Options and requirements                                              */
/* ======================================================================== */

#ifndef PY_VERSION_HEX
#  error "Include Python.h before pyfini.h"
#endif
#if PY_VERSION_HEX < 0x030B0000
#  error "pyfini needs CPython 3.11 or newer"
#endif
#ifdef Py_GIL_DISABLED
#  error "pyfini does not support free-threaded CPython builds yet (its registry relies on the GIL)"
#endif
#if defined(PYFINI_CALLOC) != defined(PYFINI_FREE)
#  error "Define both PYFINI_CALLOC and PYFINI_FREE, or neither."
#endif
#ifndef PYFINI_CALLOC
#  define PYFINI_CALLOC(n, size) calloc((n), (size))
#  define PYFINI_FREE(p) free(p)
#endif
/* The test-build fault hook (PYFINI_TEST_FAULTS): PYFINI__NEW wraps a call
   returning a pointer (NULL on failure, MemoryError), PYFINI__NEG one
   returning an int (-1, MemoryError), PYFINI__QUIET one that CPython makes
   return NULL WITHOUT an exception on an allocation failure. */
#ifdef PYFINI_TEST_FAULTS
#  define PYFINI__NEW(site, call) (pyfini__fault(site, 1) ? NULL : (call))
#  define PYFINI__NEG(site, call) (pyfini__fault(site, 1) ? -1 : (call))
#  define PYFINI__QUIET(site, call) (pyfini__fault(site, 0) ? NULL : (call))
#else
#  define PYFINI__NEW(site, call) (call)
#  define PYFINI__NEG(site, call) (call)
#  define PYFINI__QUIET(site, call) (call)
#endif
#if defined(PYFINI_DECLS_ONLY) && !defined(PYFINI_FUNC)
#  error "PYFINI_DECLS_ONLY needs PYFINI_FUNC, defined alike in every file that includes pyfini.h"
#endif
#ifndef PYFINI_FUNC
#  define PYFINI_FUNC static inline
/* pyfini_state / pyfini_state_find: their hit inlined into the caller */
#  define PYFINI__HIT_FUNC static PYFINI__ALWAYS_INLINE
#else
#  define PYFINI__HIT_FUNC PYFINI_FUNC
#endif

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#include <pthread.h>
#include <time.h>

#define PYFINI_VERSION_MAJOR 0
#define PYFINI_VERSION_MINOR 1
#define PYFINI_VERSION_PATCH 0
#define PYFINI_VERSION_HEX                                                     \
    ((PYFINI_VERSION_MAJOR << 16) | (PYFINI_VERSION_MINOR << 8) | PYFINI_VERSION_PATCH)
/* Layout version of the structures shared by every copy in a process
   (section 3); part of every key and capsule name. Copies with another ABI
   version keep separate registries. Bump it when a copy of an older layout
   could misread a newer one: a field moved, removed or changed in meaning.
   Fields added at the end of a structure need no bump (readers check
   struct_size first). */
#define PYFINI_ABI_VERSION 1
#define PYFINI__STR(x) #x
#define PYFINI__XSTR(x) PYFINI__STR(x)
/* "1": the ABI version as text, for names */
#define PYFINI__ABI_TAG PYFINI__XSTR(PYFINI_ABI_VERSION)
/* The state-dict key (and builtins-dict key) of the registry:
   "__pyfini_registry_v1__". */
#define PYFINI_REGISTRY_KEY "__pyfini_registry_v" PYFINI__ABI_TAG "__"

#ifdef __cplusplus
#  define PYFINI_CAST(type, expr) (reinterpret_cast<type>(expr))
#  define PYFINI_THREAD_LOCAL thread_local
extern "C" {
#else
#  define PYFINI_CAST(type, expr) ((type)(expr))
#  define PYFINI_THREAD_LOCAL _Thread_local
#endif

#if defined(__GNUC__) || defined(__clang__)
#  define PYFINI__UNUSED __attribute__((unused))
#  define PYFINI__NOINLINE __attribute__((noinline))
#  define PYFINI__ALWAYS_INLINE __attribute__((always_inline)) inline
#  define PYFINI__UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#  define PYFINI__UNUSED
#  define PYFINI__NOINLINE
#  define PYFINI__ALWAYS_INLINE inline
#  define PYFINI__UNLIKELY(x) (x)
#endif

/* ======================================================================== */
/* 2. Public API                                                            */
/* ======================================================================== */
/* The phases of an interpreter's end, in the order they run. */
typedef enum pyfini_phase {
    /* Interpreter intact; other threads still running. Runs inside
       threading._shutdown() (Lib/threading.py), from the
       threading._register_atexit() list, newest first, BEFORE non-daemon
       threads are joined. Python code may run. CPython source:
       Py_EndInterpreter / Py_FinalizeEx -> wait_for_thread_shutdown(). */
    PYFINI_PRE_SHUTDOWN = 1,
    /* With the Python-level atexit callbacks, in one LIFO order with them
       (each pyfini callback is its own atexit.register() entry).
       Python code may run. CPython: _PyAtExit_Call(). */
    PYFINI_USER = 2,
    /* After the interpreter's LAST garbage collection: the state dict is
       gone, PyUnstable_AtExit callbacks (3.13+) have run, the last GC has
       freed every garbage cycle, sys is cleared; runs while the builtins dict
       is cleared (pyfini's entry is the last one of it). No Python code may
       run; Py_DECREF of references the callback owns is allowed (a heap type
       released here does not die by itself: break its cycle or release it
       earlier). Newest first. CPython: interpreter_clear() in
       Python/pystate.c, PyDict_Clear(interp->builtins). */
    PYFINI_POST_SHUTDOWN = 3,
    /* Process-wide, after every interpreter is gone, from ONE Py_AtExit slot
       (Python/pylifecycle.c call_ll_exitfuncs()). No C API at all, no
       thread state. Newest first. */
    PYFINI_RUNTIME_SHUTDOWN = 4
} pyfini_phase;

/* pyfini_current_phase() returns this while no phase has begun. */
#define PYFINI_RUNNING 0

/* A callback. Return 0 on success; non-zero means failure, which is reported
   once on stderr (phase, interpreter ID, callback address and symbol); the
   remaining callbacks still run. In PRE_SHUTDOWN and USER a callback may also
   fail by leaving a Python exception set (same report; the exception is
   cleared). A callback must return with the thread state it was called
   with: one that ends its own interpreter (Py_EndInterpreter from USER) or
   finalizes Python (Py_FinalizeEx from PRE_SHUTDOWN or USER), which CPython
   does not refuse there, makes pyfini print what happened and abort() -
   the teardown's thread state is freed by then (tests/test_hostile.c). */
typedef int (*pyfini_callback)(void *arg);

/* Register func(arg) to run in `phase` of the CURRENT interpreter
   (PYFINI_RUNTIME_SHUTDOWN: of the process).
   - Thread state: an attached thread state (the GIL held) is required.
   - Order: within a phase, newest first. The same (func, arg) may be
     registered several times and then runs as often.
   - arg: passed as is; ownership stays with the caller. No count limit.
   - A callback may register callbacks for LATER phases.
   - The first call in an interpreter makes its registry (a capsule in the
     state dict and one in the builtins dict); PRE_SHUTDOWN imports
     `threading` there, USER imports `atexit`.
   Returns 0 on success. On failure returns -1 and registers nothing:
   - func NULL: TypeError.
   - phase not one of the four: ValueError.
   - the phase has already begun in this interpreter (or the interpreter is
     past its state-dict clear): RuntimeError.
   - allocation failure: MemoryError; earlier registrations stay intact.
   - RUNTIME_SHUTDOWN: all 32 Py_AtExit slots of the process are taken
     (pyfini uses one for the whole process, shared by all copies):
     RuntimeError; from a sub-interpreter during runtime finalization
     (the main interpreter can no longer be attached): RuntimeError.
   - NO thread state: -1 WITHOUT an exception (none can be set); the caller
     can tell by PyThreadState_GetUnchecked() (3.13+) being NULL, and
     pyfini_last_error() says why. Nothing crashes.
   pyfini_last_error() describes every failure, in every case.
   CPython 3.11-3.15. */
PYFINI_FUNC int pyfini_atexit(pyfini_callback func, void *arg, pyfini_phase phase);

/* Cancel the newest registration of (func, arg) in `phase` of the current
   interpreter (RUNTIME_SHUTDOWN: of the process) that has not run yet.
   Allowed from inside a callback (also for the same phase).
   Returns 1 if one was removed, 0 if none matched, -1 on error (same errors
   and thread-state rule as pyfini_atexit, except that a begun phase is not
   an error). Exception: from inside a RUNTIME_SHUTDOWN callback (no thread
   state exists then) RUNTIME_SHUTDOWN registrations can be cancelled when
   the callback was registered through the same copy of pyfini.h as the one
   that holds the process's Py_AtExit slot (always so with one copy);
   otherwise -1. */
PYFINI_FUNC int pyfini_atexit_cancel(pyfini_callback func, void *arg, pyfini_phase phase);

/* The phase the CURRENT interpreter is in: PYFINI_RUNNING (0) while none has
   begun, else the latest phase that has begun (PRE_SHUTDOWN, USER,
   POST_SHUTDOWN). The first call in an interpreter sets up its registry.
   Thread state: attached. Returns -1 with no thread state (no exception) or
   with an exception set on failure, and -1 with RuntimeError in an
   interpreter past its state-dict clear that pyfini never saw.
   CPython 3.11-3.15. */
PYFINI_FUNC int pyfini_current_phase(void);

/* "PYFINI_PRE_SHUTDOWN", ..., "PYFINI_RUNNING" for 0; "PYFINI_UNKNOWN_PHASE"
   otherwise. Static storage; no thread state needed. */
PYFINI_FUNC const char *pyfini_phase_name(int phase);

/* A description of the last failure of a pyfini call made by this thread
   through this copy of pyfini (any file of this shared object, see USING
   IT), or NULL if none failed yet. Valid until this thread's next pyfini
   failure. No thread state needed. */
PYFINI_FUNC const char *pyfini_last_error(void);

/* ---- per-interpreter state ------------------------------------------------

   A block of memory per interpreter and per name, for a binding library's
   "internals": created race-free on first use, found in O(1) through a
   per-thread cache, and freed at POST_SHUTDOWN - after the interpreter's last
   garbage collection, so that objects collected by it may still use it from
   tp_traverse/tp_clear/tp_dealloc (the case that made pybind11 revert freeing
   its internals in a state-dict capsule destructor). */
typedef struct pyfini_state_def {
    /* Unique key, e.g. "mylib.internals.v3"; the same name means the same
       state, also across copies of pyfini.h. NUL-terminated; copied. */
    const char *name;
    /* Bytes, zero-filled; aligned like malloc(). 0 is allowed with an init. */
    size_t size;
    /* Optional. Runs once, with an attached thread state (it may release the
       GIL: other threads asking for the same state wait, with the GIL
       released). Return 0, or -1 with an exception set: the state is then
       discarded and the exception propagates. */
    int (*init)(void *state);
    /* Optional. Runs at POST_SHUTDOWN, after the POST_SHUTDOWN callbacks, in
       the reverse order of completed inits (a state made inside another's
       init is cleared after it); may Py_DECREF what the state owns (no
       Python code). During it, lookups of this state return the same
       pointer. Then the memory is freed - unless a tracked object leaked. */
    void (*clear)(void *state);
} pyfini_state_def;

/* The state `def` of the CURRENT interpreter; created (zero-filled, then
   def->init) on first use. `def` is identified by its address, name and
   size: give it static storage and never change it (like a PyModuleDef).
   May be called with an exception set (e.g. from tp_dealloc): it is kept
   aside and restored, unless pyfini_state fails with its own.
   Thread state: attached. Borrowed: valid until the interpreter's
   POST_SHUTDOWN (do not keep it across interpreters).
   Fast path (inlined into the caller, no lock, no thread-local access):
   CPython's thread-state fetch, then one entry of a process-wide table of
   this copy, keyed on (def, interpreter, epoch) and read under a sequence
   lock; then, out of line, a per-thread cache (8 slots) and the registry.
   A new interpreter at an ended one's address never hits: the epoch changes
   at the POST_SHUTDOWN of every interpreter whose states this copy cached,
   and from a hook that CPython runs whatever leaked: from 3.13.2 and
   3.14.0a3 the interpreter's exit hook (PyUnstable_AtExit; interpreter_clear()
   -> _PyAtExit_Fini()), decided at run time; on 3.11, 3.12 and 3.13.0-3.13.1
   (gh-127791 loses PyUnstable_AtExit callbacks) one process-wide C audit
   hook per copy (PySys_AddAuditHook, added at the first fill of each
   runtime initialization; interpreter_clear() raises
   "cpython.PyInterpreterState_Clear"). Where that hook is vetoed (a hook
   refusing "sys.addaudithook") or left out (PYFINI_NO_AUDIT_HOOK), a hit
   also checks the interpreter ID, out of line: slower (see bench/), and
   after Py_FinalizeEx + Py_Initialize a main interpreter that leaked both
   its registry and its builtins dict is not told apart there (same address,
   same ID 0). fork() at any moment: pthread_atfork() handlers (registered
   once per copy, before the table is first used) keep the child from
   waiting on a lock or an entry that another thread held at the fork; if
   they cannot be registered, lookups skip the table (per-thread cache).
   NULL with an exception on failure: TypeError (def or def->name NULL),
   ValueError (size 0 without init; the name already used with another size),
   MemoryError, RuntimeError (called again from its own init; the state was
   already freed, or the interpreter is too far in its finalization to create
   one: it is never re-created), or what init raised. No thread state: NULL,
   no exception, pyfini_last_error() says why. CPython 3.11-3.15. */
PYFINI_FUNC void *pyfini_state(const pyfini_state_def *def);

/* Like pyfini_state, but never creates: NULL WITHOUT an exception if the
   state does not exist (yet, or any more) in the current interpreter; NULL
   with an exception only for a bad def. Out of memory while looking the
   registry up (during the interpreter's teardown) is also NULL without an
   exception, with pyfini_last_error() saying so; a pending exception is
   kept. Safe from tp_traverse/tp_clear: never raises but for a bad def,
   never waits for another thread's init and never creates a registry.
   Thread state: attached (none: NULL, no exception, as pyfini_state). */
PYFINI_FUNC void *pyfini_state_find(const pyfini_state_def *def);

/* Report `obj` if it is still alive at POST_SHUTDOWN (after the state's
   clear): a leak. The state must exist. Holds only a weak reference: obj's
   type must support weak references (heap types and most classes do), else
   TypeError. 0, or -1 with an exception (RuntimeError if the state does not
   exist or is being cleared).
   At POST_SHUTDOWN, once every state's clear has run, pyfini breaks the
   reference cycles (metatype tp_clear) of each tracked heap type that is
   held by nothing but its own cycles - a heap type is in a cycle with its
   own tp_mro and cannot die after the last GC; nanobind does the same for
   its types - so that it is freed. A type still held by anything else (an
   instance, another interpreter, another state) is left intact. Static
   types are refused (ValueError): they never die. Tracking one object
   several times counts it once. Then, for each state with tracked objects
   still alive, one report on stderr (unless warnings are off):
       pyfini: leak in interpreter 3, state "mylib.internals.v3": 2 tracked objects still alive at POST_SHUTDOWN
       pyfini:  - type mylib.Node at 0x55.., reference count 3
       pyfini:  - mylib.Node object at 0x7f.., reference count 1
       ...  (at most 20, then "pyfini:  - ... and N more")
       pyfini: state "mylib.internals.v3" is not freed: leaked objects may still use it ...
   Environment: PYFINI_LEAK_WARNINGS=0 silences reports, PYFINI_ABORT_ON_LEAK=1
   aborts after the report (for CI). Thread state: attached (none: -1, no
   exception, pyfini_last_error() says why). Ownership: obj stays the
   caller's. CPython 3.11-3.15. */
PYFINI_FUNC int pyfini_track(const pyfini_state_def *def, PyObject *obj);

/* Turn leak reports of one state on (1) or off (0) in the current
   interpreter. Returns the previous setting, or -1 with an exception
   (RuntimeError: no such state here). Thread state: attached (none: -1, no
   exception). */
PYFINI_FUNC int pyfini_state_leak_warnings(const pyfini_state_def *def, int enabled);

#ifndef PYFINI_DECLS_ONLY
/* ------------------------------------------------------------------------ */
/* Everything below here is implementation details.                         */
/* ------------------------------------------------------------------------ */

/* ======================================================================== */
/* 3. ABI: the structures shared by every copy of pyfini.h in a process      */
/* ======================================================================== */
/* Rules for every structure here (pymetabind's): the first three fields
   (abi_version, struct_size, creator_version where present) never move; a
   structure only grows at its end; reserved fields are 0 (PYFINI_CALLOC
   zero-fills); a reader checks struct_size before it reads a field (see
   PYFINI__HAS_FIELD). Moving, removing or redefining a field needs a
   PYFINI_ABI_VERSION bump, which renames every key and capsule below. */

/* Capsule names and dict keys, all derived from PYFINI_ABI_VERSION. */
/* in the builtins dict, under PYFINI_REGISTRY_KEY: finds the registry during teardown */
#define PYFINI__FINDER_CAPSULE "pyfini.registry.v" PYFINI__ABI_TAG
/* in the builtins dict: its destructor runs POST_SHUTDOWN */
#define PYFINI__POST_CAPSULE "pyfini.post_shutdown.v" PYFINI__ABI_TAG
#define PYFINI__POST_KEY "__pyfini_post_shutdown_v" PYFINI__ABI_TAG "__"
/* the self of a PRE_SHUTDOWN / USER callable: one pyfini__entry */
#define PYFINI__ENTRY_CAPSULE "pyfini.entry.v" PYFINI__ABI_TAG
/* the self of a phase marker callable: the registry */
#define PYFINI__MARKER_CAPSULE "pyfini.opener.v" PYFINI__ABI_TAG

/* Does the structure at `p`, of type `type` and made by any copy, hold
   `field`? (Its creator's struct_size covers the field.) */
#define PYFINI__HAS_FIELD(type, p, field)                                      \
    ((size_t)(p)->struct_size >= offsetof(type, field) + sizeof((p)->field))

#define PYFINI__NPHASES 5                /* index 1..4: pyfini_phase */
#define PYFINI__STATE_BUCKETS 64         /* hash buckets of the state table */
#define PYFINI__NRESERVED 8

struct pyfini__registry;
struct pyfini__state_rec;

/* One registration. Owned by: the Python hook object registered with
   threading/atexit (PRE_SHUTDOWN, USER), else by its list. */
typedef struct pyfini__entry {
    struct pyfini__entry *prev, *next;   /* in the list of its phase; newest at head */
    pyfini_callback func;
    void *arg;
    int phase;
    int state;                           /* PYFINI__PENDING ... */
    int linked;                          /* 1 while in a list */
    int reserved0;
    struct pyfini__registry *registry;   /* PRE/USER: NULL once the registry is gone */
    PyObject *hook;                      /* PRE/USER: borrowed; owned by threading/atexit */
} pyfini__entry;

enum { PYFINI__PENDING = 0, PYFINI__RAN = 1, PYFINI__CANCELLED = 2 };

/* Process-wide: the RUNTIME_SHUTDOWN list. Lives in the main interpreter's
   registry; touched only with the main interpreter's GIL held, or from the
   Py_AtExit callback (single-threaded, no C API). */
typedef struct pyfini__root {
    uint32_t abi_version;                /* PYFINI_ABI_VERSION */
    uint32_t struct_size;                /* sizeof(pyfini__root) of the creator: checked by readers */
    uint32_t creator_version;            /* PYFINI_VERSION_HEX of the creator: named in errors */
    int phase;                           /* 0, or RUNTIME_SHUTDOWN once it began */
    int atexit_registered;               /* the one Py_AtExit slot is taken */
    int reserved0;
    pyfini__entry *head;
    size_t count;
    void *reserved[PYFINI__NRESERVED];
} pyfini__root;

/* One interpreter. Found in its state dict under PYFINI_REGISTRY_KEY (a
   capsule named PYFINI_REGISTRY_KEY); during the interpreter's teardown in
   its builtins dict under the same key (a capsule named
   PYFINI__FINDER_CAPSULE). Touched only with the interpreter's GIL held. */
typedef struct pyfini__registry {
    uint32_t abi_version;                /* PYFINI_ABI_VERSION */
    uint32_t struct_size;                /* sizeof(pyfini__registry) of the creator: checked by readers */
    uint32_t creator_version;            /* PYFINI_VERSION_HEX of the creator: named in errors */
    int phase;                           /* PYFINI_RUNNING .. POST_SHUTDOWN */
    PyInterpreterState *interp;
    int64_t interp_id;
    int published;                       /* 1 once stored in the state dict */
    int dict_cleared;                    /* the state dict has been cleared */
    int sentinel_installed;              /* phase markers in: PYFINI__MARKER_PRE, PYFINI__MARKER_USER */
    int finder_armed;                    /* the builtins finder puts itself back when removed */
    PyObject *builtins;                  /* borrowed: the interpreter's builtins dict */
    int finder_replanting;
    int reserved0;
    pyfini__entry *heads[PYFINI__NPHASES];
    size_t counts[PYFINI__NPHASES];
    pyfini__root *root;                  /* main interpreter: owned; others: NULL */
    /* Operations, implemented by the copy that created the registry, so that
       every copy agrees on the semantics. Called with the GIL held. */
    int (*add)(struct pyfini__registry *reg, pyfini_callback func, void *arg, int phase);
    int (*cancel)(struct pyfini__registry *reg, pyfini_callback func, void *arg, int phase);
    /* per-interpreter states (pyfini_state): hash buckets by name, and the
       creator's operations. mode: PYFINI__FIND or PYFINI__GET. */
    struct pyfini__state_rec *state_buckets[PYFINI__STATE_BUCKETS];
    struct pyfini__state_rec *state_newest;      /* creation order, newest first */
    void *(*state_get)(struct pyfini__registry *reg, const pyfini_state_def *def, int mode,
                       uint64_t *caller_epoch, int *cacheable);
    int (*state_track)(struct pyfini__registry *reg, const pyfini_state_def *def, PyObject *obj);
    int (*state_warnings)(struct pyfini__registry *reg, const pyfini_state_def *def, int enabled);
    /* the per-copy cache epochs to bump when states of this interpreter are
       freed (each copy that cached one of them added its counter) */
    uint64_t **epochs;
    size_t nepochs, cap_epochs;
    void *reserved[PYFINI__NRESERVED];
} pyfini__registry;

/* registry->sentinel_installed bits */
enum { PYFINI__MARKER_PRE = 1, PYFINI__MARKER_USER = 2 };
/* mode of state_get */
enum { PYFINI__FIND = 0, PYFINI__GET = 1 };

/* One state. */
typedef struct pyfini__state_rec {
    struct pyfini__state_rec *next;      /* in its hash bucket */
    struct pyfini__state_rec *older;     /* creation order */
    char *name;
    size_t size;
    void *data;
    void (*clear)(void *state);
    int status;                          /* PYFINI__STATE_... */
    int leak_warnings;
    unsigned long init_thread;           /* PyThread_get_thread_ident() of the initializer */
    PyObject **tracked;                  /* weak references */
    size_t ntracked, cap_tracked;
    void *reserved[4];
} pyfini__state_rec;

enum { PYFINI__STATE_INIT = 1, PYFINI__STATE_ALIVE = 2, PYFINI__STATE_CLEARING = 3,
       PYFINI__STATE_DEAD = 4 };

/* -------- private per-copy state: one per shared object (see USING IT) ---- */
/* A copy of pyfini is one shared object (or executable): every translation
   unit of it that includes this header uses the same two structures below,
   pyfini__copy_layoutN (process-wide) and pyfini__thread_layoutN
   (thread-local). They are WEAK, HIDDEN definitions with C linkage, one in
   every unit: the static linker keeps one of them per shared object (C and
   C++ units alike), and hidden visibility keeps them out of the dynamic
   symbol table, so no other shared object can bind to them and each one
   keeps its own. Why not stb's PYFINI_IMPLEMENTATION-in-one-file: the
   header-only promise ("copy one file, include it") stays true for any
   number of files, and no build can end up with none or two
   implementations. The symbol names carry PYFINI__COPY_LAYOUT, so units of
   two pyfini versions with different layouts linked into one shared object
   keep separate structures instead of merging mismatched ones.
   Other compilers and object formats (neither GCC nor Clang, or not ELF:
   macOS's Mach-O, whose thread-local variables go through dyld and whose
   weak thread-locals pyfini has not tested) get `static` structures: there
   every translation unit is a copy of its own (its own hit table, cache,
   last error and, on CPython 3.11-3.13.1, its own audit hook), which is
   correct but slower and noisier. PYFINI__SHARED_STATE says which (1:
   shared); the test-only PYFINI__PER_UNIT_STATE forces the fallback
   (tests/compile_check.c builds both). */

/* Bump whenever a field of pyfini__copy_state or pyfini__thread_state (or of
   a structure inside them: pyfini__cache_slot, pyfini__hit_entry,
   pyfini__hooked) is added, moved, removed or changes meaning, or one of
   their sizes (PYFINI__ERROR_MAX, PYFINI__CACHE_SLOTS, PYFINI__HITS_BITS)
   changes: it renames both symbols. */
#define PYFINI__COPY_LAYOUT 1
#define PYFINI__CAT2(a, b) a##b
#define PYFINI__CAT(a, b) PYFINI__CAT2(a, b)
#define PYFINI__COPY PYFINI__CAT(pyfini__copy_layout, PYFINI__COPY_LAYOUT)
#define PYFINI__THREAD PYFINI__CAT(pyfini__thread_layout, PYFINI__COPY_LAYOUT)
#if (defined(__GNUC__) || defined(__clang__)) && defined(__ELF__) &&                          \
    !defined(PYFINI__PER_UNIT_STATE)
#  define PYFINI__SHARED_STATE 1
/* __thread, not thread_local: in C++ it never asks for a TLS wrapper
   function, so C and C++ units reach the same symbol the same way */
#  define PYFINI__COPY_STORAGE __attribute__((weak, visibility("hidden")))
#  define PYFINI__THREAD_STORAGE __attribute__((weak, visibility("hidden"))) __thread
#else
#  define PYFINI__SHARED_STATE 0
#  define PYFINI__COPY_STORAGE PYFINI__UNUSED static
#  define PYFINI__THREAD_STORAGE PYFINI__UNUSED static PYFINI_THREAD_LOCAL
#endif

#define PYFINI__ERROR_PREFIX "pyfini: "
#define PYFINI__ERROR_MAX 256
/* The per-thread state cache of this copy; its epoch (in pyfini__copy_state):
   any copy that frees states of an interpreter this copy cached bumps it
   (atomically). */
#define PYFINI__CACHE_SLOTS 8
typedef struct pyfini__cache_slot {
    PyInterpreterState *interp;
    int64_t interp_id;
    uint64_t epoch;
    const pyfini_state_def *def;
    const char *name;                    /* def->name and def->size when cached */
    size_t size;
    void *data;
    int fillable;                        /* may go into the hit table (pyfini__state_slow) */
} pyfini__cache_slot;
/* The process-wide hit table of this copy, in front of the per-thread
   cache: no thread-local access and no call on a hit. Two entries may hold
   (def, interpreter): the one its hash names, read inline by a hit, and
   the one half the table away, read out of line when the first holds
   another pair (pyfini__hit_fill takes the second only then). Each entry is
   under its own sequence lock (seq odd while a writer fills it; a writer
   that cannot take it skips the fill, and a later lookup that finds the
   pair in its thread's cache fills it then). Where the
   end of the entry's interpreter bumps PYFINI__COPY.epoch through a hook that
   CPython always runs (pyfini__end_hooked; on 3.11, 3.12, 3.13.0-3.13.1 the
   audit hook, pyfini__audit_hooked), a hit needs no interpreter ID;
   elsewhere (PYFINI__COPY.hits_need_id: the audit hook vetoed or left out, or
   between Py_FinalizeEx and the next fill) a hit also compares it, out of
   line. Fields are read and written with
   __atomic builtins. */
#define PYFINI__HITS_BITS 7
#define PYFINI__HITS (1 << PYFINI__HITS_BITS)
typedef struct pyfini__hit_entry {
    uint64_t seq;
    const pyfini_state_def *def;
    PyInterpreterState *interp;
    uint64_t epoch;
    const char *name;                    /* def->name and def->size when filled */
    size_t size;
    void *data;
    int64_t interp_id;                   /* checked where PYFINI__COPY.hits_need_id */
} pyfini__hit_entry;
/* The interpreters whose exit hook this copy registered (one node each,
   freed by the hook), under a spin lock: own-GIL interpreters race. */
typedef struct pyfini__hooked {
    PyInterpreterState *interp;
    struct pyfini__hooked *next;
} pyfini__hooked;
/* audit_state: this copy's process-wide C audit hook (pyfini__audit_hooked),
   where no reliable exit hook exists (3.11, 3.12, 3.13.0-3.13.1): 0 not
   added in this runtime initialization, 2 being added, 1 added and seen
   working (hits then skip the ID check), -1 refused (a hook vetoed
   "sys.addaudithook", or the probe never reached it: the ID check stays). */
#define PYFINI__AUDIT_NONE 0
#define PYFINI__AUDIT_ON 1
#define PYFINI__AUDIT_ADDING 2
#define PYFINI__AUDIT_REFUSED (-1)

/* One copy's process-wide state. epoch and hits_need_id start at 1 (the
   initializer below), everything else at 0. */
typedef struct pyfini__copy_state {
    uint64_t epoch;                      /* the cache epoch (see pyfini__cache_slot) */
    int hits_need_id;                    /* hits also compare the interpreter ID */
    int audit_state;                     /* PYFINI__AUDIT_... */
    int audit_probe_seen;
    /* this copy's pthread_atfork() handlers: 0 not yet, 2 being registered,
       1 registered, -1 failed (pyfini__fork_safe) */
    int atfork_state;
    char hooked_lock;
    pyfini__hooked *hooked_list;
    /* The root whose Py_AtExit slot this copy registered (at most one copy). */
    pyfini__root *atexit_root;
    /* The root whose RUNTIME_SHUTDOWN callbacks this copy is running now. */
    pyfini__root *running_root;
    pyfini__hit_entry hits[PYFINI__HITS];
} pyfini__copy_state;

/* One copy's thread-local state; all zero at a thread's start. */
typedef struct pyfini__thread_state {
    const char *error_msg;               /* pyfini_last_error() */
    /* 1 while this thread runs under a temporary thread state of the main
       interpreter (see pyfini__in_main). */
    int in_temporary_tstate;
    unsigned cache_next;
    pyfini__cache_slot cache[PYFINI__CACHE_SLOTS];
    char error_buf[PYFINI__ERROR_MAX];
} pyfini__thread_state;

#if defined(__GNUC__) || defined(__clang__)
#  pragma GCC diagnostic push
#  pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#endif
PYFINI__COPY_STORAGE pyfini__copy_state PYFINI__COPY = {1, 1};
#if defined(__GNUC__) || defined(__clang__)
#  pragma GCC diagnostic pop
#endif
PYFINI__THREAD_STORAGE pyfini__thread_state PYFINI__THREAD;

/* ======================================================================== */
/* 4. CPython compatibility: every version check of this file               */
/* ======================================================================== */
/* One shim per CPython change, named after the change and the release that
   made it (the pythoncapi_compat.h way). Nothing else in this file tests
   PY_VERSION_HEX beyond the 3.11 minimum in section 1. */

#ifdef PYFINI_TEST_FAULTS
/* The test's fault hook (section 1): 1 if the call at `site` must fail now,
   with a MemoryError set when `raise`. */
static inline int pyfini__fault(const char *site, int raise)
{
    (void)site;   /* a hook may ignore it */
    if (!(PYFINI_TEST_FAULTS(site))) {
        return 0;
    }
    if (raise) {
        PyErr_NoMemory();
    }
    return 1;
}
#endif

/* gh-108867 added PyThreadState_GetUnchecked() to Python 3.13.0a1; before,
   it was the private _PyThreadState_UncheckedGet(). The attached thread
   state or NULL; never fails. */
static inline PyThreadState *pyfini__tstate(void)
{
#if PY_VERSION_HEX >= 0x030D00A1
    return PyThreadState_GetUnchecked();
#else
    return _PyThreadState_UncheckedGet();
#endif
}

/* The exit hook of an interpreter that CPython ALWAYS runs when the
   interpreter ends, whatever leaked: interpreter_clear() (Python/pystate.c)
   calls _PyAtExit_Fini() (Modules/atexitmodule.c) unconditionally, which
   runs the PyUnstable_AtExit() callbacks, between the state-dict clear and
   the last GC. PyUnstable_AtExit() is public from 3.13.0a1 (3.12 has the
   private _Py_AtExit). Up to 3.13.1 (and on every 3.12), a registration
   overwrote the previous newest callback (gh-127791: only the first and the
   newest of three or more ran); fixed in 3.13.2 and 3.14.0a3. Decided at
   run time (Py_Version): an extension built against 3.13.2 headers may run
   on 3.13.0. 1 if the hook can be relied on. */
static inline int pyfini__exit_hook_reliable(void)
{
#if PY_VERSION_HEX >= 0x030D00A1
    unsigned long v = (unsigned long)Py_Version;
    return v >= 0x030E00A3UL || (v >= 0x030D02F0UL && v < 0x030E0000UL);
#else
    return 0;   /* 3.11: no C-level exit hook; 3.12: gh-127791 */
#endif
}

/* Register func(data) as the current interpreter's exit hook; 0, or -1
   (an exception may be set) where no reliable hook exists. */
static inline int pyfini__exit_hook_add(PyInterpreterState *interp, void (*func)(void *),
                                        void *data)
{
#if PY_VERSION_HEX >= 0x030D00A1
    if (pyfini__exit_hook_reliable()) {
        return PYFINI__NEG("exit_hook_add PyUnstable_AtExit",
                           PyUnstable_AtExit(interp, func, data));
    }
#endif
    (void)interp;
    (void)func;
    (void)data;
    return -1;
}

/* gh-108014 added Py_IsFinalizing() to Python 3.13.0a1; before, it was the
   private _Py_IsFinalizing(). Has Py_FinalizeEx begun? */
static inline int pyfini__runtime_finalizing(void)
{
#if PY_VERSION_HEX >= 0x030D00A1
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

/* PEP 667 (gh-74929) added PyEval_GetFrameBuiltins() to Python 3.13 and
   deprecated PyEval_GetBuiltins(); the new one returns a new reference.
   Which 3.13 prerelease first had it is not confirmed here, so the guard
   takes 3.13.0 final (the old function still works before it).
   Borrowed builtins dict of the current interpreter (no frame during
   teardown: interp->builtins), or NULL once it is gone. */
static inline PyObject *pyfini__builtins(void)
{
#if PY_VERSION_HEX >= 0x030D00F0
    PyObject *b = PyEval_GetFrameBuiltins();
    if (b == NULL) {
        PyErr_Clear();
        return NULL;
    }
    Py_DECREF(b);                          /* still owned by the interpreter/frame */
    return b;
#else
    return PyEval_GetBuiltins();
#endif
}

/* gh-105927 added PyWeakref_GetRef() to Python 3.13.0a1 (and deprecated
   PyWeakref_GetObject(), which returns a borrowed reference). The referent
   of a weak reference (new reference), or NULL if it died. */
static inline PyObject *pyfini__weakref_get(PyObject *wr)
{
#if PY_VERSION_HEX >= 0x030D00A1
    PyObject *o = NULL;
    if (PyWeakref_GetRef(wr, &o) < 0) {
        PyErr_Clear();
        return NULL;
    }
    return o;
#else
    PyObject *o = PyWeakref_GetObject(wr);
    if (o == NULL) {
        PyErr_Clear();
        return NULL;
    }
    return o == Py_None ? NULL : Py_NewRef(o);
#endif
}

/* Not a version shim, a rule of every version: 1 while the interpreter's
   state dict may be used, i.e. sys.modules is still a dict.
   finalize_modules() (Python/pylifecycle.c) replaces sys.modules with None
   before interpreter_clear() clears the state dict; calling
   PyInterpreterState_GetDict() during or after that clear would re-create a
   dict nobody frees. */
static inline int pyfini__state_dict_usable(void)
{
    PyObject *modules = PySys_GetObject("modules");   /* borrowed; no exception */
    return modules != NULL && PyDict_Check(modules);
}

/* dict[key] = value with a key that is NOT interned: on 3.12/3.13 an
   interned string made in an isolated sub-interpreter is never freed, so
   PyDict_SetItemString (which interns) would lose bytes per interpreter. */
static inline int pyfini__dict_set(PyObject *dict, const char *key, PyObject *value)
{
    PyObject *k = PYFINI__NEW("dict_set PyUnicode_FromString", PyUnicode_FromString(key));
    if (k == NULL) {
        return -1;
    }
    int rc = PYFINI__NEG("dict_set PyDict_SetItem", PyDict_SetItem(dict, k, value));
    Py_DECREF(k);
    return rc;
}

/* A module only if it has been imported already (new reference, or NULL
   with no exception): pyfini never imports a module just to hook into it,
   since on 3.12/3.13 each module imported in a sub-interpreter adds to what
   CPython itself loses per interpreter. */
static inline PyObject *pyfini__imported_module(const char *name)
{
    PyObject *n = PYFINI__NEW("imported_module PyUnicode_FromString", PyUnicode_FromString(name));
    PyObject *mod = n ? PYFINI__NEW("imported_module PyImport_GetModule", PyImport_GetModule(n))
                      : NULL;
    Py_XDECREF(n);
    PyErr_Clear();
    return mod;
}

/* obj.method(arg); 0, or -1 with an exception. */
static inline int pyfini__call_method(PyObject *obj, const char *method, PyObject *arg)
{
    PyObject *r = PYFINI__NEW("call_method PyObject_CallMethod",
                              PyObject_CallMethod(obj, method, "O", arg));
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* import module; module.method(arg); 0, or -1 with an exception. */
static inline int pyfini__call_module(const char *module, const char *method, PyObject *arg)
{
    PyObject *mod = PYFINI__NEW("call_module PyImport_ImportModule", PyImport_ImportModule(module));
    int rc = mod ? pyfini__call_method(mod, method, arg) : -1;
    Py_XDECREF(mod);
    return rc;
}

/* ======================================================================== */
/* 5. Errors, reports and small helpers                                     */
/* ======================================================================== */

/* Record a failure; if `exc` is not NULL and a thread state is attached,
   also raise it (unless an exception is already set). Returns -1. */
static inline int pyfini__fail(PyObject *exc, const char *msg)
{
    char *buf = PYFINI__THREAD.error_buf;
    snprintf(buf, PYFINI__ERROR_MAX, PYFINI__ERROR_PREFIX "%.240s", msg);
    PYFINI__THREAD.error_msg = buf;
    if (exc != NULL && !PyErr_Occurred()) {
        PyErr_SetString(exc, buf);
    }
    return -1;
}

/* A MemoryError and the matching last error; returns -1. */
static inline int pyfini__fail_nomem(void)
{
    pyfini__fail(NULL, "out of memory");
    PyErr_NoMemory();
    return -1;
}

/* "TypeName: message" of a fetched exception (type, value), into buf. */
static inline void pyfini__exception_text(PyObject *type, PyObject *value, char *buf, size_t size)
{
    PyObject *s = value ? PYFINI__NEW("exception_text PyObject_Str", PyObject_Str(value)) : NULL;
    const char *m = s ? PyUnicode_AsUTF8(s) : NULL;
    if (m == NULL) {
        PyErr_Clear();
    }
    snprintf(buf, size, "%s: %s", type ? ((PyTypeObject *)type)->tp_name : "exception",
             m ? m : "?");
    Py_XDECREF(s);
}

/* Record the exception already set as this thread's last error (it stays
   set). Returns -1. */
static inline int pyfini__fail_from_exception(const char *what)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    char *buf = PYFINI__THREAD.error_buf;
    int n = snprintf(buf, PYFINI__ERROR_MAX, PYFINI__ERROR_PREFIX "%s: ", what);
    if (n >= 0 && (size_t)n < PYFINI__ERROR_MAX) {
        pyfini__exception_text(type, value, buf + n, PYFINI__ERROR_MAX - (size_t)n);
    }
    PYFINI__THREAD.error_msg = buf;
    PyErr_Restore(type, value, tb);
    return -1;
}

/* The failure every no-thread-state path reports (no exception can be set). */
#define PYFINI__NO_TSTATE "no thread state: attach one (hold the GIL) first"

/* A capsule destructor body that runs with the error indicator set aside:
   CPython may release a capsule while an exception is set. */
#define PYFINI__KEEPING_EXCEPTION(statement)                                   \
    do {                                                                       \
        PyObject *pyfini__et, *pyfini__ev, *pyfini__etb;                       \
        PyErr_Fetch(&pyfini__et, &pyfini__ev, &pyfini__etb);                   \
        statement;                                                             \
        PyErr_Restore(pyfini__et, pyfini__ev, pyfini__etb);                    \
    } while (0)

/* A callback's address, symbol and object file (dladdr; "?" if unknown). */
static inline void *pyfini__symbol(pyfini_callback func, const char **sym, const char **obj)
{
    Dl_info info;
    void *addr;
    memset(&info, 0, sizeof info);
    memcpy(&addr, &func, sizeof addr);   /* a function pointer as data (no ISO C cast) */
    *sym = *obj = "?";
    if (dladdr(addr, &info) != 0) {
        *sym = info.dli_sname ? info.dli_sname : "?";
        *obj = info.dli_fname ? info.dli_fname : "?";
    }
    return addr;
}

/* Report a failed callback once on stderr. May run without a thread state
   (RUNTIME_SHUTDOWN): then exc_text is NULL and no C API is used. */
static inline void pyfini__report(int phase, int64_t interp_id, pyfini_callback func,
                                  int rc, const char *exc_text)
{
    const char *sym, *obj;
    void *addr = pyfini__symbol(func, &sym, &obj);
    char where[64];
    if (interp_id >= 0) {
        snprintf(where, sizeof where, "interpreter %lld", (long long)interp_id);
    } else {
        snprintf(where, sizeof where, "the process");
    }
    fprintf(stderr,
            "pyfini: callback %p (%s in %s) failed in phase %s of %s: %s%s%s\n",
            addr, sym, obj, pyfini_phase_name(phase), where,
            exc_text ? "raised " : "returned ",
            exc_text ? exc_text : "",
            exc_text ? "" : (rc == 0 ? "0 with an exception set" : "non-zero"));
    if (!exc_text && rc != 0) {
        fprintf(stderr, "pyfini:   (return value %d)\n", rc);
    }
    fflush(stderr);
}

/* Call one entry with the GIL held (PRE, USER, POST): with a clean error
   indicator; a failure (non-zero, or an exception left set) is reported and
   the exception cleared; the caller's exception is kept. */
static inline void pyfini__call_with_gil(pyfini__entry *e, int64_t interp_id)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);       /* run with a clean error indicator */
    PyThreadState *ts = pyfini__tstate();
    int rc = e->func(e->arg);
    if (pyfini__tstate() != ts) {
        /* The callback ended its own interpreter (Py_EndInterpreter) or
           finalized Python (Py_FinalizeEx) - CPython refuses neither from
           here - or released the GIL or switched thread states without
           switching back. The thread state this teardown runs in may be
           freed: nothing can go on safely, so say what happened and stop
           (as CPython's fatal errors do) instead of crashing later. */
        const char *sym, *obj;
        void *addr = pyfini__symbol(e->func, &sym, &obj);
        fprintf(stderr,
                "pyfini: callback %p (%s in %s) in phase %s of interpreter %lld returned with "
                "another thread state attached (%p, was %p): it ended its interpreter, finalized "
                "Python or switched thread states without switching back; the interpreter's "
                "teardown cannot go on: aborting\n",
                addr, sym, obj, pyfini_phase_name(e->phase), (long long)interp_id,
                (void *)pyfini__tstate(), (void *)ts);
        fflush(stderr);
        abort();
    }
    if (rc != 0 || PyErr_Occurred()) {
        char text[200];
        const char *exc_text = NULL;
        if (PyErr_Occurred()) {
            PyObject *et, *ev, *etb;
            PyErr_Fetch(&et, &ev, &etb);
            PyErr_NormalizeException(&et, &ev, &etb);
            pyfini__exception_text(et, ev, text, sizeof text);
            Py_XDECREF(et);
            Py_XDECREF(ev);
            Py_XDECREF(etb);
            exc_text = text;
        }
        pyfini__report(e->phase, interp_id, e->func, rc, exc_text);
    }
    PyErr_Restore(type, value, tb);
}

/* ---- the entry lists (newest at head) ------------------------------------ */

static inline void pyfini__unlink(pyfini__entry **head, size_t *count, pyfini__entry *e)
{
    if (!e->linked) {
        return;
    }
    if (e->prev) {
        e->prev->next = e->next;
    } else {
        *head = e->next;
    }
    if (e->next) {
        e->next->prev = e->prev;
    }
    e->prev = e->next = NULL;
    e->linked = 0;
    (*count)--;
}

static inline void pyfini__push(pyfini__entry **head, size_t *count, pyfini__entry *e)
{
    e->prev = NULL;
    e->next = *head;
    if (*head) {
        (*head)->prev = e;
    }
    *head = e;
    e->linked = 1;
    (*count)++;
}

/* The newest pending entry of (func, arg), or NULL. */
static inline pyfini__entry *pyfini__find(pyfini__entry *head, pyfini_callback func, void *arg)
{
    for (pyfini__entry *e = head; e != NULL; e = e->next) {
        if (e->func == func && e->arg == arg && e->state == PYFINI__PENDING) {
            return e;
        }
    }
    return NULL;
}

/* Unlink and free the newest pending entry of (func, arg): 1, or 0 if none. */
static inline int pyfini__remove(pyfini__entry **head, size_t *count, pyfini_callback func,
                                 void *arg)
{
    pyfini__entry *e = pyfini__find(*head, func, arg);
    if (e == NULL) {
        return 0;
    }
    pyfini__unlink(head, count, e);
    PYFINI_FREE(e);
    return 1;
}

/* A new pending entry (not linked), or NULL with a MemoryError. */
static inline pyfini__entry *pyfini__entry_new(pyfini_callback func, void *arg, int phase)
{
    pyfini__entry *e = PYFINI_CAST(pyfini__entry *, PYFINI_CALLOC(1, sizeof(pyfini__entry)));
    if (e == NULL) {
        pyfini__fail_nomem();
        return NULL;
    }
    e->func = func;
    e->arg = arg;
    e->phase = phase;
    return e;
}

/* ---- misc ----------------------------------------------------------------- */

/* The pointer of a capsule being released, or NULL (the error cleared). */
static inline void *pyfini__released_pointer(PyObject *capsule, const char *name)
{
    void *p = PyCapsule_GetPointer(capsule, name);
    if (p == NULL) {
        PyErr_Clear();
    }
    return p;
}

static inline void pyfini__set_phase(pyfini__registry *reg, int phase)
{
    if (reg->phase < phase) {
        reg->phase = phase;
    }
}

static inline int pyfini__env_is(const char *name, const char *value)
{
    const char *v = getenv(name);
    return v != NULL && strcmp(v, value) == 0;
}

/* Double the capacity of an array of n elements (first: the initial
   capacity); 0, or -1 with the array unchanged. */
static inline int pyfini__grow(void **arr, size_t *cap, size_t n, size_t elem, size_t first)
{
    size_t ncap = *cap ? 2 * *cap : first;
    void *a = PYFINI_CALLOC(ncap, elem);
    if (a == NULL) {
        return -1;
    }
    if (n) {
        memcpy(a, *arr, n * elem);
    }
    PYFINI_FREE(*arr);
    *arr = a;
    *cap = ncap;
    return 0;
}

/* ======================================================================== */
/* 6. The registry: check, find, create, publish, free                      */
/* ======================================================================== */
/* One registry per interpreter, shared by every copy (section 3). Its hooks
   and operations are defined in the sections that use them; the registry
   only stores or plants them. These three are the forward declarations the
   file needs for that: */
static inline void pyfini__install_markers(pyfini__registry *reg);        /* 8 */
static void pyfini__registry_capsule_destructor(PyObject *capsule);       /* 10 */
static inline void pyfini__registry_set_ops(pyfini__registry *reg);       /* 13 */

/* The registry in capsule `cap` (named `name`), made by any copy of this ABI
   version, if this copy can read it: its struct_size covers every field of
   this copy's layout. NULL with RuntimeError otherwise. */
static inline pyfini__registry *pyfini__registry_check(PyObject *cap, const char *name)
{
    if (!PyCapsule_IsValid(cap, name)) {
        pyfini__fail(PyExc_RuntimeError, "the interpreter's " PYFINI_REGISTRY_KEY
                                         " entry is not a pyfini registry");
        return NULL;
    }
    pyfini__registry *reg = PYFINI_CAST(pyfini__registry *, PyCapsule_GetPointer(cap, name));
    if (reg == NULL || reg->abi_version != PYFINI_ABI_VERSION) {
        pyfini__fail(PyExc_RuntimeError, "pyfini registry of another ABI version");
        return NULL;
    }
    if (!PYFINI__HAS_FIELD(pyfini__registry, reg, reserved)) {
        char msg[160];
        snprintf(msg, sizeof msg, "pyfini registry of %u bytes (made by pyfini 0x%06x) is "
                 "smaller than the %zu bytes this copy reads", (unsigned)reg->struct_size,
                 (unsigned)reg->creator_version, sizeof(pyfini__registry));
        pyfini__fail(PyExc_RuntimeError, msg);
        return NULL;
    }
    return reg;
}

/* ---- the registry's state table (records by name; section 13 uses it) --- */

static inline size_t pyfini__hash_name(const char *s)
{
    size_t h = 1469598103934665603u;   /* FNV-1a */
    for (; *s; s++) {
        h = (h ^ (unsigned char)*s) * 1099511628211u;
    }
    return h;
}

static inline pyfini__state_rec **pyfini__state_bucket(pyfini__registry *reg, const char *name)
{
    return &reg->state_buckets[pyfini__hash_name(name) % PYFINI__STATE_BUCKETS];
}

static inline pyfini__state_rec *pyfini__state_lookup(pyfini__registry *reg, const char *name)
{
    pyfini__state_rec *r = *pyfini__state_bucket(reg, name);
    for (; r != NULL; r = r->next) {
        if (strcmp(r->name, name) == 0) {
            return r;
        }
    }
    return NULL;
}

/* Put a record at the head of its bucket and as the newest. */
static inline void pyfini__state_link(pyfini__registry *reg, pyfini__state_rec *rec)
{
    pyfini__state_rec **bucket = pyfini__state_bucket(reg, rec->name);
    rec->next = *bucket;
    *bucket = rec;
    rec->older = reg->state_newest;
    reg->state_newest = rec;
}

static inline void pyfini__state_unlink(pyfini__registry *reg, pyfini__state_rec *rec)
{
    pyfini__state_rec **pp = pyfini__state_bucket(reg, rec->name);
    while (*pp != NULL && *pp != rec) {
        pp = &(*pp)->next;
    }
    if (*pp == rec) {
        *pp = rec->next;
    }
    pp = &reg->state_newest;
    while (*pp != NULL && *pp != rec) {
        pp = &(*pp)->older;
    }
    if (*pp == rec) {
        *pp = rec->older;
    }
}

/* Free a record; data too unless keep_data. Drops the weak references. */
static inline void pyfini__state_free(pyfini__state_rec *rec, int keep_data)
{
    for (size_t i = 0; i < rec->ntracked; i++) {
        Py_XDECREF(rec->tracked[i]);
    }
    PYFINI_FREE(rec->tracked);
    if (!keep_data) {
        PYFINI_FREE(rec->data);
    }
    PYFINI_FREE(rec->name);
    PYFINI_FREE(rec);
}

/* Drop the weak references whose objects have died. */
static inline void pyfini__track_prune(pyfini__state_rec *rec)
{
    size_t kept = 0;
    for (size_t i = 0; i < rec->ntracked; i++) {
        PyObject *o = pyfini__weakref_get(rec->tracked[i]);
        if (o != NULL) {
            rec->tracked[kept++] = rec->tracked[i];
            Py_DECREF(o);
        } else {
            Py_DECREF(rec->tracked[i]);
        }
    }
    rec->ntracked = kept;
}

/* ---- the copies' cache epochs --------------------------------------------- */

/* Invalidate every copy's cached pointers to this interpreter's states. */
static inline void pyfini__epochs_bump(pyfini__registry *reg)
{
    for (size_t i = 0; i < reg->nepochs; i++) {
        __atomic_add_fetch(reg->epochs[i], 1, __ATOMIC_SEQ_CST);
    }
}

#define PYFINI__EPOCHS_FIRST_CAP 4
/* Remember a copy's epoch counter; 0, or -1 (not remembered: don't cache). */
static inline int pyfini__epochs_add(pyfini__registry *reg, uint64_t *epoch)
{
    for (size_t i = 0; i < reg->nepochs; i++) {
        if (reg->epochs[i] == epoch) {
            return 0;
        }
    }
    if (reg->nepochs == reg->cap_epochs &&
        pyfini__grow(PYFINI_CAST(void **, &reg->epochs), &reg->cap_epochs, reg->nepochs,
                     sizeof(uint64_t *), PYFINI__EPOCHS_FIRST_CAP) < 0) {
        return -1;
    }
    reg->epochs[reg->nepochs++] = epoch;
    return 0;
}

/* ---- the finder: the registry in the builtins dict ------------------------ */

/* The finder: a capsule under PYFINI_REGISTRY_KEY in the interpreter's
   builtins dict, so that the registry is found without the state dict -
   during finalize_modules() (sys.modules is None), during the state-dict
   clear (interp->dict is NULL: PyInterpreterState_GetDict would make a new
   one) and after it. finalize_modules() empties the builtins dict and sets
   its values to None; while armed, the finder puts itself back each time
   (the dict is consistent when it is released: PyDict_Clear detaches the
   entries first, PyDict_SetItem stores the new value first). */
static void pyfini__finder_destructor(PyObject *capsule);

static inline void pyfini__finder_set(pyfini__registry *reg, PyObject *builtins)
{
    if (builtins == NULL) {
        return;
    }
    PyObject *finder = PYFINI__NEW("finder_set PyCapsule_New",
                                   PyCapsule_New(reg, PYFINI__FINDER_CAPSULE,
                                                 pyfini__finder_destructor));
    reg->finder_replanting = 1;
    if (finder == NULL || pyfini__dict_set(builtins, PYFINI_REGISTRY_KEY, finder) < 0) {
        PyErr_Clear();
    }
    reg->finder_replanting = 0;
    Py_XDECREF(finder);
}

static inline void pyfini__finder_released(PyObject *capsule)
{
    pyfini__registry *reg = PYFINI_CAST(
        pyfini__registry *, pyfini__released_pointer(capsule, PYFINI__FINDER_CAPSULE));
    if (reg != NULL && reg->finder_armed && !reg->finder_replanting && reg->builtins != NULL) {
        if (Py_REFCNT(reg->builtins) > 0) {
            pyfini__finder_set(reg, reg->builtins);
        } else {
            /* the builtins dict itself is being deallocated: POST_SHUTDOWN
               never came (a leaked reference kept the registry capsule
               alive past the state-dict clear). Never write into it, and
               drop every cached pointer to this interpreter's states: after
               Py_FinalizeEx + Py_Initialize the main interpreter comes back
               at the same address with the same ID 0. */
            reg->finder_armed = 0;
            reg->builtins = NULL;
            pyfini__epochs_bump(reg);
        }
    }
}

static void pyfini__finder_destructor(PyObject *capsule)
{
    PYFINI__KEEPING_EXCEPTION(pyfini__finder_released(capsule));
}

/* ---- free ---------------------------------------------------------------- */

static inline void pyfini__free_registry(pyfini__registry *reg)
{
    /* PRE/USER entries whose hooks are still alive (leaked): detach them */
    for (int p = PYFINI_PRE_SHUTDOWN; p <= PYFINI_USER; p++) {
        while (reg->heads[p] != NULL) {
            pyfini__entry *e = reg->heads[p];
            pyfini__unlink(&reg->heads[p], &reg->counts[p], e);
            e->registry = NULL;
        }
    }
    while (reg->heads[PYFINI_POST_SHUTDOWN] != NULL) {
        pyfini__entry *e = reg->heads[PYFINI_POST_SHUTDOWN];
        pyfini__unlink(&reg->heads[PYFINI_POST_SHUTDOWN], &reg->counts[PYFINI_POST_SHUTDOWN], e);
        PYFINI_FREE(e);
    }
    if (reg->root != NULL && !reg->root->atexit_registered) {
        /* no RUNTIME_SHUTDOWN callback was ever registered */
        PYFINI_FREE(reg->root);
    }
    reg->root = NULL;
    PYFINI_FREE(reg->epochs);
    PYFINI_FREE(reg);
}

/* ---- create and publish -------------------------------------------------- */

/* A new registry for `interp` (with the process-wide root if it is the main
   interpreter), not yet published; NULL with a MemoryError. Every field not
   set here, the reserved ones included, is 0. */
static inline pyfini__registry *pyfini__registry_new(PyInterpreterState *interp)
{
    pyfini__registry *reg = PYFINI_CAST(pyfini__registry *,
                                        PYFINI_CALLOC(1, sizeof(pyfini__registry)));
    pyfini__root *root = NULL;
    if (reg != NULL && interp == PyInterpreterState_Main()) {
        root = PYFINI_CAST(pyfini__root *, PYFINI_CALLOC(1, sizeof(pyfini__root)));
        if (root == NULL) {
            PYFINI_FREE(reg);
            reg = NULL;
        }
    }
    if (reg == NULL) {
        pyfini__fail_nomem();
        return NULL;
    }
    reg->abi_version = PYFINI_ABI_VERSION;
    reg->struct_size = (uint32_t)sizeof(pyfini__registry);
    reg->creator_version = PYFINI_VERSION_HEX;
    reg->interp = interp;
    reg->interp_id = PyInterpreterState_GetID(interp);
    pyfini__registry_set_ops(reg);
    if (root != NULL) {
        root->abi_version = PYFINI_ABI_VERSION;
        root->struct_size = (uint32_t)sizeof(pyfini__root);
        root->creator_version = PYFINI_VERSION_HEX;
        reg->root = root;
    }
    return reg;
}

/* Race-free publication in the state dict under `key`: whoever inserts
   first wins; the loser's capsule frees its registry at once
   (reg->published stays 0). Returns the winner (reg, or another copy's
   registry; *won says which), or NULL with an exception. */
static inline pyfini__registry *pyfini__registry_publish(PyObject *dict, PyObject *key,
                                                         pyfini__registry *reg, int *won)
{
    *won = 0;
    PyObject *mine = PYFINI__NEW("registry_publish PyCapsule_New",
                                 PyCapsule_New(reg, PYFINI_REGISTRY_KEY,
                                               pyfini__registry_capsule_destructor));
    if (mine == NULL) {
        pyfini__fail_from_exception("cannot create the registry");
        pyfini__free_registry(reg);
        return NULL;
    }
    PyObject *winner = PYFINI__NEW("registry_publish PyDict_SetDefault",
                                   PyDict_SetDefault(dict, key, mine));   /* borrowed */
    if (winner == NULL) {
        pyfini__fail_from_exception("cannot publish the registry");
        Py_DECREF(mine);
        return NULL;
    }
    if (winner != mine) {
        Py_DECREF(mine);
        return pyfini__registry_check(winner, PYFINI_REGISTRY_KEY);
    }
    reg->published = 1;
    *won = 1;
    Py_DECREF(mine);          /* the state dict holds it */
    return reg;
}

/* After a won publication: remember interp->builtins (== the builtins
   module's dict; it lives past POST_SHUTDOWN) - the module through
   sys.modules, else the builtins of the running frame or, with none, of the
   interpreter - plant the finder there, and install the phase markers. */
static inline void pyfini__registry_arm(pyfini__registry *reg)
{
    PyObject *bmod = pyfini__imported_module("builtins");
    reg->builtins = bmod ? PyModule_GetDict(bmod) : pyfini__builtins();
    Py_XDECREF(bmod);
    PyErr_Clear();
    if (reg->builtins != NULL) {
        reg->finder_armed = 1;
        pyfini__finder_set(reg, reg->builtins);
    }
    if (!PYFINI__THREAD.in_temporary_tstate) {
        pyfini__install_markers(reg);
    }
}

/* Make, publish and arm the registry of `interp`; returns the registry that
   won the publication, or NULL with an exception. */
static inline pyfini__registry *pyfini__registry_create(PyInterpreterState *interp,
                                                        PyObject *dict, PyObject *key)
{
    pyfini__registry *reg = pyfini__registry_new(interp);
    if (reg == NULL) {
        return NULL;
    }
    int won;
    pyfini__registry *winner = pyfini__registry_publish(dict, key, reg, &won);
    if (won) {
        pyfini__registry_arm(reg);
    }
    return winner;
}

/* ---- find ------------------------------------------------------------------ */

/* The registry in the (usable) state dict of the current interpreter;
   created and published there if absent and `create`. NULL with an
   exception on failure; NULL without one if absent and !create. */
static inline pyfini__registry *pyfini__registry_in_state_dict(int create)
{
    PyInterpreterState *interp = PyInterpreterState_Get();
    PyObject *dict = PyInterpreterState_GetDict(interp);
    if (dict == NULL) {
        pyfini__fail(PyExc_RuntimeError, "the interpreter has no state dict");
        return NULL;
    }
    PyObject *key = PYFINI__NEW("registry_in_state_dict PyUnicode_FromString",
                                PyUnicode_FromString(PYFINI_REGISTRY_KEY));
    if (key == NULL) {
        pyfini__fail_from_exception("cannot look up the registry");
        return NULL;
    }
    PyObject *cap = PyDict_GetItemWithError(dict, key);
    pyfini__registry *reg = NULL;
    if (cap != NULL) {
        reg = pyfini__registry_check(cap, PYFINI_REGISTRY_KEY);
        if (reg != NULL && !PYFINI__THREAD.in_temporary_tstate) {
            pyfini__install_markers(reg);   /* retried until both are in */
        }
    } else if (PyErr_Occurred()) {
        pyfini__fail_from_exception("cannot look up the registry");
    } else if (create) {
        reg = pyfini__registry_create(interp, dict, key);
    }
    Py_DECREF(key);
    return reg;
}

/* The registry of the current interpreter (GIL held), or NULL with an
   exception set (and pyfini_last_error()). create=0: NULL without an
   exception if there is none. During teardown it is found through the
   finder in the builtins dict; past the state-dict clear nothing is made. */
static inline pyfini__registry *pyfini__registry_get(int create)
{
    PyObject *builtins = pyfini__builtins();
    PyObject *finder = NULL;
    if (builtins != NULL) {
        /* not PyDict_GetItemString, which answers "absent" when it cannot
           make the key: during teardown that would lose the registry */
        PyObject *key = PYFINI__NEW("registry_get PyUnicode_FromString",
                                    PyUnicode_FromString(PYFINI_REGISTRY_KEY));
        finder = key ? PyDict_GetItemWithError(builtins, key) : NULL;   /* borrowed */
        Py_XDECREF(key);
        if (finder == NULL && PyErr_Occurred()) {
            if (!pyfini__state_dict_usable()) {
                pyfini__fail_from_exception("cannot look up the registry");
                return NULL;
            }
            PyErr_Clear();   /* the state dict has the registry: looked up below */
        }
    }
    if (finder != NULL && PyCapsule_IsValid(finder, PYFINI__FINDER_CAPSULE)) {
        return pyfini__registry_check(finder, PYFINI__FINDER_CAPSULE);   /* teardown */
    }
    if (builtins == NULL || !pyfini__state_dict_usable()) {
        if (create) {
            pyfini__fail(PyExc_RuntimeError, "the interpreter is past its state-dict clear "
                                             "(finalized); nothing can be registered");
        }
        return NULL;
    }
    return pyfini__registry_in_state_dict(create);
}

/* ======================================================================== */
/* 7. PRE_SHUTDOWN                                                          */
/* ======================================================================== */
/* Trigger: threading._register_atexit(). Py_EndInterpreter and
   Py_FinalizeEx call wait_for_thread_shutdown() (Python/pylifecycle.c),
   i.e. threading._shutdown() (Lib/threading.py), which runs that list
   newest first BEFORE it joins the non-daemon threads.
   Marker: the oldest entry of that list, pyfini__pre_end, marks the phase
   (it runs after every pyfini PRE_SHUTDOWN callback) and hands over to USER.
   Runner: the entry callables of section 9. */

/* Register fn with threading._register_atexit; 0, or -1 with an exception. */
static inline int pyfini__pre_register(PyObject *fn)
{
    return pyfini__call_module("threading", "_register_atexit", fn);
}

/* USER's begin marker, registered at PRE_SHUTDOWN's end (section 8). */
static inline int pyfini__user_marker_register(pyfini__registry *reg);

/* At PRE_SHUTDOWN's end: register USER's begin marker; if that fails (out
   of memory) USER is taken to begin now, so that Python-level atexit
   callbacks are not told PRE_SHUTDOWN: USER registrations made from now on
   (threads still being joined) get RuntimeError instead of running. 0, or
   -1 with the exception of the failure set. */
static inline int pyfini__user_marker_or_phase(pyfini__registry *reg)
{
    if (pyfini__user_marker_register(reg) == 0) {
        return 0;
    }
    pyfini__set_phase(reg, PYFINI_USER);
    return -1;
}

/* A marker callable (self: a PYFINI__MARKER_CAPSULE) was called: `phase`
   has begun. Its registry, or NULL with an exception. */
static inline pyfini__registry *pyfini__marker_hit(PyObject *self, int phase)
{
    pyfini__registry *reg = PYFINI_CAST(pyfini__registry *,
                                        PyCapsule_GetPointer(self, PYFINI__MARKER_CAPSULE));
    if (reg != NULL) {
        pyfini__set_phase(reg, phase);
    }
    return reg;
}

/* The marker: threading._register_atexit() callback registered when the
   registry is made; runs after every pyfini PRE_SHUTDOWN callback (it is
   the oldest). */
PYFINI__UNUSED static PyObject *pyfini__pre_end(PyObject *self, PyObject *unused)
{
    (void)unused;
    pyfini__registry *reg = pyfini__marker_hit(self, PYFINI_PRE_SHUTDOWN);
    if (reg == NULL) {
        return NULL;
    }
    if (pyfini__user_marker_or_phase(reg) < 0) {
        PyErr_WriteUnraisable(NULL);
    }
    Py_RETURN_NONE;
}
PYFINI__UNUSED static PyMethodDef pyfini__pre_end_def = {
    "pyfini_pre_shutdown_ends", pyfini__pre_end, METH_NOARGS,
    "Marks the end of pyfini's PRE_SHUTDOWN phase."};

/* A marker callable: def bound to the registry. New reference, or NULL
   with an exception. */
static inline PyObject *pyfini__marker_new(pyfini__registry *reg, PyMethodDef *def)
{
    PyObject *cap = PYFINI__NEW("marker_new PyCapsule_New",
                                PyCapsule_New(reg, PYFINI__MARKER_CAPSULE, NULL));
    if (cap == NULL) {
        return NULL;
    }
    PyObject *fn = PYFINI__NEW("marker_new PyCFunction_New", PyCFunction_New(def, cap));
    Py_DECREF(cap);
    return fn;
}

/* Module `name` (new reference) if marker `bit` is not in yet and the module
   has been imported (never imported just for a marker; see
   pyfini__imported_module). Else NULL. The caller sets the bit once the
   marker is in: one that could not be registered (out of memory) is
   retried by the next lookup. */
static inline PyObject *pyfini__marker_due(pyfini__registry *reg, int bit, const char *name)
{
    if (reg->sentinel_installed & bit) {
        return NULL;
    }
    return pyfini__imported_module(name);
}

/* Install the PRE_SHUTDOWN marker once `threading` has been imported in the
   interpreter (never imported just for this; see pyfini__imported_module).
   If threading is already shutting down, PRE_SHUTDOWN has begun: the phase
   is set and USER's marker registered at once. */
static inline void pyfini__pre_marker_install(pyfini__registry *reg)
{
    PyObject *threading = pyfini__marker_due(reg, PYFINI__MARKER_PRE, "threading");
    if (threading == NULL) {
        return;
    }
    PyObject *fn = pyfini__marker_new(reg, &pyfini__pre_end_def);
    int rc = fn ? pyfini__call_method(threading, "_register_atexit", fn) : -1;
    Py_XDECREF(fn);
    Py_DECREF(threading);
    if (rc == 0) {
        reg->sentinel_installed |= PYFINI__MARKER_PRE;
        return;
    }
    if (fn != NULL && PyErr_ExceptionMatches(PyExc_RuntimeError)) {
        /* threading is already shutting down: PRE_SHUTDOWN has begun */
        PyErr_Clear();
        reg->sentinel_installed |= PYFINI__MARKER_PRE;
        reg->phase = PYFINI_PRE_SHUTDOWN;
        pyfini__user_marker_or_phase(reg);
        PyErr_Clear();
        return;
    }
    PyErr_Clear();   /* out of memory: retried by the next lookup */
}

/* ======================================================================== */
/* 8. USER                                                                  */
/* ======================================================================== */
/* Trigger: atexit.register(); _PyAtExit_Call() runs the list newest first,
   with the Python-level callbacks in one LIFO order.
   Marker: "USER begins" (pyfini__user_begin) - registered with atexit at
   PRE_SHUTDOWN's end, so it is the newest atexit callback and runs first;
   registered early too (the "tail" marker, once atexit is imported) so it
   runs after every atexit callback registered later.
   Runner: the entry callables of section 9, which also run a USER
   registration that CPython 3.11-3.13 drop (made while atexit runs). */

/* Register fn with atexit; 0, or -1 with an exception. */
static inline int pyfini__user_register(PyObject *fn)
{
    return pyfini__call_module("atexit", "register", fn);
}

/* The marker. */
PYFINI__UNUSED static PyObject *pyfini__user_begin(PyObject *self, PyObject *unused)
{
    (void)unused;
    return pyfini__marker_hit(self, PYFINI_USER) != NULL ? Py_NewRef(Py_None) : NULL;
}
PYFINI__UNUSED static PyMethodDef pyfini__user_begin_def = {
    "pyfini_user_phase_begins", pyfini__user_begin, METH_NOARGS,
    "Marks the start of pyfini's USER phase."};

static inline int pyfini__user_marker_register(pyfini__registry *reg)
{
    PyObject *fn = pyfini__marker_new(reg, &pyfini__user_begin_def);
    if (fn == NULL) {
        return -1;
    }
    int rc = pyfini__user_register(fn);
    Py_DECREF(fn);
    return rc;
}

/* Install USER's tail marker once `atexit` has been imported (not imported
   just for this). */
static inline void pyfini__user_marker_install(pyfini__registry *reg)
{
    PyObject *atexit = pyfini__marker_due(reg, PYFINI__MARKER_USER, "atexit");
    if (atexit == NULL) {
        return;
    }
    Py_DECREF(atexit);
    if (pyfini__user_marker_register(reg) == 0) {
        reg->sentinel_installed |= PYFINI__MARKER_USER;
    } else {
        PyErr_Clear();   /* out of memory: retried by the next lookup */
    }
}

/* Both phase markers, installed when the registry is made and retried on
   later lookups (and registrations) until they are in; only while no phase
   has begun. Never under pyfini's temporary thread state of the main
   interpreter (callers check): threading._main_thread must not be bound to
   a thread state deleted at once (its _shutdown() would fail
   "assert tlock.locked()", seen on 3.12.1). */
static inline void pyfini__install_markers(pyfini__registry *reg)
{
    if (reg->phase != PYFINI_RUNNING) {
        return;
    }
    pyfini__user_marker_install(reg);
    pyfini__pre_marker_install(reg);
}

/* ======================================================================== */
/* 9. PRE_SHUTDOWN and USER callbacks: one Python callable per entry        */
/* ======================================================================== */
/* The runner of both phases: each registration is a PyCFunction whose self
   is a capsule owning the entry, registered with the phase's trigger
   (sections 7, 8). threading/atexit own the callable. */

/* threading or atexit released a callable. */
static inline void pyfini__entry_released(PyObject *capsule)
{
    pyfini__entry *e = PYFINI_CAST(pyfini__entry *,
                                   pyfini__released_pointer(capsule, PYFINI__ENTRY_CAPSULE));
    if (e == NULL) {
        return;
    }
    pyfini__registry *reg = e->registry;
    if (reg != NULL) {
        if (e->state == PYFINI__PENDING) {
            /* threading or atexit dropped a callback without calling it */
            if (e->phase == PYFINI_USER && reg->phase >= PYFINI_PRE_SHUTDOWN &&
                pyfini__state_dict_usable()) {
                /* a USER registration made while atexit was running, which
                   CPython 3.11-3.13 drop in atexit_cleanup(): run it now,
                   still inside the atexit step */
                e->state = PYFINI__RAN;
                pyfini__set_phase(reg, PYFINI_USER);
                pyfini__call_with_gil(e, reg->interp_id);
            } else {
                void *addr;
                memcpy(&addr, &e->func, sizeof addr);
                fprintf(stderr, "pyfini: a %s callback %p of interpreter %lld did not run: %s "
                                "dropped it (registered after its step had run?)\n",
                        pyfini_phase_name(e->phase), addr, (long long)reg->interp_id,
                        e->phase == PYFINI_USER ? "atexit" : "threading");
                fflush(stderr);
            }
        }
        pyfini__unlink(&reg->heads[e->phase], &reg->counts[e->phase], e);
    }
    PYFINI_FREE(e);
}

PYFINI__UNUSED static void pyfini__entry_capsule_destructor(PyObject *capsule)
{
    PYFINI__KEEPING_EXCEPTION(pyfini__entry_released(capsule));
}

/* The callable's body: marks the phase, runs the entry once. */
static PyObject *pyfini__hook_call(PyObject *self, PyObject *unused)
{
    (void)unused;
    pyfini__entry *e = PYFINI_CAST(pyfini__entry *,
                                   PyCapsule_GetPointer(self, PYFINI__ENTRY_CAPSULE));
    if (e == NULL) {
        return NULL;
    }
    pyfini__registry *reg = e->registry;
    if (reg != NULL) {
        pyfini__set_phase(reg, e->phase);
    }
    if (e->state == PYFINI__PENDING) {
        e->state = PYFINI__RAN;
        if (reg != NULL) {
            pyfini__unlink(&reg->heads[e->phase], &reg->counts[e->phase], e);
        }
        pyfini__call_with_gil(e, reg ? reg->interp_id : -1);
    }
    Py_RETURN_NONE;
}

PYFINI__UNUSED static PyMethodDef pyfini__hook_def = {
    "pyfini_callback", pyfini__hook_call, METH_NOARGS,
    "A pyfini exit callback (PRE_SHUTDOWN or USER phase)."};

/* Link entry e (PRE_SHUTDOWN or USER) and register its callable with the
   phase's trigger. 0, or -1 with the last error set; on failure e is freed
   (or left cancelled to its callable) and nothing stays registered. */
static inline int pyfini__entry_add_python(pyfini__registry *reg, pyfini__entry *e)
{
    int phase = e->phase;
    PyObject *cap = PYFINI__NEW("entry_add_python PyCapsule_New",
                                PyCapsule_New(e, PYFINI__ENTRY_CAPSULE,
                                              pyfini__entry_capsule_destructor));
    if (cap == NULL) {
        PYFINI_FREE(e);
        return pyfini__fail_from_exception("cannot register");
    }
    pyfini__push(&reg->heads[phase], &reg->counts[phase], e);
    PyObject *fn = PYFINI__NEW("entry_add_python PyCFunction_New",
                               PyCFunction_New(&pyfini__hook_def, cap));
    if (fn == NULL) {
        /* never registered: the release below frees e and must neither run
           it (a USER entry made during PRE_SHUTDOWN would) nor report it
           as dropped */
        e->state = PYFINI__CANCELLED;
    }
    Py_DECREF(cap);        /* on failure this frees e */
    if (fn == NULL) {
        return pyfini__fail_from_exception("cannot register");
    }
    e->hook = fn;
    int rc = phase == PYFINI_PRE_SHUTDOWN ? pyfini__pre_register(fn) : pyfini__user_register(fn);
    if (rc < 0) {
        e->state = PYFINI__CANCELLED;   /* never ran; must not run from the destructor */
        Py_DECREF(fn);
        return pyfini__fail_from_exception("cannot register");
    }
    Py_DECREF(fn);         /* threading/atexit keeps it */
    pyfini__install_markers(reg);   /* threading or atexit is imported now */
    return 0;
}

/* Cancel entry e (already unlinked and marked cancelled): before
   finalization a USER callable is also dropped from atexit (which frees the
   entry); otherwise it stays registered as a no-op. */
static inline void pyfini__entry_cancel_python(pyfini__registry *reg, pyfini__entry *e)
{
    if (e->phase == PYFINI_USER && reg->phase < PYFINI_PRE_SHUTDOWN &&
        pyfini__call_module("atexit", "unregister", e->hook) < 0) {
        PyErr_Clear();   /* it stays registered as a no-op */
    }
}

/* ======================================================================== */
/* 10. POST_SHUTDOWN                                                        */
/* ======================================================================== */
/* Trigger, in two steps, both in interpreter_clear() (Python/pystate.c):
   1. Py_CLEAR(interp->dict) releases the registry's state-dict capsule:
      pyfini__registry_capsule_destructor plants the finder and the
      POST_SHUTDOWN capsule as the last entries of the builtins dict;
   2. PyDict_Clear(interp->builtins), after the last GC, releases that
      capsule: pyfini__post_capsule_destructor runs the phase.
   Marker: registry->phase, set by the runner (the state-dict clear also
   sets USER and dict_cleared).
   Runner: pyfini__run_post - the callbacks newest first, then the states
   (clear, cycle breaking of tracked types, leak report, free), then the
   registry is freed. */

/* Is heap type `type` held only by its own reference cycles (tp_mro, the
   descriptors in its dict, ...)? A small version of the GC's test, on the
   objects reachable from the type without entering other types or modules:
   every one of them must be referenced only from inside that set (plus the
   caller's one reference to the type). Conservative: 0 when unsure (more
   than PYFINI__ISLAND_MAX objects). */
#define PYFINI__ISLAND_MAX 512
typedef struct pyfini__island {
    PyObject *objs[PYFINI__ISLAND_MAX];
    Py_ssize_t internal[PYFINI__ISLAND_MAX];
    size_t n, cap;
    PyObject *type;
    int overflow;
    int counting;
} pyfini__island;

static inline long pyfini__island_find(pyfini__island *is, PyObject *o)
{
    for (size_t i = 0; i < is->n; i++) {
        if (is->objs[i] == o) {
            return (long)i;
        }
    }
    return -1;
}

/* tp_traverse visitor: first collects the island, then (counting) counts
   the references from inside it. */
static int pyfini__island_visit(PyObject *o, void *arg)
{
    pyfini__island *is = PYFINI_CAST(pyfini__island *, arg);
    if (o == NULL) {
        return 0;
    }
    long at = pyfini__island_find(is, o);
    if (is->counting) {
        if (at >= 0) {
            is->internal[at]++;
        }
        return 0;
    }
    if (at >= 0 || !PyObject_IS_GC(o) || PyModule_Check(o) || (PyType_Check(o) && o != is->type)) {
        return 0;   /* not a container of the type's own, or already in */
    }
    if (is->n == is->cap) {
        is->overflow = 1;
        return 0;
    }
    is->objs[is->n++] = o;
    return 0;
}

/* Visit every object of the island (collecting: while it grows). */
static inline void pyfini__island_traverse(pyfini__island *is)
{
    for (size_t i = 0; i < is->n && !is->overflow; i++) {
        traverseproc tr = Py_TYPE(is->objs[i])->tp_traverse;
        if (tr != NULL) {
            tr(is->objs[i], pyfini__island_visit, is);
        }
    }
}

static inline int pyfini__type_only_self_held(PyObject *type)
{
    /* on the stack (8 KiB on 64-bit): no allocation to fail at POST_SHUTDOWN,
       where a failure would keep the type and report a leak */
    pyfini__island is;
    memset(&is, 0, sizeof is);
    is.cap = PYFINI__ISLAND_MAX;
    is.type = type;
    int only = 0;
    is.objs[is.n++] = type;
    pyfini__island_traverse(&is);   /* collect */
    if (!is.overflow) {
        is.counting = 1;
        pyfini__island_traverse(&is);   /* count references from inside */
        only = 1;
        for (size_t i = 0; i < is.n && only; i++) {
            Py_ssize_t outside = Py_REFCNT(is.objs[i]) - is.internal[i] - (i == 0 ? 1 : 0);
            only = outside == 0;
        }
    }
    return only;
}

#define PYFINI__REPORT_MAX_OBJECTS 20
/* Count the distinct live tracked objects of a state (dropping dead and
   repeated references) and, unless reports are off, report them. */
static inline size_t pyfini__state_report(pyfini__registry *reg, pyfini__state_rec *rec)
{
    /* drop dead and repeated references first: count distinct live objects */
    size_t alive = 0;
    for (size_t i = 0; i < rec->ntracked; i++) {
        PyObject *o = pyfini__weakref_get(rec->tracked[i]);
        int dup = 0;
        for (size_t j = 0; o != NULL && j < alive && !dup; j++) {
            PyObject *p = pyfini__weakref_get(rec->tracked[j]);
            dup = p == o;
            Py_XDECREF(p);
        }
        Py_XDECREF(o);
        if (o == NULL || dup) {
            Py_DECREF(rec->tracked[i]);
        } else {
            rec->tracked[alive++] = rec->tracked[i];
        }
    }
    rec->ntracked = alive;
    if (alive == 0 || !rec->leak_warnings || pyfini__env_is("PYFINI_LEAK_WARNINGS", "0")) {
        return alive;
    }
    fprintf(stderr, "pyfini: leak in interpreter %lld, state \"%s\": %zu tracked object%s "
                    "still alive at POST_SHUTDOWN\n",
            (long long)reg->interp_id, rec->name, alive, alive == 1 ? "" : "s");
    for (size_t i = 0; i < alive && i < PYFINI__REPORT_MAX_OBJECTS; i++) {
        PyObject *o = pyfini__weakref_get(rec->tracked[i]);
        if (o == NULL) {
            continue;
        }
        int is_type = PyType_Check(o);
        fprintf(stderr, "pyfini:  - %s %s at %p, reference count %zd\n",
                is_type ? "type" : Py_TYPE(o)->tp_name,
                is_type ? PYFINI_CAST(PyTypeObject *, o)->tp_name : "object",
                PYFINI_CAST(void *, o), (Py_ssize_t)(Py_REFCNT(o) - 1));
        Py_DECREF(o);
    }
    if (alive > PYFINI__REPORT_MAX_OBJECTS) {
        fprintf(stderr, "pyfini:  - ... and %zu more\n", alive - PYFINI__REPORT_MAX_OBJECTS);
    }
    fprintf(stderr, "pyfini: state \"%s\" is not freed: leaked objects may still use it "
                    "(likely cause: a missing Py_DECREF, or a reference cycle through a C "
                    "object without tp_traverse)\n", rec->name);
    fflush(stderr);
    return alive;
}

/* Run every live state's clear, newest first, with the error indicator set
   aside. */
static inline void pyfini__states_clear(pyfini__registry *reg)
{
    for (pyfini__state_rec *r = reg->state_newest; r != NULL; r = r->older) {
        if (r->status != PYFINI__STATE_ALIVE) {
            continue;
        }
        r->status = PYFINI__STATE_CLEARING;
        if (r->clear != NULL) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            r->clear(r->data);
            if (PyErr_Occurred()) {
                fprintf(stderr, "pyfini: clear of state \"%s\" in interpreter %lld left an "
                                "exception set; cleared\n", r->name, (long long)reg->interp_id);
                PyErr_Clear();
            }
            PyErr_Restore(type, value, tb);
        }
    }
}

/* Heap types cannot die after the last GC (tp_mro holds the type): break
   the cycles of a tracked type that nothing else holds any more - not an
   instance, not another interpreter, not another state. */
static inline void pyfini__states_break_type_cycles(pyfini__registry *reg)
{
    for (pyfini__state_rec *r = reg->state_newest; r != NULL; r = r->older) {
        for (size_t i = 0; i < r->ntracked; i++) {
            PyObject *o = pyfini__weakref_get(r->tracked[i]);
            if (o != NULL && PyType_Check(o) &&
                PyType_HasFeature(PYFINI_CAST(PyTypeObject *, o), Py_TPFLAGS_HEAPTYPE) &&
                Py_TYPE(o)->tp_clear != NULL && pyfini__type_only_self_held(o)) {
                Py_TYPE(o)->tp_clear(o);
            }
            Py_XDECREF(o);
        }
    }
}

/* After the callbacks: clear every state (newest first), break the cycles
   of tracked heap types, report leaks, free. Returns the number of states
   kept because of leaks. */
static inline int pyfini__states_finalize(pyfini__registry *reg)
{
    if (reg->state_newest == NULL) {
        pyfini__epochs_bump(reg);
        return 0;
    }
    pyfini__states_clear(reg);
    pyfini__states_break_type_cycles(reg);
    int kept = 0;
    int abort_on_leak = pyfini__env_is("PYFINI_ABORT_ON_LEAK", "1");
    /* every copy's cached pointers become invalid before anything is freed */
    pyfini__epochs_bump(reg);
    while (reg->state_newest != NULL) {
        pyfini__state_rec *r = reg->state_newest;
        size_t leaked = pyfini__state_report(reg, r);
        r->status = PYFINI__STATE_DEAD;
        pyfini__state_unlink(reg, r);
        pyfini__state_free(r, leaked > 0);
        kept += leaked > 0;
    }
    if (kept > 0 && abort_on_leak) {
        fprintf(stderr, "pyfini: PYFINI_ABORT_ON_LEAK=1: aborting\n");
        fflush(stderr);
        abort();
    }
    return kept;
}

/* Take the finder out of the builtins dict before the registry is freed,
   without allocating (no key string to make: PyDict_Next yields the key
   object; deleting an existing key allocates nothing). Its destructor is
   dropped first, so that even a finder left behind never reads the freed
   registry when the builtins dict is deallocated. */
static inline void pyfini__finder_remove(pyfini__registry *reg)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(reg->builtins, &pos, &key, &value)) {
        if (PyCapsule_IsValid(value, PYFINI__FINDER_CAPSULE) &&
            PyCapsule_GetPointer(value, PYFINI__FINDER_CAPSULE) == PYFINI_CAST(void *, reg)) {
            PyCapsule_SetDestructor(value, NULL);
            Py_INCREF(key);
            if (PyDict_DelItem(reg->builtins, key) < 0) {
                PyErr_Clear();
            }
            Py_DECREF(key);
            return;
        }
    }
}

/* The runner. */
static inline void pyfini__run_post(pyfini__registry *reg)
{
    pyfini__set_phase(reg, PYFINI_POST_SHUTDOWN);
    /* the builtins dict is being emptied: make sure the finder is in it */
    if (reg->finder_armed) {
        pyfini__finder_set(reg, reg->builtins);
    }
    pyfini__entry **head = &reg->heads[PYFINI_POST_SHUTDOWN];
    while (*head != NULL) {
        pyfini__entry *e = *head;
        pyfini__unlink(head, &reg->counts[PYFINI_POST_SHUTDOWN], e);
        e->state = PYFINI__RAN;
        pyfini__call_with_gil(e, reg->interp_id);
        PYFINI_FREE(e);
    }
    pyfini__states_finalize(reg);
    if (reg->finder_armed) {
        reg->finder_armed = 0;
        pyfini__finder_remove(reg);
    }
    pyfini__free_registry(reg);
}

/* Trigger step 2: the builtins dict releases the POST_SHUTDOWN capsule. */
static inline void pyfini__post_released(PyObject *capsule)
{
    pyfini__registry *reg = PYFINI_CAST(
        pyfini__registry *, pyfini__released_pointer(capsule, PYFINI__POST_CAPSULE));
    if (reg != NULL) {
        pyfini__run_post(reg);
    }
}

PYFINI__UNUSED static void pyfini__post_capsule_destructor(PyObject *capsule)
{
    PYFINI__KEEPING_EXCEPTION(pyfini__post_released(capsule));
}

/* Put the POST_SHUTDOWN capsule (new reference `post`, consumed) as the
   last entry of the builtins dict; if that fails its release runs
   POST_SHUTDOWN now. */
static inline void pyfini__post_plant(pyfini__registry *reg, PyObject *builtins, PyObject *post)
{
    if (reg->finder_armed) {
        pyfini__finder_set(reg, builtins);
    }
    /* delete first so that the key is appended: last to be released */
    if (PYFINI__NEG("post_plant PyDict_DelItemString",
                    PyDict_DelItemString(builtins, PYFINI__POST_KEY)) < 0) {
        PyErr_Clear();
    }
    if (pyfini__dict_set(builtins, PYFINI__POST_KEY, post) == 0) {
        Py_DECREF(post);
        return;
    }
    /* the capsule's destructor runs POST_SHUTDOWN now */
    PyErr_Clear();
    fprintf(stderr, "pyfini: interpreter %lld: cannot defer POST_SHUTDOWN past the last "
                    "garbage collection; running it at the state-dict clear\n",
            (long long)reg->interp_id);
    Py_DECREF(post);
}

/* Trigger step 1: the state dict releases the registry's capsule. */
static inline void pyfini__registry_released(PyObject *capsule)
{
    pyfini__registry *reg = PYFINI_CAST(
        pyfini__registry *, pyfini__released_pointer(capsule, PYFINI_REGISTRY_KEY));
    if (reg == NULL) {
        return;
    }
    if (!reg->published) {
        /* lost the race to PyDict_SetDefault(): never used, free at once */
        pyfini__free_registry(reg);
        return;
    }
    reg->dict_cleared = 1;
    pyfini__set_phase(reg, PYFINI_USER);
    /* drop now the weak references of tracked objects that already died:
       CPython 3.11 loses a weak reference object freed after a
       sub-interpreter's last GC (80 bytes each; pinned by tests) */
    for (pyfini__state_rec *r = reg->state_newest; r != NULL; r = r->older) {
        pyfini__track_prune(r);
    }
    PyObject *builtins = reg->builtins;
    PyObject *post = builtins ? PYFINI__NEW("registry_released PyCapsule_New",
                                            PyCapsule_New(reg, PYFINI__POST_CAPSULE,
                                                          pyfini__post_capsule_destructor))
                              : NULL;
    if (post != NULL) {
        pyfini__post_plant(reg, builtins, post);
        return;
    }
    PyErr_Clear();
    fprintf(stderr, "pyfini: interpreter %lld: %s at the state-dict clear; running "
                    "POST_SHUTDOWN early\n", (long long)reg->interp_id,
            builtins ? "out of memory" : "no builtins dict");
    pyfini__run_post(reg);
}

static void pyfini__registry_capsule_destructor(PyObject *capsule)
{
    PYFINI__KEEPING_EXCEPTION(pyfini__registry_released(capsule));
}

/* ======================================================================== */
/* 11. RUNTIME_SHUTDOWN                                                     */
/* ======================================================================== */
/* Trigger: ONE Py_AtExit() slot for the process, shared by all copies
   (call_ll_exitfuncs() in Python/pylifecycle.c runs it at the end of
   Py_FinalizeEx, after every interpreter is gone; no C API, no thread
   state). Marker: root->phase. Runner: pyfini__runtime_run. The list (the
   root) lives in the main interpreter's registry; registrations from a
   sub-interpreter go there under a temporary thread state of the main
   interpreter (pyfini__in_main). */

/* The runner (the Py_AtExit callback). */
PYFINI__UNUSED static void pyfini__runtime_run(void)
{
    pyfini__root *root = PYFINI__COPY.atexit_root;
    PYFINI__COPY.atexit_root = NULL;
    if (root == NULL) {
        return;
    }
    root->phase = PYFINI_RUNTIME_SHUTDOWN;
    PYFINI__COPY.running_root = root;
    /* newest first; a callback may cancel others (they are unlinked and freed) */
    while (root->head != NULL) {
        pyfini__entry *e = root->head;
        pyfini__unlink(&root->head, &root->count, e);
        int rc = e->func(e->arg);
        if (rc != 0) {
            pyfini__report(PYFINI_RUNTIME_SHUTDOWN, -1, e->func, rc, NULL);
        }
        PYFINI_FREE(e);
    }
    PYFINI__COPY.running_root = NULL;
    PYFINI_FREE(root);
}

/* Cancel from inside a RUNTIME_SHUTDOWN callback run by this copy (no
   thread state, no C API): 1 removed, 0 none matched, -1 not possible here
   (not inside this copy's runner). */
static inline int pyfini__runtime_cancel_running(pyfini_callback func, void *arg)
{
    pyfini__root *root = PYFINI__COPY.running_root;
    if (root == NULL) {
        return -1;
    }
    return pyfini__remove(&root->head, &root->count, func, arg);
}

/* The process-wide list, with the main interpreter's GIL held; NULL with an
   exception if the main registry has none (or one this copy cannot read). */
static inline pyfini__root *pyfini__main_root(void)
{
    pyfini__registry *reg = pyfini__registry_get(1);
    if (reg == NULL) {
        return NULL;
    }
    if (reg->root == NULL) {
        pyfini__fail(PyExc_RuntimeError, "RUNTIME_SHUTDOWN: the main interpreter's registry "
                                         "has no process-wide list (made by an older copy?)");
        return NULL;
    }
    if (reg->root->abi_version != PYFINI_ABI_VERSION ||
        !PYFINI__HAS_FIELD(pyfini__root, reg->root, reserved)) {
        char msg[160];
        snprintf(msg, sizeof msg, "RUNTIME_SHUTDOWN: the process-wide list (made by pyfini "
                 "0x%06x) has a layout this copy cannot read",
                 (unsigned)reg->root->creator_version);
        pyfini__fail(PyExc_RuntimeError, msg);
        return NULL;
    }
    return reg->root;
}

/* With the main interpreter's GIL held. */
static inline int pyfini__root_add_locked(pyfini_callback func, void *arg)
{
    pyfini__root *root = pyfini__main_root();
    if (root == NULL) {
        return -1;
    }
    if (root->phase >= PYFINI_RUNTIME_SHUTDOWN) {
        return pyfini__fail(PyExc_RuntimeError, "phase PYFINI_RUNTIME_SHUTDOWN has already begun");
    }
    pyfini__entry *e = pyfini__entry_new(func, arg, PYFINI_RUNTIME_SHUTDOWN);
    if (e == NULL) {
        return -1;
    }
    if (!root->atexit_registered) {
        if (Py_AtExit(pyfini__runtime_run) < 0) {
            PYFINI_FREE(e);
            return pyfini__fail(PyExc_RuntimeError, "RUNTIME_SHUTDOWN: all 32 Py_AtExit slots "
                                                    "of the process are taken");
        }
        root->atexit_registered = 1;
        PYFINI__COPY.atexit_root = root;
    }
    pyfini__push(&root->head, &root->count, e);
    return 0;
}

/* With the main interpreter's GIL held. */
static inline int pyfini__root_cancel_locked(pyfini_callback func, void *arg)
{
    pyfini__root *root = pyfini__main_root();
    if (root == NULL) {
        return -1;
    }
    return pyfini__remove(&root->head, &root->count, func, arg);
}

/* Run fn with the MAIN interpreter's GIL held, from a sub-interpreter: a
   temporary thread state of the main interpreter is attached
   (PyThreadState_New + PyEval_RestoreThread), then the caller's thread state
   is restored. Exceptions raised under the main interpreter are turned into
   RuntimeError in the caller's. */
typedef int (*pyfini__main_fn)(pyfini_callback func, void *arg);

static inline int pyfini__in_main(pyfini__main_fn fn, pyfini_callback func, void *arg)
{
    PyInterpreterState *main_interp = PyInterpreterState_Main();
    if (PyInterpreterState_Get() == main_interp) {
        return fn(func, arg);
    }
    if (pyfini__runtime_finalizing()) {
        return pyfini__fail(PyExc_RuntimeError,
                            "RUNTIME_SHUTDOWN: the runtime is finalizing; the main interpreter "
                            "can no longer be attached from a sub-interpreter");
    }
    PyThreadState *mine = PyEval_SaveThread();
    PyThreadState *ts = PYFINI__QUIET("in_main PyThreadState_New", PyThreadState_New(main_interp));
    if (ts == NULL) {
        PyEval_RestoreThread(mine);
        return pyfini__fail(PyExc_MemoryError, "RUNTIME_SHUTDOWN: cannot create a thread state "
                                               "of the main interpreter");
    }
    PyEval_RestoreThread(ts);
    PYFINI__THREAD.in_temporary_tstate = 1;
    int rc = fn(func, arg);
    PYFINI__THREAD.in_temporary_tstate = 0;
    char msg[PYFINI__ERROR_MAX] = "";
    int nomem = 0;
    if (rc < 0 && PyErr_Occurred()) {
        nomem = PyErr_ExceptionMatches(PyExc_MemoryError);
        pyfini__fail_from_exception("in the main interpreter");
        snprintf(msg, sizeof msg, "%s", PYFINI__THREAD.error_buf + strlen(PYFINI__ERROR_PREFIX));
        PyErr_Clear();
    }
    PyThreadState_Clear(ts);
    PyThreadState_DeleteCurrent();
    PyEval_RestoreThread(mine);
    if (rc < 0) {
        /* out of memory stays a MemoryError (the documented error) */
        return pyfini__fail(nomem ? PyExc_MemoryError : PyExc_RuntimeError,
                            msg[0] ? msg : "RUNTIME_SHUTDOWN: failed in the main interpreter");
    }
    return rc;
}

/* Add or cancel (func, arg) in the process-wide list from any interpreter. */
static inline int pyfini__runtime_add(pyfini__registry *reg, pyfini_callback func, void *arg)
{
    if (reg->root != NULL) {   /* main interpreter: also during its teardown */
        return pyfini__root_add_locked(func, arg);
    }
    return pyfini__in_main(pyfini__root_add_locked, func, arg);
}

static inline int pyfini__runtime_cancel(pyfini__registry *reg, pyfini_callback func, void *arg)
{
    if (reg->root != NULL) {
        return pyfini__root_cancel_locked(func, arg);
    }
    return pyfini__in_main(pyfini__root_cancel_locked, func, arg);
}

/* ======================================================================== */
/* 12. Registration: the registry's add and cancel operations               */
/* ======================================================================== */
/* Stored in the registry by its creator (reg->add, reg->cancel); every copy
   calls the creator's. GIL held; phase is 1..4 (checked by the caller). */

PYFINI__UNUSED static int pyfini__registry_add(pyfini__registry *reg, pyfini_callback func,
                                               void *arg, int phase)
{
    if (phase == PYFINI_RUNTIME_SHUTDOWN) {
        return pyfini__runtime_add(reg, func, arg);
    }
    if (reg->phase >= phase) {
        char msg[160];
        snprintf(msg, sizeof msg, "cannot register for %s in interpreter %lld: phase %s has already begun",
                 pyfini_phase_name(phase), (long long)reg->interp_id,
                 pyfini_phase_name(reg->phase > phase ? reg->phase : phase));
        return pyfini__fail(PyExc_RuntimeError, msg);
    }
    pyfini__entry *e = pyfini__entry_new(func, arg, phase);
    if (e == NULL) {
        return -1;
    }
    e->registry = reg;
    if (phase == PYFINI_POST_SHUTDOWN) {
        pyfini__push(&reg->heads[phase], &reg->counts[phase], e);
        return 0;
    }
    return pyfini__entry_add_python(reg, e);
}

PYFINI__UNUSED static int pyfini__registry_cancel(pyfini__registry *reg, pyfini_callback func,
                                                  void *arg, int phase)
{
    if (phase == PYFINI_RUNTIME_SHUTDOWN) {
        return pyfini__runtime_cancel(reg, func, arg);
    }
    if (phase == PYFINI_POST_SHUTDOWN) {
        return pyfini__remove(&reg->heads[phase], &reg->counts[phase], func, arg);
    }
    pyfini__entry *e = pyfini__find(reg->heads[phase], func, arg);
    if (e == NULL) {
        return 0;
    }
    pyfini__unlink(&reg->heads[phase], &reg->counts[phase], e);
    e->state = PYFINI__CANCELLED;   /* its callable stays with threading/atexit as a no-op */
    pyfini__entry_cancel_python(reg, e);
    return 1;
}

/* ======================================================================== */
/* 13. Per-interpreter state (pyfini_state)                                 */
/* ======================================================================== */
/* Records live in the registry's state table (section 6) and end at
   POST_SHUTDOWN (section 10). Here: the creator's operations stored in the
   registry (state_get, state_track, state_warnings), then the per-thread
   cache of each copy, whose hit path is pyfini__state_access. */

#define PYFINI__INIT_WAIT_NS 100000      /* poll interval while another thread runs an init */
#define PYFINI__TRACKED_FIRST_CAP 16

/* May the caller (one copy) cache a pointer to this interpreter's state?
   Only once its epoch is remembered, so that POST_SHUTDOWN bumps it. */
static inline int pyfini__state_cacheable(pyfini__registry *reg, uint64_t *caller_epoch)
{
    return caller_epoch != NULL && pyfini__epochs_add(reg, caller_epoch) == 0;
}

/* A record in INIT: from its own init, find gets the partly made data and
   get is an error; from another thread, find gets NULL (it never waits:
   tp_traverse may call it) and get waits (*wait = 1). */
static inline void *pyfini__state_initializing(pyfini__state_rec *rec,
                                               const pyfini_state_def *def, int mode, int *wait)
{
    if (rec->init_thread == PyThread_get_thread_ident()) {
        if (mode == PYFINI__FIND) {
            return rec->data;   /* from its own init: partly made */
        }
        char msg[200];
        snprintf(msg, sizeof msg, "state \"%.80s\" asked for again from its own init", def->name);
        pyfini__fail(PyExc_RuntimeError, msg);
        return NULL;
    }
    *wait = mode != PYFINI__FIND;
    return NULL;
}

/* Another thread runs an init with the GIL released: let it run. */
static inline void pyfini__state_wait(void)
{
    Py_BEGIN_ALLOW_THREADS
    struct timespec ts = {0, PYFINI__INIT_WAIT_NS};
    nanosleep(&ts, NULL);
    Py_END_ALLOW_THREADS
}

/* The data of an existing record, by its status; NULL with an exception on
   error, NULL without one where find finds nothing. *wait: see
   pyfini__state_initializing. */
static inline void *pyfini__state_existing(pyfini__registry *reg, pyfini__state_rec *rec,
                                           const pyfini_state_def *def, int mode,
                                           uint64_t *caller_epoch, int *cacheable, int *wait)
{
    char msg[200];
    if (rec->size != def->size) {
        snprintf(msg, sizeof msg, "state \"%.80s\" exists with size %zu, not %zu",
                 def->name, rec->size, def->size);
        pyfini__fail(PyExc_ValueError, msg);
        return NULL;
    }
    switch (rec->status) {
    case PYFINI__STATE_ALIVE:
        *cacheable = pyfini__state_cacheable(reg, caller_epoch);
        return rec->data;
    case PYFINI__STATE_CLEARING:
        return rec->data;
    case PYFINI__STATE_INIT:
        return pyfini__state_initializing(rec, def, mode, wait);
    default:   /* DEAD */
        if (mode == PYFINI__FIND) {
            return NULL;
        }
        snprintf(msg, sizeof msg, "state \"%.80s\" of interpreter %lld was freed at "
                 "POST_SHUTDOWN; it is never re-created", def->name,
                 (long long)reg->interp_id);
        pyfini__fail(PyExc_RuntimeError, msg);
        return NULL;
    }
}

/* A new record for def with zero-filled data, published at once (before
   its init runs: other threads find it and wait); NULL with MemoryError. */
static inline pyfini__state_rec *pyfini__state_new(pyfini__registry *reg,
                                                   const pyfini_state_def *def)
{
    pyfini__state_rec *rec = PYFINI_CAST(pyfini__state_rec *,
                                          PYFINI_CALLOC(1, sizeof(pyfini__state_rec)));
    size_t nlen = strlen(def->name);
    char *name = rec ? PYFINI_CAST(char *, PYFINI_CALLOC(1, nlen + 1)) : NULL;
    void *data = name ? PYFINI_CALLOC(1, def->size ? def->size : 1) : NULL;
    if (data == NULL) {
        if (rec) {
            PYFINI_FREE(name);
            PYFINI_FREE(rec);
        }
        pyfini__fail_nomem();
        return NULL;
    }
    memcpy(name, def->name, nlen);
    rec->name = name;
    rec->size = def->size;
    rec->data = data;
    rec->clear = def->clear;
    rec->leak_warnings = 1;
    rec->status = def->init ? PYFINI__STATE_INIT : PYFINI__STATE_ALIVE;
    rec->init_thread = PyThread_get_thread_ident();
    pyfini__state_link(reg, rec);
    return rec;
}

/* Run def->init on a new record: 0, or -1 with the exception set and the
   record gone. */
static inline int pyfini__state_init(pyfini__registry *reg, pyfini__state_rec *rec,
                                     const pyfini_state_def *def)
{
    int rc = def->init(rec->data);
    if (rc != 0 || PyErr_Occurred()) {
        if (!PyErr_Occurred()) {
            char msg[200];
            snprintf(msg, sizeof msg, "init of state \"%.80s\" failed without an exception",
                     def->name);
            PyErr_SetString(PyExc_SystemError, msg);
        }
        pyfini__fail_from_exception("state init failed");
        pyfini__state_unlink(reg, rec);
        pyfini__state_free(rec, 0);
        return -1;
    }
    rec->status = PYFINI__STATE_ALIVE;
    /* cleared in the reverse order of COMPLETED inits: a state made inside
       this init is cleared after this one */
    pyfini__state_unlink(reg, rec);
    pyfini__state_link(reg, rec);
    return 0;
}

/* Create the state def (get, none exists); its data or NULL with an
   exception. */
static inline void *pyfini__state_create(pyfini__registry *reg, const pyfini_state_def *def,
                                         uint64_t *caller_epoch, int *cacheable)
{
    if (reg->phase >= PYFINI_POST_SHUTDOWN) {
        char msg[200];
        snprintf(msg, sizeof msg, "state \"%.80s\" cannot be created in interpreter %lld: "
                 "POST_SHUTDOWN has begun", def->name, (long long)reg->interp_id);
        pyfini__fail(PyExc_RuntimeError, msg);
        return NULL;
    }
    pyfini__state_rec *rec = pyfini__state_new(reg, def);
    if (rec == NULL) {
        return NULL;
    }
    void *data = rec->data;
    if (def->init != NULL && pyfini__state_init(reg, rec, def) < 0) {
        return NULL;
    }
    *cacheable = pyfini__state_cacheable(reg, caller_epoch);
    return data;
}

/* reg->state_get: the state def of this registry's interpreter (mode
   PYFINI__FIND or PYFINI__GET); *cacheable: the caller may cache it. */
static void *pyfini__state_get_impl(pyfini__registry *reg, const pyfini_state_def *def, int mode,
                                    uint64_t *caller_epoch, int *cacheable)
{
    *cacheable = 0;
    for (;;) {
        pyfini__state_rec *rec = pyfini__state_lookup(reg, def->name);
        if (rec == NULL) {
            return mode == PYFINI__FIND ? NULL
                                        : pyfini__state_create(reg, def, caller_epoch, cacheable);
        }
        int wait = 0;
        void *data = pyfini__state_existing(reg, rec, def, mode, caller_epoch, cacheable, &wait);
        if (!wait) {
            return data;
        }
        pyfini__state_wait();
    }
}

/* reg->state_track (pyfini_track). */
static int pyfini__state_track_impl(pyfini__registry *reg, const pyfini_state_def *def,
                                    PyObject *obj)
{
    pyfini__state_rec *rec = pyfini__state_lookup(reg, def->name);
    if (rec == NULL || (rec->status != PYFINI__STATE_ALIVE && rec->status != PYFINI__STATE_INIT)) {
        char msg[160];
        snprintf(msg, sizeof msg, "pyfini_track: state \"%.80s\" %s", def->name,
                 rec == NULL ? "does not exist in this interpreter" : "is being cleared or freed");
        return pyfini__fail(PyExc_RuntimeError, msg);
    }
    if (PyType_Check(obj) && !PyType_HasFeature(PYFINI_CAST(PyTypeObject *, obj),
                                                Py_TPFLAGS_HEAPTYPE)) {
        return pyfini__fail(PyExc_ValueError, "pyfini_track: a static type never dies; "
                                              "track heap types and instances");
    }
    PyObject *wr = PYFINI__NEW("state_track_impl PyWeakref_NewRef", PyWeakref_NewRef(obj, NULL));
    if (wr == NULL) {
        return pyfini__fail_from_exception("pyfini_track");
    }
    if (rec->ntracked == rec->cap_tracked) {
        pyfini__track_prune(rec);   /* first drop the references whose objects died */
    }
    if (rec->ntracked == rec->cap_tracked &&
        pyfini__grow(PYFINI_CAST(void **, &rec->tracked), &rec->cap_tracked, rec->ntracked,
                     sizeof(PyObject *), PYFINI__TRACKED_FIRST_CAP) < 0) {
        Py_DECREF(wr);
        return pyfini__fail_nomem();
    }
    rec->tracked[rec->ntracked++] = wr;
    return 0;
}

/* reg->state_warnings (pyfini_state_leak_warnings). */
static int pyfini__state_warnings_impl(pyfini__registry *reg, const pyfini_state_def *def,
                                       int enabled)
{
    pyfini__state_rec *rec = pyfini__state_lookup(reg, def->name);
    if (rec == NULL) {
        return pyfini__fail(PyExc_RuntimeError, "pyfini_state_leak_warnings: no such state in "
                                                "this interpreter");
    }
    int prev = rec->leak_warnings;
    rec->leak_warnings = enabled != 0;
    return prev;
}

/* Validate a def; 0 or -1 with an exception. */
static inline int pyfini__def_check(const pyfini_state_def *def)
{
    if (def == NULL || def->name == NULL) {
        return pyfini__fail(PyExc_TypeError, def == NULL ? "pyfini_state_def is NULL"
                                                         : "pyfini_state_def.name is NULL");
    }
    if (def->size == 0 && def->init == NULL) {
        return pyfini__fail(PyExc_ValueError, "pyfini_state_def with size 0 needs an init");
    }
    return 0;
}

/* ---- the exit hooks and the process-wide hit table ------------------------ */

static inline void pyfini__hooked_acquire(void)
{
    while (__atomic_test_and_set(&PYFINI__COPY.hooked_lock, __ATOMIC_ACQUIRE)) {
    }
}

static inline void pyfini__hooked_release(void)
{
    __atomic_clear(&PYFINI__COPY.hooked_lock, __ATOMIC_RELEASE);
}

/* The exit hook (see pyfini__exit_hook_reliable): the interpreter ends, so
   every entry this copy filled for it (and, harmlessly, for others) goes. */
static void pyfini__end_hook(void *data)
{
    pyfini__hooked *node = PYFINI_CAST(pyfini__hooked *, data);
    __atomic_add_fetch(&PYFINI__COPY.epoch, 1, __ATOMIC_SEQ_CST);
    pyfini__hooked_acquire();
    for (pyfini__hooked **p = &PYFINI__COPY.hooked_list; *p != NULL; p = &(*p)->next) {
        if (*p == node) {
            *p = node->next;
            break;
        }
    }
    pyfini__hooked_release();
    PYFINI_FREE(node);
}

/* 1 if the end of interp (the current interpreter) bumps PYFINI__COPY.epoch
   through this copy's exit hook, registering it if needed; 0 if it cannot
   (no reliable hook on this CPython, out of memory, or too late: once
   finalize_modules() began, _PyAtExit_Fini() may already have run). The
   spin lock is held only around list links (no call under it), so a fork
   handler can take it (pyfini__fork_safe). The hook is registered before
   its node is linked: the interpreter cannot end in between, its thread
   runs here. */
static inline int pyfini__end_hooked(PyInterpreterState *interp)
{
    if (!pyfini__exit_hook_reliable() || !pyfini__state_dict_usable()) {
        return 0;
    }
    /* this CPython's exit hook is reliable: no hit needs the ID (never
       set back: on this runtime every entry is filled under a hook) */
    __atomic_store_n(&PYFINI__COPY.hits_need_id, 0, __ATOMIC_RELAXED);
    int hooked = 0;
    pyfini__hooked_acquire();
    for (pyfini__hooked *n = PYFINI__COPY.hooked_list; n != NULL && !hooked; n = n->next) {
        hooked = n->interp == interp;   /* a node lives exactly as long as its interpreter */
    }
    pyfini__hooked_release();
    if (hooked) {
        return 1;
    }
    pyfini__hooked *node = PYFINI_CAST(pyfini__hooked *, PYFINI_CALLOC(1, sizeof(pyfini__hooked)));
    if (node == NULL) {
        return 0;
    }
    node->interp = interp;
    if (pyfini__exit_hook_add(interp, pyfini__end_hook, node) != 0) {
        PYFINI_FREE(node);
        PyErr_Clear();
        return 0;
    }
    pyfini__hooked_acquire();
    node->next = PYFINI__COPY.hooked_list;
    PYFINI__COPY.hooked_list = node;
    pyfini__hooked_release();
    return 1;
}

/* Where no reliable exit hook exists (3.11, 3.12, 3.13.0-3.13.1), the C
   audit hook, which is process-wide and which CPython calls whatever
   leaked: interpreter_clear() (Python/pystate.c) raises
   "cpython.PyInterpreterState_Clear" for every interpreter it clears (a
   sub-interpreter in Py_EndInterpreter, the main one in Py_FinalizeEx, the
   others in a fork child), after finalize_modules() and so after atexit;
   then Py_FinalizeEx raises "cpython._PySys_ClearAuditHooks" and removes
   every C hook (_PySys_ClearAuditHooks(), Python/sysmodule.c). The hook only
   compares the event name: no Python API, no allocation, no lock. The event
   of an earlier C hook that fails (returns -1) is not passed on to later
   ones (sys_audit_tstate()): such a hook, added before pyfini's, hides
   these events. Pinned by tests/test_state.c
   (test_pin_PyInterpreterState_Clear_audit_event_whatever_leaked). */
#ifndef PYFINI_NO_AUDIT_HOOK
#define PYFINI__AUDIT_PROBE "pyfini.audit_hook_probe"

static int pyfini__audit_hook(const char *event, PyObject *args, void *data)
{
    (void)args;
    (void)data;
    if (event[0] == 'c' && strncmp(event, "cpython.", 8) == 0) {
        if (strcmp(event + 8, "PyInterpreterState_Clear") == 0) {
            if (pyfini__runtime_finalizing()) {
                /* Py_FinalizeEx: this hook is removed soon, and an earlier
                   C hook that fails on "cpython._PySys_ClearAuditHooks"
                   would hide that event from it: hits check the ID from
                   here until the next fill after Py_Initialize adds it again */
                __atomic_store_n(&PYFINI__COPY.hits_need_id, 1, __ATOMIC_SEQ_CST);
                __atomic_store_n(&PYFINI__COPY.audit_state, PYFINI__AUDIT_NONE, __ATOMIC_RELEASE);
            }
            __atomic_add_fetch(&PYFINI__COPY.epoch, 1, __ATOMIC_SEQ_CST);
        } else if (strcmp(event + 8, "_PySys_ClearAuditHooks") == 0) {
            /* this hook is removed next: hits check the ID again until the
               next fill after Py_Initialize adds it again */
            __atomic_store_n(&PYFINI__COPY.hits_need_id, 1, __ATOMIC_SEQ_CST);
            __atomic_add_fetch(&PYFINI__COPY.epoch, 1, __ATOMIC_SEQ_CST);
            __atomic_store_n(&PYFINI__COPY.audit_state, PYFINI__AUDIT_NONE, __ATOMIC_RELEASE);
        }
    } else if (event[0] == 'p' && strcmp(event, PYFINI__AUDIT_PROBE) == 0) {
        __atomic_store_n(&PYFINI__COPY.audit_probe_seen, 1, __ATOMIC_RELAXED);
    }
    return 0;
}
#endif

/* Add this copy's audit hook once per runtime initialization (GIL held, no
   exception set); 1 if it is in place. PySys_AddAuditHook() returns 0
   WITHOUT adding it when an existing hook vetoes "sys.addaudithook" with a
   RuntimeError, so the hook counts only once it saw a probe event
   (PySys_Audit) - any copy's probe proves this copy's hook is in the list.
   Once it counts, the epoch is bumped first (entries filled while no hook
   watched, e.g. by another thread meanwhile, miss), then hits skip the ID
   check (release: a hit reads PYFINI__COPY.hits_need_id before the epoch). A
   refusal is final: the ID check stays. With PYFINI_NO_AUDIT_HOOK: 0. */
static inline int pyfini__audit_hooked(void)
{
#ifdef PYFINI_NO_AUDIT_HOOK
    return 0;
#else
    int s = __atomic_load_n(&PYFINI__COPY.audit_state, __ATOMIC_ACQUIRE);
    if (s != PYFINI__AUDIT_NONE ||
        !__atomic_compare_exchange_n(&PYFINI__COPY.audit_state, &s, PYFINI__AUDIT_ADDING, 0,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        return s == PYFINI__AUDIT_ON;
    }
    __atomic_store_n(&PYFINI__COPY.audit_probe_seen, 0, __ATOMIC_RELAXED);
    /* Python audit hooks run in both calls and may release the GIL */
    if (PySys_AddAuditHook(pyfini__audit_hook, NULL) == 0) {
        (void)PySys_Audit(PYFINI__AUDIT_PROBE, NULL);
    }
    PyErr_Clear();
    int on = __atomic_load_n(&PYFINI__COPY.audit_probe_seen, __ATOMIC_RELAXED);
    if (on) {
        __atomic_add_fetch(&PYFINI__COPY.epoch, 1, __ATOMIC_SEQ_CST);
        __atomic_store_n(&PYFINI__COPY.hits_need_id, 0, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&PYFINI__COPY.audit_state, on ? PYFINI__AUDIT_ON : PYFINI__AUDIT_REFUSED,
                     __ATOMIC_RELEASE);
    return on;
#endif
}

/* May the hit table get an entry for interp (the current interpreter) now?
   With a reliable exit hook, only under it (pyfini__end_hooked). Elsewhere
   the audit hook is added first (pyfini__audit_hooked; hits skip the ID
   check once it is in place, else they check it), and then only while
   sys.modules is a dict: the interpreter's "cpython.PyInterpreterState_Clear"
   comes after finalize_modules() replaced it with None, so no entry is
   filled for an interpreter whose event has passed - also from a registry
   made after atexit (whose phase is still below USER). */
static inline int pyfini__hit_guarded(PyInterpreterState *interp)
{
    if (pyfini__exit_hook_reliable()) {
        return pyfini__end_hooked(interp);
    }
    if (!pyfini__state_dict_usable()) {
        return 0;   /* and no hook is added during finalization */
    }
    (void)pyfini__audit_hooked();
    return 1;
}

/* ---- fork ------------------------------------------------------------------ */

/* A child forked while another thread held PYFINI__COPY.hooked_lock would spin
   forever when an interpreter's exit hook runs in it (PyOS_AfterFork_Child()
   -> _PyInterpreterState_DeleteExceptMain() -> PyInterpreterState_Clear()
   runs every sub-interpreter's PyUnstable_AtExit callbacks), and an entry a
   writer held odd at the fork would miss forever. So fork() takes the lock
   first (the holder only links a node, no call), and the child, the only
   thread left, releases it and evens out the entries of vanished writers
   (emptied: their other fields may be half written). A reader never
   blocks, so nothing else can freeze. glibc drops the handlers when the
   shared object that registered them is unloaded (__dso_handle). */
static void pyfini__fork_prepare(void)
{
    pyfini__hooked_acquire();
}

static void pyfini__fork_parent(void)
{
    pyfini__hooked_release();
}

static void pyfini__fork_child(void)
{
    for (unsigned i = 0; i < PYFINI__HITS; i++) {
        pyfini__hit_entry *e = &PYFINI__COPY.hits[i];
        uint64_t seq = __atomic_load_n(&e->seq, __ATOMIC_RELAXED);
        if ((seq & 1) != 0) {
            PyInterpreterState *no_interp = NULL;
            const pyfini_state_def *no_def = NULL;
            __atomic_store_n(&e->interp, no_interp, __ATOMIC_RELAXED);
            __atomic_store_n(&e->def, no_def, __ATOMIC_RELAXED);
            __atomic_store_n(&e->seq, seq + 1, __ATOMIC_RELEASE);
        }
    }
    if (__atomic_load_n(&PYFINI__COPY.audit_state, __ATOMIC_RELAXED) == PYFINI__AUDIT_ADDING) {
        /* the adding thread is gone: the next fill tries again (a second
           hook of this copy only costs its call) */
        __atomic_store_n(&PYFINI__COPY.audit_state, PYFINI__AUDIT_NONE, __ATOMIC_RELAXED);
    }
    pyfini__hooked_release();
}

/* 1 once this copy's fork handlers are registered (the hit table and the
   exit hooks are used only then); 0 while another thread registers them or
   if pthread_atfork() failed (lookups then go through the per-thread
   cache). Never blocks. */
static inline int pyfini__fork_safe(void)
{
    int s = __atomic_load_n(&PYFINI__COPY.atfork_state, __ATOMIC_ACQUIRE);
    if (s == 0) {
        if (__atomic_compare_exchange_n(&PYFINI__COPY.atfork_state, &s, 2, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            s = pthread_atfork(pyfini__fork_prepare, pyfini__fork_parent, pyfini__fork_child) == 0
                    ? 1 : -1;
            __atomic_store_n(&PYFINI__COPY.atfork_state, s, __ATOMIC_RELEASE);
        }
    }
    return s == 1;
}

/* The hit-table entry of (def, interp): Fibonacci hashing of the def's
   number (its address in defs: sizeof is a power of two, so a shift) plus
   the interpreter's address in 16-byte units, the top bits of the product.
   Defs side by side (an array, or static ones next to each other) get
   entries far apart, and the interpreters' defs do not fall on each other
   in blocks. Two earlier indexes missed on every lookup in bench_state:
   the def's address in words (an array of defs used 8 entries of 32, a
   ninth def took one of theirs), and the def's number XOR the interpreter's
   page (each interpreter's defs took an aligned block of 8 entries, and two
   own-GIL interpreters' blocks met). */
static inline unsigned pyfini__hit_index(const pyfini_state_def *def,
                                         const PyInterpreterState *interp)
{
    uint64_t key = (uint64_t)((uintptr_t)def / sizeof(pyfini_state_def)) +
                   (uint64_t)((uintptr_t)interp >> 4);
    return (unsigned)((key * UINT64_C(0x9E3779B97F4A7C15)) >> (64 - PYFINI__HITS_BITS));
}

/* The second entry that may hold the pair of entry i. */
#define PYFINI__HIT_WAY2(i) ((i) ^ (PYFINI__HITS / 2))

/* 1 if entry e holds no current pair but (def, interp)'s: empty, filled at
   an older epoch, or (def, interp) already. A racy read: only where to
   write is chosen from it, the write itself is under the entry's lock. */
static inline int pyfini__hit_free(const pyfini__hit_entry *e, const pyfini_state_def *def,
                                   const PyInterpreterState *interp, uint64_t epoch_now)
{
    const pyfini_state_def *d = __atomic_load_n(&e->def, __ATOMIC_RELAXED);
    return d == NULL || __atomic_load_n(&e->epoch, __ATOMIC_RELAXED) != epoch_now ||
           (d == def && __atomic_load_n(&e->interp, __ATOMIC_RELAXED) == interp);
}

/* Fill an entry with (def, interp) (seqlock writer): the first of its two
   entries that holds no current pair, else, with evict, the second (the
   first stays with whoever came first; a third pair on both takes turns
   in the second), else nothing. Skipped if another thread is filling it.
   `epoch`: PYFINI__COPY.epoch read before data was found; interp_id:
   PyInterpreterState_GetID(interp). */
static inline void pyfini__hit_fill(const pyfini_state_def *def, PyInterpreterState *interp,
                                    uint64_t epoch, void *data, int64_t interp_id, int evict)
{
    unsigned i = pyfini__hit_index(def, interp);
    uint64_t now = __atomic_load_n(&PYFINI__COPY.epoch, __ATOMIC_ACQUIRE);
    pyfini__hit_entry *e = &PYFINI__COPY.hits[i];
    if (!pyfini__hit_free(e, def, interp, now)) {
        e = &PYFINI__COPY.hits[PYFINI__HIT_WAY2(i)];
        if (!evict && !pyfini__hit_free(e, def, interp, now)) {
            return;
        }
    }
    uint64_t seq = __atomic_load_n(&e->seq, __ATOMIC_RELAXED);
    if ((seq & 1) != 0 || !__atomic_compare_exchange_n(&e->seq, &seq, seq + 1, 0,
                                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        return;
    }
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&e->def, def, __ATOMIC_RELAXED);
    __atomic_store_n(&e->interp, interp, __ATOMIC_RELAXED);
    __atomic_store_n(&e->epoch, epoch, __ATOMIC_RELAXED);
    __atomic_store_n(&e->name, def->name, __ATOMIC_RELAXED);
    __atomic_store_n(&e->size, def->size, __ATOMIC_RELAXED);
    __atomic_store_n(&e->data, data, __ATOMIC_RELAXED);
    __atomic_store_n(&e->interp_id, interp_id, __ATOMIC_RELAXED);
    __atomic_store_n(&e->seq, seq + 2, __ATOMIC_RELEASE);
}

/* The seqlock reader of entry e for (def, interp) at the current epoch
   (the interpreter ID too where PYFINI__COPY.hits_need_id): 1 and *data, or 0.
   The hit in pyfini__state_access is this, inline, for the first entry. */
static inline int pyfini__hit_probe(const pyfini__hit_entry *e, const pyfini_state_def *def,
                                    PyInterpreterState *interp, void **data)
{
    uint64_t seq = __atomic_load_n(&e->seq, __ATOMIC_ACQUIRE);
    int need_id = __atomic_load_n(&PYFINI__COPY.hits_need_id, __ATOMIC_ACQUIRE);
    if ((seq & 1) != 0 || __atomic_load_n(&e->def, __ATOMIC_RELAXED) != def ||
        __atomic_load_n(&e->interp, __ATOMIC_RELAXED) != interp ||
        __atomic_load_n(&e->epoch, __ATOMIC_RELAXED) !=
            __atomic_load_n(&PYFINI__COPY.epoch, __ATOMIC_RELAXED) ||
        __atomic_load_n(&e->name, __ATOMIC_RELAXED) != def->name ||
        __atomic_load_n(&e->size, __ATOMIC_RELAXED) != def->size) {
        return 0;
    }
    void *d = __atomic_load_n(&e->data, __ATOMIC_RELAXED);
    int64_t id = __atomic_load_n(&e->interp_id, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (seq != __atomic_load_n(&e->seq, __ATOMIC_RELAXED) ||
        (need_id && id != PyInterpreterState_GetID(interp))) {
        return 0;
    }
    *data = d;
    return 1;
}

/* ---- the per-thread cache and the lookup ----------------------------------- */

/* Look def up through the registry (creating it for mode PYFINI__GET) and
   fill this thread's cache slot (and the hit table, where the interpreter's
   end is hooked) on success. */
static inline void *pyfini__state_slow(const pyfini_state_def *def, int mode,
                                       PyInterpreterState *interp, uint64_t epoch)
{
    if (pyfini__def_check(def) < 0) {
        return NULL;
    }
    pyfini__registry *reg = pyfini__registry_get(mode);
    if (reg == NULL) {
        return NULL;   /* find: no registry, no exception; get: exception set */
    }
    if (reg->state_get == NULL) {
        pyfini__fail(PyExc_RuntimeError, "the interpreter's pyfini registry has no states");
        return NULL;
    }
    int cacheable = 0;
    void *data = reg->state_get(reg, def, mode, &PYFINI__COPY.epoch, &cacheable);
    if (data != NULL && cacheable) {
        /* one slot per (def, interpreter): a stale one (another interpreter
           ID) is replaced, else the oldest */
        pyfini__cache_slot *c = NULL;
        for (unsigned i = 0; i < PYFINI__CACHE_SLOTS && c == NULL; i++) {
            if (PYFINI__THREAD.cache[i].def == def && PYFINI__THREAD.cache[i].interp == interp) {
                c = &PYFINI__THREAD.cache[i];
            }
        }
        if (c == NULL) {
            c = &PYFINI__THREAD.cache[PYFINI__THREAD.cache_next++ % PYFINI__CACHE_SLOTS];
        }
        c->interp = interp;
        c->interp_id = PyInterpreterState_GetID(interp);
        c->epoch = epoch;
        c->def = def;
        c->name = def->name;
        c->size = def->size;
        c->data = data;
        /* only where the interpreter's end bumps the epoch (exit hook or
           audit hook) or hits check the ID (PYFINI__COPY.hits_need_id); the slot
           remembers it, so that a lookup that finds the pair in it while
           the epoch stays the same may fill the table later (the pair's
           entries were taken, or a fill was skipped) */
        c->fillable = reg->phase < PYFINI_USER && pyfini__fork_safe() &&
                      pyfini__hit_guarded(interp);
        if (c->fillable) {
            pyfini__hit_fill(def, interp, epoch, data, c->interp_id, 1);
        }
    }
    return data;
}

/* The miss path of the hit table: no thread state, this thread's cache
   (checked with the interpreter ID), then the registry. Kept out of line so
   that a hit is a few loads in the caller. A pending exception (e.g. in
   tp_dealloc) is kept aside. */
static PYFINI__NOINLINE void *pyfini__state_miss(const pyfini_state_def *def, int mode,
                                                 PyThreadState *ts)
{
    if (ts == NULL) {
        pyfini__fail(NULL, PYFINI__NO_TSTATE);
        return NULL;
    }
    uint64_t epoch = __atomic_load_n(&PYFINI__COPY.epoch, __ATOMIC_ACQUIRE);
    PyInterpreterState *interp = ts->interp;
    if (def != NULL) {
        /* the pair's second entry in the hit table */
        void *hit;
        unsigned way2 = PYFINI__HIT_WAY2(pyfini__hit_index(def, interp));
        if (pyfini__hit_probe(&PYFINI__COPY.hits[way2], def, interp, &hit)) {
            return hit;
        }
        /* A new interpreter at an ended one's address never hits here: its
           ID differs, and the epoch changes whenever an interpreter whose
           states this copy cached reaches POST_SHUTDOWN (which also covers
           Py_FinalizeEx + Py_Initialize, when IDs start again at 0). One
           that ended without POST_SHUTDOWN (a leak kept pyfini's registry
           alive) is covered by the ID within one initialization, and across
           Py_FinalizeEx + Py_Initialize by the epoch bump when its builtins
           dict is deallocated (pyfini__finder_destructor). */
        const pyfini__cache_slot *cache = PYFINI__THREAD.cache;
        for (unsigned i = 0; i < PYFINI__CACHE_SLOTS; i++) {
            const pyfini__cache_slot *c = &cache[i];
            if (c->def == def && c->interp == interp && c->epoch == epoch &&
                c->name == def->name && c->size == def->size) {
                if (c->interp_id == PyInterpreterState_GetID(interp)) {
                    if (c->fillable) {   /* into an entry no current pair holds */
                        pyfini__hit_fill(def, interp, epoch, c->data, c->interp_id, 0);
                    }
                    return c->data;
                }
                break;   /* at most one slot per (def, interpreter) */
            }
        }
    }
    PyObject *etype, *evalue, *etb;
    PyErr_Fetch(&etype, &evalue, &etb);
    void *data = pyfini__state_slow(def, mode, interp, epoch);
    if (data == NULL && mode == PYFINI__FIND && PyErr_ExceptionMatches(PyExc_MemoryError)) {
        /* find never raises but for a bad def (tp_traverse may call it): out
           of memory is "not found", pyfini_last_error() says why */
        pyfini__fail(NULL, "pyfini_state_find: out of memory looking up the registry");
        PyErr_Clear();
    }
    if (data != NULL || !PyErr_Occurred()) {
        PyErr_Restore(etype, evalue, etb);
    } else {
        Py_XDECREF(etype);   /* pyfini's own error replaces it */
        Py_XDECREF(evalue);
        Py_XDECREF(etb);
    }
    return data;
}

/* A hit where the exit hook cannot be relied on (PYFINI__COPY.hits_need_id):
   also the interpreter ID, which is never reused within one initialization
   (across Py_FinalizeEx + Py_Initialize the epoch covers it, see
   pyfini__state_miss). Out of line: the hit itself spills nothing. */
static PYFINI__NOINLINE void *pyfini__hit_id_checked(const pyfini_state_def *def, int mode,
                                                     PyThreadState *ts,
                                                     const pyfini__hit_entry *e, uint64_t seq,
                                                     void *data)
{
    int64_t id = __atomic_load_n(&e->interp_id, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (seq == __atomic_load_n(&e->seq, __ATOMIC_RELAXED) &&
        id == PyInterpreterState_GetID(ts->interp)) {
        return data;
    }
    return pyfini__state_miss(def, mode, ts);
}

static PYFINI__ALWAYS_INLINE void *pyfini__state_access(const pyfini_state_def *def, int mode)
{
    /* the hit: the process-wide table, no lock, no thread-local, no call
       but CPython's thread-state fetch. The interpreter is read from the
       (non-limited API) thread-state struct. A new interpreter at an ended
       one's address never hits: entries are filled only for interpreters
       whose end bumps the epoch through the exit or audit hook, whatever
       leaked (pyfini__hit_guarded), or their hits also check the interpreter ID
       (pyfini__hit_id_checked); POST_SHUTDOWN bumps the epoch too. An
       empty entry has interp NULL, never a thread state's. */
    PyThreadState *ts = pyfini__tstate();
    if (ts != NULL) {
        PyInterpreterState *interp = ts->interp;
        const pyfini__hit_entry *e = &PYFINI__COPY.hits[pyfini__hit_index(def, interp)];
        /* seqlock reader: a compare that fails on a torn read only misses;
           one that passes is confirmed by the second read of seq */
        uint64_t seq = __atomic_load_n(&e->seq, __ATOMIC_ACQUIRE);
        /* before the epoch: pyfini__audit_hooked bumps it, then clears this */
        int need_id = __atomic_load_n(&PYFINI__COPY.hits_need_id, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&e->def, __ATOMIC_RELAXED) == def &&
            __atomic_load_n(&e->interp, __ATOMIC_RELAXED) == interp &&
            __atomic_load_n(&e->epoch, __ATOMIC_RELAXED) ==
                __atomic_load_n(&PYFINI__COPY.epoch, __ATOMIC_RELAXED) &&
            __atomic_load_n(&e->name, __ATOMIC_RELAXED) == def->name &&
            __atomic_load_n(&e->size, __ATOMIC_RELAXED) == def->size) {
            void *data = __atomic_load_n(&e->data, __ATOMIC_RELAXED);
            __atomic_thread_fence(__ATOMIC_ACQUIRE);
            if ((seq & 1) == 0 && seq == __atomic_load_n(&e->seq, __ATOMIC_RELAXED)) {
                if (PYFINI__UNLIKELY(need_id)) {
                    return pyfini__hit_id_checked(def, mode, ts, e, seq, data);
                }
                return data;
            }
        }
    }
    return pyfini__state_miss(def, mode, ts);
}

/* The operations this copy stores in the registries it creates. */
static inline void pyfini__registry_set_ops(pyfini__registry *reg)
{
    reg->add = pyfini__registry_add;
    reg->cancel = pyfini__registry_cancel;
    reg->state_get = pyfini__state_get_impl;
    reg->state_track = pyfini__state_track_impl;
    reg->state_warnings = pyfini__state_warnings_impl;
}

/* ======================================================================== */
/* 14. Public definitions                                                   */
/* ======================================================================== */

PYFINI_FUNC const char *pyfini_last_error(void) { return PYFINI__THREAD.error_msg; }

PYFINI_FUNC const char *pyfini_phase_name(int phase)
{
    switch (phase) {
    case PYFINI_RUNNING: return "PYFINI_RUNNING";
    case PYFINI_PRE_SHUTDOWN: return "PYFINI_PRE_SHUTDOWN";
    case PYFINI_USER: return "PYFINI_USER";
    case PYFINI_POST_SHUTDOWN: return "PYFINI_POST_SHUTDOWN";
    case PYFINI_RUNTIME_SHUTDOWN: return "PYFINI_RUNTIME_SHUTDOWN";
    default: return "PYFINI_UNKNOWN_PHASE";
    }
}

PYFINI__HIT_FUNC void *pyfini_state(const pyfini_state_def *def)
{
    return pyfini__state_access(def, PYFINI__GET);
}

PYFINI__HIT_FUNC void *pyfini_state_find(const pyfini_state_def *def)
{
    return pyfini__state_access(def, PYFINI__FIND);
}

/* The checks of a call about an existing state: a thread state, a valid
   def. 0, or -1 (with an exception where one can be set). */
static inline int pyfini__state_call_check(const pyfini_state_def *def)
{
    if (pyfini__tstate() == NULL) {
        return pyfini__fail(NULL, PYFINI__NO_TSTATE);
    }
    return pyfini__def_check(def);
}

/* The registry of a call about an existing state (`who`: the public
   function), or NULL with an exception: RuntimeError if none exists. */
static inline pyfini__registry *pyfini__state_registry(const char *who)
{
    pyfini__registry *reg = pyfini__registry_get(0);
    if (reg == NULL && !PyErr_Occurred()) {
        char msg[120];
        snprintf(msg, sizeof msg, "%s: no pyfini state exists in this interpreter", who);
        pyfini__fail(PyExc_RuntimeError, msg);
    }
    return reg;
}

PYFINI_FUNC int pyfini_track(const pyfini_state_def *def, PyObject *obj)
{
    if (pyfini__state_call_check(def) < 0) {
        return -1;
    }
    if (obj == NULL) {
        return pyfini__fail(PyExc_TypeError, "pyfini_track: obj is NULL");
    }
    pyfini__registry *reg = pyfini__state_registry("pyfini_track");
    return reg ? reg->state_track(reg, def, obj) : -1;
}

PYFINI_FUNC int pyfini_state_leak_warnings(const pyfini_state_def *def, int enabled)
{
    if (pyfini__state_call_check(def) < 0) {
        return -1;
    }
    pyfini__registry *reg = pyfini__state_registry("pyfini_state_leak_warnings");
    return reg ? reg->state_warnings(reg, def, enabled) : -1;
}

/* The checks every registration call starts with; 0, or -1. */
static inline int pyfini__check_args(pyfini_callback func, int phase, PyThreadState **ts)
{
    *ts = pyfini__tstate();
    if (*ts == NULL) {
        return pyfini__fail(NULL, PYFINI__NO_TSTATE "; nothing was done");
    }
    if (PyErr_Occurred()) {
        /* CPython's rule: no C API call with an exception set. Left as is. */
        return pyfini__fail(NULL, "called with an exception set; nothing was done");
    }
    if (func == NULL) {
        return pyfini__fail(PyExc_TypeError, "the callback is NULL");
    }
    if (phase < PYFINI_PRE_SHUTDOWN || phase > PYFINI_RUNTIME_SHUTDOWN) {
        char msg[80];
        snprintf(msg, sizeof msg, "unknown phase %d (expected 1 to 4)", phase);
        return pyfini__fail(PyExc_ValueError, msg);
    }
    return 0;
}

PYFINI_FUNC int pyfini_atexit(pyfini_callback func, void *arg, pyfini_phase phase)
{
    PyThreadState *ts;
    if (pyfini__check_args(func, (int)phase, &ts) < 0) {
        return -1;
    }
    pyfini__registry *reg = pyfini__registry_get(1);
    if (reg == NULL) {
        return -1;
    }
    int rc = reg->add(reg, func, arg, (int)phase);
    if (rc < 0 && PyErr_Occurred()) {
        pyfini__fail_from_exception("pyfini_atexit");   /* the registry may be another copy's */
    }
    return rc;
}

PYFINI_FUNC int pyfini_atexit_cancel(pyfini_callback func, void *arg, pyfini_phase phase)
{
    PyThreadState *ts;
    if (phase == PYFINI_RUNTIME_SHUTDOWN && PYFINI__COPY.running_root != NULL && func != NULL &&
        pyfini__tstate() == NULL) {
        /* from a RUNTIME_SHUTDOWN callback run by this copy: no C API needed */
        return pyfini__runtime_cancel_running(func, arg);
    }
    if (pyfini__check_args(func, (int)phase, &ts) < 0) {
        return -1;
    }
    pyfini__registry *reg = pyfini__registry_get(0);
    if (reg == NULL) {
        if (PyErr_Occurred()) {
            return -1;
        }
        if (phase != PYFINI_RUNTIME_SHUTDOWN) {
            return 0;   /* nothing was ever registered here */
        }
        reg = pyfini__registry_get(1);
        if (reg == NULL) {
            return -1;
        }
    }
    int rc = reg->cancel(reg, func, arg, (int)phase);
    if (rc < 0 && PyErr_Occurred()) {
        pyfini__fail_from_exception("pyfini_atexit_cancel");
    }
    return rc;
}

PYFINI_FUNC int pyfini_current_phase(void)
{
    if (pyfini__tstate() == NULL) {
        return pyfini__fail(NULL, "no thread state");
    }
    pyfini__registry *reg = pyfini__registry_get(1);
    return reg ? reg->phase : -1;
}

#endif /* PYFINI_DECLS_ONLY */

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* PYFINI_H */
