/* lc_alloc.c - counting wrapper around CPython's allocator domains.
 * See lc_alloc.h.  Everything here runs inside Python's allocators: it must
 * never call a Python allocator itself; its own tables use libc calloc. */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define UNW_LOCAL_ONLY
#include <libunwind.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "lc_alloc.h"
#include "lc_util.h"

#define LC_FORWARD_SLACK 64      /* bytes the debug hooks may add to a forwarded request */
#define LC_SITES_FIRST_CAP 4096   /* first size of the site table */
#define LC_INDEX_FIRST_CAP 8192   /* first size of its hash index (a power of two, > 2 x sites) */

/* The header in front of every block.  16 bytes keep the 16-byte alignment
 * Python's allocators promise. */
typedef struct lc_hdr {
    size_t size;      /* requested size */
    uint32_t site;    /* attribution site id, 0 = none */
    uint32_t flags;   /* LC_F_* and the obmalloc cycle tag in the top 24 bits */
} lc_hdr;
_Static_assert(sizeof(lc_hdr) == 16, "lc_hdr must keep 16-byte alignment");

#define LC_F_DOMAIN  0x3u
#define LC_F_COUNTED 0x4u   /* counted in the totals */
#define LC_F_BARE    0x8u   /* site counters: recorded during a bare cycle */
#define LC_F_OBM     0x10u  /* a pymalloc block of the cycle's interpreter */
#define LC_F_OWN     0x20u  /* tracemalloc's tables: not counted, here nor in the C-heap meter */
#define LC_F_SAMPLE  0x40u  /* allocated in the Python-lines pass: a site's sample, not in its counts */
#define LC_TAG(f)    ((f) >> 8)

static const PyMemAllocatorDomain lc_doms[3] = {PYMEM_DOMAIN_RAW, PYMEM_DOMAIN_MEM, PYMEM_DOMAIN_OBJ};
static PyMemAllocatorEx lc_orig[3];
static int lc_domain_ids[3] = {LC_DOMAIN_RAW, LC_DOMAIN_MEM, LC_DOMAIN_OBJ};
static int lc_where;

/* The C-heap meter of the worker (lc_heap.c), when linked: the tool's own
 * allocations (site tables, tracemalloc's tables) are not counted there. */
void lc_heap_own_enter(void) __attribute__((weak));
void lc_heap_own_leave(void) __attribute__((weak));
static inline void heap_own_enter(void)
{
    if (lc_heap_own_enter) lc_heap_own_enter();
}
static inline void heap_own_leave(void)
{
    if (lc_heap_own_leave) lc_heap_own_leave();
}

/* Counters, one set per thread that ever allocated: only the owning thread
 * writes its set (no atomic read-modify-write on the hot path, which costs
 * more than the rest of the wrapper); readers add all sets up.  A block freed
 * by another thread than the one that allocated it moves the counts between
 * sets, the sum stays exact.  Sets are never freed (one per thread). */
typedef struct lc_counts {
    int64_t bytes[LC_NDOMAINS], blocks[LC_NDOMAINS];
    struct lc_counts *next;
} lc_counts;
static lc_counts *lc_all_counts;               /* list head, pushed atomically */
static _Thread_local lc_counts *lc_my_counts;

static lc_counts *register_counts(void)
{
    heap_own_enter();
    lc_counts *c = calloc(1, sizeof *c);
    heap_own_leave();
    if (!c) abort();   /* cannot count: better a clear crash than wrong figures */
    c->next = __atomic_load_n(&lc_all_counts, __ATOMIC_ACQUIRE);
    while (!__atomic_compare_exchange_n(&lc_all_counts, &c->next, c, 0, __ATOMIC_RELEASE, __ATOMIC_ACQUIRE)) {}
    lc_my_counts = c;
    return c;
}

static inline void count(int domain, int64_t dbytes, int64_t dblocks)
{
    lc_counts *c = lc_my_counts;
    if (__builtin_expect(c == NULL, 0)) c = register_counts();
    __atomic_store_n(&c->bytes[domain], c->bytes[domain] + dbytes, __ATOMIC_RELAXED);
    __atomic_store_n(&c->blocks[domain], c->blocks[domain] + dblocks, __ATOMIC_RELAXED);
}

/* > 0 while this thread is inside pymalloc (a MEM or OBJ request).  A RAW
 * call then is either pymalloc forwarding a request too large for its pools
 * (the same size, plus at most the debug hooks' few bytes: not counted again,
 * the MEM/OBJ wrapper counts it) or pymalloc's own bookkeeping (arena table,
 * arena map nodes: counted in LC_DOMAIN_OBMALLOC, the py.obm meter). */
static _Thread_local int lc_in_pymalloc;
static _Thread_local size_t lc_outer_size;     /* the MEM/OBJ request being served */
static _Thread_local int lc_forwarded;         /* that request went to RAW */
static _Thread_local unsigned lc_raw_hits;

/* tracemalloc's hooks on this thread (see "tracemalloc's own requests") */
static _Thread_local int lc_tm_depth, lc_tm_free, lc_tm_first_done;
/* The return address of the outermost hook: the same return address (into
 * PyObject_Malloc & co, or their caller) that an untraced request's stack
 * has right after the counting wrapper's frames. */
static _Thread_local void *lc_tm_ret;

/* --- attribution sites -------------------------------------------------- */
typedef struct lc_site {
    uint64_t hash;
    uint32_t next_sample;   /* round robin over info.samples when all are live */
    lc_site_info info;
} lc_site;

static pthread_mutex_t lc_site_lock = PTHREAD_MUTEX_INITIALIZER;
static lc_site *lc_sites;         /* id = index + 1 */
static uint32_t lc_nsites, lc_capsites;
static uint32_t *lc_index;        /* open addressing, holds ids */
static uint32_t lc_index_cap;     /* power of two */
static int lc_recording;          /* 0 off, 1 subject, 2 bare */

/* obmalloc blocks of the current cycle's interpreter */
static void *lc_obm_main;         /* main interpreter; NULL = not tracking */
static uint32_t lc_obm_tag;
static int64_t lc_obm_live;

static inline void add64(int64_t *p, int64_t v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

/* One multiply per frame, not per byte (FNV-1a over the bytes cost one
 * dependent multiply per byte: 192 per 24-frame stack, for every allocation
 * of a --where cycle).  The hash only picks the slot; site_find compares the
 * frames themselves. */
static uint64_t hash_frames(int domain, void **ip, int n)
{
    uint64_t h = LC_FNV_OFFSET ^ (uint64_t)domain;
    for (int i = 0; i < n; i++) {
        h = (h ^ (uint64_t)(uintptr_t)ip[i]) * 0x9e3779b97f4a7c15u;
        h ^= h >> 29;
    }
    return h ? h : 1;
}

static int index_insert(uint32_t id, uint64_t hash)
{
    uint32_t mask = lc_index_cap - 1;
    for (uint32_t i = (uint32_t)hash & mask;; i = (i + 1) & mask) {
        if (lc_index[i] == 0) {
            lc_index[i] = id;
            return 0;
        }
    }
}

static int grow_tables(void)
{
    if (lc_nsites + 1 > lc_capsites) {
        uint32_t cap = lc_capsites ? lc_capsites * 2 : LC_SITES_FIRST_CAP;
        lc_site *s = realloc(lc_sites, cap * sizeof *s);
        if (!s) return -1;
        lc_sites = s;
        lc_capsites = cap;
    }
    if ((lc_nsites + 1) * 2 > lc_index_cap) {
        uint32_t cap = lc_index_cap ? lc_index_cap * 2 : LC_INDEX_FIRST_CAP;
        uint32_t *ix = calloc(cap, sizeof *ix);
        if (!ix) return -1;
        free(lc_index);
        lc_index = ix;
        lc_index_cap = cap;
        for (uint32_t id = 1; id <= lc_nsites; id++) index_insert(id, lc_sites[id - 1].hash);
    }
    return 0;
}

/* Called with the lock held: the id of the site of that stack (hash h), 0 none. */
static uint32_t site_find(int domain, void **ip, int n, uint64_t h)
{
    if (!lc_index_cap) return 0;
    uint32_t mask = lc_index_cap - 1;
    for (uint32_t i = (uint32_t)h & mask; lc_index[i]; i = (i + 1) & mask) {
        lc_site *s = &lc_sites[lc_index[i] - 1];
        if (s->hash == h && s->info.domain == domain && s->info.nframes == n
            && memcmp(s->info.frames, ip, (size_t)n * sizeof(void *)) == 0)
            return lc_index[i];
    }
    return 0;
}

/* Called with the lock held. Returns the site id or 0 when out of memory. */
static uint32_t site_lookup(int domain, void **ip, int n)
{
    uint64_t h = hash_frames(domain, ip, n);
    uint32_t found = site_find(domain, ip, n, h);
    if (found) return found;
    heap_own_enter();
    int grown = grow_tables();
    heap_own_leave();
    if (grown < 0) return 0;
    lc_site *s = &lc_sites[lc_nsites++];
    memset(s, 0, sizeof *s);
    s->hash = h;
    s->info.domain = domain;
    s->info.nframes = n;
    memcpy(s->info.frames, ip, (size_t)n * sizeof(void *));
    index_insert(lc_nsites, h);
    return lc_nsites;
}

/* A sample: a free slot first, else round robin; a freed sample frees its
   slot, so blocks that stay (a leak's) accumulate in the slots. */
static void site_put_sample(lc_site *s, void *sample)
{
    int slot = -1;
    for (int i = 0; i < LC_SAMPLES && slot < 0; i++)
        if (!s->info.samples[i]) slot = i;
    if (slot < 0) slot = (int)(s->next_sample++ % LC_SAMPLES);
    s->info.samples[slot] = sample;
}

uint32_t lc_alloc_site_add(int domain, void **ip, int n, int64_t bytes, int bare, void *sample)
{
    pthread_mutex_lock(&lc_site_lock);
    uint32_t id = site_lookup(domain, ip, n);
    if (id) {
        lc_site *s = &lc_sites[id - 1];
        s->info.bytes[bare] += bytes;
        s->info.blocks[bare] += 1;
        if (!bare && sample) site_put_sample(s, sample);
    }
    pthread_mutex_unlock(&lc_site_lock);
    return id;
}

void lc_alloc_site_change(uint32_t id, int bare, int64_t dbytes, int64_t dblocks, void *old_ptr, void *now_ptr)
{
    pthread_mutex_lock(&lc_site_lock);
    lc_site *s = &lc_sites[id - 1];
    s->info.bytes[bare] += dbytes;
    s->info.blocks[bare] += dblocks;
    if (old_ptr)
        for (int i = 0; i < LC_SAMPLES; i++)
            if (s->info.samples[i] == old_ptr) s->info.samples[i] = now_ptr;
    pthread_mutex_unlock(&lc_site_lock);
}

/* The Python-lines pass (recording kind 3): a block allocated at a known
 * site becomes one of its samples (a free slot first, else round robin);
 * the site's counts do not change. */
uint32_t lc_alloc_site_sample(int domain, void **ip, int n, void *sample)
{
    pthread_mutex_lock(&lc_site_lock);
    uint32_t id = site_find(domain, ip, n, hash_frames(domain, ip, n));
    if (id) site_put_sample(&lc_sites[id - 1], sample);
    pthread_mutex_unlock(&lc_site_lock);
    return id;
}

/* The stack of a traced request (Python-lines pass) as the untraced
 * request's was: this program's frames (the counting wrapper), then from
 * the hook's return address on, without tracemalloc's frames between.
 * Returns the number of frames in out, 0 when the hook's frame is not found. */
extern const char __executable_start[], etext[];
static int untraced_stack(void **ip, int n, void **out)
{
    int i0 = 0, k = 0;
    while (i0 < n && (const char *)ip[i0] >= __executable_start && (const char *)ip[i0] < etext) i0++;
    int j = i0;
    while (j < n && ip[j] != lc_tm_ret) j++;
    if (j == n || !lc_tm_ret) return 0;
    for (int i = 0; i < i0 && k < LC_MAX_FRAMES; i++) out[k++] = ip[i];
    for (int i = j; i < n && k < LC_MAX_FRAMES; i++) out[k++] = ip[i];
    return k;
}

#define LC_TM_FRAMES_MAX 12   /* tracemalloc's frames in a traced request's stack, at most */

static void site_attach(lc_hdr *h, int domain)
{
    int kind = __atomic_load_n(&lc_recording, __ATOMIC_RELAXED);
    if (!kind) return;
    void *ip[LC_MAX_FRAMES + 1 + LC_TM_FRAMES_MAX];
    int n = unw_backtrace(ip, kind == 3 ? LC_MAX_FRAMES + 1 + LC_TM_FRAMES_MAX : LC_MAX_FRAMES + 1);
    if (n <= 1) return;
    /* frame 0 is this function's caller inside this file: drop it */
    if (kind == 3) {
        /* a request from outside tracemalloc's hooks has its stack as is */
        void *st[LC_MAX_FRAMES];
        int k = lc_tm_depth > 0 ? untraced_stack(ip + 1, n - 1, st) : 0;
        if (!k) {
            k = n - 1 < LC_MAX_FRAMES ? n - 1 : LC_MAX_FRAMES;
            memcpy(st, ip + 1, (size_t)k * sizeof *st);
        }
        uint32_t id = lc_alloc_site_sample(domain, st, k, h + 1);
        if (id) h->site = id, h->flags |= LC_F_SAMPLE;
        return;
    }
    uint32_t id = lc_alloc_site_add(domain, ip + 1, n - 1, (int64_t)h->size, kind == 2, NULL);
    if (!id) return;
    h->site = id;
    if (kind == 2) h->flags |= LC_F_BARE;
}

/* A block of the site was freed (now_ptr NULL) or moved by realloc. */
static void site_adjust(const lc_hdr *h, int64_t dbytes, int64_t dblocks, void *old_ptr, void *now_ptr)
{
    if (h->flags & LC_F_SAMPLE) dbytes = dblocks = 0;   /* only the sample moves */
    lc_alloc_site_change(h->site, (h->flags & LC_F_BARE) != 0, dbytes, dblocks, old_ptr, now_ptr);
}

/* --- obmalloc blocks of one interpreter ---------------------------------- */
static PyThreadState *current_tstate(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return PyThreadState_GetUnchecked();
#else
    return _PyThreadState_UncheckedGet();
#endif
}

static void obm_tag(lc_hdr *h, int domain, int large)
{
    void *main_interp = __atomic_load_n(&lc_obm_main, __ATOMIC_RELAXED);
    if (!main_interp || domain == LC_DOMAIN_RAW || large) return;
    PyThreadState *ts = current_tstate();
    if (!ts || (void *)PyThreadState_GetInterpreter(ts) == main_interp) return;
    h->flags |= LC_F_OBM | (lc_obm_tag << 8);
    add64(&lc_obm_live, 1);
}

static void obm_untag(lc_hdr *h)
{
    if ((h->flags & LC_F_OBM) && LC_TAG(h->flags) == __atomic_load_n(&lc_obm_tag, __ATOMIC_RELAXED))
        add64(&lc_obm_live, -1);
    h->flags &= 0xffu & ~LC_F_OBM;
}

/* --- tracemalloc's own requests (--where with Python lines) ------------- */
/* Once lc_alloc_over_tracemalloc() ran, the chain is: caller -> outer hook
 * (below) -> tracemalloc's hook -> counting wrapper -> original allocator.
 * Within one outer malloc/calloc/realloc, tracemalloc first forwards the
 * caller's request (the first top-level call of a counting wrapper), then
 * allocates for its own tables (every later one; all of them within an outer
 * free). A top-level call outside any outer hook is counted as the caller's:
 * after the subject called tracemalloc.stop(), every request arrives that
 * way (tracemalloc puts back the counting wrappers it wrapped); only the
 * rare table allocation of PyTraceMalloc_Track() is then counted too. */
static int lc_over_tm;
static PyMemAllocatorEx lc_tm[3];          /* tracemalloc's hooks */
static _Thread_local int lc_inner_depth;   /* counting wrappers active on this thread */

static inline int tm_own_request(void)
{
    if (!lc_over_tm || lc_inner_depth > 0 || lc_tm_depth == 0) return 0;
    if (lc_tm_free || lc_tm_first_done) return 1;
    lc_tm_first_done = 1;
    return 0;
}

/* --- the wrappers -------------------------------------------------------- */
static void *account_new(void *raw, size_t n, int domain, int large, int own)
{
    lc_hdr *h = raw;
    h->size = n;
    h->site = 0;
    h->flags = (uint32_t)domain;
    if (own) {   /* tracemalloc's tables: never counted */
        h->flags |= LC_F_OWN;
        return h + 1;
    }
    if (domain == LC_DOMAIN_RAW && lc_in_pymalloc && !lc_forwarded && n >= lc_outer_size
        && n <= lc_outer_size + LC_FORWARD_SLACK) {
        lc_forwarded = 1;
        lc_raw_hits++;          /* a forwarded large request: counted by its MEM/OBJ caller */
        return h + 1;
    }
    if (domain == LC_DOMAIN_RAW && lc_in_pymalloc) {
        domain = LC_DOMAIN_OBMALLOC;   /* pymalloc's own bookkeeping */
        h->flags = (uint32_t)domain;
    }
    h->flags |= LC_F_COUNTED;
    count(domain, (int64_t)n, 1);
    if (lc_where) {
        site_attach(h, domain);
        obm_tag(h, domain, large);
    }
    return h + 1;
}

/* Around every call into the original allocator of domain d: inside
 * pymalloc (MEM, OBJ) a RAW call is pymalloc's, and a request of
 * outer_size bytes (0: a free) may be forwarded to RAW whole. */
static inline void orig_enter(int d, size_t outer_size)
{
    lc_inner_depth++;
    if (d == LC_DOMAIN_RAW) return;
    lc_in_pymalloc++;
    lc_outer_size = outer_size;
    lc_forwarded = 0;
}

static inline void orig_leave(int d)
{
    lc_inner_depth--;
    if (d == LC_DOMAIN_RAW) return;
    lc_forwarded = 0;
    lc_in_pymalloc--;
}

/* malloc (zero = 0) or calloc (zero = 1) of n bytes in the domain of ctx */
static void *alloc_new(void *ctx, size_t n, int zero)
{
    int d = *(int *)ctx;
    PyMemAllocatorEx *o = &lc_orig[d];
    unsigned hits = lc_raw_hits;
    int own = tm_own_request();
    orig_enter(d, n + sizeof(lc_hdr));
    if (own) heap_own_enter();
    void *p = zero ? o->calloc(o->ctx, 1, n + sizeof(lc_hdr)) : o->malloc(o->ctx, n + sizeof(lc_hdr));
    if (own) heap_own_leave();
    orig_leave(d);
    if (!p) return NULL;
    return account_new(p, n, d, lc_raw_hits != hits, own);
}

static void *lc_malloc(void *ctx, size_t n)
{
    if (n > SIZE_MAX - sizeof(lc_hdr)) return NULL;
    return alloc_new(ctx, n, 0);
}

static void *lc_calloc(void *ctx, size_t nelem, size_t elsize)
{
    if (elsize && nelem > (SIZE_MAX - sizeof(lc_hdr)) / elsize) return NULL;
    return alloc_new(ctx, nelem * elsize, 1);
}

static void lc_free(void *ctx, void *ptr)
{
    if (!ptr) return;
    int d = *(int *)ctx;
    lc_hdr *h = (lc_hdr *)ptr - 1;
    if (h->flags & LC_F_COUNTED) {
        int hd = (int)(h->flags & LC_F_DOMAIN);
        count(hd, -(int64_t)h->size, -1);
        if (h->site) site_adjust(h, -(int64_t)h->size, -1, ptr, NULL);
        if (h->flags & LC_F_OBM) obm_untag(h);
    }
    PyMemAllocatorEx *o = &lc_orig[d];
    int own = (h->flags & LC_F_OWN) != 0;
    lc_inner_depth++;
    if (d != LC_DOMAIN_RAW) lc_in_pymalloc++;
    if (own) heap_own_enter();
    o->free(o->ctx, h);
    if (own) heap_own_leave();
    if (d != LC_DOMAIN_RAW) lc_in_pymalloc--;
    lc_inner_depth--;
}

static void *lc_realloc(void *ctx, void *ptr, size_t n)
{
    if (!ptr) return lc_malloc(ctx, n);
    int d = *(int *)ctx;
    if (n > SIZE_MAX - sizeof(lc_hdr)) return NULL;
    lc_hdr *h = (lc_hdr *)ptr - 1;
    size_t old = h->size;
    PyMemAllocatorEx *o = &lc_orig[d];
    unsigned hits = lc_raw_hits;
    (void)tm_own_request();   /* the block keeps its kind: counted or tracemalloc's */
    int own = (h->flags & LC_F_OWN) != 0;
    orig_enter(d, n + sizeof(lc_hdr));
    if (own) heap_own_enter();
    lc_hdr *nh = o->realloc(o->ctx, h, n + sizeof(lc_hdr));
    if (own) heap_own_leave();
    orig_leave(d);
    if (!nh) return NULL;   /* the old block is untouched */
    nh->size = n;
    if (nh->flags & LC_F_COUNTED) {
        int hd = (int)(nh->flags & LC_F_DOMAIN);
        count(hd, (int64_t)n - (int64_t)old, 0);
        if (nh->site) site_adjust(nh, (int64_t)n - (int64_t)old, 0, ptr, nh + 1);
        if (lc_where && hd != LC_DOMAIN_RAW) {
            obm_untag(nh);
            obm_tag(nh, hd, lc_raw_hits != hits);
        }
    }
    return nh + 1;
}

/* Without --where, MEM and OBJ requests (nearly all of a cycle's) take a
 * shorter path: the same counts as alloc_new()/lc_free() give there, less
 * of what only --where needs (tracemalloc's own requests, sites, obmalloc
 * tags).  Counting costs one of these per allocation and per free: it was
 * 7 % of a bare cycle's instructions (cachegrind, CPython 3.13.0). */
static inline void *pm_new(int d, size_t n, int zero)
{
    PyMemAllocatorEx *o = &lc_orig[d];
    orig_enter(d, n + sizeof(lc_hdr));
    lc_hdr *h = zero ? o->calloc(o->ctx, 1, n + sizeof(lc_hdr)) : o->malloc(o->ctx, n + sizeof(lc_hdr));
    orig_leave(d);
    if (!h) return NULL;
    h->size = n;
    h->site = 0;
    h->flags = (uint32_t)d | LC_F_COUNTED;
    count(d, (int64_t)n, 1);
    return h + 1;
}

static void *pm_malloc(void *ctx, size_t n)
{
    if (n > SIZE_MAX - sizeof(lc_hdr)) return NULL;
    return pm_new(*(int *)ctx, n, 0);
}

static void *pm_calloc(void *ctx, size_t nelem, size_t elsize)
{
    if (elsize && nelem > (SIZE_MAX - sizeof(lc_hdr)) / elsize) return NULL;
    return pm_new(*(int *)ctx, nelem * elsize, 1);
}

static void pm_free(void *ctx, void *ptr)
{
    if (!ptr) return;
    int d = *(int *)ctx;
    lc_hdr *h = (lc_hdr *)ptr - 1;
    if (h->flags & LC_F_COUNTED) count((int)(h->flags & LC_F_DOMAIN), -(int64_t)h->size, -1);
    PyMemAllocatorEx *o = &lc_orig[d];
    lc_inner_depth++;
    lc_in_pymalloc++;
    o->free(o->ctx, h);
    lc_in_pymalloc--;
    lc_inner_depth--;
}

void lc_alloc_install(int where)
{
    lc_where = where;
    for (int d = 0; d < 3; d++) {
        PyMem_GetAllocator(lc_doms[d], &lc_orig[d]);
        PyMemAllocatorEx w = {&lc_domain_ids[d], lc_malloc, lc_calloc, lc_realloc, lc_free};
        if (!where && lc_doms[d] != PYMEM_DOMAIN_RAW) w.malloc = pm_malloc, w.calloc = pm_calloc, w.free = pm_free;
        PyMem_SetAllocator(lc_doms[d], &w);
    }
}

/* The outer hooks: mark the extent of one caller request. */
typedef struct tm_saved {
    int free, first_done;
    void *ret;
} tm_saved;
/* ret: the hook's return address, into the caller of the allocator API (see
   lc_tm_ret) */
static inline tm_saved tm_enter(int is_free, void *ret)
{
    tm_saved s = {lc_tm_free, lc_tm_first_done, lc_tm_ret};
    lc_tm_depth++;
    lc_tm_free = is_free;
    lc_tm_first_done = 0;
    lc_tm_ret = ret;
    return s;
}
static inline void tm_leave(tm_saved s)
{
    lc_tm_depth--;
    lc_tm_free = s.free;
    lc_tm_first_done = s.first_done;
    lc_tm_ret = s.ret;
}
static void *lc_tmhook_malloc(void *ctx, size_t n)
{
    PyMemAllocatorEx *t = &lc_tm[*(int *)ctx];
    tm_saved s = tm_enter(0, __builtin_return_address(0));
    void *p = t->malloc(t->ctx, n);
    tm_leave(s);
    return p;
}
static void *lc_tmhook_calloc(void *ctx, size_t nelem, size_t elsize)
{
    PyMemAllocatorEx *t = &lc_tm[*(int *)ctx];
    tm_saved s = tm_enter(0, __builtin_return_address(0));
    void *p = t->calloc(t->ctx, nelem, elsize);
    tm_leave(s);
    return p;
}
static void *lc_tmhook_realloc(void *ctx, void *ptr, size_t n)
{
    PyMemAllocatorEx *t = &lc_tm[*(int *)ctx];
    tm_saved s = tm_enter(0, __builtin_return_address(0));
    void *p = t->realloc(t->ctx, ptr, n);
    tm_leave(s);
    return p;
}
static void lc_tmhook_free(void *ctx, void *ptr)
{
    PyMemAllocatorEx *t = &lc_tm[*(int *)ctx];
    tm_saved s = tm_enter(1, __builtin_return_address(0));
    t->free(t->ctx, ptr);
    tm_leave(s);
}

void lc_alloc_recheck_tracemalloc(void)
{
    if (!lc_where || !__atomic_load_n(&lc_over_tm, __ATOMIC_ACQUIRE)) return;
    for (int d = 0; d < 3; d++) {
        PyMemAllocatorEx cur;
        PyMem_GetAllocator(lc_doms[d], &cur);
        /* the hook on top, or the counting wrapper (tracemalloc stopped):
           every request is classified right */
        if (cur.malloc == lc_tmhook_malloc || cur.malloc == lc_malloc) continue;
        /* tracemalloc started again (by the subject) right over the counting
           wrapper: put the hook over it again */
        lc_tm[d] = cur;
        PyMemAllocatorEx w = {&lc_domain_ids[d], lc_tmhook_malloc, lc_tmhook_calloc, lc_tmhook_realloc,
                              lc_tmhook_free};
        PyMem_SetAllocator(lc_doms[d], &w);
    }
}

void lc_alloc_over_tracemalloc(void)
{
    if (!lc_where || lc_over_tm) return;
    for (int d = 0; d < 3; d++) {
        PyMem_GetAllocator(lc_doms[d], &lc_tm[d]);
        PyMemAllocatorEx w = {&lc_domain_ids[d], lc_tmhook_malloc, lc_tmhook_calloc, lc_tmhook_realloc, lc_tmhook_free};
        PyMem_SetAllocator(lc_doms[d], &w);
    }
    __atomic_store_n(&lc_over_tm, 1, __ATOMIC_RELEASE);
}

void lc_alloc_totals(int64_t bytes[LC_NDOMAINS], int64_t blocks[LC_NDOMAINS])
{
    for (int d = 0; d < LC_NDOMAINS; d++) bytes[d] = blocks[d] = 0;
    for (lc_counts *c = __atomic_load_n(&lc_all_counts, __ATOMIC_ACQUIRE); c; c = c->next)
        for (int d = 0; d < LC_NDOMAINS; d++) {
            bytes[d] += __atomic_load_n(&c->bytes[d], __ATOMIC_RELAXED);
            blocks[d] += __atomic_load_n(&c->blocks[d], __ATOMIC_RELAXED);
        }
}

int64_t lc_alloc_bytes(void)
{
    int64_t bytes[LC_NDOMAINS], blocks[LC_NDOMAINS], sum = 0;
    lc_alloc_totals(bytes, blocks);
    for (int d = 0; d < LC_NDOMAINS; d++) sum += bytes[d];
    return sum;
}

int lc_alloc_heap_class(void)
{
    if (lc_inner_depth > 0) return 1;
    /* tracemalloc's hashtables use malloc() itself (Python/tracemalloc.c:
       hashtable_new() passes {malloc, free}): within one of its hooks and
       outside the counting wrappers, a C-heap block is its own */
    if (lc_tm_depth > 0 && __atomic_load_n(&lc_over_tm, __ATOMIC_RELAXED)) return -1;
    return 0;
}

/* The C-heap sites a pass block may be a sample of when no site has its
 * exact stack (lc_alloc_site_sample_near): those holding more bytes from
 * subject cycles than from bare ones, the LC_NEAR_MAX largest. */
#define LC_NEAR_MAX 256
static uint32_t lc_near[LC_NEAR_MAX];
static int lc_nnear;

static int cmp_near(const void *a, const void *b)
{
    const lc_site *x = &lc_sites[*(const uint32_t *)a - 1], *y = &lc_sites[*(const uint32_t *)b - 1];
    int64_t dx = x->info.bytes[0] - x->info.bytes[1], dy = y->info.bytes[0] - y->info.bytes[1];
    return (dx < dy) - (dx > dy);
}

void lc_alloc_samples_reset(void)
{
    pthread_mutex_lock(&lc_site_lock);
    lc_nnear = 0;
    for (uint32_t i = 0; i < lc_nsites; i++) {
        memset(lc_sites[i].info.samples, 0, sizeof lc_sites[i].info.samples);
        const lc_site_info *in = &lc_sites[i].info;
        if (in->domain != LC_SITE_HEAP || in->bytes[0] <= in->bytes[1]) continue;
        if (lc_nnear < LC_NEAR_MAX) {
            lc_near[lc_nnear++] = i + 1;
        } else {   /* keep the largest: replace the smallest so far */
            qsort(lc_near, LC_NEAR_MAX, sizeof *lc_near, cmp_near);
            const lc_site_info *last = &lc_sites[lc_near[LC_NEAR_MAX - 1] - 1].info;
            if (in->bytes[0] - in->bytes[1] > last->bytes[0] - last->bytes[1]) lc_near[LC_NEAR_MAX - 1] = i + 1;
        }
    }
    pthread_mutex_unlock(&lc_site_lock);
}

uint32_t lc_alloc_site_sample_near(int domain, void **ip, int n, void *sample, int min_common)
{
    uint32_t id = lc_alloc_site_sample(domain, ip, n, sample);
    if (id) return id;
    pthread_mutex_lock(&lc_site_lock);
    int best_len = 0;
    for (int c = 0; c < lc_nnear; c++) {
        lc_site *s = &lc_sites[lc_near[c] - 1];
        if (s->info.domain != domain) continue;
        int k = 0;
        while (k < n && k < s->info.nframes && s->info.frames[k] == ip[k]) k++;
        int need = min_common < s->info.nframes ? min_common : s->info.nframes;
        if (k >= need && k > best_len) best_len = k, id = lc_near[c];
    }
    if (id) site_put_sample(&lc_sites[id - 1], sample);
    pthread_mutex_unlock(&lc_site_lock);
    return id;
}

void lc_alloc_set_recording(int kind)
{
    __atomic_store_n(&lc_recording, lc_where ? kind : 0, __ATOMIC_RELAXED);
}

void lc_alloc_obm_begin(void *main_interp, uint32_t tag)
{
    if (!lc_where) return;
    __atomic_store_n(&lc_obm_live, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&lc_obm_tag, tag & 0xffffffu, __ATOMIC_RELAXED);
    __atomic_store_n(&lc_obm_main, main_interp, __ATOMIC_RELAXED);
}

int64_t lc_alloc_obm_end(void)
{
    __atomic_store_n(&lc_obm_main, NULL, __ATOMIC_RELAXED);
    return __atomic_load_n(&lc_obm_live, __ATOMIC_RELAXED);
}

void lc_alloc_foreach_site(lc_site_fn fn, void *arg)
{
    pthread_mutex_lock(&lc_site_lock);
    uint32_t n = lc_nsites;
    pthread_mutex_unlock(&lc_site_lock);
    for (uint32_t id = 1; id <= n; id++) {
        lc_site_info copy;
        pthread_mutex_lock(&lc_site_lock);
        copy = lc_sites[id - 1].info;
        pthread_mutex_unlock(&lc_site_lock);
        if (copy.bytes[0] || copy.bytes[1]) fn(id, &copy, arg);
    }
}
