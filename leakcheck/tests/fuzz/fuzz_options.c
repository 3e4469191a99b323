/* fuzz_options.c - pyfini-leakcheck's command line (driver/options.c).
 *
 * The input is argv: arguments separated by NUL bytes (argv[0] is the
 * tool's name).  lc_parse_args_try() must parse it or refuse it with a
 * message - never crash, never exit - and a request it accepts must hold
 * what the rest of the driver relies on, down to the schedule a run follows.  What the driver then does with the
 * subject's text (--code, --import, --file) before any worker runs: the
 * report's subject line and the JSON string of --code.
 */
#define _GNU_SOURCE
#include <jansson.h>
#include <string.h>

#include "driver.h"
#include "fuzz.h"

#define FUZZ_MAX_ARGS 256

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_quiet_stdout();   /* --help */
    return 0;
}

static void check_request(const lc_request *q)
{
    long min = lc_schedule_min_cycles(lc_has_subject(q) || q->scan || q->demo, q->baseline);
    if (!q->config) fuzz_fail("accepted without a config");
    if (q->nimports < 0 || q->nimports > LC_MAX_IMPORTS) fuzz_fail("%d imports", q->nimports);
    if (!q->version && q->cycles_set && q->cycles < min) fuzz_fail("accepted --cycles %ld < %ld", q->cycles, min);
    if (q->warmup < 0 || q->timeout < 0.1 || q->max_bytes < 0) fuzz_fail("accepted a negative number");
    for (int i = 0; i < q->nimports; i++)
        if (!q->imports[i][0]) fuzz_fail("accepted an empty --import");
    /* the schedule lc_run_request() makes of it first (its length: the
       cycle records the run waits for) */
    lc_schedule s = lc_schedule_make(q->warmup, q->cycles, lc_has_subject(q), q->baseline);
    if (lc_schedule_length(&s) < q->cycles) fuzz_fail("a schedule shorter than its %ld cycles", q->cycles);
    /* the subject as the text report and --junit name it */
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f) fuzz_fail("open_memstream");
    lc_print_subject(f, q);
    fclose(f);
    if (!n || strlen(text) != n) fuzz_fail("subject line of %zu bytes, %zu to the first NUL", n, strlen(text));
    free(text);
    /* --code in the JSON report: a string, even when it is no UTF-8 */
    if (q->code) {
        json_t *j = lc_json_str(q->code);
        if (!json_is_string(j)) fuzz_fail("--code is no JSON string");
        json_decref(j);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    char *argv[FUZZ_MAX_ARGS + 2];
    int argc = 0;
    argv[argc++] = "pyfini-leakcheck";
    for (size_t i = 0; i < size && argc <= FUZZ_MAX_ARGS; i += strlen(buf + i) + 1) argv[argc++] = buf + i;
    argv[argc] = NULL;
    lc_request *q = malloc(sizeof *q);   /* large: its worker path */
    char err[LC_MESSAGE_MAX];
    int rc = q ? lc_parse_args_try(q, argc, argv, err, sizeof err) : -1;
    if (rc == 0) check_request(q);
    else if (rc == 2 && !err[0]) fuzz_fail("a usage error without a message");
    else if (rc != 1 && rc != 2 && q) fuzz_fail("lc_parse_args_try returned %d", rc);
    free(q);
    free(buf);
    return 0;
}
