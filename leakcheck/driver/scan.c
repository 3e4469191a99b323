/* scan.c - --scan: every extension module of the Python (or the --import
 * modules) in a legacy and an isolated interpreter, worst first. */
#define _GNU_SOURCE
#include <jansson.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"

#define LC_SCAN_CYCLES 8
#define LC_SCAN_WARMUP 2
#define LC_SCAN_TIMEOUT_S 30
#define LC_LIST_TIMEOUT_S 60
#define LC_SCAN_CONFIGS 2    /* the columns: legacy, isolated */

/* Worst last; a row's severity is its worst cell's. */
enum scan_severity { SEV_OK, SEV_REFUSES, SEV_NOT_JUDGED, SEV_LEAK, SEV_ERROR, SEV_HANG, SEV_CRASH };

typedef struct scan_cell {
    int ran;
    int judged;          /* ok: every meter that sees the subject judged "no leak" */
    enum scan_severity severity;
    char status[48];
    char message[600];
    double py_per_cycle, malloc_per_cycle, loss;
    int py_known;
    long rounds;         /* judged rounds run: fewer than the cap after --early-stop stopped */
} scan_cell;

typedef struct scan_row {
    char name[256], path[1024];
    int extension;   /* found by the worker's listing (lib-dynload, site-packages) */
    scan_cell cell[LC_SCAN_CONFIGS];
    enum scan_severity severity;
    double loss;
} scan_row;

/* The columns: legacy and isolated, or the one --config given. */
typedef struct scan_cols {
    int n;
    int cfg[LC_SCAN_CONFIGS];   /* index into interp_configs */
} scan_cols;

static scan_cols scan_columns(const lc_request *q)
{
    scan_cols c = {2, {INTERP_LEGACY, INTERP_ISOLATED}};
    /* by name: interp_configs is static in every file (common/interp_configs.h), so
       q->config points into options.c's copy, not this file's */
    if (q->config_set) c = (scan_cols){1, {(int)(interp_config_find(q->config->name) - interp_configs), 0}};
    return c;
}

/* The worker's last line of output. */
static void crash_cell(scan_cell *c, const lc_run *r)
{
    c->severity = SEV_CRASH;
    if (r->signal)
        snprintf(c->status, sizeof c->status, "CRASH %s", sigabbrev_np(r->signal) ? sigabbrev_np(r->signal) : "?");
    else if (lc_broken_text(r)) snprintf(c->status, sizeof c->status, "BROKE fds");
    else snprintf(c->status, sizeof c->status, "CRASH exit %d", r->exit_status);
    const char *t = r->output_tail;
    size_t end = strlen(t);
    while (end && t[end - 1] == '\n') end--;
    size_t start = end;
    while (start && t[start - 1] != '\n') start--;
    snprintf(c->message, sizeof c->message, "cycle %ld: %.*s", r->begun.seq, (int)(end - start), t + start);
}

/* A failure: the config refused the module (the E record says so), or
 * another error.  The message without its context: "the subject failed in
 * cycle N (config interpreter): import X: Type: msg" -> "Type: msg". */
static void error_cell(scan_cell *c, const lc_run *r)
{
    int refuses = r->outcome == LC_OUT_ERROR && r->error_refused;
    int missing = r->outcome == LC_OUT_ERROR && !strcmp(r->error_kind, "usage") && strstr(r->error, "no module named");
    c->severity = refuses ? SEV_REFUSES : SEV_ERROR;
    lc_scopy(c->status, sizeof c->status, refuses ? "refuses" : missing ? "not found" : "error");
    const char *m = strstr(r->error, ": ");
    const char *m2 = m ? strstr(m + 2, ": ") : NULL;
    if (m2 && r->begun.seq > 1)   /* the first cycle(s) imported it: say where it failed */
        snprintf(c->message, sizeof c->message, "cycle %ld: %s", r->begun.seq, m2 + 2);
    else
        lc_scopy(c->message, sizeof c->message, m2 ? m2 + 2 : r->error);
}

/* The first count meter judged LEAK that makes a run LEAK (fds; blocks,
 * heap.blocks and refs when no loss is allowed: see run_rule). */
static const meter_result *leaking_count(const analysis *a, double max_bytes)
{
    for (size_t i = 0; i < LC_NMETERS; i++) {
        const meter_result *m = &a->m[i];
        if (m->def->bytes || !m->available || !m->judged || m->verdict != LC_LEAK) continue;
        if (m->def->value == LC_V_FDS || max_bytes <= 0) return m;
    }
    return NULL;
}

/* A run that finished: a failed child of the subject (as a crash), pyfini's
 * leak report on its stderr, or a LEAK of any bytes meter but RSS (too coarse
 * for a few cycles), py (the sum of its rows) and heap (heap.plain + the
 * C-heap blocks of Python's allocators, which the py rows count in requested
 * bytes) above --max-bytes-per-cycle - malloc (glibc's mallinfo2, noisy
 * over a few cycles: its free lists) only where the exact C-heap meter did
 * not judge; a count meter's LEAK where no bytes meter's is; otherwise "ok"
 * only when every meter that sees the subject's allocations judged "no
 * leak" (run_rule; RSS left out here too), else "not judged". */
static void judged_cell(scan_cell *c, const lc_run *r, const lc_request *q)
{
    const meter_result *count;
    analysis a;
    lc_analyse(r, &a, q->max_bytes);
    c->rounds = (long)r->sched.cycles;
    const meter_result *worst = NULL;
    int heap_exact = 0;
    for (size_t i = 0; i < LC_NMETERS; i++)
        if (a.m[i].def->value == LC_V_HEAP_PLAIN && a.m[i].available && a.m[i].judged) heap_exact = 1;
    for (size_t i = 0; i < LC_NMETERS; i++) {
        const meter_result *m = &a.m[i];
        if (!m->def->bytes || m->def->value == LC_V_RSS || !m->available || !m->judged) continue;
        if (m->def->value == LC_V_PY) {
            c->py_known = 1;
            c->py_per_cycle = m->judged->slope;
        }
        if (m->def->value == LC_V_MALLOC) c->malloc_per_cycle = m->judged->slope;
        if (m->def->value == LC_V_MALLOC && heap_exact) continue;
        if (m->verdict == LC_LEAK && m->def->value != LC_V_PY && m->def->value != LC_V_HEAP && (!worst || m->judged->slope > worst->judged->slope))
            worst = m;
    }
    const char *beyond = q->baseline ? " beyond the bare cycle" : "";
    if (r->children.failed) {
        const lc_child_end *e = r->children.nends ? &r->children.ends[0] : NULL;
        c->severity = SEV_CRASH;
        lc_scopy(c->status, sizeof c->status, "child failed");
        snprintf(c->message, sizeof c->message, "%ld of %ld processes the subject forked did not exit 0 (first: %s %d)",
                 r->children.failed, r->children.total, e && e->exit_code < 0 ? "signal" : "exit status",
                 e ? (e->exit_code < 0 ? e->signal : e->exit_code) : 0);
    } else if (worst) {
        char b[32];
        lc_fmt_bytes(b, sizeof b, worst->judged->slope, 1);
        c->severity = SEV_LEAK;
        c->loss = worst->judged->slope;
        snprintf(c->status, sizeof c->status, "LEAK %s/cycle", b);
        snprintf(c->message, sizeof c->message, "%s grows %s per cycle%s", worst->def->name, b, beyond);
    } else if ((count = leaking_count(&a, q->max_bytes)) != NULL) {
        /* a count meter alone (the bytes meters inconclusive): LEAK all the same */
        char b[32];
        lc_fmt_value(b, sizeof b, count->def, count->judged->slope, 1);
        c->severity = SEV_LEAK;
        snprintf(c->status, sizeof c->status, "LEAK %s %s/cycle", b, count->def->name);
        snprintf(c->message, sizeof c->message, "%s grows %s per cycle%s (the bytes meters: inconclusive)",
                 count->def->name, b, beyond);
    } else if (r->err.leak_reports) {
        const lc_leak_report *l = &r->err.leaks[0];
        c->severity = SEV_LEAK;
        lc_scopy(c->status, sizeof c->status, "LEAK pyfini report");
        snprintf(c->message, sizeof c->message, "pyfini reported a leak %ld times: state \"%s\", %ld tracked objects "
                 "still alive at POST_SHUTDOWN", r->err.leak_reports, r->err.nleaks ? l->state : "?",
                 r->err.nleaks ? l->objects : 0L);
    } else if (a.nundecided || !a.rounds_judged) {
        c->severity = SEV_NOT_JUDGED;
        lc_scopy(c->status, sizeof c->status, "not judged");
        size_t off = (size_t)snprintf(c->message, sizeof c->message, "in %ld cycles, not \"no leak\":", c->rounds);
        for (int i = 0; i < a.nundecided && off < sizeof c->message; i++)
            off += (size_t)snprintf(c->message + off, sizeof c->message - off, "%s %s %s", i ? "," : "",
                                    a.m[a.undecided[i]].def->name,
                                    a.m[a.undecided[i]].judged ? lc_verdict_name(a.m[a.undecided[i]].verdict) : "not judged");
    } else {
        c->judged = 1;
        c->severity = SEV_OK;
        lc_scopy(c->status, sizeof c->status, "ok");
    }
}

static void scan_one(scan_row *row, int cfg, scan_cell *c, const lc_request *q, double timeout)
{
    lc_request one = *q;
    one.config = &interp_configs[cfg];
    one.imports[0] = row->name;
    one.nimports = 1;
    one.where = 0;
    lc_run r;
    lc_run_request(&r, &one, timeout, 0);
    c->ran = 1;
    if (r.outcome == LC_OUT_CRASH) {
        crash_cell(c, &r);
    } else if (r.outcome == LC_OUT_MEMORY) {
        char rss[32];
        lc_fmt_bytes(rss, sizeof rss, (double)r.rss_at_kill, 0);
        c->severity = SEV_CRASH;
        snprintf(c->status, sizeof c->status, "MEMORY");
        snprintf(c->message, sizeof c->message, "cycle %ld: resident set %s, above --max-rss", r.begun.seq, rss);
    } else if (r.outcome == LC_OUT_HANG) {
        c->severity = SEV_HANG;
        snprintf(c->status, sizeof c->status, "HANG");
        snprintf(c->message, sizeof c->message, "cycle %ld did not end within %g s", r.begun.seq, timeout);
    } else if (r.outcome == LC_OUT_ERROR || r.outcome == LC_OUT_SPAWN) {
        error_cell(c, &r);
    } else if (r.outcome == LC_OUT_INTERRUPTED) {
        snprintf(c->status, sizeof c->status, "interrupted");
        snprintf(c->message, sizeof c->message, "signal %d after %zu cycles", r.interrupted, r.ncyc);
    } else {
        judged_cell(c, &r, q);
    }
    lc_run_free(&r);
}

static int cmp_rows(const void *x, const void *y)
{
    const scan_row *a = x, *b = y;
    if (a->severity != b->severity) return (int)b->severity - (int)a->severity;
    if (a->loss != b->loss) return a->loss < b->loss ? 1 : -1;
    return strcmp(a->name, b->name);
}

/* The rows: the --import modules (each once), or every module the worker
 * listed. */
static scan_row *scan_rows(const lc_request *q, const lc_run *lr, size_t *n)
{
    size_t want = q->nimports ? (size_t)q->nimports : lr->nextensions;
    scan_row *rows = calloc(want ? want : 1, sizeof *rows);
    if (!rows) return NULL;
    *n = 0;
    for (size_t i = 0; i < want; i++) {
        scan_row *r = &rows[*n];
        if (!q->nimports) {
            lc_scopy(r->name, sizeof r->name, lr->extensions[i][0]);
            lc_scopy(r->path, sizeof r->path, lr->extensions[i][1]);
            r->extension = 1;
            ++*n;
            continue;
        }
        int seen = 0;
        for (size_t k = 0; k < *n && !seen; k++) seen = !strcmp(rows[k].name, q->imports[i]);
        if (seen) continue;   /* --import X --import X: one row */
        lc_scopy(r->name, sizeof r->name, q->imports[i]);
        for (size_t j = 0; j < lr->nextensions; j++)
            if (!strcmp(lr->extensions[j][0], q->imports[i])) {
                lc_scopy(r->path, sizeof r->path, lr->extensions[j][1]);
                r->extension = 1;
            }
        ++*n;
    }
    return rows;
}

/* --junit: one test case per module and config (see report_junit.c). */
static void junit_cell(const scan_row *row, const scan_cell *c, int cfg, double seconds)
{
    const char *config = interp_configs[cfg].name;
    char classname[128], message[sizeof c->status + sizeof c->message + 4], *text = NULL;
    snprintf(classname, sizeof classname, "pyfini-leakcheck.scan.%s", config);
    snprintf(message, sizeof message, "%s%s%s", c->status, c->message[0] ? ": " : "", c->message);
    enum lc_case_result res = LC_CASE_ERROR;   /* error, HANG, CRASH, child failed, interrupted */
    const char *type = c->status;
    if (!c->ran) {
        res = LC_CASE_SKIPPED;   /* n/a, not run */
    } else if (!strcmp(c->status, "interrupted")) {
        res = LC_CASE_ERROR;
    } else if (c->severity == SEV_OK && c->judged) {
        res = LC_CASE_PASS;
    } else if (c->severity == SEV_OK || c->severity == SEV_NOT_JUDGED) {
        res = LC_CASE_SKIPPED;   /* no LEAK seen, but not every meter judged "no leak" */
        type = "not judged";
    } else if (c->severity == SEV_LEAK) {
        res = LC_CASE_FAILURE;
        type = "LEAK";
    } else if (c->severity == SEV_REFUSES) {
        res = LC_CASE_SKIPPED;   /* the config refused the module: a finding, not a failure */
    }
    if (asprintf(&text, "pyfini-leakcheck --scan: module %s%s%s%s, config %s: %s\n", row->name,
                 row->path[0] ? " (" : "", row->path, row->path[0] ? ")" : "", config, message) < 0)
        text = NULL;
    lc_junit_add(classname, row->name, seconds, res, type, message, text);
    free(text);
}

/* A config this Python has: the worker's 'configs' list names it. */
static int has_config(const lc_run *lr, int cfg)
{
    if (interp_configs[cfg].legacy) return 1;
    const char *name = interp_configs[cfg].name, *p = lr->configs;
    size_t n = strlen(name);
    for (; (p = strstr(p, name)); p += n)
        if ((p == lr->configs || p[-1] == ' ' || p[-1] == ',') && (!p[n] || p[n] == ' ' || p[n] == ','))
            return 1;
    return 0;
}

/* --- the cells, run by --jobs threads ----------------------------------------
 * Each cell is one worker process (lc_run_request); a thread takes the next
 * cell not taken yet and writes only that cell.  The rows' severities, the
 * --junit cases and the sort come after, in the serial order: the table of
 * --jobs N is the table of --jobs 1. */
typedef struct scan_job {
    size_t row;
    int col;
    double seconds;
} scan_job;

typedef struct scan_pool {
    scan_row *rows;
    const scan_cols *cols;
    const lc_request *q;
    double timeout;
    scan_job *jobs;
    size_t njobs, next;
    int tty;
    pthread_mutex_t lock;
} scan_pool;

long lc_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

/* The next job, or NULL when all are taken or a signal came. */
static scan_job *take_job(scan_pool *p)
{
    pthread_mutex_lock(&p->lock);
    scan_job *j = p->next < p->njobs && !lc_interrupted() ? &p->jobs[p->next++] : NULL;
    if (j && p->tty)
        fprintf(stderr, "\r\033[K[pyfini-leakcheck] scan %zu/%zu %s (%s)", (size_t)(j - p->jobs) + 1, p->njobs,
                p->rows[j->row].name, interp_configs[p->cols->cfg[j->col]].name),
            fflush(stderr);
    pthread_mutex_unlock(&p->lock);
    return j;
}

static void *scan_thread(void *arg)
{
    scan_pool *p = arg;
    for (scan_job *j; (j = take_job(p));) {
        scan_row *row = &p->rows[j->row];
        double t0 = lc_now();
        scan_one(row, p->cols->cfg[j->col], &row->cell[j->col], p->q, p->timeout);
        j->seconds = lc_now() - t0;
    }
    return NULL;
}

/* Run the pool's jobs in q->jobs threads (this one among them). */
static void run_jobs(scan_pool *p)
{
    size_t nthreads = (size_t)(p->q->jobs > 1 ? p->q->jobs : 1);
    if (nthreads > p->njobs) nthreads = p->njobs ? p->njobs : 1;
    pthread_t *t = nthreads > 1 ? calloc(nthreads - 1, sizeof *t) : NULL;
    size_t started = 0;
    for (; t && started < nthreads - 1; started++)
        if (pthread_create(&t[started], NULL, scan_thread, p) != 0) break;   /* fewer threads: still all jobs */
    scan_thread(p);
    for (size_t i = 0; i < started; i++) pthread_join(t[i], NULL);
    free(t);
}

static void scan_all(scan_row *rows, size_t n, const scan_cols *cols, const lc_request *q, const lc_run *lr,
                     double timeout)
{
    scan_pool p = {rows, cols, q, timeout, calloc(n * (size_t)cols->n + 1, sizeof(scan_job)), 0, 0,
                   lc_show_progress(q), PTHREAD_MUTEX_INITIALIZER};
    if (!p.jobs) {
        fprintf(stderr, "pyfini-leakcheck: out of memory\n");
        exit(3);
    }
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < cols->n; k++) {
            if (has_config(lr, cols->cfg[k])) {
                p.jobs[p.njobs++] = (scan_job){i, k, 0};
                continue;
            }
            scan_cell *c = &rows[i].cell[k];
            snprintf(c->status, sizeof c->status, "n/a");
            snprintf(c->message, sizeof c->message, "CPython %s has no %s interpreters (it has: %s)", lr->version,
                     interp_configs[cols->cfg[k]].name, lr->configs);
        }
    run_jobs(&p);
    if (p.tty) fprintf(stderr, "\r\033[K");
    size_t j = 0;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < cols->n; k++) {
            scan_cell *c = &rows[i].cell[k];
            double seconds = j < p.njobs && p.jobs[j].row == i && p.jobs[j].col == k ? p.jobs[j++].seconds : 0;
            if (!c->ran && !c->status[0]) snprintf(c->status, sizeof c->status, "not run");   /* interrupted */
            if (q->junit) junit_cell(&rows[i], c, cols->cfg[k], seconds);
            if (c->severity > rows[i].severity) rows[i].severity = c->severity;
            if (c->severity == SEV_LEAK && c->loss > rows[i].loss) rows[i].loss = c->loss;
        }
    free(p.jobs);
}

/* --plot: the rows that lost bytes per cycle (a LEAK cell's figure), most first. */
static int by_loss(const void *x, const void *y)
{
    const lc_plot_bar *a = x, *b = y;
    double la = a->loss[0] > a->loss[1] ? a->loss[0] : a->loss[1];
    double lb = b->loss[0] > b->loss[1] ? b->loss[0] : b->loss[1];
    if (la != lb) return la < lb ? 1 : -1;
    return strcmp(a->module, b->module);
}

static int plot_scan(const scan_row *rows, size_t n, const scan_cols *cols, const lc_request *q, const lc_run *lr)
{
    lc_plot_bar *bars = calloc(n + 1, sizeof *bars);
    char title[256], subtitle[512], err[LC_MESSAGE_MAX];
    if (!bars) {
        fprintf(stderr, "pyfini-leakcheck: --plot %s: out of memory\n", q->plot);
        return -1;
    }
    size_t nb = 0, leaking = 0;
    for (size_t i = 0; i < n; i++) {
        lc_plot_bar b = {rows[i].name, {0, 0}, {"", ""}};
        for (int k = 0; k < cols->n; k++) {
            const scan_cell *c = &rows[i].cell[k];
            b.status[k] = c->status;
            if (c->severity == SEV_LEAK && c->loss > 0) b.loss[k] = c->loss;
        }
        if (b.loss[0] > 0 || b.loss[1] > 0) bars[nb++] = b;
    }
    leaking = nb;
    qsort(bars, nb, sizeof *bars, by_loss);
    if (nb > LC_PLOT_SCAN_TOP) nb = LC_PLOT_SCAN_TOP;
    snprintf(title, sizeof title, "pyfini-leakcheck --scan: CPython %s%s (%s build), %zu module%s", lr->version,
             lr->abiflags, lr->debug ? "debug" : "release", n, lc_plural((long long)n));
    snprintf(subtitle, sizeof subtitle, "bytes lost per cycle%s: the %zu of %zu module%s with a LEAK figure, most "
             "first; %ld warm-up + %s%ld judged cycles each", q->baseline ? " beyond a bare cycle" : "", nb, leaking,
             lc_plural((long long)leaking), q->warmup, q->early_stop ? "up to " : "", q->cycles);
    lc_plot_scan_data d = {title, subtitle, {NULL, NULL}, cols->n, bars, nb};
    for (int k = 0; k < cols->n; k++) d.configs[k] = interp_configs[cols->cfg[k]].name;
    int rc = lc_plot_scan(q->plot, &d, err, sizeof err);
    if (rc) fprintf(stderr, "pyfini-leakcheck: %s\n", err);
    free(bars);
    return rc;
}

static void print_scan_json(const scan_row *rows, size_t n, const scan_cols *cols, const lc_request *q,
                            const lc_run *lr, int status)
{
    json_t *o = json_object(), *arr = json_array(), *cj = json_array();
    json_object_set_new(o, "tool", lc_json_str("pyfini-leakcheck"));
    json_object_set_new(o, "tool_version", lc_json_str(LC_VERSION));
    json_object_set_new(o, "mode", lc_json_str("scan"));
    json_object_set_new(o, "python", lc_python_json(q, lr));
    json_object_set_new(o, "warmup", json_integer(q->warmup));
    json_object_set_new(o, "cycles", json_integer(q->cycles));
    json_t *early = json_null();
    if (q->early_stop) {
        early = json_object();
        json_object_set_new(early, "cap", json_integer(q->cycles));
        json_object_set_new(early, "every", json_integer(LC_EARLY_STOP_ROUNDS));
    }
    json_object_set_new(o, "early_stop", early);
    json_object_set_new(o, "judged", lc_json_str(q->baseline ? "excess" : "raw"));
    json_object_set_new(o, "max_bytes_per_cycle", json_real(q->max_bytes));
    json_object_set_new(o, "max_rss", json_integer(q->max_rss));
    for (int k = 0; k < cols->n; k++) json_array_append_new(cj, lc_json_str(interp_configs[cols->cfg[k]].name));
    json_object_set_new(o, "configs", cj);
    for (size_t i = 0; i < n; i++) {
        json_t *rj = json_object();
        json_object_set_new(rj, "module", lc_json_str(rows[i].name));
        json_object_set_new(rj, "path", lc_json_str(rows[i].path));
        json_object_set_new(rj, "extension", json_boolean(rows[i].extension));
        for (int k = 0; k < cols->n; k++) {
            const scan_cell *c = &rows[i].cell[k];
            json_t *cellj = json_object();
            json_object_set_new(cellj, "status", lc_json_str(c->status));
            json_object_set_new(cellj, "message", lc_json_str(c->message));
            json_object_set_new(cellj, "py_per_cycle", c->ran && (c->severity == SEV_OK || c->severity == SEV_LEAK) &&
                                                           c->py_known ? json_real(c->py_per_cycle) : json_null());
            json_object_set_new(cellj, "malloc_per_cycle", c->ran && (c->severity == SEV_OK || c->severity == SEV_LEAK)
                                                               ? json_real(c->malloc_per_cycle) : json_null());
            json_object_set_new(cellj, "cycles", c->rounds > 0 ? json_integer(c->rounds) : json_null());
            json_object_set_new(rj, interp_configs[cols->cfg[k]].name, cellj);
        }
        json_array_append_new(arr, rj);
    }
    json_object_set_new(o, "modules", arr);
    json_object_set_new(o, "exit_status", json_integer(status));
    lc_json_print(o, JSON_INDENT(2));
}

static void print_scan_text(const scan_row *rows, size_t n, const scan_cols *cols, const lc_request *q,
                            const lc_run *lr, int status)
{
    size_t next = 0;
    for (size_t i = 0; i < n; i++) next += (size_t)rows[i].extension;
    printf("pyfini-leakcheck --scan: CPython %s%s (%s build), ", lr->version, lr->abiflags,
           lr->debug ? "debug" : "release");
    if (next == n) printf("%zu extension module%s", n, lc_plural((long long)n));
    else printf("%zu module%s (extension modules on sys.path among them: %zu)", n, lc_plural((long long)n), next);
    printf(", %ld warm-up + %s%ld judged cycles each (%s)\n", q->warmup, q->early_stop ? "up to " : "", q->cycles,
           q->baseline ? "excess over a bare cycle" : "raw, --no-baseline");
    if (q->early_stop)
        printf("--early-stop: each module judged every %d rounds, stopped once its verdicts held at two checkpoints\n",
               LC_EARLY_STOP_ROUNDS);
    printf("\n");
    printf("%-36s", "module");
    for (int k = 0; k < cols->n; k++) printf(" %-22s", interp_configs[cols->cfg[k]].name);
    printf("\n");
    for (size_t i = 0; i < n; i++) {
        printf("%-36s", rows[i].name);
        for (int k = 0; k < cols->n; k++) printf(" %-22s", rows[i].cell[k].status);
        printf("\n");
    }
    int notes = 0;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < cols->n; k++) {
            const scan_cell *c = &rows[i].cell[k];
            if (!c->message[0] || !c->ran) continue;
            if (!notes++) printf("\nnotes:\n");
            printf("  %s (%s): %s\n", rows[i].name, interp_configs[cols->cfg[k]].name, c->message);
        }
    printf("\nLEAK = Python's allocators or the C heap (malloc where its exact meter is off) grew in every chunk%s%s (few cycles: "
           "check one module with --import for a full verdict).\nexit status %d\n",
           q->baseline ? " beyond the bare cycle" : "", q->max_bytes > 0 ? " by more than --max-bytes-per-cycle" : "",
           status);
}

/* 3 a crash or hang, 2 a failure (not found, raised), 1 a leak, 4 not
 * judged, 0 otherwise: the worst row decides. */
static int scan_status(const scan_row *rows, size_t n)
{
    static const int by_severity[] = {[SEV_OK] = 0, [SEV_REFUSES] = 0, [SEV_NOT_JUDGED] = LC_EXIT_NOT_JUDGED,
                                      [SEV_LEAK] = LC_EXIT_LEAK, [SEV_ERROR] = LC_EXIT_USAGE,
                                      [SEV_HANG] = LC_EXIT_CRASH, [SEV_CRASH] = LC_EXIT_CRASH};
    enum scan_severity worst = SEV_OK;
    for (size_t i = 0; i < n; i++)
        if (rows[i].severity > worst) worst = rows[i].severity;
    return by_severity[worst];
}

int lc_scan(const lc_request *q)
{
    lc_request list = *q;
    list.list_extensions = 1;
    lc_run lr;
    lc_run_request(&lr, &list, LC_LIST_TIMEOUT_S, 0);
    if (lr.outcome != LC_OUT_DONE) {
        fprintf(stderr, "pyfini-leakcheck: listing extension modules failed: %s\n", lr.error[0] ? lr.error : lr.output_tail);
        lc_run_free(&lr);
        return lr.outcome == LC_OUT_ERROR ? 2 : 3;
    }
    lc_request s = *q;
    s.jobs = q->jobs ? q->jobs : lc_cores();
    s.cycles = q->cycles_set ? q->cycles : LC_SCAN_CYCLES;
    s.warmup = q->warmup_set ? q->warmup : LC_SCAN_WARMUP;
    double timeout = q->timeout_set ? q->timeout : LC_SCAN_TIMEOUT_S;
    scan_cols cols = scan_columns(q);
    if (q->config_set && !has_config(&lr, cols.cfg[0])) {
        fprintf(stderr, "pyfini-leakcheck: --config %s: CPython %s has no such interpreters (it has: %s)\n",
                q->config->name, lr.version, lr.configs);
        lc_run_free(&lr);
        return LC_EXIT_USAGE;
    }
    size_t n;
    scan_row *rows = scan_rows(&s, &lr, &n);
    if (!rows) {
        fprintf(stderr, "pyfini-leakcheck: out of memory\n");
        lc_run_free(&lr);
        return 3;
    }
    scan_all(rows, n, &cols, &s, &lr, timeout);
    qsort(rows, n, sizeof *rows, cmp_rows);
    int status = scan_status(rows, n);
    if (lc_interrupted()) status = LC_EXIT_INTERRUPTED;   /* the table shows the modules done */
    if (q->plot && plot_scan(rows, n, &cols, &s, &lr) != 0 && !status) status = LC_EXIT_USAGE;
    if (q->json) print_scan_json(rows, n, &cols, &s, &lr, status);
    else print_scan_text(rows, n, &cols, &s, &lr, status);
    free(rows);
    lc_run_free(&lr);
    return status;
}
