/* worker.h - what the parts of pyfini-leakcheck's worker tell each other.
 *
 *   main.c     options, CPython start-up, the cycle loop (follows lc_schedule)
 *   meters.c   one reading of every meter (rss, malloc, py*, blocks, refs, fds)
 *   subject.c  the subject: imports, --code, --file; Python errors as text
 *   where.c    --where: the sites still holding bytes, C frames, Python lines
 *   lc_alloc.c the counting allocator wrapper (also used by pyfini's tests)
 *   symbols.c  return addresses to function, file and line (elfutils libdw)
 * Include after Python.h.
 */
#ifndef LC_WORKER_H
#define LC_WORKER_H

#include "interp_configs.h"
#include "lc_protocol.h"
#include "lc_schedule.h"


/* What the driver asked for (worker options). */
typedef struct wk_request {
    const interp_config *config;
    const char *imports[LC_MAX_IMPORTS];
    int nimports;
    const char *code;
    const char *file;
    char *file_src;   /* contents of file */
    long cycles, warmup;
    long block;           /* --block: the schedule's block length k (0: lc_schedule_make's) */
    long early_stop;      /* --early-stop N: ask the driver (LC_CONTROL_FD) every N judged rounds; 0 never */
    int baseline, where, list_extensions, no_wrapper;
    long driver_pid;      /* --driver-pid: the parent that PR_SET_PDEATHSIG watches (0 not given) */
    long long max_rss;    /* --max-rss: the driver's limit, bytes (0 none): RLIMIT_DATA at twice it */
} wk_request;

static inline int wk_has_subject(const wk_request *q) { return q->nimports > 0 || q->code || q->file; }

/* records */
void wk_emit(const lc_line *l);   /* exits (4) when the driver is gone */
void wk_fail(enum lc_error_kind kind, int refused, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));   /* an E record, then exit 2 */
void wk_info(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));   /* an I record */

/* meters.c */
void wk_meters_open(void);                    /* before anything else */
void wk_meters_report(const wk_request *q);   /* A records; after Py_Initialize */
void wk_reading(const wk_request *q, int64_t v[LC_NVALUES]);

/* settle.c: CPython 3.11's tables shared with the main interpreter, sized
 * by their contents (after each cycle, in the main interpreter) */
int wk_settle_available(void);
void wk_settle_shared(void);

/* subject.c */
void wk_describe_exception(char *out, size_t n);   /* the pending exception as text; clears it */
int wk_run_subject(const wk_request *q, char *err, size_t n, int *refused);   /* 0, or -1 and err */
void wk_precheck_subject(const wk_request *q);     /* fails with a usage error */
/* Compile src (--code's text, a --file's contents) as filename; 0, or -1
 * with the SyntaxError (or other exception) as text in err, cleared.  What
 * wk_precheck_subject does with each source; needs an attached thread state. */
int wk_compile_subject(const char *src, const char *filename, char *err, size_t n);
void wk_list_extensions(void);                     /* X records */

/* where.c */
/* --where's Python lines come from a pass of LC_PY_PASS_CYCLES more cycles
 * after the judged ones, traced by tracemalloc (started then: tracing every
 * cycle made --where several times slower); wk_start_tracemalloc() returns
 * 0 when it is unavailable (an I record says why). */
#define LC_PY_PASS_CYCLES 2
int wk_start_tracemalloc(void);
/* One more cycle after those gives C-heap sites their Python line
 * (where.c): wk_start_heap_lines() 1 if the C-heap meter is there; then
 * wk_heap_lines_attach() in that cycle's interpreter, right after it was
 * created, and wk_heap_lines_detach() after it ended. */
int wk_start_heap_lines(void);
void wk_heap_lines_attach(void);
void wk_heap_lines_detach(void);
void wk_report_where(const lc_schedule *s);

#endif
