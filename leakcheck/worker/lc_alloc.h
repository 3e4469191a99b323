/* lc_alloc.h - counting wrapper around CPython's three allocator domains:
 * the one allocator meter of pyfini-leakcheck's worker and of pyfini's tests.
 *
 * lc_alloc_install() must run before Py_PreInitialize()/Py_Initialize(): it
 * saves the current RAW, MEM and OBJ allocators and installs wrappers that
 * put a 16-byte header in front of every block (the requested size, the
 * attribution site, flags).  Every block allocated through a domain is
 * counted exactly in requested bytes; a RAW allocation made by pymalloc
 * itself (a MEM/OBJ request too large for pymalloc) is not counted a second
 * time.  Counters are kept per thread (a RAW call may come from any thread,
 * interpreters with their own GIL may run at the same time) and added up
 * when read.
 */
#ifndef LC_ALLOC_H
#define LC_ALLOC_H

#include <stddef.h>
#include <stdint.h>

/* LC_DOMAIN_OBMALLOC: RAW blocks that pymalloc allocates for itself while
 * serving a MEM/OBJ request (arena table, radix-tree arena map nodes). */
enum { LC_DOMAIN_RAW, LC_DOMAIN_MEM, LC_DOMAIN_OBJ, LC_DOMAIN_OBMALLOC, LC_NDOMAINS };

/* Sites of --where have a domain: one of these, or LC_SITE_HEAP (plain C-heap
 * blocks, recorded by the worker's C-heap meter, lc_heap.c). */
#define LC_SITE_HEAP LC_NDOMAINS
#define LC_NSITE_DOMAINS (LC_NDOMAINS + 1)

/* Install the wrappers. where != 0: also record the allocating call stack
 * of blocks allocated while lc_alloc_set_recording() is on. */
void lc_alloc_install(int where);

/* Live bytes and blocks per domain. */
void lc_alloc_totals(int64_t bytes[LC_NDOMAINS], int64_t blocks[LC_NDOMAINS]);
/* Live bytes of all domains: each block once, in requested bytes. */
int64_t lc_alloc_bytes(void);

/* Attribution (only with where): 0 off, 1 record as subject cycle, 2 as bare,
 * 3 the Python-lines pass: a block allocated at a site already recorded
 * becomes one of its samples, the site's counts stay.
 * lc_alloc_samples_reset() empties every site's samples (before that pass). */
void lc_alloc_set_recording(int kind);
void lc_alloc_samples_reset(void);

/* obmalloc blocks of the interpreter created in the current cycle (only with
 * where): lc_alloc_obm_begin(main_interp, tag) before the interpreter is
 * created, lc_alloc_obm_end() right after it ended returns the number of
 * pymalloc blocks it allocated that are still in use. */
void lc_alloc_obm_begin(void *main_interp, uint32_t tag);
int64_t lc_alloc_obm_end(void);

/* What a C-heap block allocated or freed by this thread now is: 1 Python's
 * (inside a counting wrapper's call into an original allocator), -1 the
 * tool's own (tracemalloc's tables, allocated with malloc() inside its hooks:
 * not counted), 0 plain (anything else). */
int lc_alloc_heap_class(void);

/* The recorded sites: call fn for each site with live bytes. */
#define LC_MAX_FRAMES 24
#define LC_SAMPLES 4
typedef struct lc_site_info {
    int domain;
    int nframes;
    void *frames[LC_MAX_FRAMES];
    int64_t bytes[2], blocks[2];   /* [0] subject cycles, [1] bare cycles */
    /* up to LC_SAMPLES live blocks of the site allocated in the Python-lines
     * pass (the pointers Python's allocator API returned; NULL = none):
     * tracemalloc knows their Python tracebacks */
    void *samples[LC_SAMPLES];
} lc_site_info;
typedef void (*lc_site_fn)(uint32_t id, const lc_site_info *info, void *arg);
void lc_alloc_foreach_site(lc_site_fn fn, void *arg);

/* A block of bytes allocated at the call stack ip[0..n-1] (domain: an
 * LC_DOMAIN_* or LC_SITE_HEAP), in a bare cycle or not; sample: a pointer
 * tracemalloc may know, or NULL.  Returns the site id (0: out of memory).
 * lc_alloc_site_change(): a block of the site changed size or went (dblocks
 * -1); old_ptr/now_ptr move a sample (NULL: none). */
uint32_t lc_alloc_site_add(int domain, void **ip, int n, int64_t bytes, int bare, void *sample);
void lc_alloc_site_change(uint32_t id, int bare, int64_t dbytes, int64_t dblocks, void *old_ptr, void *now_ptr);
/* The Python-lines pass: the block sample, allocated at the call stack
 * ip[0..n-1], becomes one of the samples of that stack's site if the site
 * exists (its counts stay).  Returns the site id, 0: no such site. */
uint32_t lc_alloc_site_sample(int domain, void **ip, int n, void *sample);
/* The same, and when no site has that exact stack: the site, among the
 * C-heap sites holding more bytes from subject cycles than from bare ones
 * when lc_alloc_samples_reset() ran, whose stack shares the longest run of
 * innermost frames with ip, at least min_common of them (or all its own).
 * A C trace function changes the interpreter loop's code path (3.12+:
 * instrumented bytecode), and with it the outer frames of every stack. */
uint32_t lc_alloc_site_sample_near(int domain, void **ip, int n, void *sample, int min_common);

/* After tracemalloc has started (it wraps these wrappers): wrap it in turn
 * with pass-through hooks that tell the counting wrappers which requests are
 * the caller's and which are tracemalloc's own tables (not counted: the
 * figures stay those of an untraced process). Only with where. */
void lc_alloc_over_tracemalloc(void);

/* Between cycles: if the subject restarted tracemalloc (stop() + start()), it
 * now sits right over the counting wrappers; put the hook back over it. The
 * cycle in which the restart happened counts tracemalloc's tables from then
 * on as the caller's. */
void lc_alloc_recheck_tracemalloc(void);

#endif
