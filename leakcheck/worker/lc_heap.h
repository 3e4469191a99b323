/* lc_heap.h - the exact C-heap meter of pyfini-leakcheck's worker.
 *
 * lc_heap.c defines malloc, calloc, realloc, reallocarray, free, free_sized,
 * free_aligned_sized, posix_memalign, aligned_alloc, memalign, valloc and
 * pvalloc in the worker executable (exported: -Wl,--dynamic-list=
 * lc_heap.dynlist), so that they interpose glibc's for every object of the
 * process: libpython, the dynamic loader once relocated, every extension
 * module dlopen()ed later, and libstdc++ (its operator new/delete, all
 * variants, sized and aligned, call malloc/aligned_alloc/free: they are
 * counted through these).  Each forwards to glibc's own entry points
 * (__libc_malloc, __libc_memalign, ...: no dlsym, so nothing is needed
 * before the first call, and dlsym's own allocations are counted like any
 * other) and counts the block's malloc_usable_size() - the bytes the block
 * holds, at least what was asked (glibc: up to 8 + 15 more).
 *
 * Two sets of counters: blocks obtained through Python's allocators
 * (the counting wrapper of lc_alloc.c is on the stack: py.raw, and the
 * MEM/OBJ requests pymalloc forwards to RAW) and every other block ("plain":
 * malloc() of C extensions, libstdc++'s new, libc's own).  The heap meter is
 * their sum: a byte of PyMem_RawMalloc is counted in py.raw AND in heap,
 * never twice in one meter.  Counters are per thread (a slot of a static
 * table, taken at the thread's first call; past LC_HEAP_SLOTS threads a
 * shared slot with atomic adds): exact across threads, no lock, no
 * allocation, nothing to do at fork (the child's copy is its own).
 *
 * Not built under AddressSanitizer (its runtime replaces malloc itself):
 * lc_heap_available() is 0 there.
 */
#ifndef LC_HEAP_H
#define LC_HEAP_H

#include <stdint.h>

typedef struct lc_heap_totals {
    int64_t bytes, blocks;               /* every live block */
    int64_t plain_bytes, plain_blocks;   /* ... not obtained through Python's allocators */
} lc_heap_totals;

int lc_heap_available(void);   /* 0 under AddressSanitizer */
void lc_heap_read(lc_heap_totals *t);

/* --where: record the allocating call stack of plain blocks allocated while
 * recording (kind 1 subject cycle, 2 bare cycle, 0 off); their sites are
 * kept with lc_alloc's (domain LC_SITE_HEAP), so a block freed in a later
 * cycle leaves its site.  lc_heap_where_enable() once, before the cycles. */
void lc_heap_where_enable(void);
void lc_heap_set_recording(int kind);

/* --where's Python-lines pass (recording kind 3): a plain block allocated at
 * the call stack of a recorded site becomes one of the site's samples
 * (lc_alloc_site_sample), tagged with the allocating thread's Python line,
 * a number set by lc_heap_set_pyloc() (0: none; its meaning is the caller's:
 * where.c's table of "file:line" texts).  lc_heap_sample_pyloc(): the line
 * of a live sample block, 0 if p is none. */
void lc_heap_set_pyloc(uint32_t loc);
uint32_t lc_heap_sample_pyloc(void *p);

/* Corruption (a free of a pointer malloc never returned, a double free, an
 * overrun block) is left to glibc's own checks, which abort the worker
 * ("free(): invalid pointer", "free(): double free detected in tcache 2",
 * "free(): invalid size", "munmap_chunk(): invalid pointer"; or the
 * worker's malloc_usable_size() faults first, SIGSEGV): the driver reports
 * the signal in that cycle
 * with glibc's message as the subject's crash, exit status 3. */

/* The tool's own allocations (its tables, libunwind's caches): while a
 * thread is inside lc_heap_own_enter()/leave(), malloc & co pass through
 * uncounted; so do the blocks tracemalloc allocates with malloc() inside its
 * hooks (lc_alloc_heap_class() < 0).  A block must be freed the way it was
 * allocated. */
void lc_heap_own_enter(void);
void lc_heap_own_leave(void);

#endif
