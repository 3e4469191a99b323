/* whose.c - whose loss a run's LEAK is: the subject's own, or CPython's
 * (leakcheck/README.md, "Whose loss").
 *
 * The worker's --where classifies every site still holding bytes
 * (worker/whose.c: a C frame in the subject's objects, else the innermost
 * Python frame's file) and sums them per allocator domain and class (I
 * records "whose").  A run without --where that found a loss gets a short
 * second run with --where (LC_WHOSE_PASS_CYCLES judged rounds, the same
 * warm-up): runs without a loss cost nothing more.
 *
 * Per meter that the sites cover (py and its rows, blocks: the Python
 * allocators' domains; heap.plain, heap.blocks: the C-heap domain), the
 * excess per cycle is split: CPython's share (its sites' net excess, at
 * least 0, at most the excess), the subject's sites' (likewise, at most
 * what is left), and the rest, unattributed (blocks no site recorded, sites
 * of no known class) - the subject's for the verdict.  The subject's view
 * judges the run again with CPython's share taken off every sample. */
#include <stdlib.h>
#include <string.h>

#include "driver.h"

static const char *const domain_names[LC_WHOSE_DOMAINS] = {"raw", "mem", "obj", "obmalloc", "heap"};
static const char *const class_names[LC_NWHOSE] = {"subject", "cpython", "unattributed"};

static int index_of(const char *s, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

void lc_whose_take_info(lc_run *r, const char *key, const char *val)
{
    lc_whose_totals *t = &r->whose;
    if (!strcmp(key, "whose_done")) {
        t->done = 1;
    } else if (!strcmp(key, "whose_dir")) {
        size_t l = strlen(t->dirs);
        snprintf(t->dirs + l, sizeof t->dirs - l, "%s%s", l ? ", " : "", val);
    } else if (!strcmp(key, "whose_site")) {
        unsigned id;
        char cls[16];
        if (sscanf(val, "%u %15s", &id, cls) != 2) return;
        for (size_t i = r->nsites; i-- > 0;)
            if (r->sites[i].id == id) {
                lc_scopy(r->sites[i].whose, sizeof r->sites[i].whose, cls);
                break;
            }
    } else if (!strcmp(key, "whose")) {
        char dom[16], cls[16];
        long long b0, k0, b1, k1;
        long n;
        if (sscanf(val, "%15s %15s %lld %lld %lld %lld %ld", dom, cls, &b0, &k0, &b1, &k1, &n) != 7) return;
        int d = index_of(dom, domain_names, LC_WHOSE_DOMAINS), c = index_of(cls, class_names, LC_NWHOSE);
        if (d < 0 || c < 0) return;
        t->bytes[d][c][0] = b0, t->blocks[d][c][0] = k0;
        t->bytes[d][c][1] = b1, t->blocks[d][c][1] = k1;
        t->sites[d][c] = n;
    }
}

/* The domains whose sites split meter v (bit d: domain_names[d]), and
 * whether in blocks; 0: none (rss, malloc, heap: judged through their
 * parts, analyse.c; refs, fds). */
static unsigned domains_of(int v, int *blocks)
{
    *blocks = v == LC_V_BLOCKS || v == LC_V_HEAP_BLOCKS;
    switch (v) {
    case LC_V_PY: case LC_V_BLOCKS: return 0xf;
    case LC_V_PY_RAW: return 1u << 0;
    case LC_V_PY_MEM: return 1u << 1;
    case LC_V_PY_OBJ: return 1u << 2;
    case LC_V_PY_OBMALLOC: return 1u << 3;
    /* the C-heap sites are plain blocks only: heap.blocks' malloc-served
       Python blocks are never excused (conservative) */
    case LC_V_HEAP_PLAIN: case LC_V_HEAP_BLOCKS: return 1u << 4;
    }
    return 0;
}

static double clamp(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

static void split(lc_whose *w, const lc_schedule *s, const analysis *a)
{
    const lc_whose_totals *t = &w->totals;
    for (size_t mi = 0; mi < LC_NMETERS; mi++) {
        const meter_result *m = &a->m[mi];
        int v = m->def->value, blocks;
        unsigned doms = domains_of(v, &blocks);
        if (!doms || !m->available || !m->judged) continue;
        double by[LC_NWHOSE] = {0};
        for (int d = 0; d < LC_WHOSE_DOMAINS; d++)
            for (int c = 0; doms >> d & 1 && c < LC_NWHOSE; c++) {
                const int64_t *x = blocks ? t->blocks[d][c] : t->bytes[d][c];
                by[c] += lc_schedule_excess(s, x[0], x[1]);
            }
        double e = m->judged->slope, top = e > 0 ? e : 0;
        w->covered[v] = 1;
        w->excess[v] = e;
        w->cpython[v] = clamp(by[LC_WHOSE_CPYTHON], 0, top);
        w->subject[v] = clamp(by[LC_WHOSE_SUBJECT], 0, top - w->cpython[v]);
        w->unattributed[v] = e - w->cpython[v] - w->subject[v];
    }
}

void lc_whose_attribute(const lc_request *q, const lc_run *r, analysis *a, lc_whose *w)
{
    memset(w, 0, sizeof *w);
    w->judge_whole = q->judge_whole;
    /* nothing to split: no loss, or no subject (bare cycles: all CPython's) */
    if (!a->leak || r->outcome != LC_OUT_DONE || !lc_has_subject(q)) return;
    a->whose = w;
    w->attempted = 1;
    const lc_run *src = r;
    lc_run pass;
    int have_pass = 0;
    if (!q->where) {
        lc_request p = *q;
        p.where = 1;
        p.cycles = q->cycles < LC_WHOSE_PASS_CYCLES ? q->cycles : LC_WHOSE_PASS_CYCLES;
        p.early_stop = 0;
        p.csv = p.junit = p.plot = NULL;
        double t0 = lc_now();
        lc_run_request(&pass, &p, q->timeout, 0);
        w->pass_seconds = lc_now() - t0;
        w->pass_cycles = p.cycles;
        w->from_pass = have_pass = 1;
        src = &pass;
        if (pass.outcome != LC_OUT_DONE) {
            snprintf(w->why, sizeof w->why, "the attribution pass (%ld rounds with --where) did not finish: %.300s",
                     p.cycles, pass.error[0] ? pass.error : "crashed, hung or was interrupted");
        }
    }
    if (!w->why[0] && !src->whose.done)
        snprintf(w->why, sizeof w->why, "the worker classified no site (%.400s)",
                 src->where_note[0] ? src->where_note : "--where found no standard library directory");
    if (!w->why[0]) {
        w->totals = src->whose;
        split(w, &src->sched, a);
        double shift[LC_NVALUES] = {0};
        for (int v = 0; v < LC_NVALUES; v++) shift[v] = w->covered[v] ? w->cpython[v] : 0;
        w->view = malloc(sizeof *w->view);
        if (w->view) {
            lc_analyse_shifted(r, w->view, q->max_bytes, shift, a);
            w->done = 1;
        } else {
            snprintf(w->why, sizeof w->why, "out of memory");
        }
    }
    if (have_pass) lc_run_free(&pass);
}

void lc_whose_free(lc_whose *w)
{
    free(w->view);
    w->view = NULL;
}

/* The CPython issues behind the per-import loss of legacy interpreters
 * (leakcheck/README.md, "Whose loss"): CPython's sites are the strings
 * marshal interns while it loads the modules' code - immortal since PEP 683
 * (3.12), and an interpreter that shares the main obmalloc shares its
 * interned dict (gh-116510): they outlive it. */
const char *lc_whose_issue(const char *version)
{
    if (!strncmp(version, "3.12", 4) || !strncmp(version, "3.13", 4))
        return "interned strings are immortal (PEP 683) and outlive the interpreter: python/cpython gh-113993, "
               "gh-110411 (sub-interpreters leak interned strings), gh-116510 (legacy interpreters share the main "
               "one's interned dict)";
    return NULL;
}
