/* report_text.c - the report of one check, as text. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "driver.h"

#define LC_CRASH_CYCLES 6        /* last finished cycles shown after a crash */
#define LC_CRASH_OUTPUT_LINES 15 /* last lines of the worker's output shown */
#define LC_OUTPUT_SHOW 160       /* characters of a stderr line shown (--json has LC_OUTPUT_LINE_MAX) */

void lc_fmt_bytes(char *out, size_t n, double b, int sign)
{
    const char *s = sign ? (b > 0 ? "+" : (b < 0 ? "-" : "")) : (b < 0 ? "-" : "");
    double a = fabs(b);
    if (!isfinite(b)) snprintf(out, n, "?");
    else if (a < 9.95 && a != floor(a)) snprintf(out, n, "%s%.1f B", s, a);
    else if (a < 999.5) snprintf(out, n, "%s%.0f B", s, a);
    else if (a < 999.5e3) snprintf(out, n, "%s%.1f kB", s, a / 1e3);
    else if (a < 999.5e6) snprintf(out, n, "%s%.2f MB", s, a / 1e6);
    else snprintf(out, n, "%s%.2f GB", s, a / 1e9);
}

void lc_fmt_value(char *out, size_t n, const lc_meter_def *m, double v, int sign)
{
    if (m->bytes) lc_fmt_bytes(out, n, v, sign);
    else if (!isfinite(v)) snprintf(out, n, "?");
    else if (fabs(v) < 9.95 && v != floor(v)) snprintf(out, n, sign ? "%+.1f" : "%.1f", v);
    else snprintf(out, n, sign ? "%+.0f" : "%.0f", v);
}

const char *lc_verdict_mark(const meter_result *m)
{
    if (!m->available || !m->judged) return "";
    return m->verdict == LC_LEAK ? "LEAK" : (m->verdict == LC_NO_LEAK ? "ok" : "?");
}

const char *lc_signal_name(int sig)
{
    const char *d = sigdescr_np(sig);
    return d ? d : "unknown signal";
}

const char *lc_signal_abbrev(int sig, char *out, size_t n)
{
    const char *a = sigabbrev_np(sig);
    snprintf(out, n, "SIG%s", a ? a : "?");
    return out;
}

void lc_config_description(char *out, size_t n, const interp_config *c)
{
    snprintf(out, n, "%s: %s", c->name, c->description);
}

void lc_print_subject(FILE *f, const lc_request *q)
{
    if (!lc_has_subject(q)) {
        fprintf(f, "(none: the bare cycle itself is judged)");
        return;
    }
    const char *sep = "";
    for (int i = 0; i < q->nimports; i++) fprintf(f, "%s--import %s", sep, q->imports[i]), sep = " ";
    if (q->code) fprintf(f, "%s--code '%s'", sep, q->code), sep = " ";
    if (q->file) fprintf(f, "%s--file %s", sep, q->file);
}

static void print_meter_row(FILE *f, const meter_result *m, int paired)
{
    if (!m->available) {
        fprintf(f, "%-11s unavailable: %s\n", m->def->name, m->how && *m->how ? m->how : "not reported by the worker");
        return;
    }
    char s[32] = "", b[32] = "", j[32] = "", bd[32] = "", col[64];
    if (m->have_subject) lc_fmt_value(s, sizeof s, m->def, m->subject.slope, 1);
    if (m->have_bare) lc_fmt_value(b, sizeof b, m->def, m->bare.slope, 1);
    if (!m->judged) {
        fprintf(f, "%-11s (no judged cycle)\n", m->def->name);
        return;
    }
    lc_fmt_value(j, sizeof j, m->def, m->judged->slope, 1);
    lc_fmt_value(bd, sizeof bd, m->def, m->judged->bound, 0);
    snprintf(col, sizeof col, "%s ± %s", j, bd);
    if (paired) fprintf(f, "%-11s %14s %14s   %-28s %s\n", m->def->name, s, b, col, lc_verdict_name(m->verdict));
    else fprintf(f, "%-11s   %-28s %s\n", m->def->name, col, lc_verdict_name(m->verdict));
}

static void print_meter_table(FILE *f, const analysis *a, int paired)
{
    if (paired)
        fprintf(f, "%-11s %14s %14s   %-28s %s\n", "meter", "subject/cycle", "bare/cycle", "excess/cycle ± 99% bound",
                "verdict");
    else
        fprintf(f, "%-11s   %-28s %s\n", "meter", "per cycle ± 99% bound", "verdict");
    for (size_t i = 0; i < LC_NMETERS; i++) print_meter_row(f, &a->m[i], paired);
    for (size_t i = 0; i < LC_NMETERS; i++)
        if (strcmp(a->m[i].def->name, "heap") == 0 && a->m[i].available)
            fprintf(f, "(bytes in two meters: a block that CPython's RAW domain, or pymalloc for a request over 512 B,\n"
                       " gets from malloc is in py.raw/py.mem/py.obj and in heap; heap.plain is heap without them)\n");
}

static void print_site(FILE *f, size_t rank, const lc_site *s)
{
    char bb[32];
    lc_fmt_bytes(bb, sizeof bb, s->bytes_per_cycle, 1);
    fprintf(f, "  #%zu %s/cycle in %.2f blocks/cycle, domain %s%s%s\n", rank, bb, s->blocks_per_cycle, s->domain,
            s->whose[0] ? ", whose: " : "", s->whose);
    for (int k = 0; k < s->nframes; k++) fprintf(f, "       %s %s\n", k ? "  " : "at", s->frames[k]);
    if (s->npyframes)
        fprintf(f, "%s", strcmp(s->domain, "heap") == 0
                             ? "       Python (the line that called into C code on the allocating thread):\n"
                             : "       Python (tracemalloc, innermost first):\n");
    for (int k = 0; k < s->npyframes; k++) fprintf(f, "          %s\n", s->pyframes[k]);
}

static void print_where(FILE *f, const lc_run *r, const analysis *a)
{
    if (a->obm_n)
        fprintf(f, "\nobmalloc blocks still in use when each interpreter ended (judged cycles): "
                   "min %lld, mean %.1f, max %lld%s\n",
                (long long)a->obm_min, a->obm_mean, (long long)a->obm_max,
                a->obm_max > 0 ? "\n  (an own-obmalloc interpreter whose blocks are not all freed abandons its arenas)"
                               : "\n  (none: the interpreter's arenas can be freed)");
    int nb = a->n_subject && a->n_bare;
    fprintf(f, "\nwhere: allocating call stacks of the bytes still held after the judged cycles,\n"
               "excess bytes per cycle%s, top %d per domain\n",
            nb ? " (subject cycles' minus bare cycles')" : "", LC_SITES_PER_DOMAIN);
    if (r->where_note[0]) fprintf(f, "  (symbols unavailable: %s)\n", r->where_note);
    if (!r->nsites) {
        fprintf(f, "  nothing: no block allocated during a judged cycle (Python's allocators, the C heap) is still "
                   "held%s\n", nb ? " beyond the bare cycles'" : "");
        return;
    }
    for (size_t i = 0; i < r->nsites; i++) print_site(f, i + 1, &r->sites[i]);
    fprintf(f, "  (domain heap: plain C-heap blocks - malloc & co, operator new - outside Python's allocators)\n");
    if (!strncmp(r->where_python, "unavailable", strlen("unavailable")))
        fprintf(f, "  (Python lines of the raw/mem/obj sites %s)\n", r->where_python);
}

static void print_last_cycles(FILE *f, const lc_run *r)
{
    static const int vals[4] = {LC_V_RSS, LC_V_MALLOC, LC_V_PY, LC_V_BLOCKS};
    fprintf(f, "last cycles finished (increase of each meter over the cycle):\n");
    fprintf(f, "  %6s %-8s %10s %12s %12s %12s %10s\n", "cycle", "kind", "ms", "rss", "malloc", "py", "blocks");
    for (size_t i = r->ncyc > LC_CRASH_CYCLES ? r->ncyc - LC_CRASH_CYCLES : 0; i < r->ncyc; i++) {
        const lc_cycle *c = &r->cyc[i];
        char cols[4][32];
        for (int k = 0; k < 4; k++) {
            int64_t prev = i ? r->cyc[i - 1].v[vals[k]] : r->initial[vals[k]];
            if (c->v[vals[k]] < 0 || prev < 0) lc_scopy(cols[k], sizeof cols[k], "n/a");
            else if (vals[k] == LC_V_BLOCKS) snprintf(cols[k], sizeof cols[k], "%+lld", (long long)(c->v[vals[k]] - prev));
            else lc_fmt_bytes(cols[k], sizeof cols[k], (double)(c->v[vals[k]] - prev), 1);
        }
        fprintf(f, "  %6ld %-8s %10.2f %12s %12s %12s %10s\n", c->id.seq, c->id.kind == 'S' ? "subject" : "bare",
                (double)c->v[LC_V_TIME_NS] / 1e6, cols[0], cols[1], cols[2], cols[3]);
    }
}

static void print_output_tail(FILE *f, const char *p)
{
    fprintf(f, "last output of the worker:\n");
    int lines = 0;
    for (const char *q = p; *q; q++) lines += *q == '\n';
    for (; *p && lines > LC_CRASH_OUTPUT_LINES; p++)
        if (*p == '\n') lines--;
    while (*p) {
        const char *e = strchr(p, '\n');
        int len = e ? (int)(e - p) : (int)strlen(p);
        fprintf(f, "  | %.*s\n", len, p);
        p += len + (e != NULL);
    }
}

const char *lc_broken_text(const lc_run *r)
{
    int said = r->broken ? r->broken : r->err.broken;
    if (r->signal || !said || said != r->exit_status) return NULL;
    switch (said) {
    case LC_WK_EXIT_RECORD_CLOSED: return "the subject closed the tool's record pipe (file descriptor 3)";
    case LC_WK_EXIT_RECORD_REPLACED:
        return "the subject replaced the tool's record pipe (file descriptor 3: closed and reopened, or dup2 over it)";
    case LC_WK_EXIT_STDERR_CLOSED: return "the subject closed the worker's stderr (file descriptor 2)";
    case LC_WK_EXIT_STDERR_REPLACED:
        return "the subject replaced the worker's stderr (file descriptor 2: closed and reopened, or dup2 over it)";
    }
    return NULL;
}

const char *lc_sanitizer_summary(const lc_run *r, char *out, size_t n)
{
    const char *last = NULL;
    for (const char *s = r->output_tail, *q; (q = strstr(s, "SUMMARY: ")); s = q + 9) last = q;
    if (r->signal || !last) return NULL;
    last += 9;
    const char *san = strstr(last, "Sanitizer: "), *eol = strchr(last, '\n');
    if (!san || (eol && san > eol)) return NULL;
    const char *kind = san + 11;
    size_t len = strcspn(kind, " \n");
    snprintf(out, n, "%.*s%.*s", (int)(kind - last), last, (int)len, kind);
    return out;
}

static void print_crash(FILE *f, const lc_run *r)
{
    const char *what = r->begun.kind == 'S' ? "a subject cycle" : "a bare cycle";
    long round = r->begun.round;
    const char *phase = r->begun.judged ? "judged" : "warm-up";
    char abbrev[96], rss[32], limit[32];
    if (r->outcome == LC_OUT_HANG) {
        fprintf(f, "HANG: cycle %ld (%s, round %ld, %s) did not finish within %g s: the worker was killed\n",
                r->begun.seq, what, round + 1, phase, r->timeout_s);
    } else if (r->outcome == LC_OUT_MEMORY) {
        lc_fmt_bytes(rss, sizeof rss, (double)r->rss_at_kill, 0);
        lc_fmt_bytes(limit, sizeof limit, (double)r->max_rss, 0);
        fprintf(f, "MEMORY LIMIT: the worker's resident set was %s (%lld bytes), above --max-rss %s (%lld bytes),\n"
                   "  in cycle %ld (%s, round %ld, %s): the worker and its process group were killed\n",
                rss, r->rss_at_kill, limit, r->max_rss, r->begun.seq, what, round + 1, phase);
    } else if (r->signal) {
        fprintf(f, "CRASH: the worker was killed by signal %d (%s, %s) in cycle %ld (%s, round %ld, %s)\n", r->signal,
                lc_signal_abbrev(r->signal, abbrev, sizeof abbrev), lc_signal_name(r->signal), r->begun.seq, what,
                round + 1, phase);
    }
    else if (lc_sanitizer_summary(r, abbrev, sizeof abbrev))
        fprintf(f, "SANITIZER: %s in cycle %ld (%s, round %ld, %s): the sanitizer's report ended the worker\n"
                   "  (exit status %d); the report is the worker's last output below\n", abbrev, r->begun.seq, what,
                round + 1, phase, r->exit_status);
    else if (lc_broken_text(r))   /* from here: the worker ended by itself */
        fprintf(f, "BROKEN: %s in cycle %ld (%s, round %ld, %s): the worker could not go on\n", lc_broken_text(r),
                r->begun.seq, what, round + 1, phase);
    else
        fprintf(f, "EXIT: the worker process ended with exit status %d in cycle %ld (%s, round %ld, %s) before the\n"
                   "  cycle finished: the subject ended the process (e.g. os._exit(%d)); its cycles are not all judged\n",
                r->exit_status, r->begun.seq, what, round + 1, phase, r->exit_status);
    if (!r->signal && !lc_broken_text(r) && r->exit_status >= LC_WK_EXIT_RECORD_CLOSED
        && r->exit_status <= LC_WK_EXIT_STDERR_REPLACED)
        fprintf(f, "  (%d is also the worker's status for a broken record pipe or stderr, unconfirmed: the subject\n"
                   "  may have closed both fd 2 and fd 3)\n", r->exit_status);
    if (!r->begun.seq) fprintf(f, "  (before the first cycle began: while starting CPython)\n");
    if (r->ncyc) print_last_cycles(f, r);
    if (r->output_tail[0]) print_output_tail(f, r->output_tail);
}

static void print_leak_report(FILE *f, const lc_leak_report *L)
{
    fprintf(f, "  PYFINI LEAK: state \"%s\": %ld tracked object%s still alive at POST_SHUTDOWN, reported %ld time%s "
               "(first in cycle %ld, interpreter %lld)\n",
            L->state, L->objects, lc_plural(L->objects), L->count, lc_plural(L->count), L->first_cycle,
            L->interpreter);
    for (int i = 0; i < L->ntypes; i++) fprintf(f, "    - %s\n", L->types[i]);
}

/* What the subject wrote on stderr: pyfini's leak reports, then the other
 * lines, distinct, with their counts. */
static void print_subject_stderr(FILE *f, const lc_run *r)
{
    const lc_output *o = &r->err;
    if (!o->lines) {
        fprintf(f, "\nsubject's stderr: nothing\n");
        return;
    }
    fprintf(f, "\nsubject's stderr: %ld line%s (stdout is not read)\n", o->lines, lc_plural(o->lines));
    for (size_t i = 0; i < o->nleaks; i++) print_leak_report(f, &o->leaks[i]);
    if (o->leak_reports_dropped)
        fprintf(f, "  ... %ld more pyfini leak report%s of other states\n", o->leak_reports_dropped,
                lc_plural(o->leak_reports_dropped));
    for (size_t i = 0; i < o->ndistinct; i++) {
        const lc_output_line *d = &o->distinct[i];
        fprintf(f, "  %5ldx from cycle %-4ld [%s] %.*s%s\n", d->count, d->first_cycle, d->kind, LC_OUTPUT_SHOW,
                d->text, strlen(d->text) > LC_OUTPUT_SHOW ? "..." : "");
    }
    if (o->more_distinct)
        fprintf(f, "  ... %s%ld more distinct line%s\n", o->more_saturated ? "at least " : "", o->more_distinct,
                lc_plural(o->more_distinct));
}

/* How much the worker wrote, when the report could not keep all of it. */
static void print_output_cut(FILE *f, const lc_run *r)
{
    if (!r->tail_cut && !r->err.lines_cut) return;
    char out[32], err[32];
    lc_fmt_bytes(out, sizeof out, (double)r->stdout_bytes, 0);
    lc_fmt_bytes(err, sizeof err, (double)r->stderr_bytes, 0);
    fprintf(f, "subject's output: CUT: %s on stdout, %s on stderr; kept: the summary of stderr above (lines up to %d\n"
               "  bytes: %ld longer line%s cut there) and the last %zu bytes of both (the worker's last output)\n",
            out, err, LC_OUTPUT_LINE_MAX - 1, r->err.lines_cut, lc_plural(r->err.lines_cut), strlen(r->output_tail));
}

/* How the processes the subject forked ended. */
static void print_children(FILE *f, const lc_run *r)
{
    const lc_children *c = &r->children;
    if (r->group_killed || r->escaped_killed)
        fprintf(f, "\nprocesses the subject started that outlived the worker, killed (SIGKILL): %ld in its process "
                   "group, %ld that had left it (setsid)\n", r->group_killed, r->escaped_killed);
    if (!c->total) return;
    fprintf(f, "\nchildren of the subject (forked; the worker is their reaper): %ld ended, %ld not with exit 0\n",
            c->total, c->failed);
    for (size_t i = 0; i < c->nends; i++) {
        const lc_child_end *e = &c->ends[i];
        char how[160];
        if (e->signal) snprintf(how, sizeof how, "killed by signal %d (%s)", e->signal, lc_signal_name(e->signal));
        else snprintf(how, sizeof how, "exit status %d", e->exit_code);
        fprintf(f, "  %5ld %-40s %s (first: pid %ld, collected after cycle %ld)\n", e->count, how,
                e->exit_code ? "FAILED" : "ok", e->first_pid, e->first_cycle);
    }
    if (c->other_ends) fprintf(f, "  ... %ld more with other ends\n", c->other_ends);
}

/* The head of the report: the Python, the config, the subject, the run. */
static void print_header(FILE *f, const lc_request *q, const lc_run *r, const analysis *a)
{
    char descr[256];
    lc_config_description(descr, sizeof descr, q->config);
    fprintf(f, "pyfini-leakcheck: CPython %s%s (%s build) %s\n", r->version, r->abiflags, r->debug ? "debug" : "release",
            r->executable);
    fprintf(f, "config   %s\n", descr);
    fprintf(f, "subject  ");
    lc_print_subject(f, q);
    fprintf(f, "\n");
    if (lc_paired(q))
        fprintf(f, "cycles   %ld warm-up + %ld judged rounds; a round = 1 subject + 1 bare cycle (judged: blocks of %ld\n"
                   "         subject cycle%s, then %ld bare one%s); judged is the subject's excess over the bare cycle\n",
                q->warmup, r->sched.cycles, r->sched.block, lc_plural(r->sched.block), r->sched.block, lc_plural(r->sched.block));
    else
        fprintf(f, "cycles   %ld warm-up + %ld judged %s\n", q->warmup, r->sched.cycles,
                lc_has_subject(q) ? "subject cycles (--no-baseline: raw figures judged)" : "bare cycles");
    if (q->early_stop && r->stopped_at)
        fprintf(f, "early    stopped after %ld of at most %ld judged rounds: the verdict held at %ld and %ld\n",
                r->stopped_at, q->cycles, r->stopped_at - LC_EARLY_STOP_ROUNDS, r->stopped_at);
    else if (q->early_stop && r->outcome == LC_OUT_DONE && r->control_lost)
        fprintf(f, "early    no stop: the worker's control socket was lost after %d checkpoint%s (the subject closed or\n"
                   "         replaced descriptor %d, or wrote to the record descriptor); all %ld rounds judged\n",
                r->checkpoints, lc_plural(r->checkpoints), LC_CONTROL_FD, q->cycles);
    else if (q->early_stop && r->outcome == LC_OUT_DONE && q->cycles <= LC_EARLY_STOP_EARLIEST)
        fprintf(f, "early    no stop: --cycles %ld leaves no two checkpoints (every %d rounds) before the cap\n", q->cycles,
                LC_EARLY_STOP_ROUNDS);
    else if (q->early_stop && r->outcome == LC_OUT_DONE)
        fprintf(f, "early    no stop: the verdict was not the same at two checkpoints in a row (%d checkpoints, every %d\n"
                   "         rounds); all %ld rounds judged\n", r->checkpoints, LC_EARLY_STOP_ROUNDS, q->cycles);
    if (r->ignored_env[0]) fprintf(f, "note     ignored from the environment: %s\n", r->ignored_env);
    if (a->n_subject || a->n_bare) {
        fprintf(f, "time     ");
        if (a->n_subject) fprintf(f, "subject %.2f ms/cycle", a->time_subject_ms);
        if (a->n_subject && a->n_bare) fprintf(f, ", ");
        if (a->n_bare) fprintf(f, "bare %.2f ms/cycle", a->time_bare_ms);
        fprintf(f, "\n");
    }
    fprintf(f, "\n");
}

/* Why a LEAK of a meter was made inconclusive (run_rule in analyse.c). */
static void print_overruled(FILE *f, const analysis *a)
{
    if (a->malloc_overruled)
        fprintf(f, "(malloc grew in every chunk, but the exact heap meters count every block of malloc & co: "
                   "glibc's own bookkeeping, judged inconclusive)\n");
    if (!a->noise_overruled) return;
    for (int noise = 1; noise >= 0; noise--) {
        const char *sep = " ";
        enum lc_overrule why = noise ? LC_OVERRULE_NOISE : LC_OVERRULE_UNBACKED;
        for (size_t i = 0; i < LC_NMETERS; i++)
            if (a->m[i].overruled == why)
                fprintf(f, "%s%s", *sep == ' ' ? "(judged inconclusive, not LEAK: " : sep, a->m[i].def->name), sep = ", ";
        if (*sep == ' ') continue;
        if (noise)
            fprintf(f, " - not every block pair grew, or the meter's own level did not grow in every chunk, and no\n"
                       " count of blocks grew with it: a table that grows in some cycles and shrinks in others)\n");
        else
            fprintf(f, " - it grew, but no count of blocks grew with it: pages the allocators hold for freed\n"
                       " blocks (fragmentation), or memory no allocator saw; not \"no leak\" either)\n");
    }
}

static void print_verdict(FILE *f, const lc_run *r, const analysis *a, int paired, const char *title)
{
    fprintf(f, "%s", title);
    if (r->children.failed)
        fprintf(f, "CHILD FAILED: %ld of the subject's %ld forked children did not exit 0 (see above)\n         ",
                r->children.failed, r->children.total);
    if (r->err.leak_reports) {
        fprintf(f, "LEAK: pyfini reported %ld leak%s on the subject's stderr (tracked objects still alive at "
                   "POST_SHUTDOWN)%s\n", r->err.leak_reports, lc_plural(r->err.leak_reports),
                a->leak ? "; and the meters:" : "");
        if (!a->leak) return;
        fprintf(f, "         ");
    }
    if (!a->leak && !a->no_leak) {
        fprintf(f, "not judged: ");
        if (!a->nundecided) {
            fprintf(f, "no meter judged a cycle\n");
            return;
        }
        fprintf(f, "the meters that see the subject's allocations must all say \"no leak\"; not so:");
        const char *sep = " ";
        for (int i = 0; i < a->nundecided; i++) {
            const meter_result *m = &a->m[a->undecided[i]];
            fprintf(f, "%s%s %s", sep, m->def->name, m->judged ? lc_verdict_name(m->verdict) : "not judged");
            sep = ", ";
        }
        fprintf(f, "\n");
        print_overruled(f, a);
        return;
    }
    if (!a->leak) {
        fprintf(f, "no leak%s\n", a->inconclusive ? " (some meters inconclusive: see above)" : "");
        print_overruled(f, a);
        return;
    }
    fprintf(f, "LEAK:");
    const char *sep = " ";
    for (size_t i = 0; i < LC_NMETERS; i++) {
        const meter_result *m = &a->m[i];
        if (m->verdict != LC_LEAK || !m->available || !m->judged) continue;
        char b[32];
        lc_fmt_value(b, sizeof b, m->def, m->judged->slope, 1);
        fprintf(f, "%s%s %s/cycle", sep, m->def->name, b);
        sep = ", ";
    }
    fprintf(f, "%s\n", paired ? " beyond the bare cycle" : "");
}

/* A LEAK's split (whose.c), then the verdict on the subject's share. */
static void print_whose(FILE *f, const lc_run *r, const analysis *a, int paired)
{
    const lc_whose *w = a->whose;
    fprintf(f, "\nwhose: the excess per cycle by where its still-held blocks were allocated (");
    if (w->from_pass) fprintf(f, "a second run with --where, %ld rounds, %.1f s", w->pass_cycles, w->pass_seconds);
    else fprintf(f, "--where's sites");
    fprintf(f, ")\n");
    if (!w->done) {
        fprintf(f, "  not split: %s\n  the exit status judges the whole excess\n", w->why);
        return;
    }
    int any_cpython = 0;
    for (size_t i = 0; i < LC_NMETERS; i++) {
        const meter_result *m = &a->m[i];
        int v = m->def->value;
        if (!w->covered[v] || m->verdict != LC_LEAK) continue;
        char e[32], c[32], s[32], u[32];
        lc_fmt_value(e, sizeof e, m->def, w->excess[v], 1);
        lc_fmt_value(c, sizeof c, m->def, w->cpython[v], 1);
        lc_fmt_value(s, sizeof s, m->def, w->subject[v], 1);
        lc_fmt_value(u, sizeof u, m->def, w->unattributed[v], 1);
        fprintf(f, "  %-11s %s = CPython %s, subject %s, unattributed %s\n", m->def->name, e, c, s, u);
        any_cpython |= w->cpython[v] > 0;
    }
    fprintf(f, "  (CPython: every C frame in libpython, the standard library's extension modules or libc & co,\n"
               "   and the innermost Python frame in the standard library or the import machinery; unattributed\n"
               "   counts as the subject's.  CPython's directories: %s)\n", w->totals.dirs);
    const char *issue = lc_whose_issue(r->version);
    if (any_cpython && issue) fprintf(f, "  CPython %s's own loss per cycle: %s\n", r->version, issue);
    if (w->judge_whole)
        print_verdict(f, r, w->view, paired, "  (the subject's share alone, not what the exit status judges: --judge whole): ");
    else
        fprintf(f, "  the verdict below judges the subject's share: the run again with CPython's share off each "
                   "sample\n  (--judge whole: the whole excess)\n");
    fprintf(f, "\n");
}

void lc_print_report(FILE *f, const lc_request *q, const lc_run *r, const analysis *a, int exit_status)
{
    print_header(f, q, r, a);
    if (a->rounds_judged) print_meter_table(f, a, lc_paired(q));
    else fprintf(f, "(no judged cycle finished)\n");
    if (q->where && r->outcome == LC_OUT_DONE) print_where(f, r, a);
    print_subject_stderr(f, r);
    print_output_cut(f, r);
    print_children(f, r);
    fprintf(f, "\n");
    if (lc_outcome_crashed(r->outcome)) {
        print_crash(f, r);
        fprintf(f, "subject: ");
        lc_print_subject(f, q);
        fprintf(f, ", config %s, CPython %s%s; figures above: %zu cycle%s finished\n", q->config->name, r->version,
                r->abiflags, r->ncyc, lc_plural((long long)r->ncyc));
    } else if (r->outcome == LC_OUT_INTERRUPTED) {
        fprintf(f, "INTERRUPTED by signal %d (%s) after %zu of %ld cycles: the figures above are those of the\n"
                   "finished cycles, not a verdict; the worker was killed\n",
                r->interrupted, lc_signal_name(r->interrupted), r->ncyc, lc_schedule_length(&r->sched));
    } else {
        const lc_whose *w = a->whose;
        int subject = w && w->view && !w->judge_whole;
        if (w) {
            print_verdict(f, r, a, lc_paired(q), subject ? "whole excess: " : "verdict: ");
            print_whose(f, r, a, lc_paired(q));
        }
        if (subject) print_verdict(f, r, w->view, lc_paired(q), "verdict: ");
        else if (!w) print_verdict(f, r, a, lc_paired(q), "verdict: ");
    }
    fprintf(f, "exit status %d\n", exit_status);
}
