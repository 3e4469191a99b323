/* lc_heap.c - the exact C-heap meter: glibc's malloc family interposed from
 * the worker executable.  See lc_heap.h.  Nothing here may allocate through
 * malloc: the tables are mmap()ed, the counters static. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "lc_alloc.h"
#include "lc_heap.h"

#if defined(__SANITIZE_ADDRESS__)

/* AddressSanitizer's runtime defines malloc & co; defining them here too
 * would hand its blocks to glibc.  No meter. */
int lc_heap_available(void) { return 0; }
void lc_heap_read(lc_heap_totals *t) { memset(t, 0, sizeof *t); }
void lc_heap_where_enable(void) {}
void lc_heap_set_recording(int kind) { (void)kind; }
void lc_heap_set_pyloc(uint32_t loc) { (void)loc; }
uint32_t lc_heap_sample_pyloc(void *p) { (void)p; return 0; }
void lc_heap_own_enter(void) {}
void lc_heap_own_leave(void) {}

#else

#define UNW_LOCAL_ONLY
#include <libunwind.h>

/* glibc's own entry points (exported by every glibc since 2.2.5) */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

/* --- counters ---------------------------------------------------------- */
#define LC_HEAP_SLOTS 1024
typedef struct heap_slot {
    int64_t bytes[2], blocks[2];   /* [0] plain, [1] through Python's allocators */
    char pad[64 - 4 * sizeof(int64_t)];
} heap_slot;
_Static_assert(sizeof(heap_slot) == 64, "one cache line per slot");

static heap_slot heap_slots[LC_HEAP_SLOTS];
static heap_slot heap_shared;          /* threads beyond LC_HEAP_SLOTS: atomic adds */
static uint32_t heap_nslots;
static _Thread_local heap_slot *heap_my;
static _Thread_local int heap_own;    /* > 0: the tool's own allocation, not counted */

static heap_slot *take_slot(void)
{
    uint32_t i = __atomic_fetch_add(&heap_nslots, 1, __ATOMIC_RELAXED);
    heap_my = i < LC_HEAP_SLOTS ? &heap_slots[i] : &heap_shared;
    return heap_my;
}

static inline void heap_count(int py, int64_t dbytes, int64_t dblocks)
{
    heap_slot *s = heap_my;
    if (__builtin_expect(s == NULL, 0)) s = take_slot();
    if (__builtin_expect(s == &heap_shared, 0)) {
        __atomic_fetch_add(&s->bytes[py], dbytes, __ATOMIC_RELAXED);
        __atomic_fetch_add(&s->blocks[py], dblocks, __ATOMIC_RELAXED);
        return;
    }
    /* only this thread writes its slot: a plain add, published atomically */
    __atomic_store_n(&s->bytes[py], s->bytes[py] + dbytes, __ATOMIC_RELAXED);
    __atomic_store_n(&s->blocks[py], s->blocks[py] + dblocks, __ATOMIC_RELAXED);
}

int lc_heap_available(void) { return 1; }

void lc_heap_read(lc_heap_totals *t)
{
    int64_t b[2] = {0, 0}, n[2] = {0, 0};
    uint32_t ns = __atomic_load_n(&heap_nslots, __ATOMIC_RELAXED);
    if (ns > LC_HEAP_SLOTS) ns = LC_HEAP_SLOTS;
    for (int k = 0; k < 2; k++) {
        for (uint32_t i = 0; i < ns; i++) {
            b[k] += __atomic_load_n(&heap_slots[i].bytes[k], __ATOMIC_RELAXED);
            n[k] += __atomic_load_n(&heap_slots[i].blocks[k], __ATOMIC_RELAXED);
        }
        b[k] += __atomic_load_n(&heap_shared.bytes[k], __ATOMIC_RELAXED);
        n[k] += __atomic_load_n(&heap_shared.blocks[k], __ATOMIC_RELAXED);
    }
    t->plain_bytes = b[0];
    t->plain_blocks = n[0];
    t->bytes = b[0] + b[1];
    t->blocks = n[0] + n[1];
}

void lc_heap_own_enter(void) { heap_own++; }
void lc_heap_own_leave(void) { heap_own--; }

/* --- --where: the recorded plain blocks --------------------------------- */
/* Open addressing on the block's address (linear probing, deletion by
 * backward shift), in mmap()ed memory, under one lock.  Only blocks
 * allocated while recording are in it; every free looks there once the
 * first one was recorded. */
typedef struct rec_entry {
    uintptr_t ptr;     /* 0: empty */
    uint32_t site;
    uint32_t bare;     /* 1: allocated in a bare cycle */
    int64_t size;
    uint32_t sample;   /* 1: a sample of the Python-lines pass (not counted in its site) */
    uint32_t pyloc;    /* a sample's Python line (lc_heap_set_pyloc), 0 none */
} rec_entry;

#define LC_REC_FIRST_CAP (1u << 16)
static int heap_where;
static int heap_recording;             /* 0 off, 1 subject, 2 bare, 3 Python-lines pass */
static _Thread_local uint32_t heap_pyloc;   /* this thread's Python line (lc_heap_set_pyloc) */
static int heap_any_recorded;
static pthread_mutex_t rec_lock = PTHREAD_MUTEX_INITIALIZER;
static rec_entry *rec_tab;
static size_t rec_cap, rec_n;          /* cap: a power of two */

static inline size_t rec_hash(uintptr_t p) { return (size_t)((p >> 4) * 0x9E3779B97F4A7C15ull); }

static void rec_put(rec_entry *tab, size_t cap, const rec_entry *e)
{
    size_t mask = cap - 1;
    for (size_t i = rec_hash(e->ptr) & mask;; i = (i + 1) & mask)
        if (!tab[i].ptr) {
            tab[i] = *e;
            return;
        }
}

static int rec_grow(void)
{
    size_t cap = rec_cap ? rec_cap * 2 : LC_REC_FIRST_CAP;
    void *m = mmap(NULL, cap * sizeof(rec_entry), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return -1;
    rec_entry *tab = m;
    for (size_t i = 0; i < rec_cap; i++)
        if (rec_tab[i].ptr) rec_put(tab, cap, &rec_tab[i]);
    if (rec_tab) munmap(rec_tab, rec_cap * sizeof(rec_entry));
    rec_tab = tab;
    rec_cap = cap;
    return 0;
}

/* Remove ptr's entry into *out; 0 when it was not recorded. */
static int rec_take(uintptr_t ptr, rec_entry *out)
{
    if (!rec_cap) return 0;
    size_t mask = rec_cap - 1, i = rec_hash(ptr) & mask;
    for (; rec_tab[i].ptr != ptr; i = (i + 1) & mask)
        if (!rec_tab[i].ptr) return 0;
    *out = rec_tab[i];
    for (size_t j = i;;) {
        j = (j + 1) & mask;
        if (!rec_tab[j].ptr) break;
        size_t k = rec_hash(rec_tab[j].ptr) & mask;
        /* entry j may move to the hole at i unless its home k lies in (i, j] */
        int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        rec_tab[i] = rec_tab[j];
        i = j;
    }
    rec_tab[i].ptr = 0;
    rec_n--;
    return 1;
}

static void rec_lock_prepare(void) { pthread_mutex_lock(&rec_lock); }
static void rec_lock_release(void) { pthread_mutex_unlock(&rec_lock); }

void lc_heap_where_enable(void)
{
    heap_own++;
    pthread_atfork(rec_lock_prepare, rec_lock_release, rec_lock_release);
    heap_own--;
    __atomic_store_n(&heap_where, 1, __ATOMIC_RELEASE);
}

void lc_heap_set_recording(int kind)
{
    __atomic_store_n(&heap_recording, heap_where ? kind : 0, __ATOMIC_RELAXED);
}

/* Innermost frames a pass block shares with a site to be its sample (the
 * C function that allocated, its caller and theirs) */
#define LC_HEAP_NEAR_FRAMES 3

/* A plain block p of size bytes was allocated while recording. */
static void __attribute__((noinline)) rec_block(void *p, int64_t size, int kind)
{
    void *ip[LC_MAX_FRAMES + 2];
    heap_own++;
    int n = unw_backtrace(ip, LC_MAX_FRAMES + 2);
    if (n > 2 && kind == 3) {
        /* the pass: a block of a site the judged cycles recorded becomes one
           of its samples, with this thread's Python line */
        uint32_t id = lc_alloc_site_sample_near(LC_SITE_HEAP, ip + 2, n - 2, p, LC_HEAP_NEAR_FRAMES);
        pthread_mutex_lock(&rec_lock);
        if (id && ((rec_n + 1) * 2 <= rec_cap || rec_grow() == 0)) {
            rec_entry e = {(uintptr_t)p, id, 0, size, 1, heap_pyloc};
            rec_put(rec_tab, rec_cap, &e);
            rec_n++;
            __atomic_store_n(&heap_any_recorded, 1, __ATOMIC_RELAXED);
        } else if (id) {
            lc_alloc_site_change(id, 0, 0, 0, p, NULL);   /* cannot follow it: drop the sample */
        }
        pthread_mutex_unlock(&rec_lock);
    } else if (n > 2) {
        /* frames 0 and 1: this function and the interposed entry point */
        uint32_t id = lc_alloc_site_add(LC_SITE_HEAP, ip + 2, n - 2, size, kind == 2, NULL);
        pthread_mutex_lock(&rec_lock);
        if (id && ((rec_n + 1) * 2 <= rec_cap || rec_grow() == 0)) {
            rec_entry e = {(uintptr_t)p, id, kind == 2, size, 0, 0};
            rec_put(rec_tab, rec_cap, &e);
            rec_n++;
            __atomic_store_n(&heap_any_recorded, 1, __ATOMIC_RELAXED);
        } else if (id) {
            lc_alloc_site_change(id, kind == 2, -size, -1, NULL, NULL);   /* cannot follow it: forget it */
        }
        pthread_mutex_unlock(&rec_lock);
    }
    heap_own--;
}

/* p is being freed (now NULL) or moved by realloc to now, of now_size bytes. */
static void rec_forget(void *p, void *now, int64_t now_size)
{
    rec_entry e;
    pthread_mutex_lock(&rec_lock);
    int found = rec_take((uintptr_t)p, &e);
    if (found && now) {
        int64_t old = e.size;
        e.ptr = (uintptr_t)now;
        e.size = now_size;
        if ((rec_n + 1) * 2 > rec_cap && rec_grow() < 0) now = NULL;
        else {
            rec_put(rec_tab, rec_cap, &e);
            rec_n++;
        }
        pthread_mutex_unlock(&rec_lock);
        heap_own++;
        if (e.sample) lc_alloc_site_change(e.site, 0, 0, 0, p, now);   /* the sample moves (or goes) */
        else if (now) lc_alloc_site_change(e.site, (int)e.bare, now_size - old, 0, NULL, NULL);
        else lc_alloc_site_change(e.site, (int)e.bare, -old, -1, NULL, NULL);
        heap_own--;
        return;
    }
    pthread_mutex_unlock(&rec_lock);
    if (found) {
        heap_own++;
        if (e.sample) lc_alloc_site_change(e.site, 0, 0, 0, p, NULL);
        else lc_alloc_site_change(e.site, (int)e.bare, -e.size, -1, NULL, NULL);
        heap_own--;
    }
}

void lc_heap_set_pyloc(uint32_t loc) { heap_pyloc = loc; }

uint32_t lc_heap_sample_pyloc(void *p)
{
    uint32_t loc = 0;
    pthread_mutex_lock(&rec_lock);
    if (rec_cap) {
        size_t mask = rec_cap - 1;
        for (size_t i = rec_hash((uintptr_t)p) & mask; rec_tab[i].ptr; i = (i + 1) & mask)
            if (rec_tab[i].ptr == (uintptr_t)p) {
                if (rec_tab[i].sample) loc = rec_tab[i].pyloc;
                break;
            }
    }
    pthread_mutex_unlock(&rec_lock);
    return loc;
}

/* --- the accounting around glibc's calls -------------------------------- */
/* -1: not counted (the tool's own), 0 plain, 1 Python's */
static inline int heap_class(void) { return heap_own ? -1 : lc_alloc_heap_class(); }

static inline void *heap_new(void *p)
{
    int py;
    if (!p || (py = heap_class()) < 0) return p;
    int64_t sz = (int64_t)malloc_usable_size(p);
    heap_count(py, sz, 1);
    if (__builtin_expect(__atomic_load_n(&heap_recording, __ATOMIC_RELAXED) != 0, 0) && !py)
        rec_block(p, sz, __atomic_load_n(&heap_recording, __ATOMIC_RELAXED));
    return p;
}

static inline void heap_gone(void *p)
{
    int py;
    if (!p || (py = heap_class()) < 0) return;
    heap_count(py, -(int64_t)malloc_usable_size(p), -1);
    if (__builtin_expect(__atomic_load_n(&heap_any_recorded, __ATOMIC_RELAXED), 0)) rec_forget(p, NULL, 0);
}

#define LC_EXPORT __attribute__((visibility("default")))

LC_EXPORT void *malloc(size_t n) { return heap_new(__libc_malloc(n)); }

LC_EXPORT void *calloc(size_t nelem, size_t elsize) { return heap_new(__libc_calloc(nelem, elsize)); }

LC_EXPORT void free(void *p)
{
    heap_gone(p);
    __libc_free(p);
}

/* C23's sized frees (glibc 2.41+ has them): the sizes are a hint */
LC_EXPORT void free_sized(void *p, size_t n)
{
    (void)n;
    free(p);
}

LC_EXPORT void free_aligned_sized(void *p, size_t alignment, size_t n)
{
    (void)alignment, (void)n;
    free(p);
}

LC_EXPORT void *realloc(void *p, size_t n)
{
    if (!p) return malloc(n);
    int py = heap_class();
    if (py < 0) return __libc_realloc(p, n);
    int64_t old = (int64_t)malloc_usable_size(p);
    void *q = __libc_realloc(p, n);
    if (!q) {
        if (n == 0) {   /* glibc: realloc(p, 0) frees p */
            heap_count(py, -old, -1);
            if (__atomic_load_n(&heap_any_recorded, __ATOMIC_RELAXED)) rec_forget(p, NULL, 0);
        }
        return NULL;    /* else: failed, p untouched */
    }
    int64_t now = (int64_t)malloc_usable_size(q);
    heap_count(py, now - old, 0);
    if (__atomic_load_n(&heap_any_recorded, __ATOMIC_RELAXED)) rec_forget(p, q, now);
    return q;
}

LC_EXPORT void *reallocarray(void *p, size_t nelem, size_t elsize)
{
    size_t n;
    if (__builtin_mul_overflow(nelem, elsize, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(p, n);
}

LC_EXPORT void *memalign(size_t alignment, size_t n) { return heap_new(__libc_memalign(alignment, n)); }

LC_EXPORT void *aligned_alloc(size_t alignment, size_t n) { return memalign(alignment, n); }

LC_EXPORT int posix_memalign(void **out, size_t alignment, size_t n)
{
    if (alignment % sizeof(void *) || (alignment & (alignment - 1)) || !alignment) return EINVAL;
    int saved = errno;
    void *p = memalign(alignment, n);
    if (!p) return ENOMEM;
    errno = saved;
    *out = p;
    return 0;
}

LC_EXPORT void *valloc(size_t n) { return memalign((size_t)sysconf(_SC_PAGESIZE), n); }

LC_EXPORT void *pvalloc(size_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), r;
    if (__builtin_add_overflow(n, page - 1, &r)) {
        errno = ENOMEM;
        return NULL;
    }
    r &= ~(page - 1);
    return memalign(page, r ? r : page);
}

#endif
