/* report_json.c - --json: the report of one check as one JSON document. */
#define _GNU_SOURCE
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

/* A JSON string of text that may not be UTF-8 (file names, a crashed
 * worker's output): jansson refuses invalid UTF-8, so such bytes become '?'. */
json_t *lc_json_str(const char *s)
{
    json_t *j = json_string(s);
    if (j || !s) return j;
    char *c = strdup(s);
    if (!c) return json_null();
    for (unsigned char *p = (unsigned char *)c; *p; p++)
        if (*p >= 0x80) *p = '?';
    j = json_string(c);
    free(c);
    return j ? j : json_null();
}

void lc_json_print(json_t *o, size_t flags)
{
    json_dumpf(o, stdout, flags);
    printf("\n");
    json_decref(o);
}

static json_t *jnum(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static void set(json_t *o, const char *key, json_t *v) { json_object_set_new(o, key, v); }

static json_t *judgement_json(const lc_judgement *j)
{
    json_t *o = json_object();
    set(o, "n", json_integer((json_int_t)j->n));
    set(o, "per_cycle", jnum(j->slope));
    set(o, "bound", jnum(j->bound));
    set(o, "lower", jnum(j->slope - j->bound));
    set(o, "upper", jnum(j->slope + j->bound));
    set(o, "mean", jnum(j->mean));
    set(o, "floor", jnum(j->floor));
    json_t *ch = json_array();
    for (int c = 0; c < j->nchunks; c++) json_array_append_new(ch, jnum(j->chunk_growth[c]));
    set(o, "chunk_growth", ch);
    if (j->nchunks) set(o, "chunk_min_per_cycle", jnum(j->chunk_rate_min));
    if (j->nchunks) set(o, "sample_min_per_cycle", jnum(j->sample_min));
    set(o, "late_per_cycle", jnum(j->late_slope));
    set(o, "late_bound", jnum(j->late_bound));
    set(o, "verdict", lc_json_str(lc_verdict_name(j->verdict)));
    return o;
}

json_t *lc_python_json(const lc_request *q, const lc_run *r)
{
    json_t *py = json_object();
    set(py, "version", lc_json_str(r->version));
    set(py, "abiflags", lc_json_str(r->abiflags));
    set(py, "debug", json_boolean(r->debug));
    set(py, "executable", lc_json_str(r->executable));
    set(py, "compiler", lc_json_str(r->compiler));
    json_t *cf = json_array();
    char tmp[256];
    lc_scopy(tmp, sizeof tmp, r->configs);
    for (char *save = NULL, *t = strtok_r(tmp, " ", &save); t; t = strtok_r(NULL, " ", &save))
        json_array_append_new(cf, lc_json_str(t));
    set(py, "configs", cf);
    set(py, "worker", lc_json_str(q->worker));
    return py;
}

static json_t *crash_json(const lc_run *r)
{
    json_t *c = json_object();
    char abbrev[32];
    set(c, "kind", lc_json_str(r->outcome == LC_OUT_HANG ? "hang" : r->outcome == LC_OUT_MEMORY ? "memory" : "crash"));
    int sig = r->signal;   /* a hang, a memory limit: the driver's SIGKILL */
    set(c, "signal", sig ? json_integer(sig) : json_null());
    set(c, "signal_name", sig ? lc_json_str(lc_signal_name(sig)) : json_null());
    set(c, "signal_abbrev", sig ? lc_json_str(lc_signal_abbrev(sig, abbrev, sizeof abbrev)) : json_null());
    set(c, "rss_at_kill", r->outcome == LC_OUT_MEMORY ? json_integer(r->rss_at_kill) : json_null());
    set(c, "exit_status", r->exit_status >= 0 ? json_integer(r->exit_status) : json_null());
    const char *why = lc_broken_text(r);
    char san[96], san_why[160];
    if (!why && r->outcome == LC_OUT_CRASH && lc_sanitizer_summary(r, san, sizeof san)) {
        snprintf(san_why, sizeof san_why, "%s: the sanitizer's report ended the worker", san);
        why = san_why;
    }
    if (!why && !r->signal && r->outcome == LC_OUT_CRASH)
        why = "the worker process ended before the cycle finished: the subject ended it (e.g. os._exit)";
    set(c, "reason", why ? lc_json_str(why) : json_null());
    set(c, "cycle", json_integer(r->begun.seq));
    set(c, "cycle_kind", lc_json_str(r->begun.kind == 'S' ? "subject" : "bare"));
    set(c, "round", json_integer(r->begun.seq ? r->begun.round + 1 : 0));
    set(c, "phase", lc_json_str(r->begun.judged ? "judged" : "warmup"));
    set(c, "cycles_finished", json_integer((json_int_t)r->ncyc));
    set(c, "output_tail", lc_json_str(r->output_tail));
    return c;
}

static json_t *meter_json(const meter_result *m)
{
    json_t *mj = json_object();
    set(mj, "available", json_boolean(m->available));
    set(mj, "how", lc_json_str(m->how ? m->how : ""));
    set(mj, "bytes_meter", json_boolean(m->def->bytes));
    set(mj, "resolution", json_real(m->def->resolution));
    set(mj, "exact", json_boolean(m->def->exact));
    if (m->available && m->judged) {
        if (m->have_subject) set(mj, "subject", judgement_json(&m->subject));
        if (m->have_bare) set(mj, "bare", judgement_json(&m->bare));
        if (m->have_excess) set(mj, "excess", judgement_json(&m->excess));
        set(mj, "judged", lc_json_str(m->have_excess ? "excess" : (m->have_subject ? "subject" : "bare")));
        set(mj, "verdict", lc_json_str(lc_verdict_name(m->verdict)));
        set(mj, "level_min_per_cycle", jnum(m->level_min_per_cycle));
        set(mj, "overruled", m->overruled == LC_OVERRULE_MALLOC  ? lc_json_str("malloc")
                             : m->overruled == LC_OVERRULE_NOISE ? lc_json_str("noise")
                             : m->overruled == LC_OVERRULE_UNBACKED ? lc_json_str("unbacked")
                             : m->overruled == LC_OVERRULE_CPYTHON ? lc_json_str("cpython")
                                                                 : json_null());
    } else {
        set(mj, "verdict", lc_json_str(m->available ? "no judged cycle" : "unavailable"));
    }
    return mj;
}

static json_t *strings_json(const char *const *s, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, lc_json_str(s[i]));
    return a;
}

static json_t *site_json(const lc_site *s)
{
    json_t *sj = json_object(), *fr = json_array(), *pf = json_array();
    set(sj, "domain", lc_json_str(s->domain));
    set(sj, "bytes_per_cycle", json_real(s->bytes_per_cycle));
    set(sj, "blocks_per_cycle", json_real(s->blocks_per_cycle));
    set(sj, "subject_bytes_held", json_integer(s->bytes[0]));
    set(sj, "bare_bytes_held", json_integer(s->bytes[1]));
    for (int k = 0; k < s->nframes; k++) json_array_append_new(fr, lc_json_str(s->frames[k]));
    set(sj, "frames", fr);
    for (int k = 0; k < s->npyframes; k++) json_array_append_new(pf, lc_json_str(s->pyframes[k]));
    set(sj, "python_frames", pf);
    if (s->whose[0]) set(sj, "whose", lc_json_str(s->whose));
    return sj;
}

/* What the subject wrote on stderr (output.c). */
static json_t *stderr_json(const lc_output *o)
{
    json_t *sj = json_object(), *leaks = json_array(), *lines = json_array();
    set(sj, "lines", json_integer(o->lines));
    set(sj, "pyfini_leak_reports", json_integer(o->leak_reports));
    for (size_t i = 0; i < o->nleaks; i++) {
        const lc_leak_report *L = &o->leaks[i];
        json_t *lj = json_object(), *types = json_array();
        set(lj, "state", lc_json_str(L->state));
        set(lj, "interpreter", json_integer(L->interpreter));
        set(lj, "objects", json_integer(L->objects));
        set(lj, "first_cycle", json_integer(L->first_cycle));
        set(lj, "reports", json_integer(L->count));
        for (int k = 0; k < L->ntypes; k++) json_array_append_new(types, lc_json_str(L->types[k]));
        set(lj, "types", types);
        json_array_append_new(leaks, lj);
    }
    set(sj, "pyfini_leaks", leaks);
    set(sj, "pyfini_leak_reports_of_other_states", json_integer(o->leak_reports_dropped));
    for (size_t i = 0; i < o->ndistinct; i++) {
        const lc_output_line *d = &o->distinct[i];
        json_t *dj = json_object();
        set(dj, "text", lc_json_str(d->text));
        set(dj, "kind", lc_json_str(d->kind));
        set(dj, "count", json_integer(d->count));
        set(dj, "first_cycle", json_integer(d->first_cycle));
        json_array_append_new(lines, dj);
    }
    set(sj, "distinct_lines", lines);
    set(sj, "more_distinct_lines", json_integer(o->more_distinct));
    set(sj, "more_distinct_lines_at_least", json_boolean(o->more_saturated));
    set(sj, "fatal_errors", json_integer(o->fatal_errors));
    return sj;
}

/* How much the worker wrote on stdout and stderr, and what of it is kept. */
static json_t *output_json(const lc_run *r)
{
    json_t *oj = json_object();
    set(oj, "stdout_bytes", json_integer(r->stdout_bytes));
    set(oj, "stderr_bytes", json_integer(r->stderr_bytes));
    set(oj, "tail_bytes", json_integer((json_int_t)strlen(r->output_tail)));
    set(oj, "cut", json_boolean(r->tail_cut || r->err.lines_cut));
    set(oj, "stderr_lines_cut", json_integer(r->err.lines_cut));
    return oj;
}

static json_t *children_json(const lc_run *r)
{
    const lc_children *c = &r->children;
    json_t *cj = json_object(), *ends = json_array();
    set(cj, "total", json_integer(c->total));
    set(cj, "failed", json_integer(c->failed));
    for (size_t i = 0; i < c->nends; i++) {
        const lc_child_end *e = &c->ends[i];
        json_t *ej = json_object();
        set(ej, "exit_status", e->signal ? json_null() : json_integer(e->exit_code));
        set(ej, "signal", e->signal ? json_integer(e->signal) : json_null());
        set(ej, "signal_name", e->signal ? lc_json_str(lc_signal_name(e->signal)) : json_null());
        set(ej, "count", json_integer(e->count));
        set(ej, "first_cycle", json_integer(e->first_cycle));
        set(ej, "first_pid", json_integer(e->first_pid));
        json_array_append_new(ends, ej);
    }
    set(cj, "ends", ends);
    set(cj, "other_ends", json_integer(c->other_ends));
    set(cj, "killed_with_group", json_integer(r->group_killed));
    set(cj, "killed_left_group", json_integer(r->escaped_killed));
    return cj;
}

/* What was asked: the config, the subject, the run. */
static void request_json(json_t *o, const lc_request *q)
{
    char descr[256];
    lc_config_description(descr, sizeof descr, q->config);
    set(o, "config", lc_json_str(q->config->name));
    set(o, "config_description", lc_json_str(descr));
    json_t *subj = json_object();
    set(subj, "imports", strings_json(q->imports, (size_t)q->nimports));
    set(subj, "code", q->code ? lc_json_str(q->code) : json_null());
    set(subj, "file", q->file ? lc_json_str(q->file) : json_null());
    set(o, "subject", subj);
    set(o, "baseline", json_boolean(lc_paired(q)));
    set(o, "judged", lc_json_str(lc_paired(q) ? "excess" : "raw"));
    set(o, "warmup", json_integer(q->warmup));
    set(o, "cycles", json_integer(q->cycles));
    set(o, "max_bytes_per_cycle", json_real(q->max_bytes));
    set(o, "max_rss", json_integer(q->max_rss));
}

/* What was found: times, meters, obmalloc blocks, --where sites. */
static void findings_json(json_t *o, const lc_request *q, const lc_run *r, const analysis *a)
{
    json_t *t = json_object();
    set(t, "subject_ms", a->n_subject ? jnum(a->time_subject_ms) : json_null());
    set(t, "bare_ms", a->n_bare ? jnum(a->time_bare_ms) : json_null());
    set(o, "time_per_cycle", t);
    json_t *ms = json_object();
    for (size_t i = 0; i < LC_NMETERS; i++) set(ms, a->m[i].def->name, meter_json(&a->m[i]));
    set(o, "meters", ms);
    if (a->obm_n) {
        json_t *ob = json_object();
        set(ob, "min", json_integer(a->obm_min));
        set(ob, "max", json_integer(a->obm_max));
        set(ob, "mean", json_real(a->obm_mean));
        set(ob, "cycles", json_integer(a->obm_n));
        set(o, "obmalloc_blocks_at_end", ob);
    }
    if (q->where && r->outcome == LC_OUT_DONE) {
        json_t *w = json_array();
        for (size_t i = 0; i < r->nsites; i++) json_array_append_new(w, site_json(&r->sites[i]));
        set(o, "where", w);
        set(o, "where_python", lc_json_str(r->where_python));
    }
}

/* A LEAK's split (whose.c), null when nothing leaked. */
static json_t *whose_json(const lc_run *r, const analysis *a)
{
    const lc_whose *w = a->whose;
    if (!w) return json_null();
    json_t *o = json_object(), *ms = json_object();
    set(o, "done", json_boolean(w->done));
    set(o, "why_not", w->done ? json_null() : lc_json_str(w->why));
    set(o, "judge", lc_json_str(w->judge_whole ? "whole" : "subject"));
    set(o, "from_pass", json_boolean(w->from_pass));
    set(o, "pass_rounds", w->from_pass ? json_integer(w->pass_cycles) : json_null());
    set(o, "pass_seconds", w->from_pass ? json_real(w->pass_seconds) : json_null());
    set(o, "cpython_dirs", lc_json_str(w->totals.dirs));
    const char *issue = lc_whose_issue(r->version);
    set(o, "cpython_issue", issue ? lc_json_str(issue) : json_null());
    for (size_t i = 0; w->done && i < LC_NMETERS; i++) {
        int v = a->m[i].def->value;
        if (!w->covered[v]) continue;
        json_t *m = json_object();
        set(m, "excess", json_real(w->excess[v]));
        set(m, "cpython", json_real(w->cpython[v]));
        set(m, "subject", json_real(w->subject[v]));
        set(m, "unattributed", json_real(w->unattributed[v]));
        set(m, "subject_verdict", lc_json_str(lc_verdict_name(w->view->m[i].verdict)));
        set(ms, a->m[i].def->name, m);
    }
    set(o, "meters", ms);
    json_t *lm = json_array();
    for (size_t i = 0; w->done && i < LC_NMETERS; i++)
        if (w->view->m[i].verdict == LC_LEAK && w->view->m[i].available)
            json_array_append_new(lm, lc_json_str(w->view->m[i].def->name));
    set(o, "subject_leaking_meters", lm);
    return o;
}

void lc_print_json(const lc_request *q, const lc_run *r, const analysis *a, int exit_status)
{
    json_t *o = json_object();
    set(o, "tool", lc_json_str("pyfini-leakcheck"));
    set(o, "tool_version", lc_json_str(LC_VERSION));
    set(o, "python", lc_python_json(q, r));
    request_json(o, q);
    set(o, "cycles", json_integer(r->sched.cycles));   /* judged rounds run: fewer than asked after an early stop */
    if (q->early_stop) {
        json_t *e = json_object();
        set(e, "cap", json_integer(q->cycles));
        set(e, "every", json_integer(LC_EARLY_STOP_ROUNDS));
        set(e, "checkpoints", json_integer(r->checkpoints));
        set(e, "stopped_at", r->stopped_at ? json_integer(r->stopped_at) : json_null());
        set(o, "early_stop", e);
    } else {
        set(o, "early_stop", json_null());
    }
    findings_json(o, q, r, a);
    set(o, "whose", whose_json(r, a));
    set(o, "verdict", lc_json_str(lc_run_verdict(r, a)));
    set(o, "subject_stderr", stderr_json(&r->err));
    set(o, "subject_output", output_json(r));
    set(o, "children", children_json(r));
    if (r->outcome == LC_OUT_INTERRUPTED) {
        json_t *ij = json_object();
        set(ij, "signal", json_integer(r->interrupted));
        set(ij, "signal_name", lc_json_str(lc_signal_name(r->interrupted)));
        set(ij, "cycles_planned", json_integer(lc_schedule_length(&r->sched)));
        set(o, "interrupted", ij);
    } else {
        set(o, "interrupted", json_null());
    }
    json_t *lm = json_array();
    for (size_t i = 0; i < LC_NMETERS; i++)
        if (a->m[i].verdict == LC_LEAK && a->m[i].available) json_array_append_new(lm, lc_json_str(a->m[i].def->name));
    set(o, "leaking_meters", lm);
    json_t *un = json_array();
    for (int i = 0; i < a->nundecided; i++) json_array_append_new(un, lc_json_str(a->m[a->undecided[i]].def->name));
    set(o, "undecided_meters", un);
    set(o, "crash", lc_outcome_crashed(r->outcome) ? crash_json(r) : json_null());
    set(o, "cycles_finished", json_integer((json_int_t)r->ncyc));
    set(o, "exit_status", json_integer(exit_status));
    lc_json_print(o, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
}
