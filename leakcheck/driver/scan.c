/* scan.c - --scan: every extension module of the Python (or the --import
 * modules) in a legacy and an isolated interpreter, worst first. */
#define _GNU_SOURCE
#include <jansson.h>
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

enum scan_severity { SEV_OK, SEV_REFUSES, SEV_ERROR, SEV_LEAK, SEV_HANG, SEV_CRASH };

typedef struct scan_cell {
    int ran;
    enum scan_severity severity;
    char status[48];
    char message[600];
    double py_per_cycle, malloc_per_cycle, loss;
    int py_known;
} scan_cell;

typedef struct scan_row {
    char name[256], path[1024];
    scan_cell cell[LC_SCAN_CONFIGS];
    enum scan_severity severity;
    double loss;
} scan_row;

static const int scan_configs[LC_SCAN_CONFIGS] = {INTERP_LEGACY, INTERP_ISOLATED};

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
    c->severity = refuses ? SEV_REFUSES : SEV_ERROR;
    lc_scopy(c->status, sizeof c->status, refuses ? "refuses" : "error");
    const char *m = strstr(r->error, ": ");
    const char *m2 = m ? strstr(m + 2, ": ") : NULL;
    lc_scopy(c->message, sizeof c->message, m2 ? m2 + 2 : r->error);
}

/* LEAK: any bytes meter but RSS (too coarse for a few cycles), py (the sum
 * of its rows) and heap (heap.plain + the C-heap blocks of Python's
 * allocators, which the py rows count in requested bytes). */
static void judged_cell(scan_cell *c, const lc_run *r)
{
    analysis a;
    lc_analyse(r, &a, 0);
    const meter_result *worst = NULL;
    for (size_t i = 0; i < LC_NMETERS; i++) {
        const meter_result *m = &a.m[i];
        if (!m->def->bytes || m->def->value == LC_V_RSS || !m->available || !m->judged) continue;
        if (m->def->value == LC_V_PY) {
            c->py_known = 1;
            c->py_per_cycle = m->judged->slope;
        }
        if (m->def->value == LC_V_MALLOC) c->malloc_per_cycle = m->judged->slope;
        if (m->verdict == LC_LEAK && m->def->value != LC_V_PY && m->def->value != LC_V_HEAP && (!worst || m->judged->slope > worst->judged->slope))
            worst = m;
    }
    if (!worst) {
        c->severity = SEV_OK;
        lc_scopy(c->status, sizeof c->status, "ok");
        return;
    }
    char b[32];
    lc_fmt_bytes(b, sizeof b, worst->judged->slope, 1);
    c->severity = SEV_LEAK;
    c->loss = worst->judged->slope;
    snprintf(c->status, sizeof c->status, "LEAK %s/cycle", b);
    snprintf(c->message, sizeof c->message, "%s grows %s per cycle beyond the bare cycle", worst->def->name, b);
}

static void scan_one(scan_row *row, int k, const lc_request *q, double timeout)
{
    scan_cell *c = &row->cell[k];
    lc_request one = *q;
    one.config = &interp_configs[scan_configs[k]];
    one.imports[0] = row->name;
    one.nimports = 1;
    one.baseline = 1;
    one.where = 0;
    lc_run r;
    lc_run_request(&r, &one, timeout, 0);
    c->ran = 1;
    if (r.outcome == LC_OUT_CRASH) {
        crash_cell(c, &r);
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
        judged_cell(c, &r);
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

/* The rows: the --import modules, or every module the worker listed. */
static scan_row *scan_rows(const lc_request *q, const lc_run *lr, size_t *n)
{
    *n = q->nimports ? (size_t)q->nimports : lr->nextensions;
    scan_row *rows = calloc(*n ? *n : 1, sizeof *rows);
    if (!rows) return NULL;
    for (size_t i = 0; i < *n; i++) {
        if (!q->nimports) {
            lc_scopy(rows[i].name, sizeof rows[i].name, lr->extensions[i][0]);
            lc_scopy(rows[i].path, sizeof rows[i].path, lr->extensions[i][1]);
            continue;
        }
        lc_scopy(rows[i].name, sizeof rows[i].name, q->imports[i]);
        for (size_t j = 0; j < lr->nextensions; j++)
            if (!strcmp(lr->extensions[j][0], q->imports[i]))
                lc_scopy(rows[i].path, sizeof rows[i].path, lr->extensions[j][1]);
    }
    return rows;
}

static void scan_all(scan_row *rows, size_t n, const lc_request *q, const lc_run *lr, double timeout)
{
    int isolated_ok = strstr(lr->configs, interp_configs[INTERP_ISOLATED].name) != NULL;
    int tty = isatty(2);
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < LC_SCAN_CONFIGS; k++) {
            scan_cell *c = &rows[i].cell[k];
            if (scan_configs[k] == INTERP_ISOLATED && !isolated_ok) {
                snprintf(c->status, sizeof c->status, "n/a");
                snprintf(c->message, sizeof c->message, "CPython %s has only legacy interpreters", lr->version);
                continue;
            }
            if (tty)
                fprintf(stderr, "\r\033[K[pyfini-leakcheck] scan %zu/%zu %s (%s)", i + 1, n, rows[i].name,
                        interp_configs[scan_configs[k]].name), fflush(stderr);
            if (lc_interrupted()) {
                snprintf(c->status, sizeof c->status, "not run");
                continue;
            }
            scan_one(&rows[i], k, q, timeout);
            if (c->severity > rows[i].severity) rows[i].severity = c->severity;
            if (c->severity == SEV_LEAK && c->loss > rows[i].loss) rows[i].loss = c->loss;
        }
    if (tty) fprintf(stderr, "\r\033[K");
}

static void print_scan_json(const scan_row *rows, size_t n, const lc_request *q, const lc_run *lr, int status)
{
    json_t *o = json_object(), *arr = json_array();
    json_object_set_new(o, "tool", lc_json_str("pyfini-leakcheck"));
    json_object_set_new(o, "tool_version", lc_json_str(LC_VERSION));
    json_object_set_new(o, "mode", lc_json_str("scan"));
    json_object_set_new(o, "python", lc_python_json(q, lr));
    json_object_set_new(o, "warmup", json_integer(q->warmup));
    json_object_set_new(o, "cycles", json_integer(q->cycles));
    for (size_t i = 0; i < n; i++) {
        json_t *rj = json_object();
        json_object_set_new(rj, "module", lc_json_str(rows[i].name));
        json_object_set_new(rj, "path", lc_json_str(rows[i].path));
        for (int k = 0; k < LC_SCAN_CONFIGS; k++) {
            const scan_cell *c = &rows[i].cell[k];
            json_t *cj = json_object();
            json_object_set_new(cj, "status", lc_json_str(c->status));
            json_object_set_new(cj, "message", lc_json_str(c->message));
            json_object_set_new(cj, "py_per_cycle",
                                c->ran && c->severity <= SEV_LEAK && c->py_known ? json_real(c->py_per_cycle) : json_null());
            json_object_set_new(cj, "malloc_per_cycle", c->ran && (c->severity == SEV_OK || c->severity == SEV_LEAK)
                                                            ? json_real(c->malloc_per_cycle) : json_null());
            json_object_set_new(rj, interp_configs[scan_configs[k]].name, cj);
        }
        json_array_append_new(arr, rj);
    }
    json_object_set_new(o, "modules", arr);
    json_object_set_new(o, "exit_status", json_integer(status));
    lc_json_print(o, JSON_INDENT(2));
}

static void print_scan_text(const scan_row *rows, size_t n, const lc_request *q, const lc_run *lr, int status)
{
    printf("pyfini-leakcheck --scan: CPython %s%s (%s build), %zu extension module%s, %ld warm-up + %ld judged "
           "cycles each (excess over a bare cycle)\n\n", lr->version, lr->abiflags, lr->debug ? "debug" : "release", n,
           lc_plural((long long)n), q->warmup, q->cycles);
    printf("%-36s %-22s %-22s\n", "module", "legacy", "isolated");
    for (size_t i = 0; i < n; i++) printf("%-36s %-22s %-22s\n", rows[i].name, rows[i].cell[0].status, rows[i].cell[1].status);
    int notes = 0;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < LC_SCAN_CONFIGS; k++) {
            const scan_cell *c = &rows[i].cell[k];
            if (!c->message[0] || !c->ran) continue;
            if (!notes++) printf("\nnotes:\n");
            printf("  %s (%s): %s\n", rows[i].name, interp_configs[scan_configs[k]].name, c->message);
        }
    printf("\nLEAK = Python's allocators or malloc grew in every chunk beyond the bare cycle (few cycles: "
           "check one module with --import for a full verdict).\nexit status %d\n", status);
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
    s.cycles = q->cycles_set ? q->cycles : LC_SCAN_CYCLES;
    s.warmup = q->warmup_set ? q->warmup : LC_SCAN_WARMUP;
    double timeout = q->timeout_set ? q->timeout : LC_SCAN_TIMEOUT_S;
    size_t n;
    scan_row *rows = scan_rows(&s, &lr, &n);
    if (!rows) {
        fprintf(stderr, "pyfini-leakcheck: out of memory\n");
        lc_run_free(&lr);
        return 3;
    }
    scan_all(rows, n, &s, &lr, timeout);
    qsort(rows, n, sizeof *rows, cmp_rows);
    int status = 0;
    for (size_t i = 0; i < n; i++) {
        if (rows[i].severity >= SEV_HANG) status = 3;
        else if (rows[i].severity == SEV_LEAK && status < 1) status = 1;
    }
    if (lc_interrupted()) status = LC_EXIT_INTERRUPTED;   /* the table shows the modules done */
    if (q->json) print_scan_json(rows, n, &s, &lr, status);
    else print_scan_text(rows, n, &s, &lr, status);
    free(rows);
    lc_run_free(&lr);
    return status;
}
