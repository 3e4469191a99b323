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
 * fact pinned by tests/pybind11/test_pybind11.cpp, which names it; what
 * pybind11 itself would change: docs/upstream/pybind11.md):
 *  - detail/internals.h: the shared `internals` and each shared object's
 *    `local_internals` live in capsules of the interpreter state dict whose
 *    payload is a `new std::unique_ptr<...>` and whose destructor is NULL
 *    ("intentionally leaked"). They hold strong references that nothing
 *    releases: internals::instance_base, ::static_property_type,
 *    ::default_metaclass, local_internals::function_record_py_type. One live
 *    object keeps an own-obmalloc interpreter's arenas from being freed:
 *    about 1.7 MB per ended interpreter.
 *  - detail/class.h: pybind11_meta_dealloc() calls PyType_Type.tp_dealloc
 *    without Py_DECREF of the metaclass; pybind11_static_property inherits
 *    CPython's property_dealloc (no Py_DECREF of its heap type, its __dict__
 *    never cleared); a class made without a scope (iterator and bind_vector
 *    helper classes) is kept "alive forever".
 *  - pybind11 instances are not tracked by the GC: a py::enum_ class and its
 *    values (in its dict) hold each other for good.
 *  - module_::def_submodule leaks a reference to the parent's __file__;
 *    all_type_info_get_cache() leaves weak references with pybind11
 *    callbacks on types that never die (static types such as `object`).
 *  - internals::tstate is a thread_specific_storage: a TSS key given back only
 *    by ~internals (about 1,010 leaked internals exhaust the keys and pybind11
 *    aborts "could not initialize the TSS key!").
 *  - internals_pp_manager::get_pp() caches, per thread and per shared object,
 *    the last interpreter's ADDRESS and its pointer-to-internals
 *    (thread_local last_istate / internals_p); a cache miss reads the state
 *    dict (which re-creates an empty one during the last GC), and a new
 *    interpreter at an ended one's address hits the stale entry - on any
 *    thread that used the ended one.
 *
 * What attach() arranges, per interpreter (idempotent per interpreter and
 * shared object; one record per interpreter in a pyfini_state):
 *  - the calling shared object's pybind11 is switched to its per-thread,
 *    per-interpreter lookup in a sub-interpreter (detail::ensure_internals(),
 *    what PYBIND11_MODULE does first);
 *  - the metaclass's tp_dealloc gives back the reference each dead class holds
 *    (the original pybind11_meta_dealloc still runs first); the static
 *    property type gets a tp_dealloc, tp_traverse and tp_clear that do what
 *    subtype_dealloc would;
 *  - each thread that fills this shared object's pybind11 cache is noted
 *    (fetch hook on_fetch_ and attach()); when an interpreter ends, every
 *    thread's cache that names it is dropped (compare-and-swap);
 *  - at USER (atexit): the calling thread's pybind11 caches of every attached
 *    shared object are pointed at this interpreter, so that tp_traverse /
 *    tp_clear / tp_dealloc run by the last GC find the live internals without
 *    reading the (then cleared) state dict - pybind11's reverted case; the
 *    references def_submodule leaked are given back; the type-cache weak
 *    references on types that outlive the internals are given up; pybind11's
 *    own classes alive now are noted (weak references); the pybind11 types
 *    are tracked with pyfini_track (leak reports);
 *  - at POST_SHUTDOWN (after the last GC, pyfini_state clear): the noted
 *    classes still alive are cleared (metatype tp_clear; the "alive forever"
 *    reference of scope-less ones given back), instances still alive are
 *    reported by class; the type references of the shared and of every
 *    attached local internals are dropped, the metaclass stops calling into
 *    the internals, every attached local internals and the shared internals
 *    are deleted (TSS key given back, each pointer-to-pointer removed from
 *    pybind11's "already created" set so that a later interpreter may reuse
 *    its address), every thread's caches of the interpreter are dropped; then
 *    pyfini breaks the types' own cycles and frees them (instance_base first,
 *    the metaclass last).
 *
 * Rules (see docs/pybind11.md):
 *  1. Every shared object that uses pybind11 in the interpreter calls attach()
 *     there: each extension module (in its PYBIND11_MODULE body) and a program
 *     that embeds with pybind11 (scoped_interpreter, scoped_subinterpreter)
 *     right after entering the interpreter. A pybind11 shared object that did
 *     not attach is noticed at USER (its module-local capsule in the state
 *     dict): its function-record type reference is still dropped, the repairs
 *     above cover its classes (they are the interpreter's), but its local
 *     internals, the shared internals' 8-byte holder, its def_submodule
 *     references and its threads' caches are left to pybind11 (whose own
 *     destroy() in embed.h / subinterpreter.h frees the holder), and a note
 *     is printed.
 *  2. attach() before any pybind11 class of the interpreter has died (a class
 *     that died before leaves its metaclass reference lost; pyfini reports the
 *     metaclass as leaked).
 *  (release_thread(), once rule 2, is no longer needed: threads are handled
 *  as above. It stays, harmless.)
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
#include <dlfcn.h>
#include <memory>
#include <mutex>
#include <string>
#include <typeindex>
#include <unordered_set>
#include <vector>

#define PYFINI_PYBIND11_VERSION_MAJOR 0
#define PYFINI_PYBIND11_VERSION_MINOR 2
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
/* the per-thread cache of get_pp(): the private static function returning
   the thread's last interpreter (last_istate_tls), and the fetch hook that
   a cache miss calls (on_fetch_) */
template <typename Manager>
struct last_tag {
    using type = PyInterpreterState *&(*)();
    friend type member_of(last_tag);
};
template <typename Manager>
struct fetch_tag {
    using type = typename Manager::on_fetch_function *Manager::*;
    friend type member_of(fetch_tag);
};
#if defined(__GNUC__) && !defined(__clang__)
#  pragma GCC diagnostic pop
#endif
template struct member_access<set_tag<shared_manager, shared_pp>, &shared_manager::pps_have_created_content_>;
template struct member_access<mutex_tag<shared_manager>, &shared_manager::pp_set_mutex_>;
template struct member_access<set_tag<local_manager, local_pp>, &local_manager::pps_have_created_content_>;
template struct member_access<mutex_tag<local_manager>, &local_manager::pp_set_mutex_>;
template struct member_access<last_tag<shared_manager>, &shared_manager::last_istate_tls>;
template struct member_access<last_tag<local_manager>, &local_manager::last_istate_tls>;
template struct member_access<fetch_tag<shared_manager>, &shared_manager::on_fetch_>;
template struct member_access<fetch_tag<local_manager>, &local_manager::on_fetch_>;
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
    unsigned layout;                         /* 2 */
    const char *(*local_key)();              /* its module-local state-dict key */
    void (*prime)();                         /* its caches -> current interpreter */
    bool (*created_shared)(void *pp);        /* pp in its "created" set? */
    void (*forget_shared)(void *pp);         /* take pp out of that set */
    void (*release_local)(void *pp);         /* out of the set, delete */
    void (*release_thread)();                /* drop the calling thread's caches */
    void (*forget_interp)(PyInterpreterState *);   /* every thread's caches of it dropped */
};

struct module_rec {
    const module_ops *ops;
    local_pp *local;                         /* its local internals' pointer-to-pointer */
};

/* The record of one interpreter (a pyfini_state: zero-filled, freed by pyfini
   after clear()). */
/* A pybind11 class whose metatype is not pybind11's (py::metaclass()): when
   it dies, CPython's type_dealloc runs, not pybind11_meta_dealloc, so its
   type_info is never deleted (note_class, free_orphan_type_infos). */
struct foreign_meta_class {
    PyObject *wr;                            /* weak reference to the class */
    PyTypeObject *type;                      /* compared, never read once dead */
    pbd::type_info *tinfo;
};

struct interp_rec {
    module_rec *mods;                        /* malloc'd */
    size_t nmods, capmods;
    local_pp **foreign;                      /* local internals of unattached objects (malloc'd) */
    size_t nforeign, capforeign;
    shared_pp *shared;                       /* the shared internals' pointer-to-pointer */
    PyTypeObject *metaclass;                 /* borrowed; its tp_dealloc is ours */
    destructor metaclass_dealloc;            /* pybind11's, called first */
    PyObject **classes;                      /* weak references to the classes alive at USER (malloc'd) */
    PyObject **scopeless;                    /* the same, of those pybind11 made without a scope */
    size_t nscopeless, capscopeless;
    foreign_meta_class *foreign_meta;        /* malloc'd */
    size_t nforeign_meta, capforeign_meta;
    PyInterpreterState *interp;              /* this record's interpreter */
    int64_t interp_id;
    size_t nclasses, capclasses;
    int user_registered;
    int released;
};

inline void interp_clear(void *p);

inline const pyfini_state_def &state_def()
{
    static const pyfini_state_def def = {"pyfini_pybind11.interpreter.v2", sizeof(interp_rec),
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

/* ---- every thread's caches ----------------------------------------------- */

/* pybind11 caches, per thread and per shared object, the last interpreter's
   ADDRESS and its internals (get_pp(): thread_local last_istate /
   internals_p, one pair per internals kind). A thread that used an
   interpreter keeps them after that interpreter ended, and when a new
   interpreter lands at the same address (CPython reuses it nearly every
   time), its next pybind11 call there takes the ended interpreter's freed
   internals - whether it entered through the C API,
   py::subinterpreter_scoped_activate (whose destructor fills the cache again
   as it leaves) or py::gil_scoped_acquire. pybind11 gives no way to reach
   another thread's cache, so this shared object notes, for each thread that
   fills one, where that thread's last_istate slots are: the attaching thread
   in attach(), every other one from the fetch hook that a cache miss calls
   (internals_pp_manager::on_fetch_, wrapped: the original still runs). When
   an interpreter ends (POST_SHUTDOWN), each noted slot that still names it is
   set to nullptr by a compare-and-swap: that thread's next call misses and
   reads the state dict of the interpreter it is in; a thread that is filling
   its slot for another interpreter at that moment wins (the swap finds
   another value), and a stale internals_p is never read once last_istate
   differs. A thread's note is taken out by a thread_local destructor when
   it exits. Pinned: tests/pybind11 test_second_thread_*. */
struct thread_note {
    PyInterpreterState **last[2];           /* shared, local */
    thread_note *prev, *next;
    bool linked;
    ~thread_note();
};

inline std::mutex &threads_mutex()
{
    static std::mutex m;
    return m;
}

inline thread_note *&threads_head()
{
    static thread_note *head = nullptr;
    return head;
}

inline thread_note::~thread_note()
{
    if (!linked) {
        return;
    }
    std::lock_guard<std::mutex> lock(threads_mutex());
    (prev != nullptr ? prev->next : threads_head()) = next;
    if (next != nullptr) {
        next->prev = prev;
    }
    linked = false;
}

/* Note the calling thread's cache slots of this shared object (once). */
inline void note_thread()
{
    static thread_local thread_note note{};
    if (note.linked) {
        return;
    }
    note.last[0] = &member_of(last_tag<shared_manager>{})();
    note.last[1] = &member_of(last_tag<local_manager>{})();
    std::lock_guard<std::mutex> lock(threads_mutex());
    note.prev = nullptr;
    note.next = threads_head();
    if (note.next != nullptr) {
        note.next->prev = &note;
    }
    threads_head() = &note;
    note.linked = true;
}

inline void ops_forget_interp(PyInterpreterState *interp)
{
    std::lock_guard<std::mutex> lock(threads_mutex());
    for (thread_note *t = threads_head(); t != nullptr; t = t->next) {
        for (PyInterpreterState **slot : t->last) {
            PyInterpreterState *expected = interp;
            __atomic_compare_exchange_n(slot, &expected, nullptr, false, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST);
        }
    }
}

/* The fetch hooks: the original (pybind11's) first, then the note. */
template <typename Manager, typename Internals>
struct fetch_hook {
    static typename Manager::on_fetch_function *&original()
    {
        static typename Manager::on_fetch_function *fn = nullptr;
        return fn;
    }
    static void call(Internals *in)
    {
        if (original() != nullptr) {
            original()(in);
        }
        note_thread();
    }
    static void install(Manager &mgr)
    {
        auto field = member_of(fetch_tag<Manager>{});
        if (mgr.*field != &call) {
            original() = mgr.*field;
            mgr.*field = &call;
        }
    }
};

inline void install_fetch_hooks()
{
    static std::once_flag once;
    std::call_once(once, [] {
        fetch_hook<shared_manager, pbd::internals>::install(pbd::get_internals_pp_manager());
        fetch_hook<local_manager, pbd::local_internals>::install(pbd::get_local_internals_pp_manager());
    });
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
    static const module_ops ops = {2, &ops_local_key, &ops_prime, &ops_created_shared,
                                   &ops_forget_shared, &ops_release_local, &ops_release_thread,
                                   &ops_forget_interp};
    return ops;
}

/* ---- the metaclass ------------------------------------------------------- */

/* Installed as the metaclass's tp_dealloc by attach(): pybind11's dealloc,
   then the reference the dead class held on its metaclass (what
   subtype_dealloc would have given back). Also when called through
   subtype_dealloc, for a class whose metaclass is a Python subclass of
   pybind11's (class M(type(PbBase), abc.ABCMeta)): subtype_dealloc gives back
   the type reference only when the base dealloc it calls is a static type's
   (Objects/typeobject.c, type_needs_decref); this base is a heap type, whose
   dealloc must do it (CPython 3.8+). Pinned: repro/atk.cpp pymeta (M kept
   one reference per dead class, and through it pybind11's metaclass). */
extern "C" inline void metaclass_dealloc_repaired(PyObject *cls)
{
    PyTypeObject *meta = Py_TYPE(cls);
    interp_rec *rec = find_rec();
    destructor orig = rec != nullptr && rec->metaclass_dealloc != nullptr
                          ? rec->metaclass_dealloc
                          : &pbd::pybind11_meta_dealloc;
    orig(cls);
    Py_DECREF(meta);
}

/* After the internals are freed: the class's own dealloc without pybind11's
   bookkeeping (it would read the freed internals). */
extern "C" inline void metaclass_dealloc_after(PyObject *cls)
{
    PyTypeObject *meta = Py_TYPE(cls);
    PyType_Type.tp_dealloc(cls);
    Py_DECREF(meta);
}

/* ---- the static property type -------------------------------------------- */

/* pybind11_static_property (detail/class.h make_static_property_type) is a
   heap type made by hand: it inherits CPython's property_dealloc
   (Objects/descrobject.c), which neither gives back the reference each
   instance holds on its heap type nor clears the instance's __dict__
   (enable_dynamic_attributes, 3.12+), and its tp_traverse
   (pybind11_traverse) does not visit the property's getter, setter and doc.
   Every def_readwrite_static, def_property_static and every py::enum_
   (__doc__, __members__) makes such instances: their type and dicts stay
   alive for good, and so do the interpreter's obmalloc arenas. attach()
   installs these three slots instead. Pinned: tests/pybind11
   pin_static_property_dealloc. */
extern "C" inline void static_property_dealloc_repaired(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    /* as subtype_dealloc does: untracked while the dict is cleared (its
       values may run code), tracked again for the base's dealloc */
    PyObject_GC_UnTrack(self);
    pbd::pybind11_clear(self);
    PyObject_GC_Track(self);
    PyProperty_Type.tp_dealloc(self);
    /* always: for a Python subclass's instance too, as subtype_dealloc gives
       back the type's reference only when its base is a static type
       (Objects/typeobject.c, type_needs_decref) - this base is a heap type */
    Py_DECREF(tp);
}

extern "C" inline int static_property_traverse_repaired(PyObject *self, visitproc visit, void *arg)
{
    int r = pbd::pybind11_traverse(self, visit, arg);
    return r != 0 ? r : PyProperty_Type.tp_traverse(self, visit, arg);
}

extern "C" inline int static_property_clear_repaired(PyObject *self)
{
    pbd::pybind11_clear(self);
    return PyProperty_Type.tp_clear != nullptr ? PyProperty_Type.tp_clear(self) : 0;
}

inline void repair_static_property_type(PyTypeObject *tp)
{
    if (tp == nullptr || tp->tp_dealloc == &static_property_dealloc_repaired ||
        tp->tp_base != &PyProperty_Type || tp->tp_dealloc != PyProperty_Type.tp_dealloc) {
        return;   /* repaired by this shared object already, or not the type pinned */
    }
    tp->tp_dealloc = &static_property_dealloc_repaired;
    tp->tp_traverse = &static_property_traverse_repaired;
    tp->tp_clear = &static_property_clear_repaired;
}

/* ---- USER: the references pybind11's def_submodule keeps ------------------ */

/* pybind11 3.1 module_::def_submodule (pybind11.h) stores the NEW reference
   that PyModule_GetFilenameObject() returns in a handle and never releases
   it: each call leaks one reference to the parent module's __file__ string,
   which then outlives the interpreter and keeps an isolated interpreter's
   obmalloc arenas (394 kB of obmalloc state, ~1.7 MB RSS) alive. How many
   references one call leaks is measured once per shared object on a scratch
   module (0 once pybind11 is fixed: nothing is given back then). Pinned:
   tests/pybind11 pin_def_submodule_leak. */
inline Py_ssize_t def_submodule_leak_per_call()
{
    static std::atomic<Py_ssize_t> measured{-1};
    Py_ssize_t known = measured.load();
    if (known >= 0) {
        return known;
    }
    PyObject *file = PyUnicode_FromString("pyfini_pybind11: def_submodule probe");
    PyObject *mod = file != nullptr ? PyModule_New("__pyfini_pybind11_probe__") : nullptr;
    if (mod == nullptr || PyModule_AddObjectRef(mod, "__file__", file) < 0) {
        Py_XDECREF(mod);
        Py_XDECREF(file);
        PyErr_Clear();
        return -1;
    }
    Py_ssize_t before = Py_REFCNT(file), leaked = -1;
    try {
        pybind11::reinterpret_borrow<pybind11::module_>(mod).def_submodule("probe");
        leaked = Py_REFCNT(file) - before - 1;   /* the submodule's __file__ holds one */
    } catch (pybind11::error_already_set &e) {
        e.discard_as_unraisable("pyfini_pybind11: def_submodule probe");
    } catch (...) {
    }
    if (PyDict_DelItemString(PyImport_GetModuleDict(), "__pyfini_pybind11_probe__.probe") < 0) {
        PyErr_Clear();
    }
    for (Py_ssize_t i = 0; i < leaked; i++) {
        Py_DECREF(file);
    }
    Py_DECREF(mod);
    Py_DECREF(file);
    if (leaked < 0 || leaked > 1) {
        return -1;   /* not what pybind11 3.1 does: give nothing back */
    }
    measured.store(leaked);
    return leaked;
}

inline bool is_function_record(PyObject *o)
{
    namespace fr = pbd::function_record_PyTypeObject_methods;
    return o != nullptr && (std::strcmp(Py_TYPE(o)->tp_name, fr::tp_qualname_impl) == 0 ||
                            std::strcmp(Py_TYPE(o)->tp_name, fr::tp_plainname_impl) == 0);
}

/* The shared object an address is in (its load address), or nullptr. */
inline const void *object_of(const void *addr)
{
    Dl_info info;
    return addr != nullptr && dladdr(addr, &info) != 0 ? info.dli_fbase : nullptr;
}

/* The extension module at the top of `name` (a.b.c -> a) if pybind11 in a
   shared object defined it - attached here or not - else nullptr (borrowed). */
inline PyObject *attached_top_module(const interp_rec *rec, PyObject *modules, const char *name)
{
    std::string top(name, std::strcspn(name, "."));
    PyObject *m = PyDict_GetItemString(modules, top.c_str());
    PyModuleDef *def = m != nullptr && PyModule_Check(m) ? PyModule_GetDef(m) : nullptr;
    const void *obj = object_of(def);
    if (obj == nullptr) {
        PyErr_Clear();
        return nullptr;
    }
    for (size_t i = 0; i < rec->nmods; i++) {
        if (object_of(reinterpret_cast<const void *>(rec->mods[i].ops->prime)) == obj) {
            return m;
        }
    }
    /* a pybind11 module of a shared object that did not attach (one its user
       cannot rebuild): a function of its own (a cpp_function, whose self is
       a pybind11 function record from the same shared object) in its dict */
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    PyObject *d = PyModule_GetDict(m);
    while (d != nullptr && PyDict_Next(d, &pos, &key, &value)) {
        if (PyCFunction_Check(value) && is_function_record(PyCFunction_GET_SELF(value)) &&
            object_of(reinterpret_cast<const void *>(PyCFunction_GET_FUNCTION(value))) == obj) {
            return m;
        }
    }
    return nullptr;
}

/* 1 if sub was made by def_submodule under top: PyImport_AddModule's bare
   module (__spec__ None) holding top's very __file__ object. */
inline int made_by_def_submodule(PyObject *sub, PyObject *top)
{
    PyObject *d = PyModule_GetDict(sub);
    PyObject *spec = d != nullptr ? PyDict_GetItemString(d, "__spec__") : nullptr;
    PyObject *f = d != nullptr ? PyDict_GetItemString(d, "__file__") : nullptr;
    PyObject *td = PyModule_GetDict(top);
    PyObject *tf = td != nullptr ? PyDict_GetItemString(td, "__file__") : nullptr;
    return spec == Py_None && f != nullptr && f == tf;
}

/* At USER (modules alive): give back the references leaked by each
   def_submodule of a pybind11 module's (attached or not). Each submodule
   OBJECT counts once (a submodule also in sys.modules under another name
   would otherwise be given back twice: a use after free of __file__), and
   never more is given back than the references that no object the garbage
   collector sees holds (Py_REFCNT(__file__) minus the references found by
   traversing every GC object: the modules' dicts, the spec's origin...),
   so that a module made some other way that looks like a def_submodule one
   (a bare module holding the parent's very __file__) cannot drive the
   string to zero while objects still hold it. A def_submodule called twice with one
   name leaks two references with one trace: the second is left (LEAK,
   never a crash). Pinned: tests/pybind11 pin_def_submodule_leak,
   def_submodule_alias (repro/atk.cpp submodule_alias, submodule_twice). */
struct held_by_gc {
    PyObject *target;
    Py_ssize_t n;
};

inline int count_ref(PyObject *o, void *arg)
{
    auto *c = static_cast<held_by_gc *>(arg);
    c->n += o == c->target;
    return 0;
}

inline int count_holders(PyObject *op, void *arg)
{
    traverseproc t = Py_TYPE(op)->tp_traverse;
    if (t != nullptr) {
        t(op, &count_ref, arg);
    }
    return 1;
}

inline void give_back_def_submodule_refs(const interp_rec *rec)
{
    PyObject *modules = PyImport_GetModuleDict();
    PyObject *items = modules != nullptr && PyDict_Check(modules) ? PyDict_Items(modules) : nullptr;
    Py_ssize_t per_call = items != nullptr ? def_submodule_leak_per_call() : -1;
    struct group {
        PyObject *file;                    /* borrowed: the top's dict holds it */
        std::vector<PyObject *> subs;      /* distinct submodules (borrowed: items holds them) */
    };
    std::vector<group> groups;
    for (Py_ssize_t i = 0; per_call > 0 && i < PyList_GET_SIZE(items); i++) {
        PyObject *name = PyTuple_GET_ITEM(PyList_GET_ITEM(items, i), 0);
        PyObject *sub = PyTuple_GET_ITEM(PyList_GET_ITEM(items, i), 1);
        const char *n = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : nullptr;
        if (n == nullptr || std::strchr(n, '.') == nullptr || !PyModule_Check(sub)) {
            PyErr_Clear();
            continue;
        }
        PyObject *top = attached_top_module(rec, modules, n);
        if (top == nullptr || !made_by_def_submodule(sub, top)) {
            continue;
        }
        PyObject *file = PyDict_GetItemString(PyModule_GetDict(top), "__file__");
        auto g = groups.begin();
        while (g != groups.end() && g->file != file) {
            ++g;
        }
        if (g == groups.end()) {
            groups.push_back(group{file, {}});
            g = groups.end() - 1;
        }
        bool seen = false;
        for (PyObject *s : g->subs) {
            seen = seen || s == sub;
        }
        if (!seen) {
            g->subs.push_back(sub);
        }
    }
    for (const group &g : groups) {
        /* the references no object the garbage collector sees holds (the
           modules' dicts, the spec's origin, the loader's path...) */
        held_by_gc count{g.file, 0};
        PyUnstable_GC_VisitObjects(&count_holders, &count);
        Py_ssize_t unseen = Py_REFCNT(g.file) - count.n;
        Py_ssize_t give = per_call * (Py_ssize_t)g.subs.size();
        for (Py_ssize_t k = 0; k < give && k < unseen; k++) {
            Py_DECREF(g.file);
        }
    }
    Py_XDECREF(items);
    PyErr_Clear();
}

/* ---- USER: the weak references pybind11 keeps on types that outlive it ---- */

/* pybind11 3.1's all_type_info_get_cache() (pybind11.h) puts every Python
   type it looks up in internals::registered_types_py, with a weak reference
   to the type whose callback (a cpp_function) erases the entry; the weak
   reference is released on purpose and frees itself in that callback. A type
   that never dies in the interpreter - a static type such as `object`, which
   multiple inheritance and casts of plain Python objects look up - keeps its
   weak reference and callback (and the function record, and so the
   function-record type, and so the interpreter's obmalloc arenas) for good.
   The types the adapter releases at POST_SHUTDOWN (instance_base, the
   metaclass, the static property and function-record types) die after the
   internals are deleted, when the callback must not run. So at USER, while
   Python still runs, the weak references whose callback is a pybind11
   function, on exactly those types, are given up (weakref.getweakrefs()
   finds them; nothing else enumerates a static type's weak references). The
   registered_types_py entries stay until the internals are deleted. Pinned:
   tests/pybind11 pin_type_cache_weakref. */

/* 1 if t dies only at POST_SHUTDOWN, or never, in this interpreter. */
inline bool outlives_internals(const interp_rec *rec, const pbd::internals &in, PyTypeObject *t)
{
    if (!PyType_HasFeature(t, Py_TPFLAGS_HEAPTYPE) || t == reinterpret_cast<PyTypeObject *>(in.instance_base) ||
        t == in.static_property_type || t == in.default_metaclass) {
        return true;
    }
    for (size_t i = 0; i < rec->nmods; i++) {
        local_pp *lp = rec->mods[i].local;
        if (lp != nullptr && *lp && (*lp)->function_record_py_type == t) {
            return true;
        }
    }
    return false;
}

inline void give_up_type_cache_weakrefs(const interp_rec *rec)
{
    pbd::internals *in = rec->shared != nullptr ? rec->shared->get() : nullptr;
    if (in == nullptr) {
        return;
    }
    std::vector<PyObject *> types;
    for (auto &kv : in->registered_types_py) {
        if (outlives_internals(rec, *in, kv.first)) {
            types.push_back(reinterpret_cast<PyObject *>(kv.first));
        }
    }
    PyObject *mod = types.empty() ? nullptr : PyImport_ImportModule("_weakref");
    PyObject *get = mod != nullptr ? PyObject_GetAttrString(mod, "getweakrefs") : nullptr;
    for (size_t i = 0; get != nullptr && i < types.size(); i++) {
        PyObject *list = PyObject_CallOneArg(get, types[i]);
        for (Py_ssize_t k = 0; list != nullptr && PyList_Check(list) && k < PyList_GET_SIZE(list); k++) {
            PyObject *wr = PyList_GET_ITEM(list, k);
            PyObject *cb = PyWeakref_Check(wr) ? reinterpret_cast<PyWeakReference *>(wr)->wr_callback : nullptr;
            if (cb != nullptr && PyCFunction_Check(cb) && is_function_record(PyCFunction_GET_SELF(cb))) {
                Py_DECREF(wr);   /* the reference pybind11 released; the list holds another */
            }
        }
        Py_XDECREF(list);
    }
    Py_XDECREF(get);
    Py_XDECREF(mod);
    PyErr_Clear();
}

/* ---- USER and POST_SHUTDOWN: classes the last GC cannot free ------------- */

/* A py::enum_ keeps its values (instances of the class, which the GC does not
   see: instance_base has no Py_TPFLAGS_HAVE_GC) in its own dict and in
   __entries, so the class and its values hold each other for good; so does
   any class with an instance of itself in its dict (an attr, a
   def_readonly_static of its own type). At POST_SHUTDOWN no code of the
   interpreter runs any more: the metatype's tp_clear (type_clear: the dict,
   the MRO) breaks each such class while the internals are still there for
   the instances' deallocs. internals::registered_types_py cannot be read for
   them then: a class made with py::metaclass() of another metatype leaves a
   dangling entry there when it dies (only pybind11_meta_dealloc erases
   entries). So at USER the classes are found alive among the GC's objects
   and held by weak references; at POST_SHUTDOWN those still alive are
   cleared. Pinned: tests/pybind11 pin_enum_cycle. */
/* A pybind11 class made with another metatype than pybind11's (or a subtype
   of it): its type_info, to be deleted at POST_SHUTDOWN if the class died
   without pybind11_meta_dealloc. */
inline void note_foreign_meta(interp_rec *rec, pbd::internals &in, PyTypeObject *cls)
{
    if (in.default_metaclass == nullptr || PyType_IsSubtype(Py_TYPE(cls), in.default_metaclass)) {
        return;
    }
    auto found = in.registered_types_py.find(cls);
    if (found == in.registered_types_py.end() || found->second.size() != 1 || found->second[0]->type != cls) {
        return;
    }
    PyObject *wr = PyWeakref_NewRef(reinterpret_cast<PyObject *>(cls), nullptr);
    if (wr == nullptr || !grow(rec->foreign_meta, rec->capforeign_meta, rec->nforeign_meta)) {
        Py_XDECREF(wr);
        PyErr_Clear();
        return;   /* its type_info stays pybind11's (184 B of C heap) */
    }
    rec->foreign_meta[rec->nforeign_meta++] = foreign_meta_class{wr, cls, found->second[0]};
}

/* POST_SHUTDOWN, after break_class_cycles: the type_info of each such class
   that died, if pybind11 still lists it (it did not clean up), is taken out
   and deleted - what pybind11_meta_dealloc does for its own metatype. */
inline PyObject *weakref_referent(PyObject *wr);

inline void free_orphan_type_infos(interp_rec *rec, pbd::internals *in)
{
    for (size_t i = 0; i < rec->nforeign_meta; i++) {
        foreign_meta_class &f = rec->foreign_meta[i];
        PyObject *cls = weakref_referent(f.wr);
        Py_DECREF(f.wr);
        if (cls != nullptr) {
            Py_DECREF(cls);   /* alive (a leak reported elsewhere): its type_info stays */
            continue;
        }
        auto found = in != nullptr ? in->registered_types_py.find(f.type) : decltype(in->registered_types_py.end()){};
        if (in == nullptr || found == in->registered_types_py.end() || found->second.size() != 1 ||
            found->second[0] != f.tinfo) {
            continue;
        }
        in->registered_types_py.erase(found);
        if (!f.tinfo->module_local) {
            in->registered_types_cpp.erase(std::type_index(*f.tinfo->cpptype));
            in->registered_types_cpp_fast.erase(f.tinfo->cpptype);
            for (const std::type_info *alias : f.tinfo->alias_chain) {
                in->registered_types_cpp_fast.erase(alias);
            }
        }
        delete f.tinfo;
    }
    std::free(rec->foreign_meta);
    rec->foreign_meta = nullptr;
    rec->nforeign_meta = rec->capforeign_meta = 0;
}

inline int note_class(PyObject *op, void *arg)
{
    auto *rec = static_cast<interp_rec *>(arg);
    pbd::internals *in = rec->shared != nullptr ? rec->shared->get() : nullptr;
    /* pybind11's own classes only: heap types whose instances pybind11
       deallocates (not a Python subclass, whose instances may run __del__,
       nor a plain or static type looked up by a cast) */
    if (in == nullptr || !PyType_Check(op) || !PyType_HasFeature((PyTypeObject *)op, Py_TPFLAGS_HEAPTYPE) ||
        ((PyTypeObject *)op)->tp_dealloc != &pbd::pybind11_object_dealloc ||
        in->registered_types_py.find(reinterpret_cast<PyTypeObject *>(op)) == in->registered_types_py.end()) {
        return 1;
    }
    /* made without a scope (make_new_python_type: the lazily made iterator
       and bind_vector/bind_map helper classes, std::function wrappers): no
       __module__ set, and one reference pybind11 keeps "alive forever" */
    PyObject *dict = ((PyTypeObject *)op)->tp_dict;
    bool scopeless = dict != nullptr && PyDict_GetItemString(dict, "__module__") == nullptr;
    PyObject *wr = PyWeakref_NewRef(op, nullptr);
    PyObject *wr2 = wr != nullptr && scopeless ? PyWeakref_NewRef(op, nullptr) : nullptr;
    if (wr == nullptr || (scopeless && wr2 == nullptr) || !grow(rec->classes, rec->capclasses, rec->nclasses) ||
        (scopeless && !grow(rec->scopeless, rec->capscopeless, rec->nscopeless))) {
        Py_XDECREF(wr);
        Py_XDECREF(wr2);
        PyErr_Clear();
        return 0;   /* stop: the classes noted so far are still cleared */
    }
    rec->classes[rec->nclasses++] = wr;
    if (scopeless) {
        rec->scopeless[rec->nscopeless++] = wr2;
    }
    note_foreign_meta(rec, *in, (PyTypeObject *)op);
    return 1;
}

inline void classes_at_user(interp_rec *rec)
{
    if (rec->nclasses == 0) {
        PyUnstable_GC_VisitObjects(&note_class, rec);
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
    give_back_def_submodule_refs(rec);
    give_up_type_cache_weakrefs(rec);
    classes_at_user(rec);
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

/* The referent of a weak reference (new reference), or nullptr if it died. */
inline PyObject *weakref_referent(PyObject *wr)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *obj = nullptr;
    if (PyWeakref_GetRef(wr, &obj) < 0) {
        PyErr_Clear();
    }
    return obj;
#else
    PyObject *obj = PyWeakref_GetObject(wr);
    if (obj == nullptr || obj == Py_None) {
        PyErr_Clear();
        return nullptr;
    }
    Py_INCREF(obj);
    return obj;
#endif
}

/* POST_SHUTDOWN, before the internals go: the classes noted at USER that the
   last GC left alive, cleared (see note_class). */
/* Replaces each weak reference of arr[0..n) by its live referent (a new
   reference); returns how many live. */
inline size_t referents(PyObject **arr, size_t n)
{
    size_t live = 0;
    for (size_t i = 0; i < n; i++) {
        PyObject *wr = arr[i];
        PyObject *obj = weakref_referent(wr);
        Py_DECREF(wr);
        if (obj != nullptr) {
            arr[live++] = obj;
        }
    }
    return live;
}

inline void break_class_cycles(interp_rec *rec)
{
    size_t n = referents(rec->classes, rec->nclasses);
    size_t nscopeless = referents(rec->scopeless, rec->nscopeless);
    for (size_t i = 0; i < n; i++) {
        inquiry clear = Py_TYPE(rec->classes[i])->tp_clear;
        if (clear != nullptr) {
            clear(rec->classes[i]);
        }
    }
    /* the reference pybind11 keeps of a class it made without a scope; its
       own cycles are broken above, so it dies with the last reference */
    for (size_t i = 0; i < nscopeless; i++) {
        if (Py_REFCNT(rec->scopeless[i]) >= 3) {   /* ours here, the classes list's, pybind11's */
            Py_DECREF(rec->scopeless[i]);
        }
        Py_DECREF(rec->scopeless[i]);
    }
    for (size_t i = 0; i < n; i++) {
        Py_DECREF(rec->classes[i]);
    }
    std::free(rec->classes);
    std::free(rec->scopeless);
    rec->classes = rec->scopeless = nullptr;
    rec->nclasses = rec->capclasses = rec->nscopeless = rec->capscopeless = 0;
}

/* POST_SHUTDOWN, after the classes' cycles are broken: pybind11 instances
   still alive are held by something the garbage collector cannot see - a
   py::object member of a C++ object that refers back to it, py::keep_alive,
   a std::function holding a Python callable that holds its owner, or a
   missing Py_DECREF. No adapter can free them; they keep their class,
   pybind11's types and the interpreter's memory (an isolated interpreter's
   obmalloc arenas, ~1.7 MB) allocated. Said once per interpreter, naming
   the classes (internals::registered_instances). */
inline void report_live_instances(const interp_rec *rec, const pbd::internals &in)
{
    if (in.registered_instances.empty()) {
        return;
    }
    std::unordered_set<const void *> seen;
    std::vector<std::pair<std::string, size_t>> per_class;
    for (const auto &kv : in.registered_instances) {
        if (!seen.insert(kv.second).second) {
            continue;
        }
        std::string name = Py_TYPE(reinterpret_cast<PyObject *>(kv.second))->tp_name;
        auto it = per_class.begin();
        while (it != per_class.end() && it->first != name) {
            ++it;
        }
        if (it == per_class.end()) {
            per_class.emplace_back(name, 1);
        } else {
            it->second++;
        }
    }
    /* in the form of pyfini's own leak report (pyfini.h pyfini__state_report),
       which pyfini-leakcheck reads: the classes are named in its report */
    std::fprintf(stderr, "pyfini: leak in interpreter %lld, state \"pyfini_pybind11.instances\": %zu tracked "
                         "objects still alive at POST_SHUTDOWN\n", (long long)rec->interp_id, seen.size());
    for (const auto &c : per_class) {
        std::fprintf(stderr, "pyfini:  - pybind11 class %s: %zu instance(s)\n", c.first.c_str(), c.second);
    }
    std::fprintf(stderr, "pyfini_pybind11: pybind11 instances alive after the interpreter's last garbage "
                         "collection are held by references the garbage collector cannot see (a py::object "
                         "member that refers back to its owner, py::keep_alive, a std::function holding a Python "
                         "callable that holds its owner) or by a missing Py_DECREF; they keep their classes, "
                         "pybind11's types and the interpreter's memory\n");
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
    /* 0. the classes still alive after the last GC: their cycles broken
       while the internals are intact (their instances' deallocs need them) */
    break_class_cycles(rec);
    free_orphan_type_infos(rec, in);
    if (in != nullptr) {
        report_live_instances(rec, *in);
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
    /* 4. the ending thread's caches, and every other thread's that name
          this interpreter */
    for (size_t i = 0; i < rec->nmods; i++) {
        rec->mods[i].ops->release_thread();
        rec->mods[i].ops->forget_interp(rec->interp);
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
    d::install_fetch_hooks();
    d::note_thread();
    rec->interp = PyInterpreterState_Get();
    rec->interp_id = PyInterpreterState_GetID(rec->interp);
    rec->shared = shared;
    rec->mods[rec->nmods++] = d::module_rec{ops, local};
    d::repair_static_property_type((*shared)->static_property_type);
    PyTypeObject *meta = (*shared)->default_metaclass;
    if (rec->metaclass == nullptr && meta != nullptr) {
        rec->metaclass = meta;
        rec->metaclass_dealloc = meta->tp_dealloc;
        meta->tp_dealloc = &d::metaclass_dealloc_repaired;
    }
}

/* Drop the calling thread's pybind11 caches of every shared object
   attached in the current interpreter (no longer needed: every thread's
   caches of an ended interpreter are dropped at its POST_SHUTDOWN; kept for
   programs that call it) (the next pybind11 call on this thread
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
