/* demo.c - --demo: bare legacy vs bare isolated interpreters, then the same
 * with --import json; one table line each. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"

#define LC_DEMO_CYCLES 40
#define LC_DEMO_WARMUP 5

static void print_header(const lc_run *r)
{
    printf("CPython %s%s (%s build)\n\n", r->version, r->abiflags, r->debug ? "debug" : "release");
    printf("%-24s %9s  %-20s %-20s %-20s %s\n", "cycle", "ms/cycle", "rss/cycle", "malloc/cycle", "py/cycle",
           "verdict");
}

/* One line of the table; returns the exit status it contributes (0, 1, 3, 4). */
static int print_line(const char *label, const lc_run *r, int subject)
{
    if (r->outcome != LC_OUT_DONE) {
        if (r->outcome == LC_OUT_ERROR) printf("%-24s not run: %s\n", label, r->error);
        else printf("%-24s %s\n", label, r->outcome == LC_OUT_HANG ? "HANG" : lc_run_verdict(r, NULL));
        return r->outcome == LC_OUT_ERROR ? 0 : r->outcome == LC_OUT_INTERRUPTED ? LC_EXIT_INTERRUPTED : LC_EXIT_CRASH;
    }
    analysis a;
    lc_analyse(r, &a, 0);
    static const int shown[3] = {LC_V_RSS, LC_V_MALLOC, LC_V_PY};
    char cols[3][40];
    for (int k = 0; k < 3; k++) {
        const meter_result *m = lc_meter_result(&a, shown[k]);
        char v[24] = "n/a";
        if (m->available && m->judged) lc_fmt_value(v, sizeof v, m->def, m->judged->slope, 1);
        snprintf(cols[k], sizeof cols[k], "%s %s", v, lc_verdict_mark(m));
    }
    double ms = subject ? a.time_subject_ms : a.time_bare_ms;
    printf("%-24s %9.2f  %-20s %-20s %-20s %s\n", label, ms, cols[0], cols[1], cols[2], lc_run_verdict(r, &a));
    return lc_exit_status(r, &a);
}

/* the worst of the lines: crash, then LEAK, then not judged, then no leak */
static int rank(int status)
{
    return status == LC_EXIT_CRASH ? 3 : status == LC_EXIT_LEAK ? 2 : status == LC_EXIT_NOT_JUDGED ? 1 : 0;
}

/* --junit: a line of the table as a check; a config this CPython does not
 * have is skipped (the table says "not run"). */
static void junit_line(const lc_request *d, const lc_run *r, double seconds)
{
    if (r->outcome == LC_OUT_ERROR && r->error_refused) {
        char classname[128];
        snprintf(classname, sizeof classname, "pyfini-leakcheck.%s", d->config->name);
        lc_junit_add(classname, d->nimports ? "--import json" : "(none: the bare cycle itself is judged)", seconds,
                     LC_CASE_SKIPPED, "not run", r->error, r->error);
        return;
    }
    analysis a;
    memset(&a, 0, sizeof a);
    if (r->outcome != LC_OUT_ERROR && r->outcome != LC_OUT_SPAWN) lc_analyse(r, &a, 0);
    lc_junit_check(d, r, &a, r->outcome == LC_OUT_ERROR ? LC_EXIT_USAGE : lc_exit_status(r, &a), seconds);
}

int lc_demo(const lc_request *q)
{
    static const struct { int config; const char *import; } runs[] = {
        {INTERP_LEGACY, NULL}, {INTERP_ISOLATED, NULL}, {INTERP_LEGACY, "json"}, {INTERP_ISOLATED, "json"}};
    lc_request d = *q;
    d.cycles = q->cycles_set ? q->cycles : LC_DEMO_CYCLES;
    d.warmup = q->warmup_set ? q->warmup : LC_DEMO_WARMUP;
    d.baseline = 1;
    d.where = 0;
    printf("pyfini-leakcheck --demo: what one create-and-end cycle of an interpreter loses\n");
    printf("(%ld warm-up + %ld judged cycles each; with --import json, the excess over a bare cycle is judged)\n\n",
           d.warmup, d.cycles);
    int worst = 0, header = 0;
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        d.config = &interp_configs[runs[i].config];
        d.nimports = runs[i].import != NULL;
        d.imports[0] = runs[i].import;
        lc_run r;
        double t0 = lc_now();
        lc_run_request(&r, &d, q->timeout, lc_show_progress(q));
        if (q->junit) junit_line(&d, &r, lc_now() - t0);
        char label[64];
        snprintf(label, sizeof label, "%s %s", d.config->name, runs[i].import ? "--import json" : "bare");
        if (!header && r.version[0]) print_header(&r), header = 1;
        int st = print_line(label, &r, d.nimports);
        if (rank(st) > rank(worst)) worst = st;
        lc_run_free(&r);
        if (lc_interrupted()) {
            printf("INTERRUPTED by signal %d (%s)\n", lc_interrupted(), lc_signal_name(lc_interrupted()));
            return LC_EXIT_INTERRUPTED;
        }
    }
    printf("\nper cycle: least-squares slope over the judged cycles (for --import json: beyond the bare cycle).\n"
           "ok / LEAK / ? = no leak / LEAK / inconclusive for that meter.  Details of one line:\n"
           "  pyfini-leakcheck --config isolated [--import json] [--where]\n");
    return worst;
}
