/* pyfini_pybind11.h - pybind11 modules that lose nothing when an interpreter ends.
 *
 * C++17, header-only, on top of pyfini.h and pybind11 3.1 (checked below).
 *
 *     #include <pybind11/pybind11.h>
 *     #include "pyfini_pybind11.h"
 *     PYBIND11_MODULE(mymod, m, py::multiple_interpreters::per_interpreter_gil()) {
 *         pyfini_pybind11::attach();          // first statement of the body
 *         ...
 *     }
 *
 * What pybind11 3.1 does at an interpreter's end (read in its headers, each
 * fact pinned by tests/pybind11/test_pybind11.cpp, which names it):
 *  - detail/internals.h: the shared `internals` and each shared object's
 *    `local_internals` live in capsules of the interpreter state dict whose
 *    payload is a `new std::unique_ptr<...>` and whose destructor is NULL
 *    ("intentionally leaked"). They hold strong references that nothing
 *    releases: internals::instance_base, ::static_property_type,
 *    ::default_metaclass, local_internals::function_record_py_type. One live
 *    object keeps an own-obmalloc interpreter's arenas from being freed:
 *    about 1.7 MB per ended interpreter.
 *  - detail/class.h: pybind11_meta_dealloc() calls PyType_Type.tp_dealloc
 *    without Py_DECREF of the metaclass, so the metaclass gains a reference
 *    per dead pybind11 class and can never die.
 *  - internals::tstate is a thread_specific_storage: a TSS key given back only
 *    by ~internals (about 1,010 leaked internals exhaust the keys and pybind11
 *    aborts "could not initialize the TSS key!").
 *  - internals_pp_manager::get_pp() caches, per thread and per shared object,
 *    the last interpreter's ADDRESS and its pointer-to-internals
 *    (thread_local last_istate / internals_p); a cache miss reads the state
 *    dict (which re-creates an empty one during the last GC), and a new
 *    interpreter at an ended one's address hits the stale entry.
 *
 * What attach() arranges, per interpreter (idempotent per interpreter and
 * shared object; one record per interpreter in a pyfini_state):
 *  - the calling shared object's pybind11 is switched to its per-thread,
 *    per-interpreter lookup in a sub-interpreter (detail::ensure_internals(),
 *    what PYBIND11_MODULE does first);
 *  - the metaclass's tp_dealloc gives back the reference each dead class holds
 *    (the original pybind11_meta_dealloc still runs first);
 *  - at USER (atexit): the calling thread's pybind11 caches of every attached
 *    shared object are pointed at this interpreter, so that tp_traverse /
 *    tp_clear / tp_dealloc run by the last GC find the live internals without
 *    reading the (then cleared) state dict - pybind11's reverted case; the
 *    pybind11 types are tracked with pyfini_track (leak reports);
 *  - at POST_SHUTDOWN (after the last GC, pyfini_state clear): the type
 *    references of the shared and of every attached local internals are
 *    dropped, the metaclass stops calling into the internals, every attached
 *    local internals and the shared internals are deleted (TSS key given back,
 *    each pointer-to-pointer removed from pybind11's "already created" set so
 *    that a later interpreter may reuse its address), the ending thread's
 *    caches are dropped; then pyfini breaks the types' own cycles and frees
 *    them (instance_base first, the metaclass last).
 *
 * Rules (see docs/pybind11.md):
 *  1. Every shared object that uses pybind11 in the interpreter calls attach()
 *     there: each extension module (in its PYBIND11_MODULE body) and a program
 *     that embeds with pybind11 (scoped_interpreter, scoped_subinterpreter)
 *     right after entering the interpreter. A pybind11 shared object that did
 *     not attach is noticed at USER (its module-local capsule in the state
 *     dict): its function-record type reference is still dropped, but the
 *     8-byte shell of the shared internals is left to pybind11's own
 *     destroy() (embed.h / subinterpreter.h call it), and a note is printed.
 *  2. Another thread than the one that ends the interpreter, which used
 *     pybind11 there, calls pyfini_pybind11::release_thread() while it still
 *     has that interpreter's thread state (e.g. before it deletes it, or at
 *     the end of a py::subinterpreter_scoped_activate scope). pybind11 gives
 *     no way to reach another thread's thread_local cache; without this call
 *     that thread reads freed internals when a later interpreter lands at the
 *     same address (also with plain pybind11 and its scoped_subinterpreter).
 *  3. attach() before any pybind11 class of the interpreter has died (a class
 *     that died before leaves its metaclass reference lost; pyfini reports the
 *     metaclass as leaked).
 *
 * Thread state: attach() and release_thread() need an attached thread state.
 * Errors: attach() throws pybind11::error_already_set (the Python exception
 * set: MemoryError, RuntimeError - e.g. two pybind11 internals ABIs in one
 * interpreter, or the interpreter past its POST_SHUTDOWN - or what pybind11
 * raised); without a thread state no exception can be set and it throws
 * std::runtime_error (pybind11::pybind11_fail), as pybind11 does.
 * CPython: needs pybind11's sub-interpreter support (3.12+); tested on 3.13,
 * 3.14, 3.15 and the 3.14/3.15 debug builds (the sid tree has no 3.12); not
 * free-threaded (pyfini.h refuses it).
 */
#ifndef PYFINI_PYBIND11_H
#define PYFINI_PYBIND11_H

#if !defined(__cplusplus) || __cplusplus < 201703L
#  error "pyfini_pybind11.h needs C++17"
#endif

#include <pybind11/pybind11.h>
#include <pybind11/detail/internals.h>

#if !defined(PYBIND11_VERSION_MAJOR) || PYBIND11_VERSION_MAJOR != 3 || PYBIND11_VERSION_MINOR != 1
#  error "pyfini_pybind11.h supports pybind11 3.1.x only (its internals layout is pinned by tests/pybind11); this pybind11 is another version"
#endif
#if PYBIND11_INTERNALS_VERSION != 12
#  error "pyfini_pybind11.h supports PYBIND11_INTERNALS_VERSION 12 only (pybind11 3.1's default)"
#endif
#if !defined(PYBIND11_HAS_SUBINTERPRETER_SUPPORT)
#  error "pyfini_pybind11.h needs pybind11's sub-interpreter support (CPython 3.12+, PYBIND11_HAS_SUBINTERPRETER_SUPPORT)"
#endif
#if defined(PYBIND11_SIMPLE_GIL_MANAGEMENT)
#  error "pyfini_pybind11.h is tested without PYBIND11_SIMPLE_GIL_MANAGEMENT only"
#endif

#include "pyfini.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>

#define PYFINI_PYBIND11_VERSION_MAJOR 0
#define PYFINI_PYBIND11_VERSION_MINOR 1
#define PYFINI_PYBIND11_VERSION_PATCH 0

/* Each shared object has its own copy of everything below, like pybind11's
   own detail namespace: hidden visibility. */
#if defined(__GNUC__) || defined(__clang__)
#  define PYFINI_PYBIND11_HIDDEN __attribute__((visibility("hidden")))
#else
#  define PYFINI_PYBIND11_HIDDEN
#endif

namespace pyfini_pybind11 PYFINI_PYBIND11_HIDDEN {
namespace detail {

namespace pbd = pybind11::detail;
using shared_pp = std::unique_ptr<pbd::internals>;
using local_pp = std::unique_ptr<pbd::local_internals>;
using shared_manager = pbd::internals_pp_manager<pbd::internals>;
using local_manager = pbd::internals_pp_manager<pbd::local_internals>;

/* pybind11 keeps the set of pointer-to-pointers whose content it created
   private (internals_pp_manager::pps_have_created_content_ and its mutex
   pp_set_mutex_); a pointer-to-pointer that is deleted must leave it, or a
   later one at the same address is refused ("reentrant call detected").
   destroy() does that only through the calling thread's cache, so the
   adapter reaches the members through the explicit-instantiation rule
   (access is not checked in the template arguments of an explicit
   instantiation). Pinned: tests/pybind11 pin_created_set. */
namespace {
template <typename Tag, typename Tag::type Member>
struct member_access {
    friend typename Tag::type member_of(Tag) { return Member; }
};
/* GCC: the friends below are meant as plain functions, one per tag */
#if defined(__GNUC__) && !defined(__clang__)
#  pragma GCC diagnostic push
#  pragma GCC diagnostic ignored "-Wnon-template-friend"
#endif
template <typename Manager, typename Pp>
struct set_tag {
    using type = std::unordered_set<Pp *> Manager::*;
    friend type member_of(set_tag);
};
template <typename Manager>
struct mutex_tag {
    using type = std::mutex Manager::*;
    friend type member_of(mutex_tag);
};
#if defined(__GNUC__) && !defined(__clang__)
#  pragma GCC diagnostic pop
#endif
template struct member_access<set_tag<shared_manager, shared_pp>, &shared_manager::pps_have_created_content_>;
template struct member_access<mutex_tag<shared_manager>, &shared_manager::pp_set_mutex_>;
template struct member_access<set_tag<local_manager, local_pp>, &local_manager::pps_have_created_content_>;
template struct member_access<mutex_tag<local_manager>, &local_manager::pp_set_mutex_>;
}  // namespace

template <typename Manager, typename Pp>
inline bool pp_created_here(Manager &mgr, Pp *pp)
{
    std::lock_guard<std::mutex> lock(mgr.*member_of(mutex_tag<Manager>{}));
    auto &set = mgr.*member_of(set_tag<Manager, Pp>{});
    return set.find(pp) != set.end();
}

template <typename Manager, typename Pp>
inline void pp_forget_created(Manager &mgr, Pp *pp)
{
    std::lock_guard<std::mutex> lock(mgr.*member_of(mutex_tag<Manager>{}));
    (mgr.*member_of(set_tag<Manager, Pp>{})).erase(pp);
}

/* One per shared object (static storage there): what the record of an
   interpreter calls back into that shared object's copy of pybind11. The
   layout is shared by every copy of this header (state name ".v1"). */
struct module_ops {
    unsigned layout;                         /* 1 */
    const char *(*local_key)();              /* its module-local state-dict key */
    void (*prime)();                         /* its caches -> current interpreter */
    bool (*created_shared)(void *pp);        /* pp in its "created" set? */
    void (*forget_shared)(void *pp);         /* take pp out of that set */
    void (*release_local)(void *pp);         /* out of the set, delete */
    void (*release_thread)();                /* drop the calling thread's caches */
};

struct module_rec {
    const module_ops *ops;
    local_pp *local;                         /* its local internals' pointer-to-pointer */
};

/* The record of one interpreter (a pyfini_state: zero-filled, freed by pyfini
   after clear()). */
struct interp_rec {
    module_rec *mods;                        /* malloc'd */
    size_t nmods, capmods;
    local_pp **foreign;                      /* local internals of unattached objects (malloc'd) */
    size_t nforeign, capforeign;
    shared_pp *shared;                       /* the shared internals' pointer-to-pointer */
    PyTypeObject *metaclass;                 /* borrowed; its tp_dealloc is ours */
    destructor metaclass_dealloc;            /* pybind11's, called first */
    int user_registered;
    int released;
};

inline void interp_clear(void *p);

inline const pyfini_state_def &state_def()
{
    static const pyfini_state_def def = {"pyfini_pybind11.interpreter.v1", sizeof(interp_rec),
                                         nullptr, &interp_clear};
    return def;
}

inline interp_rec *find_rec() { return static_cast<interp_rec *>(pyfini_state_find(&state_def())); }

template <typename T>
inline bool grow(T *&arr, size_t &cap, size_t n)
{
    if (n < cap) {
        return true;
    }
    size_t ncap = cap == 0 ? 4 : cap * 2;
    void *q = std::realloc(arr, ncap * sizeof(T));
    if (q == nullptr) {
        return false;
    }
    arr = static_cast<T *>(q);
    cap = ncap;
    return true;
}

/* ---- this shared object's side ----------------------------------------- */

inline const char *ops_local_key() { return pbd::get_local_internals_key().c_str(); }

inline void ops_prime()
{
    pbd::get_internals_pp_manager().get_pp();
    pbd::get_local_internals_pp_manager().get_pp();
}

inline bool ops_created_shared(void *pp)
{
    return pp_created_here(pbd::get_internals_pp_manager(), static_cast<shared_pp *>(pp));
}

inline void ops_forget_shared(void *pp)
{
    pp_forget_created(pbd::get_internals_pp_manager(), static_cast<shared_pp *>(pp));
}

inline void ops_release_local(void *pp)
{
    auto *lp = static_cast<local_pp *>(pp);
    pp_forget_created(pbd::get_local_internals_pp_manager(), lp);
    delete lp;
}

inline void ops_release_thread()
{
    pbd::get_internals_pp_manager().unref();
    pbd::get_local_internals_pp_manager().unref();
}

inline const module_ops &this_module()
{
    static const module_ops ops = {1, &ops_local_key, &ops_prime, &ops_created_shared,
                                   &ops_forget_shared, &ops_release_local, &ops_release_thread};
    return ops;
}

/* ---- the metaclass ------------------------------------------------------- */

/* Installed as the metaclass's tp_dealloc by attach(): pybind11's dealloc,
   then the reference the dead class held on its metaclass (what
   subtype_dealloc would have given back). Called through subtype_dealloc for
   a Python subclass of the metaclass, which gives back its own reference. */
extern "C" inline void metaclass_dealloc_repaired(PyObject *cls)
{
    PyTypeObject *meta = Py_TYPE(cls);
    bool direct = meta->tp_dealloc == &metaclass_dealloc_repaired;
    interp_rec *rec = find_rec();
    destructor orig = rec != nullptr && rec->metaclass_dealloc != nullptr
                          ? rec->metaclass_dealloc
                          : &pbd::pybind11_meta_dealloc;
    orig(cls);
    if (direct) {
        Py_DECREF(meta);
    }
}

/* After the internals are freed: the class's own dealloc without pybind11's
   bookkeeping (it would read the freed internals). */
extern "C" inline void metaclass_dealloc_after(PyObject *cls)
{
    PyTypeObject *meta = Py_TYPE(cls);
    bool direct = meta->tp_dealloc == &metaclass_dealloc_after;
    PyType_Type.tp_dealloc(cls);
    if (direct) {
        Py_DECREF(meta);
    }
}

/* ---- USER: prime the ending thread's caches; find unattached objects ---- */

inline bool is_attached_key(const interp_rec *rec, const char *key)
{
    for (size_t i = 0; i < rec->nmods; i++) {
        if (std::strcmp(rec->mods[i].ops->local_key(), key) == 0) {
            return true;
        }
    }
    return false;
}

inline int track_types(interp_rec *rec)
{
    /* order matters for pyfini's cycle breaking: instance_base (a class of the
       metaclass) before the metaclass */
    const pyfini_state_def *def = &state_def();
    auto track = [def](PyTypeObject *t) { return t == nullptr ? 0 : pyfini_track(def, (PyObject *)t); };
    pbd::internals *in = rec->shared != nullptr ? rec->shared->get() : nullptr;
    if (in != nullptr && (track((PyTypeObject *)in->instance_base) < 0 ||
                          track(in->static_property_type) < 0)) {
        return -1;
    }
    for (size_t i = 0; i < rec->nmods; i++) {
        local_pp *lp = rec->mods[i].local;
        if (lp != nullptr && *lp && track((*lp)->function_record_py_type) < 0) {
            return -1;
        }
    }
    for (size_t i = 0; i < rec->nforeign; i++) {
        if (*rec->foreign[i] && track((*rec->foreign[i])->function_record_py_type) < 0) {
            return -1;
        }
    }
    if (in != nullptr && track(in->default_metaclass) < 0) {
        return -1;
    }
    return 0;
}

inline int scan_foreign(interp_rec *rec)
{
    PyObject *sd = PyInterpreterState_GetDict(PyInterpreterState_Get());
    if (sd == nullptr) {
        return 0;
    }
    static const char prefix[] = PYBIND11_MODULE_LOCAL_ID;
    const size_t plen = std::strlen(prefix) - 2;   /* without the trailing "__" */
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    size_t found = 0;
    while (PyDict_Next(sd, &pos, &key, &value)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : nullptr;
        if (k == nullptr) {
            PyErr_Clear();
            continue;
        }
        if (std::strncmp(k, prefix, plen) != 0 || is_attached_key(rec, k) || !PyCapsule_CheckExact(value)) {
            continue;
        }
        void *p = PyCapsule_GetPointer(value, nullptr);
        if (p == nullptr) {
            PyErr_Clear();
            continue;
        }
        bool known = false;
        for (size_t i = 0; i < rec->nforeign; i++) {
            known = known || rec->foreign[i] == p;
        }
        if (!known) {
            if (!grow(rec->foreign, rec->capforeign, rec->nforeign)) {
                PyErr_NoMemory();
                return -1;
            }
            rec->foreign[rec->nforeign++] = static_cast<local_pp *>(p);
            found++;
        }
    }
    static std::atomic<bool> noted{false};
    if (found > 0 && !noted.exchange(true)) {
        std::fprintf(stderr, "pyfini_pybind11: note: interpreter %lld has %zu pybind11 shared object(s) "
                             "that did not call pyfini_pybind11::attach(); their type references are "
                             "released, their local internals and the shared internals' 8-byte holder "
                             "are left to pybind11 (noted once per process)\n",
                     (long long)PyInterpreterState_GetID(PyInterpreterState_Get()), found);
    }
    return 0;
}

inline int at_user(void *)
{
    interp_rec *rec = find_rec();
    if (rec == nullptr) {
        return 0;
    }
    for (size_t i = 0; i < rec->nmods; i++) {
        rec->mods[i].ops->prime();
    }
    return scan_foreign(rec) < 0 || track_types(rec) < 0 ? -1 : 0;
}

/* ---- POST_SHUTDOWN: release everything (pyfini_state clear) ------------- */

inline void take(PyObject **owned, size_t &n, PyTypeObject *&field)
{
    if (field != nullptr) {
        owned[n++] = (PyObject *)field;
        field = nullptr;
    }
}

inline void interp_clear(void *p)
{
    interp_rec *rec = static_cast<interp_rec *>(p);
    rec->released = 1;
    size_t cap = 4 + rec->nmods + rec->nforeign, n = 0;
    PyObject **owned = static_cast<PyObject **>(std::calloc(cap, sizeof(PyObject *)));
    pbd::internals *in = rec->shared != nullptr ? rec->shared->get() : nullptr;
    if (owned == nullptr) {
        std::fprintf(stderr, "pyfini_pybind11: out of memory at POST_SHUTDOWN: pybind11's internals "
                             "are left alive\n");
        return;
    }
    /* 1. the type references, out of the internals (no call into pybind11) */
    if (in != nullptr) {
        PyObject *base = in->instance_base;
        in->instance_base = nullptr;
        if (base != nullptr) {
            owned[n++] = base;
        }
        take(owned, n, in->static_property_type);
    }
    for (size_t i = 0; i < rec->nmods; i++) {
        local_pp *lp = rec->mods[i].local;
        if (lp != nullptr && *lp) {
            take(owned, n, (*lp)->function_record_py_type);
        }
    }
    for (size_t i = 0; i < rec->nforeign; i++) {
        if (*rec->foreign[i]) {
            take(owned, n, (*rec->foreign[i])->function_record_py_type);
        }
    }
    if (in != nullptr) {
        if (in->default_metaclass != nullptr && in->default_metaclass == rec->metaclass) {
            rec->metaclass->tp_dealloc = &metaclass_dealloc_after;
        }
        take(owned, n, in->default_metaclass);
    }
    /* 2. the local internals of every attached shared object */
    for (size_t i = 0; i < rec->nmods; i++) {
        if (rec->mods[i].local != nullptr) {
            rec->mods[i].ops->release_local(rec->mods[i].local);
            rec->mods[i].local = nullptr;
        }
    }
    /* 3. the shared internals: ~internals gives back the TSS key */
    if (rec->shared != nullptr) {
        const module_ops *creator = nullptr;
        for (size_t i = 0; i < rec->nmods && creator == nullptr; i++) {
            if (rec->mods[i].ops->created_shared(rec->shared)) {
                creator = rec->mods[i].ops;
            }
        }
        if (creator != nullptr) {
            creator->forget_shared(rec->shared);
        }
        if (creator != nullptr && rec->nforeign == 0) {
            delete rec->shared;
        } else {
            rec->shared->reset();   /* the holder stays for pybind11's destroy() */
        }
        rec->shared = nullptr;
    }
    /* 4. the ending thread's caches */
    for (size_t i = 0; i < rec->nmods; i++) {
        rec->mods[i].ops->release_thread();
    }
    /* 5. the references; pyfini then breaks the tracked types' cycles */
    for (size_t i = 0; i < n; i++) {
        Py_DECREF(owned[i]);
    }
    std::free(owned);
    std::free(rec->mods);
    std::free(rec->foreign);
    rec->mods = nullptr;
    rec->foreign = nullptr;
    rec->nmods = rec->nforeign = 0;
}

[[noreturn]] inline void raise(PyObject *type, const char *msg)
{
    if (!PyErr_Occurred()) {
        PyErr_SetString(type, msg);
    }
    throw pybind11::error_already_set();
}

}  // namespace detail

/* Attach the calling shared object's pybind11 to the CURRENT interpreter (see
   the top of this file). Idempotent per interpreter and shared object.
   Throws pybind11::error_already_set. Thread state: attached. */
inline void attach()
{
    namespace d = detail;
    if (pybind11::detail::get_thread_state_unchecked() == nullptr) {
        /* no exception can be set without a thread state */
        pybind11::pybind11_fail("pyfini_pybind11::attach(): no thread state (the GIL is not held)");
    }
    auto *rec = static_cast<d::interp_rec *>(pyfini_state(&d::state_def()));
    if (rec == nullptr) {
        throw pybind11::error_already_set();
    }
    const d::module_ops *ops = &d::this_module();
    for (size_t i = 0; i < rec->nmods; i++) {
        if (rec->mods[i].ops == ops) {
            return;
        }
    }
    if (rec->released) {
        d::raise(PyExc_RuntimeError, "pyfini_pybind11::attach(): this interpreter's pybind11 internals "
                                     "were already released");
    }
    d::shared_pp *shared;
    d::local_pp *local;
    try {
        /* what PYBIND11_MODULE does first: in a sub-interpreter, switch this
           shared object's pybind11 to its per-thread, per-interpreter lookup
           (has_seen_non_main_interpreter) - without it a program that made
           the interpreter with the C API would use its first interpreter's
           internals everywhere */
        pybind11::detail::ensure_internals();
        shared = pybind11::detail::get_internals_pp_manager().get_pp();
        pybind11::detail::get_local_internals();
        local = pybind11::detail::get_local_internals_pp_manager().get_pp();
    } catch (pybind11::error_already_set &) {
        throw;
    } catch (const std::exception &e) {
        d::raise(PyExc_RuntimeError, e.what());
    }
    if (rec->shared != nullptr && rec->shared != shared) {
        d::raise(PyExc_RuntimeError, "pyfini_pybind11::attach(): two different pybind11 shared internals "
                                     "(compiler or ABI) in one interpreter are not supported");
    }
    if (!d::grow(rec->mods, rec->capmods, rec->nmods)) {
        PyErr_NoMemory();
        throw pybind11::error_already_set();
    }
    if (!rec->user_registered) {
        if (pyfini_atexit(&d::at_user, nullptr, PYFINI_USER) < 0) {
            throw pybind11::error_already_set();
        }
        rec->user_registered = 1;
    }
    rec->shared = shared;
    rec->mods[rec->nmods++] = d::module_rec{ops, local};
    PyTypeObject *meta = (*shared)->default_metaclass;
    if (rec->metaclass == nullptr && meta != nullptr) {
        rec->metaclass = meta;
        rec->metaclass_dealloc = meta->tp_dealloc;
        meta->tp_dealloc = &d::metaclass_dealloc_repaired;
    }
}

/* Rule 2: drop the calling thread's pybind11 caches of every shared object
   attached in the current interpreter (the next pybind11 call on this thread
   finds its internals again through the state dict). Call it on a thread
   that used pybind11 in an interpreter it will not end, while it still has
   that interpreter's thread state. No-op where nothing is attached. Never
   throws. Thread state: attached. */
inline void release_thread() noexcept
{
    detail::interp_rec *rec =
        pybind11::detail::get_thread_state_unchecked() != nullptr ? detail::find_rec() : nullptr;
    if (rec == nullptr) {
        return;
    }
    for (size_t i = 0; i < rec->nmods; i++) {
        rec->mods[i].ops->release_thread();
    }
}

}  // namespace pyfini_pybind11

#endif /* PYFINI_PYBIND11_H */
