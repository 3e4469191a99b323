/* common/interp_configs.h - the interpreter configs pyfini's programs create,
 * in one table: pyfini-leakcheck (its driver names and describes them and
 * embeds no Python; its worker creates them), the test harness and the
 * phases example.
 *
 * Without Python.h the table is plain data (name, description, the first
 * CPython that has the config, its PyInterpreterConfig fields as ints).
 * Included after Python.h it also gives interp_config_create(). C11 and C++.
 *
 * CPython sources: Include/cpython/pylifecycle.h (PyInterpreterConfig, added
 * in 3.12.0 by gh-98608/gh-99114: own GIL, own obmalloc, multi-phase check),
 * Python/pylifecycle.c (Py_NewInterpreter, Py_NewInterpreterFromConfig).
 */
#ifndef PYFINI_INTERP_CONFIGS_H
#define PYFINI_INTERP_CONFIGS_H

#include <string.h>

enum interp_config_id { INTERP_LEGACY, INTERP_ISOLATED, INTERP_OWN_OBMALLOC, INTERP_SHARED_OBMALLOC, INTERP_NCONFIGS };

typedef struct interp_config {
    const char *name;
    const char *description;   /* what it is, after "name: " */
    unsigned long min_hexversion;   /* first CPython (PY_VERSION_HEX) that can create it */
    int legacy;                /* Py_NewInterpreter() rather than Py_NewInterpreterFromConfig() */
    /* the PyInterpreterConfig (3.12+) */
    int use_main_obmalloc, allow_fork, allow_exec, allow_threads, allow_daemon_threads;
    int check_multi_interp_extensions, own_gil;
} interp_config;

/* indexed by enum interp_config_id */
static const interp_config interp_configs[INTERP_NCONFIGS] = {
    {"legacy", "Py_NewInterpreter(), shared GIL, main obmalloc", 0x030B0000ul, 1, 1, 1, 1, 1, 1, 0, 0},
    {"isolated", "own GIL, own obmalloc, multi-phase extensions only (Py_NewInterpreterFromConfig)", 0x030C0000ul,
     0, 0, 0, 0, 1, 0, 1, 1},
    {"own-obmalloc", "shared GIL, own obmalloc, multi-phase extensions only (Py_NewInterpreterFromConfig)",
     0x030C0000ul, 0, 0, 0, 0, 1, 0, 1, 0},
    {"shared-obmalloc", "shared GIL, main obmalloc, multi-phase extensions only (Py_NewInterpreterFromConfig)",
     0x030C0000ul, 0, 1, 0, 0, 1, 0, 1, 0},
};

/* The config called name, or NULL. */
static inline const interp_config *interp_config_find(const char *name)
{
    for (int i = 0; i < INTERP_NCONFIGS; i++)
        if (strcmp(interp_configs[i].name, name) == 0) return &interp_configs[i];
    return NULL;
}

/* "legacy, isolated, own-obmalloc, shared-obmalloc" (sep between names) into out[n]. */
static inline void interp_config_list(char *out, size_t n, const char *sep)
{
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < INTERP_NCONFIGS && len + 1 < n; i++) {
        const char *parts[2] = {i ? sep : "", interp_configs[i].name};
        for (int p = 0; p < 2; p++) {
            size_t l = strlen(parts[p]);
            if (len + l >= n) l = n - 1 - len;
            memcpy(out + len, parts[p], l);
            len += l;
            out[len] = 0;
        }
    }
}

#ifdef Py_PYTHON_H
/* The config exists on the CPython being compiled against. */
static inline int interp_config_available(const interp_config *c)
{
    return PY_VERSION_HEX >= c->min_hexversion;
}

/* Create an interpreter with config c; its thread state becomes current.
 * Legacy: Py_NewInterpreter() (NULL -> an error status, the exception, if
 * any, left pending). Others need CPython 3.12+ (an error status before). */
static inline PyStatus interp_config_create(const interp_config *c, PyThreadState **ts)
{
    *ts = NULL;
    if (c->legacy) {
        *ts = Py_NewInterpreter();
        return *ts ? PyStatus_Ok() : PyStatus_Error("Py_NewInterpreter() returned NULL");
    }
#if PY_VERSION_HEX >= 0x030C0000
    PyInterpreterConfig pc;
    memset(&pc, 0, sizeof pc);
    pc.use_main_obmalloc = c->use_main_obmalloc;
    pc.allow_fork = c->allow_fork;
    pc.allow_exec = c->allow_exec;
    pc.allow_threads = c->allow_threads;
    pc.allow_daemon_threads = c->allow_daemon_threads;
    pc.check_multi_interp_extensions = c->check_multi_interp_extensions;
    pc.gil = c->own_gil ? PyInterpreterConfig_OWN_GIL : PyInterpreterConfig_SHARED_GIL;
    return Py_NewInterpreterFromConfig(ts, &pc);
#else
    return PyStatus_Error("this interpreter config needs CPython 3.12 or newer");
#endif
}
#endif /* Py_PYTHON_H */

#endif /* PYFINI_INTERP_CONFIGS_H */
