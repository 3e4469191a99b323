/* analyse.c - the meters, and a finished run judged per meter (the
 * statistics: stats.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

const lc_meter_def lc_meters[LC_NMETERS] = {
    {"rss", LC_V_RSS, 1, 0, 4096,
     "resident set size of the worker process (/proc/self/statm), bytes. What the\n"
     "      system sees; includes abandoned obmalloc arenas. Noisy, one-page resolution."},
    {"malloc", LC_V_MALLOC, 1, 0, 16,
     "bytes in use in the C library's malloc (glibc mallinfo2: uordblks + hblkhd),\n"
     "      chunk sizes with malloc's own headers. Noisy (free lists): see heap."},
    {"heap", LC_V_HEAP, 1, 1, 1,
     "bytes of the live blocks of the C heap, exactly: every malloc, calloc, realloc,\n"
     "      reallocarray, posix_memalign, aligned_alloc, memalign, valloc, pvalloc and\n"
     "      free of the process (C extensions, libstdc++'s operator new/delete, libpython,\n"
     "      libc), interposed by the worker; malloc_usable_size() bytes (>= requested)."},
    {"heap.plain", LC_V_HEAP_PLAIN, 1, 1, 1,
     "the part of heap NOT obtained through Python's allocators (the blocks of\n"
     "      PyMem_RawMalloc & co are counted in py.raw and in heap, not here)."},
    {"heap.blocks", LC_V_HEAP_BLOCKS, 0, 1, 1, "live blocks of the C heap (all of heap)."},
    {"py", LC_V_PY, 1, 1, 1,
     "bytes held through Python's allocators (the four rows below): exact requested\n"
     "      sizes, counted by a PyMem_SetAllocator wrapper installed before Py_Initialize."},
    {"py.raw", LC_V_PY_RAW, 1, 1, 1,
     "the same for PYMEM_DOMAIN_RAW (PyMem_RawMalloc: interpreter and thread states,\n"
     "      an isolated interpreter's obmalloc state, buffers of C extensions)."},
    {"py.mem", LC_V_PY_MEM, 1, 1, 1, "the same for PYMEM_DOMAIN_MEM (PyMem_Malloc)."},
    {"py.obj", LC_V_PY_OBJ, 1, 1, 1, "the same for PYMEM_DOMAIN_OBJ (PyObject_Malloc: Python objects)."},
    {"py.obm", LC_V_PY_OBMALLOC, 1, 1, 1,
     "obmalloc's own bookkeeping: RAW blocks pymalloc allocates for itself (arena\n"
     "      table, radix-tree arena map). Lost with an abandoned own-obmalloc state."},
    {"blocks", LC_V_BLOCKS, 0, 1, 1,
     "blocks allocated through Python's allocators and not freed yet (all domains)."},
    {"refs", LC_V_REFS, 0, 1, 1,
     "total reference count, sys.gettotalrefcount(): debug builds (Py_REF_DEBUG) only."},
    {"fds", LC_V_FDS, 0, 1, 1, "open file descriptors of the worker (/proc/self/fd)."},
};

const meter_result *lc_meter_result(const analysis *a, int value)
{
    for (size_t i = 0; i < LC_NMETERS; i++)
        if (a->m[i].def->value == value) return &a->m[i];
    return NULL;
}

/* Cycle times and obmalloc blocks at interpreter end, over the judged cycles. */
static void judged_totals(const lc_run *r, analysis *a)
{
    double ts = 0, tb = 0;
    long ns = 0, nb = 0;
    a->obm_min = INT64_MAX;
    a->obm_max = -1;
    for (size_t i = 0; i < r->ncyc; i++) {
        const lc_cycle *c = &r->cyc[i];
        if (!c->id.judged) continue;
        if (c->id.kind == 'S') ts += (double)c->v[LC_V_TIME_NS], ns++;
        else tb += (double)c->v[LC_V_TIME_NS], nb++;
        if (c->obm >= 0) {
            if (c->obm < a->obm_min) a->obm_min = c->obm;
            if (c->obm > a->obm_max) a->obm_max = c->obm;
            a->obm_mean += (double)c->obm;
            a->obm_n++;
        }
    }
    if (a->obm_n) a->obm_mean /= (double)a->obm_n;
    a->time_subject_ms = ns ? ts / (double)ns / 1e6 : NAN;
    a->time_bare_ms = nb ? tb / (double)nb / 1e6 : NAN;
    a->n_subject = ns;
    a->n_bare = nb;
    a->rounds_judged = ns > nb ? ns : nb;
}

/* The series of value v to judge, one sample per finished block pair of the
 * schedule: growth per cycle over its subject cycles, its bare cycles, and
 * the excess.  Returns the number of pairs; *k = the block length. */
static size_t block_series(const lc_run *r, int v, double *xs, double *xb, double *xe, double *k)
{
    size_t n = 0;
    for (long i = lc_schedule_warmup_length(&r->sched); i < (long)r->ncyc;) {
        lc_slot sl = lc_schedule_at(&r->sched, i);
        long s0 = i, b0 = i + sl.block_len, end = b0 + sl.block_len;
        if (end > (long)r->ncyc) break;   /* an unfinished block (crash) */
        *k = (double)sl.block_len;
        double gs = (double)(r->cyc[b0 - 1].v[v] - (s0 ? r->cyc[s0 - 1].v[v] : r->initial[v]));
        double gb = (double)(r->cyc[end - 1].v[v] - r->cyc[b0 - 1].v[v]);
        xs[n] = gs / *k;
        xb[n] = gb / *k;
        xe[n++] = (gs - gb) / *k;
        i = end;
    }
    return n;
}

/* The smallest growth of the meter's own level over a chunk of the judged
 * samples (chunks as lc_judge cuts them), per subject cycle of the chunk:
 * with block pairs, a pair's subject and bare cycles together (xs + xb per
 * cycle, k cycles each) over its k subject cycles.  A loss of L per subject
 * cycle raises the level by at least L per subject cycle (and by what the
 * bare cycles lose themselves); a table that grows in subject cycles and
 * shrinks in bare ones does not raise it at all. */
static double level_min_per_cycle(const double *xs, const double *xb, size_t n, int nchunks)
{
    double lo = INFINITY;
    for (int c = 0; c < nchunks; c++) {
        size_t a = n * (size_t)c / (size_t)nchunks, b = n * (size_t)(c + 1) / (size_t)nchunks;
        double g = 0;
        for (size_t i = a; i < b; i++) g += xs[i] + (xb ? xb[i] : 0);
        if (b > a && g / (double)(b - a) < lo) lo = g / (double)(b - a);
    }
    return lo;
}

/* Judge one meter: block pairs (paired) or single cycles. */
static void judge_meter(const lc_run *r, meter_result *m, double thr, int paired, double *xs, double *xb,
                        double *xe, double shift)
{
    int v = m->def->value;
    double res = m->def->resolution, k = 1;
    int exact = m->def->exact;
    size_t cs = 0, cb = 0, ce = 0;
    if (paired) {
        cs = cb = ce = block_series(r, v, xs, xb, xe, &k);
    } else {
        for (size_t i = 0; i < r->ncyc; i++) {
            const lc_cycle *c = &r->cyc[i];
            int64_t prev = i ? r->cyc[i - 1].v[v] : r->initial[v];
            if (!c->id.judged) continue;
            if (c->id.kind == 'S') xs[cs++] = (double)(c->v[v] - prev);
            else xb[cb++] = (double)(c->v[v] - prev);
        }
    }
    /* the subject's view (whose.c): CPython's share off the judged series */
    for (size_t i = 0; shift != 0 && i < (paired ? ce : cs); i++) (paired ? xe : xs)[i] -= shift;
    if (cs) lc_judge(xs, cs, k, res, thr, paired, exact, &m->subject), m->have_subject = 1;
    if (cb) lc_judge(xb, cb, k, res, thr, paired, exact, &m->bare), m->have_bare = 1;
    if (ce) lc_judge(xe, ce, k, res, thr, paired, exact, &m->excess), m->have_excess = 1;
    m->judged = m->have_excess ? &m->excess : (m->have_subject ? &m->subject : (m->have_bare ? &m->bare : NULL));
    m->verdict = m->judged ? m->judged->verdict : LC_TOO_FEW;
    m->level_min_per_cycle = NAN;
    if (m->judged && m->judged->nchunks) {
        if (paired) m->level_min_per_cycle = level_min_per_cycle(xs, xb, ce, m->judged->nchunks) - shift;
        else m->level_min_per_cycle = level_min_per_cycle(cs ? xs : xb, NULL, cs ? cs : cb, m->judged->nchunks);
    }
}

static meter_result *find_meter(analysis *a, int value)
{
    for (size_t i = 0; i < LC_NMETERS; i++)
        if (a->m[i].def && a->m[i].def->value == value) return &a->m[i];
    return NULL;
}

static void set_verdict(meter_result *m, enum lc_verdict v, enum lc_overrule why)
{
    m->verdict = v;
    m->overruled = why;
    /* the series judged (m->judged points to one of these three) */
    if (m->judged == &m->excess) m->excess.verdict = v;
    else if (m->judged == &m->subject) m->subject.verdict = v;
    else if (m->judged == &m->bare) m->bare.verdict = v;
}

static int judged_as(const meter_result *m, enum lc_verdict v) { return m && m->available && m->judged && m->verdict == v; }

/* The count meter whose growth would stand behind a bytes meter's: the
 * blocks of Python's allocators behind py*, the C heap's behind heap* and
 * malloc (-3: blocks where heap.blocks is off), either behind rss (-2);
 * -1 none. */
static int count_behind(int v)
{
    switch (v) {
    case LC_V_PY: case LC_V_PY_RAW: case LC_V_PY_MEM: case LC_V_PY_OBJ: case LC_V_PY_OBMALLOC: return LC_V_BLOCKS;
    case LC_V_HEAP: case LC_V_HEAP_PLAIN: return LC_V_HEAP_BLOCKS;
    case LC_V_MALLOC: return -3;   /* heap.blocks, or blocks where the heap meters are off */
    case LC_V_RSS: return -2;
    }
    return -1;
}

/* Count meters: units, not bytes.  blocks, heap.blocks and refs stand for
 * memory (the allowed loss in bytes cannot be told in them); fds do not. */
static int count_of_memory(int v) { return v == LC_V_BLOCKS || v == LC_V_HEAP_BLOCKS || v == LC_V_REFS; }

/* The subject's view (whose.c): rss and malloc see pages and chunks, heap
 * is py's malloc-served blocks plus heap.plain - none is split by sites.
 * Their LEAK in the whole run stood on the meters of the subject's
 * allocations (py, heap.plain, blocks, heap.blocks: the count behind rss and
 * malloc, the parts of heap); with CPython's share off, none of those LEAK:
 * the growth is CPython's too, not the subject's. */
static void cpython_derived(analysis *a, const analysis *whole)
{
    static const int parts[] = {LC_V_PY, LC_V_HEAP_PLAIN, LC_V_BLOCKS, LC_V_HEAP_BLOCKS};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
        if (judged_as(find_meter(a, parts[i]), LC_LEAK)) return;
    static const int derived[] = {LC_V_RSS, LC_V_MALLOC, LC_V_HEAP};
    for (size_t i = 0; i < sizeof derived / sizeof *derived; i++) {
        meter_result *m = find_meter(a, derived[i]);
        const meter_result *w = lc_meter_result(whole, derived[i]);
        if (m && w && judged_as(w, LC_LEAK) && m->judged) set_verdict(m, LC_NO_LEAK, LC_OVERRULE_CPYTHON);
    }
}

/* The run's rule (leakcheck/README.md, "The verdict", the table):
 *  - no LEAK from noise: a meter's LEAK needs its own level grown in every
 *    chunk (regrtest -R: a leak grows every time), per subject cycle by at
 *    least the loss it claims (slope - bound), and, for an exact meter,
 *    every sample (block pair, or cycle) above the allowed loss; a bytes
 *    meter that misses either keeps its LEAK only when the count meter
 *    behind it (blocks, heap.blocks; either for rss) is LEAK - else
 *    inconclusive.  rss and malloc need that count meter LEAK anyway where
 *    one is counted; grown steadily without it, they keep the run from "no
 *    leak";
 *  - LEAK: a bytes meter judged LEAK; or a count meter: fds always, blocks,
 *    heap.blocks and refs when no loss is allowed (--max-bytes-per-cycle 0);
 *  - no leak: every meter that sees the subject's allocations judged "no
 *    leak": py (all of Python's allocators) and heap.plain (the rest of the
 *    C heap), their counts blocks and heap.blocks, refs and fds - a zero part
 *    (py.raw, heap.plain alone) never stands for an inconclusive whole.  heap
 *    is py's malloc-served blocks (in usable bytes) plus heap.plain: its LEAK
 *    counts, its "no leak" is that of its two parts.  Where py is off
 *    (--no-allocator-wrapper) only rss sees Python's objects: rss must say
 *    no leak; where heap is off (AddressSanitizer) malloc must;
 *  - otherwise not judged (exit 4). */
static void run_rule(analysis *a, double max_bytes, const analysis *whole)
{
    /* no LEAK from noise; the count meters first (a bytes meter's LEAK may
       stand on them), malloc last (it looks at heap's final verdict) */
    for (int pass = 0; pass < 3; pass++)
        for (size_t mi = 0; mi < LC_NMETERS; mi++) {
            meter_result *m = &a->m[mi];
            int pass_of = !m->def->bytes ? 0 : m->def->value == LC_V_MALLOC ? 2 : 1;
            if (!judged_as(m, LC_LEAK) || pass_of != pass) continue;
            double thr = m->def->bytes ? max_bytes : 0;
            /* the noisy meters (rss, malloc): their own level only - one
               page more or less decides a single block pair */
            /* floor: one resolution step per chunk, per cycle */
            const lc_judgement *j = m->judged;
            int steady = (!m->def->exact || j->sample_min > thr) && m->level_min_per_cycle >= j->slope - j->bound &&
                         m->level_min_per_cycle >= j->floor;
            int cb = count_behind(m->def->value);
            const meter_result *blocks = find_meter(a, LC_V_BLOCKS), *hblocks = find_meter(a, LC_V_HEAP_BLOCKS);
            if (cb == -3) cb = hblocks && hblocks->available ? LC_V_HEAP_BLOCKS : LC_V_BLOCKS;
            int backed = cb == -2 ? judged_as(blocks, LC_LEAK) || judged_as(hblocks, LC_LEAK)
                                  : cb >= 0 && judged_as(find_meter(a, cb), LC_LEAK);
            /* rss and malloc see what the exact meters see and more (pages,
               glibc's own): their growth without a block count growing with
               it (where one is counted) is not the subject's allocations -
               fragmentation (3.13.0: _pyfini_vm_churn's freed blocks beside
               CPython's own per-cycle loss, rss +454 kB/cycle "LEAK"), or
               memory no allocator saw (a direct mmap): not LEAK, and not "no
               leak" either (the run's rule keeps such a meter undecided) */
            int counted = (blocks && blocks->available) || (hblocks && hblocks->available);
            /* malloc where the exact heap meter judged the same heap (every
               block of malloc & co) and found no LEAK: what only mallinfo2
               sees is glibc's own bookkeeping, never the subject's and never
               memory outside malloc (a direct mmap is not in mallinfo2) -
               not LEAK, and not a reason to withhold "no leak" (3.14.10d,
               pb11_a isolated: malloc +572 B/cycle in every chunk, heap 0 B
               +- 0 B: "not judged" before) */
            const meter_result *hp = find_meter(a, LC_V_HEAP);
            if (m->def->value == LC_V_MALLOC && hp && hp->available && hp->judged && hp->verdict != LC_LEAK
                && !backed) {
                set_verdict(m, LC_INCONCLUSIVE, LC_OVERRULE_MALLOC);
                a->malloc_overruled = 1;
                continue;
            }
            if (steady && (m->def->exact || !counted || backed)) continue;
            if (backed) continue;
            set_verdict(m, LC_INCONCLUSIVE, steady ? LC_OVERRULE_UNBACKED : LC_OVERRULE_NOISE);
            a->noise_overruled = 1;
        }
    /* glibc's malloc statistics (mallinfo2) are not the verdict where the
       exact C-heap meter judged the same heap: every block of malloc & co is
       counted there, so a rise only mallinfo2 sees is glibc's own
       bookkeeping or its noise over few cycles (3.15.2d's bare isolated
       cycle: malloc +244 B/cycle "LEAK", heap 0 B ± 0 B) - inconclusive where
       the heap meter (every block, Python's RAW ones included) did not judge
       LEAK itself (after the rule above) */
    meter_result *heap = find_meter(a, LC_V_HEAP), *mal = find_meter(a, LC_V_MALLOC);
    int heap_says_no = heap && heap->available && heap->judged && heap->verdict != LC_LEAK;
    if (heap_says_no && judged_as(mal, LC_LEAK)) {
        set_verdict(mal, LC_INCONCLUSIVE, LC_OVERRULE_MALLOC);
        a->malloc_overruled = 1;
    }
    if (whole) cpython_derived(a, whole);
    for (size_t mi = 0; mi < LC_NMETERS; mi++) {
        meter_result *m = &a->m[mi];
        if (!m->available || !m->judged) continue;
        if (m->verdict == LC_INCONCLUSIVE) a->inconclusive = 1;
        if (m->verdict != LC_LEAK) continue;
        int v = m->def->value;
        if (m->def->bytes || v == LC_V_FDS || (count_of_memory(v) && max_bytes <= 0)) a->leak = 1;
    }
    /* the meters that must say "no leak" */
    static const int needed[] = {LC_V_PY, LC_V_HEAP_PLAIN, LC_V_BLOCKS, LC_V_HEAP_BLOCKS, LC_V_REFS, LC_V_FDS};
    const meter_result *py = find_meter(a, LC_V_PY), *hp = find_meter(a, LC_V_HEAP_PLAIN);
    a->nundecided = 0;
    for (size_t i = 0; i < sizeof needed / sizeof *needed + 2; i++) {
        int v = i < sizeof needed / sizeof *needed ? needed[i]
              : i == sizeof needed / sizeof *needed ? (py && py->available ? -1 : LC_V_RSS)
                                                    : (hp && hp->available ? -1 : LC_V_MALLOC);
        meter_result *m = v >= 0 ? find_meter(a, v) : NULL;
        if (!m || !m->available) continue;   /* refs: release builds; the wrapper's, the heap's: see above */
        if (max_bytes > 0 && count_of_memory(v)) continue;   /* the bytes meters judge the allowed loss */
        if (!judged_as(m, LC_NO_LEAK)) a->undecided[a->nundecided++] = (int)(m - a->m);
    }
    /* a noisy meter that grew steadily with no block count behind it: not
       the subject's allocations, but not nothing either - undecided (one
       that only moved both ways, a toggle, is just noise) */
    for (size_t mi = 0; mi < LC_NMETERS && a->nundecided < LC_NMETERS; mi++) {
        const meter_result *m = &a->m[mi];
        int listed = 0;
        for (int i = 0; i < a->nundecided; i++) listed |= a->undecided[i] == (int)mi;
        if (m->overruled == LC_OVERRULE_UNBACKED && !listed) a->undecided[a->nundecided++] = (int)mi;
    }
    int any = 0;   /* at least one meter judged at all */
    for (size_t mi = 0; mi < LC_NMETERS; mi++) any |= a->m[mi].available && a->m[mi].judged != NULL;
    a->no_leak = !a->leak && any && a->nundecided == 0;
}

void lc_analyse(const lc_run *r, analysis *a, double max_bytes) { lc_analyse_shifted(r, a, max_bytes, NULL, NULL); }

void lc_analyse_shifted(const lc_run *r, analysis *a, double max_bytes, const double shift[LC_NVALUES],
                        const analysis *whole)
{
    memset(a, 0, sizeof *a);
    judged_totals(r, a);
    int paired = a->n_subject && a->n_bare;
    size_t n = r->ncyc;
    double *xs = calloc(n + 1, sizeof *xs), *xb = calloc(n + 1, sizeof *xb), *xe = calloc(n + 1, sizeof *xe);
    for (size_t mi = 0; mi < LC_NMETERS; mi++) {
        meter_result *m = &a->m[mi];
        m->def = &lc_meters[mi];
        int v = m->def->value;
        m->available = r->avail[v].known ? r->avail[v].available : 1;
        m->how = r->avail[v].how;
        if (!m->available || !r->have_initial || r->initial[v] < 0) {
            m->available = 0;
            continue;
        }
        judge_meter(r, m, m->def->bytes ? max_bytes : 0, paired, xs, xb, xe, shift ? shift[v] : 0);
    }
    run_rule(a, max_bytes, whole);
    free(xs);
    free(xb);
    free(xe);
}

int lc_exit_status(const lc_run *r, const analysis *a)
{
    switch (r->outcome) {
    case LC_OUT_ERROR:
    case LC_OUT_SPAWN: return LC_EXIT_USAGE;
    case LC_OUT_CRASH:
    case LC_OUT_HANG:
    case LC_OUT_MEMORY: return LC_EXIT_CRASH;
    case LC_OUT_INTERRUPTED: return LC_EXIT_INTERRUPTED;
    case LC_OUT_DONE:
        if (r->children.failed) return LC_EXIT_CRASH;
        if (r->err.leak_reports) return LC_EXIT_LEAK;
        /* the subject's share (whose.c), where it was told: never "no leak"
           for want of it (a LEAK whose attribution failed stays LEAK) */
        if (a->leak && a->whose && a->whose->view && !a->whose->judge_whole) {
            const analysis *v = a->whose->view;
            return v->leak ? LC_EXIT_LEAK : v->no_leak ? LC_EXIT_NO_LEAK : LC_EXIT_NOT_JUDGED;
        }
        if (a->leak) return LC_EXIT_LEAK;
        return a->no_leak ? LC_EXIT_NO_LEAK : LC_EXIT_NOT_JUDGED;
    }
    return LC_EXIT_CRASH;
}

/* The rule of the verdict (run_rule): LEAK if a bytes meter or a count
 * meter judged LEAK, or pyfini reported a leak on the subject's stderr;
 * "no leak" only if every meter that sees the subject's allocations judged
 * "no leak"; otherwise "not judged". */
const char *lc_run_verdict(const lc_run *r, const analysis *a)
{
    if (r->outcome == LC_OUT_CRASH) return "crash";
    if (r->outcome == LC_OUT_HANG) return "hang";
    if (r->outcome == LC_OUT_MEMORY) return "memory limit";
    if (r->outcome == LC_OUT_INTERRUPTED) return "interrupted";
    if (r->outcome != LC_OUT_DONE) return "error";
    if (r->children.failed) return "child failed";
    if (r->err.leak_reports) return "LEAK";
    if (a->leak && a->whose && a->whose->view && !a->whose->judge_whole) {
        const analysis *v = a->whose->view;
        return v->leak ? "LEAK" : v->no_leak ? "no leak" : "not judged";
    }
    if (a->leak) return "LEAK";
    return a->no_leak ? "no leak" : "not judged";
}
