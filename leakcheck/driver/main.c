/* main.c - pyfini-leakcheck: how much does one create-and-end cycle of a
 * CPython interpreter lose, is it a leak, and who allocated it?
 *
 * This process never embeds Python: it starts a worker (worker/, linked to
 * one CPython) that runs the cycles and reports a reading of every meter
 * after each one, so that a crash or a hang of the subject is a finding
 * reported here, with the figures gathered until then.  The parts: see
 * driver.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "driver.h"

/* A run that ended before its first cycle: bad input, the subject raised,
 * the worker could not start. */
void lc_print_error(const lc_request *q, const lc_run *r)
{
    fprintf(stderr, "pyfini-leakcheck: %s\n", r->error);
    if (!strcmp(r->error_kind, "internal") && r->output_tail[0]) fprintf(stderr, "%s\n", r->output_tail);
    if (!q->json) return;
    json_t *o = json_object();
    json_object_set_new(o, "tool", lc_json_str("pyfini-leakcheck"));
    json_object_set_new(o, "verdict", lc_json_str("error"));
    json_object_set_new(o, "error_kind", lc_json_str(r->error_kind[0] ? r->error_kind : "spawn"));
    json_object_set_new(o, "error", lc_json_str(r->error));
    json_object_set_new(o, "exit_status", json_integer(2));
    lc_json_print(o, JSON_INDENT(2));
}

static int write_junit(const lc_request *q, int status);
static int junit_written;   /* run_check wrote it before its report */

/* One check: the request's config and subject, judged and reported. */
static int run_check(const lc_request *q)
{
    lc_run r;
    double t0 = lc_now();
    lc_run_request(&r, q, q->timeout, lc_show_progress(q));
    double seconds = lc_now() - t0;
    if (r.outcome == LC_OUT_ERROR || r.outcome == LC_OUT_SPAWN) {
        lc_print_error(q, &r);
        if (q->plot) fprintf(stderr, "pyfini-leakcheck: --plot %s: not written: no cycle ran\n", q->plot);
        if (q->junit) lc_junit_check(q, &r, NULL, LC_EXIT_USAGE, seconds);
        lc_run_free(&r);
        return 2;
    }
    analysis a;
    lc_analyse(&r, &a, q->max_bytes);
    lc_whose w;   /* a LEAK: whose it is (a short pass with --where when the run had none) */
    lc_whose_attribute(q, &r, &a, &w);
    int status = lc_exit_status(&r, &a);
    /* the file outputs first: one that cannot be written makes a status of
       0 a 2, and the report says the status the process exits with */
    int out_failed = 0;
    if (q->junit) {
        lc_junit_check(q, &r, &a, status, seconds);
        out_failed |= write_junit(q, 0) != 0;
        junit_written = 1;
    }
    if (q->csv && lc_write_csv(q->csv, &r) != 0) {
        fprintf(stderr, "pyfini-leakcheck: --csv %s: %s\n", q->csv, strerror(errno));
        out_failed = 1;
    }
    char err[LC_MESSAGE_MAX];
    if (q->plot && lc_plot_check(q->plot, q, &r, &a, err, sizeof err) != 0) {
        fprintf(stderr, "pyfini-leakcheck: %s\n", err);
        out_failed = 1;
    }
    if (out_failed && !status) status = LC_EXIT_USAGE;
    if (q->json) lc_print_json(q, &r, &a, status);
    else lc_print_report(stdout, q, &r, &a, status);
    lc_whose_free(&w);
    lc_run_free(&r);
    return status;
}

/* --junit FILE, --plot FILE: refused up front when FILE cannot be written
 * (it is written at the end, through a temporary file beside it). */
void lc_check_output_path(const char *option, const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) lc_usage_error("%s %s: is a directory", option, path);
    char dir[LC_PATH_MAX];
    lc_scopy(dir, sizeof dir, path);
    char *slash = strrchr(dir, '/');
    if (!slash) lc_scopy(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    if (access(dir, W_OK) != 0) lc_usage_error("%s %s: cannot write in %s: %s", option, path, dir, strerror(errno));
}

/* The run's status, or 2 when the JUnit report it asked for was not written. */
static int write_junit(const lc_request *q, int status)
{
    char err[LC_MESSAGE_MAX];
    if (lc_junit_write(q->junit, q->demo ? "demo" : q->scan ? "scan" : "check", err, sizeof err) == 0) return status;
    fprintf(stderr, "pyfini-leakcheck: %s\n", err);
    return status ? status : LC_EXIT_USAGE;
}

int main(int argc, char **argv)
{
    static lc_request q;   /* large (the worker's path): not on the stack */
    lc_parse_args(&q, argc, argv);
    char err[LC_MESSAGE_MAX];
    if (q.version) {
        if (lc_print_version(stdout, q.python, err, sizeof err) == 0) return 0;
        fprintf(stderr, "pyfini-leakcheck: %s\n", err);
        return 2;
    }
    int rc = q.python ? lc_worker_for_python(q.python, q.worker, sizeof q.worker, err, sizeof err)
                      : lc_default_worker(q.worker, sizeof q.worker, err, sizeof err);
    if (q.junit) lc_check_output_path("--junit", q.junit);
    if (q.plot) lc_check_output_path("--plot", q.plot);
    if (rc < 0) {
        fprintf(stderr, "pyfini-leakcheck: %s\n", err);
        if (q.junit) {
            lc_junit_add("pyfini-leakcheck", "worker", 0, LC_CASE_ERROR, "error", err, err);
            write_junit(&q, 2);
        }
        return 2;
    }
    if (q.csv) {
        FILE *f = fopen(q.csv, "a");
        if (!f) lc_usage_error("--csv %s: %s", q.csv, strerror(errno));
        fclose(f);
    }
    int status = q.demo ? lc_demo(&q) : q.scan ? lc_scan(&q) : run_check(&q);
    return q.junit && !junit_written ? write_junit(&q, status) : status;
}
