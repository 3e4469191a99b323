/* fuzz_records.c - what the driver makes of its worker's output
 * (driver/run.c's records, driver/output.c's stderr, then the analysis and
 * every report), whatever bytes a broken or hostile worker writes.
 *
 * The input: 4 header bytes, the record stream (fd 3) up to the first
 * FUZZ_SEP, then the worker's stderr (fd 2).
 *   byte 0: warm-up rounds (low 3 bits), a subject (bit 3), --no-baseline (bit 4),
 *           --where (bit 5), how the worker ended (bits 6-7: exit 0, exit 2,
 *           a signal, a hang)
 *   byte 1: judged rounds beyond the least a verdict needs (mod 32)
 *   byte 2: the signal or exit status it ended with
 *   byte 3: the size of the pieces stderr arrives in (1 + byte, as pipe reads)
 * The records are taken line by line as the read loop does, the run ended
 * as finish() ends it, then judged and reported: text, JSON, CSV.
 */
#define _GNU_SOURCE
#include <string.h>

#include "driver.h"
#include "fuzz.h"

#define FUZZ_SEP "\036\036"   /* two ASCII record separators */
#define FUZZ_HEADER 4

static FILE *devnull;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_quiet_stdout();   /* --json */
    devnull = fopen("/dev/null", "w");
    if (!devnull) fuzz_fail("cannot open /dev/null");
    return 0;
}

static void ignore_line(void *arg, const char *line) { (void)arg, (void)line; }

static void take_records(lc_run *r, const char *s, size_t n)
{
    char *line = malloc(n + 1);
    if (!line) return;
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {   /* as run.c's feed(): a line ends at '\n', a last partial one is dropped */
        if (s[i] != '\n') {
            line[len++] = s[i];
            continue;
        }
        line[len] = 0;
        lc_run_take_record(r, line);
        len = 0;
    }
    free(line);
}

/* What finish() makes of how the worker ended. */
static void end_run(lc_run *r, int how, int code)
{
    switch (how) {
    case 0: r->exit_status = 0; break;
    case 1: r->exit_status = 2; break;
    case 2: r->signal = code % 65, r->exit_status = -1; break;
    default: r->outcome = LC_OUT_HANG; return;
    }
    if (how == 1 && code) r->exit_status = code;
    if (r->signal || (r->outcome == LC_OUT_DONE && r->exit_status != 0)) r->outcome = LC_OUT_CRASH;
    else if (r->outcome != LC_OUT_DONE && r->outcome != LC_OUT_ERROR) r->outcome = LC_OUT_CRASH;
}

static void report(const lc_request *q, lc_run *r)
{
    if (r->outcome == LC_OUT_ERROR) {
        if (!r->error_kind[0]) fuzz_fail("an E record without its kind");
        return;   /* main.c prints r->error: a bounded string */
    }
    analysis a;
    lc_analyse(r, &a, q->max_bytes);
    int status = lc_exit_status(r, &a);
    if (status < LC_EXIT_NO_LEAK || status > LC_EXIT_INTERRUPTED) fuzz_fail("exit status %d", status);
    if (status == LC_EXIT_NO_LEAK && r->outcome != LC_OUT_DONE) fuzz_fail("no leak from a run that did not end");
    if (!lc_run_verdict(r, &a)) fuzz_fail("no verdict");
    lc_print_report(devnull, q, r, &a, status);
    lc_print_json(q, r, &a, status);
    if (lc_write_csv("/dev/null", r) != 0) fuzz_fail("--csv /dev/null failed");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < FUZZ_HEADER) return 0;
    const char *s = (const char *)data + FUZZ_HEADER;
    size_t n = size - FUZZ_HEADER;
    const char *sep = memmem(s, n, FUZZ_SEP, strlen(FUZZ_SEP));
    size_t nrec = sep ? (size_t)(sep - s) : n;
    const char *err = sep ? sep + strlen(FUZZ_SEP) : s + n;
    size_t nerr = (size_t)(s + n - err);

    static lc_request q;   /* large: its worker path */
    memset(&q, 0, sizeof q);
    q.config = &interp_configs[INTERP_LEGACY];
    q.warmup = data[0] & 7;
    if (data[0] & 8) q.code = "pass";
    q.baseline = !(data[0] & 16);
    q.where = !!(data[0] & 32);
    q.cycles = lc_schedule_min_cycles(lc_has_subject(&q), q.baseline) + data[1] % 32;
    q.timeout = 1;

    lc_run r;
    lc_run_init(&r, &q, q.timeout, 0);
    take_records(&r, s, nrec);
    size_t piece = 1 + data[3];
    for (size_t i = 0; i < nerr; i += piece)
        lc_output_feed(&r.err, err + i, nerr - i < piece ? nerr - i : piece, ignore_line, NULL);
    lc_output_end(&r.err, ignore_line, NULL);
    end_run(&r, data[0] >> 6, data[2]);
    report(&q, &r);
    lc_run_free(&r);
    return 0;
}
