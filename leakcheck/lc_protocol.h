/* lc_protocol.h - what the pyfini-leakcheck worker tells the driver.
 *
 * The driver (pyfini-leakcheck, not linked to any CPython) starts one worker
 * process (pyfini-leakcheck-worker, linked to one CPython) and reads text
 * lines from a pipe the worker gets as file descriptor LC_RECORD_FD.  One
 * record per line, fields separated by one space, the last field of E/I/F
 * records may contain spaces:
 *
 *   I <key> <value...>          information about the Python (version, build)
 *   A <meter> <0|1> <reason...> meter availability (reason when 0)
 *   R <values>                  reading before the first cycle
 *   B <seq> <S|B>               a cycle begins (S subject, B bare)
 *   C <seq> <S|B> <values>      reading after that cycle
 *   O <seq> <n>                 obmalloc blocks still in use when cycle seq's
 *                               interpreter ended (--where, own obmalloc)
 *   W <site> <domain> <sub_bytes> <sub_blocks> <bare_bytes> <bare_blocks>
 *   F <site> <n> <frame text...> symbolised frame n of site
 *   P <site> <python location...> innermost Python line of site
 *   X <module> <path>           an extension module (--list-extensions)
 *   E <usage|subject|config|internal> <message...>   then the worker exits 2
 *   D                           done
 *
 * <values> are LC_NVALUES integers in the order of enum lc_value; -1 means
 * the meter is unavailable on this build.
 */
#ifndef LC_PROTOCOL_H
#define LC_PROTOCOL_H

#define LC_RECORD_FD 3

enum lc_value {
    LC_V_TIME_NS,   /* wall time of the cycle, ns */
    LC_V_RSS,       /* resident set size, bytes */
    LC_V_MALLOC,    /* malloc bytes in use */
    LC_V_PY,        /* bytes held through Python's allocators, all domains */
    LC_V_PY_RAW,    /* ... PYMEM_DOMAIN_RAW */
    LC_V_PY_MEM,    /* ... PYMEM_DOMAIN_MEM */
    LC_V_PY_OBJ,    /* ... PYMEM_DOMAIN_OBJ */
    LC_V_PY_OBMALLOC, /* ... RAW blocks pymalloc allocates for its own bookkeeping */
    LC_V_BLOCKS,    /* blocks allocated through Python's allocators, in use */
    LC_V_REFS,      /* total reference count (debug builds) */
    LC_V_FDS,       /* open file descriptors */
    LC_NVALUES
};

#endif
