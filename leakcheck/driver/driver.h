/* driver.h - what the parts of pyfini-leakcheck's driver tell each other.
 *
 *   main.c         the request from the options, then one check, --demo or --scan
 *   options.c      options -> lc_request (usage errors, --help)
 *   run.c          start one worker for a request, decode its records into an lc_run
 *   output.c       the subject's stderr: pyfini's leak reports parsed, other lines summarised
 *   analyse.c      the meters, and an lc_run judged per meter (stats.c: the statistics)
 *   report_text.c  the report on a terminal
 *   report_json.c  --json
 *   report_csv.c   --csv
 *   report_junit.c --junit (libxml2's xmlwriter)
 *   report_plot.c  --plot (cairo's SVG surface)
 *   demo.c         --demo
 *   scan.c         --scan
 *   python.c       --python X.Y: find that CPython, build its worker once
 * The driver embeds no Python; with the worker it shares only shared/ (the
 * record codec, the schedule) and common/interp_configs.h.
 */
#ifndef LC_DRIVER_H
#define LC_DRIVER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "interp_configs.h"
#include "lc_protocol.h"
#include "lc_schedule.h"
#include "lc_util.h"
#include "stats.h"

#define LC_PATH_MAX 4096

/* --- what was asked (options.c) ------------------------------------------ */
typedef struct lc_request {
    const interp_config *config;
    const char *imports[LC_MAX_IMPORTS];
    int nimports;
    const char *code, *file, *python, *csv;
    const char *junit;          /* --junit FILE, or NULL */
    const char *plot;           /* --plot FILE.svg, or NULL */
    long jobs;                  /* --scan --jobs N: parallel workers (default: the cores) */
    long cycles, warmup;
    int cycles_set, warmup_set, config_set;
    double max_bytes, timeout;
    int timeout_set;
    long long max_rss;          /* --max-rss: bytes of the worker's resident set, 0 no limit */
    int json, where, scan, baseline, demo, no_wrapper;
    int quiet;                  /* --quiet: no progress line */
    int judge_whole;            /* --judge whole (the default): the exit status judges the whole excess; 0: --judge subject */
    int early_stop;             /* --early-stop: --cycles is a cap (run.c, early_stop_check) */
    int list_extensions;        /* the worker lists extension modules instead of running cycles */
    int version;                /* --version: print the version and the CPython, run nothing */
    char worker[LC_PATH_MAX];   /* the worker that runs it */
} lc_request;

/* The options into q; exits 0 after --help, 2 after a usage error (the
 * message on stderr). */
void lc_parse_args(lc_request *q, int argc, char **argv);
/* The same without exiting (the fuzz target, a test): 0 parsed, 1 --help
 * printed, 2 usage error (err holds the message).  q's strings point into
 * argv.  Not thread-safe (getopt). */
int lc_parse_args_try(lc_request *q, int argc, char **argv, char *err, size_t errn);
/* A usage error: the message on stderr, exit 2 (inside lc_parse_args_try:
 * back to its caller). */
void lc_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
long long lc_default_max_rss(void);   /* half the machine's RAM (0: unknown, no limit) */
static inline int lc_has_subject(const lc_request *q) { return q->nimports || q->code || q->file; }
static inline int lc_paired(const lc_request *q) { return lc_has_subject(q) && q->baseline; }

/* --- what the worker said (run.c) ---------------------------------------- */
typedef struct lc_cycle {
    lc_cycle_id id;
    int64_t v[LC_NVALUES];
    int64_t obm;        /* obmalloc blocks still in use at interpreter end, -1 unknown */
} lc_cycle;

#define LC_FRAME_TEXT 400
typedef struct lc_site {
    unsigned id;
    char domain[LC_DOMAIN_NAME_MAX];
    int64_t bytes[2], blocks[2];   /* [0] subject, [1] bare cycles */
    double bytes_per_cycle, blocks_per_cycle;   /* excess per judged cycle (lc_schedule_excess) */
    int nframes;
    char frames[LC_SITE_FRAMES][LC_FRAME_TEXT];
    int npyframes;            /* Python traceback of a sample block (tracemalloc) */
    char pyframes[LC_SITE_PYLINES][LC_FRAME_TEXT];
    char whose[16];           /* "subject", "cpython", "unattributed" (whose.c), "" unknown */
} lc_site;

/* --- whose loss (whose.c) -------------------------------------------------- */
/* What the worker's --where told of every site still holding bytes, summed
 * by allocator domain and by whose the site is (I records "whose"). */
#define LC_WHOSE_DOMAINS 5    /* raw, mem, obj, obmalloc, heap (the worker's site domains) */
enum lc_whose_class { LC_WHOSE_SUBJECT, LC_WHOSE_CPYTHON, LC_WHOSE_UNATTRIBUTED, LC_NWHOSE };
typedef struct lc_whose_totals {
    int done;                                   /* "whose_done": the worker classified every site */
    int64_t bytes[LC_WHOSE_DOMAINS][LC_NWHOSE][2], blocks[LC_WHOSE_DOMAINS][LC_NWHOSE][2];   /* [subject, bare cycles] */
    long sites[LC_WHOSE_DOMAINS][LC_NWHOSE];
    char dirs[512];                             /* CPython's directories, as the worker found them */
} lc_whose_totals;

typedef struct lc_meter_avail {
    int known, available;
    char how[300];
} lc_meter_avail;

/* What the subject wrote on the worker's stderr (output.c), in bounded memory. */
#define LC_OUTPUT_LINE_MAX 512       /* a line is kept up to this many bytes */
#define LC_OUTPUT_DISTINCT_MAX 20    /* distinct lines kept, with their counts */
#define LC_OUTPUT_HASHES_MAX 65536   /* distinct lines counted beyond those (then "at least") */
#define LC_LEAK_REPORTS_MAX 10       /* distinct pyfini leak reports kept (state, object count) */
#define LC_LEAK_TYPES_MAX 8          /* type names kept per leak report */
typedef struct lc_leak_report {
    char state[256];
    long long interpreter;    /* of its first report */
    long objects;             /* tracked objects still alive at POST_SHUTDOWN */
    long first_cycle, count;  /* the cycle of the first report, reports in all */
    int ntypes;
    char types[LC_LEAK_TYPES_MAX][128];   /* "type mylib.Node", "mylib.Node object" */
} lc_leak_report;
typedef struct lc_output_line {
    char text[LC_OUTPUT_LINE_MAX];   /* addresses normalised to 0x... */
    const char *kind;                /* "fatal error", "exception ignored", "warning", "traceback", "other" */
    long count, first_cycle;         /* cycle 0: before the first cycle */
} lc_output_line;
typedef struct lc_output {
    long cycle;                      /* the cycle being written (last marker) */
    long lines;                      /* non-empty lines in all */
    long leak_reports, leak_reports_dropped;
    lc_leak_report leaks[LC_LEAK_REPORTS_MAX];
    size_t nleaks;
    int in_report;                   /* 1 + index of the report whose " - " lines follow */
    lc_output_line distinct[LC_OUTPUT_DISTINCT_MAX];
    size_t ndistinct;
    long more_distinct;              /* distinct lines beyond distinct[] */
    int more_saturated;              /* ... at least that many */
    long fatal_errors;               /* "Fatal Python error" lines */
    int broken;                      /* the worker's LC_STDERR_BROKEN line: its exit status */
    uint64_t *hashes;
    size_t nhashes;
    char partial[LC_OUTPUT_LINE_MAX];
    size_t npartial;
    int partial_cut;                 /* the line being read is longer than partial[] */
    long lines_cut;                  /* lines longer than LC_OUTPUT_LINE_MAX, kept up to it */
} lc_output;
void lc_output_feed(lc_output *o, const char *buf, size_t n, void (*each)(void *, const char *), void *arg);
void lc_output_end(lc_output *o, void (*each)(void *, const char *), void *arg);
void lc_output_free(lc_output *o);

/* How the subject's children ended (K records), by distinct end. */
#define LC_CHILD_ENDS_MAX 16
typedef struct lc_child_end {
    int exit_code, signal;        /* exit -1: killed by signal */
    long count, first_cycle, first_pid;
} lc_child_end;
typedef struct lc_children {
    long total, failed;           /* failed: not exit 0 */
    lc_child_end ends[LC_CHILD_ENDS_MAX];
    size_t nends;
    long other_ends;              /* children whose end is beyond ends[] */
} lc_children;

enum lc_outcome {
    LC_OUT_DONE,        /* D record */
    LC_OUT_ERROR,       /* E record (bad input, subject raised, config refused) */
    LC_OUT_CRASH,       /* killed by a signal or exited without D/E */
    LC_OUT_HANG,        /* no record within the timeout: killed */
    LC_OUT_SPAWN,       /* could not start the worker */
    LC_OUT_INTERRUPTED, /* SIGINT or SIGTERM to the driver: the worker was killed */
    LC_OUT_MEMORY,      /* the worker's resident set went above --max-rss: killed */
};
/* A crash, hang or memory limit: the report's crash part applies. */
static inline int lc_outcome_crashed(int o) { return o == LC_OUT_CRASH || o == LC_OUT_HANG || o == LC_OUT_MEMORY; }

#define LC_TAIL_MAX 4096
#define LC_RUN_SIG_MAX 16   /* >= LC_NMETERS + 1 (checked in run.c) */
typedef struct lc_run {
    /* what was asked */
    lc_schedule sched;
    long expected_cycles;   /* cycle records before 'D' counts as done (0: --list-extensions) */
    double timeout_s;
    long long max_rss;  /* --max-rss, bytes; 0 no limit */
    int progress;       /* print a progress line on stderr */
    int parallel;       /* one of --scan --jobs' threads: short waits (see run.c) */
    /* --early-stop: the worker's control socket (-1: none), the allowed loss
       the checkpoints judge with, the rounds planned (the cap) and, once
       stopped, the rounds run; the last checkpoint's verdicts (LC_NMETERS
       meters' verdicts + the run's) */
    int ctl_fd;
    double max_bytes;
    long rounds_cap, stopped_at;
    int checkpoints;    /* answers given to the worker */
    int control_lost;   /* the control socket failed or the records went out of step: no stop */
    int last_sig[LC_RUN_SIG_MAX], have_last_sig;
    double started, drawn;   /* lc_now() at the start, at the last progress line */
    /* what the worker said */
    char version[64], abiflags[16], executable[1024], compiler[256], configs[256];
    int debug;
    char ignored_env[256];
    lc_meter_avail avail[LC_NVALUES];
    int64_t initial[LC_NVALUES];
    int have_initial;
    lc_cycle *cyc;
    size_t ncyc, capcyc;
    lc_site *sites;
    size_t nsites, capsites;
    char (*extensions)[2][LC_MODULE_NAME_MAX];
    size_t nextensions, capextensions;
    lc_cycle_id begun;  /* last B record */
    char where_note[512];
    char where_python[512];  /* "tracemalloc, N frames" or "unavailable...: why" */
    lc_whose_totals whose;
    /* how it ended */
    enum lc_outcome outcome;
    char error_kind[32];   /* lc_error_kind_name(), "" when none */
    int error_refused;     /* the E record's refused flag */
    char error[LC_MESSAGE_MAX];
    int exit_status;    /* worker exit status, -1 if signalled */
    int interrupted;    /* the signal that interrupted the run, 0 none */
    int broken;         /* the worker's "broken" I record: its exit status (see LC_STDERR_BROKEN) */
    int signal;         /* terminating signal or 0 */
    char output_tail[LC_TAIL_MAX];   /* last bytes of the worker's stdout+stderr */
    long long stdout_bytes, stderr_bytes;   /* what the worker wrote on each, read in all */
    int tail_cut;       /* output_tail holds only the last bytes of it */
    long long rss_at_kill;   /* LC_OUT_MEMORY: the worker's VmRSS when it was killed, bytes */
    long group_killed;  /* processes of the worker's group still there after it ended, killed */
    long escaped_killed;   /* processes that had left the group (setsid) and outlived the worker, killed */
    lc_output err;      /* the worker's stderr: what the subject said */
    lc_children children;   /* processes the subject forked, and how they ended */
} lc_run;

/* Run q's worker (q->worker) to its end; timeout in seconds per record. */
void lc_run_request(lc_run *r, const lc_request *q, double timeout, int progress);
void lc_run_free(lc_run *r);
/* The parts of lc_run_request without a worker (the fuzz target of the
 * record stream): r set up for q, nothing received yet; then one record
 * line (without its newline) taken into r as the read loop does: a line
 * that is no record is ignored. */
void lc_run_init(lc_run *r, const lc_request *q, double timeout, int progress);
void lc_run_take_record(lc_run *r, const char *line);
int lc_interrupted(void);   /* SIGINT or SIGTERM received (its number), 0 none */
/* Show a progress line: stderr is a terminal and no --quiet. */
int lc_show_progress(const lc_request *q);

/* --- meters and judgement (analyse.c) ------------------------------------ */
typedef struct lc_meter_def {
    const char *name;
    int value;           /* enum lc_value */
    int bytes;           /* a bytes meter (drives exit status 1) */
    int exact;           /* counts every unit: judged by the exact rule (stats.h) */
    double resolution;
    const char *help;
} lc_meter_def;
extern const lc_meter_def lc_meters[];
#define LC_NMETERS 13

/* Why a meter's LEAK was made inconclusive by the run's rule (analyse.c). */
enum lc_overrule {
    LC_OVERRULE_NONE,
    LC_OVERRULE_MALLOC,   /* malloc (mallinfo2) while the exact heap meter found no LEAK */
    LC_OVERRULE_NOISE,    /* not every sample grew, or the meter's level did not grow in every chunk,
                             and no count meter behind it grew (a table that grows in subject cycles
                             and shrinks in bare ones) */
    LC_OVERRULE_UNBACKED, /* rss or malloc grew steadily but no count of blocks grew with it: not the
                             subject's allocations, and not "no leak" either (kept undecided) */
    LC_OVERRULE_CPYTHON,  /* the subject's view (whose.c): rss, malloc or heap LEAK in the whole run, and
                             no meter of the subject's allocations is LEAK once CPython's share is off */
};

typedef struct meter_result {
    const lc_meter_def *def;
    int available;
    const char *how;
    lc_judgement subject, bare, excess;
    int have_subject, have_bare, have_excess;
    const lc_judgement *judged;   /* what the verdict is about */
    enum lc_verdict verdict;
    /* the meter's own level (subject and bare cycles together, not the
       excess) over each chunk of the judged cycles: its smallest growth
       per subject cycle of the chunk */
    double level_min_per_cycle;
    enum lc_overrule overruled;   /* a LEAK of the series made inconclusive, and why */
} meter_result;

typedef struct analysis {
    meter_result m[LC_NMETERS];
    double time_subject_ms, time_bare_ms;
    long n_subject, n_bare, rounds_judged;
    int leak;                      /* a bytes meter, or a count meter (see lc_analyse), judged LEAK */
    int no_leak;                   /* every meter that sees the subject's allocations judged "no leak" */
    int inconclusive;
    int malloc_overruled;          /* malloc LEAK made inconclusive: the exact heap meter judged no LEAK */
    int noise_overruled;           /* an exact meter's LEAK made inconclusive (LC_OVERRULE_NOISE) */
    /* the meters that kept the run from "no leak" (not judged "no leak"),
       as indexes into m[], nundecided of them */
    int undecided[LC_NMETERS], nundecided;
    int64_t obm_min, obm_max;
    double obm_mean;
    long obm_n;
    struct lc_whose *whose;        /* whose the loss is (whose.c), NULL: not asked (no LEAK) */
} analysis;

/* Whose a run's loss is (whose.c; leakcheck/README.md, "Whose loss"): per
 * meter that a site domain covers, the excess per cycle split into
 * CPython's share (sites shown to be CPython's), the subject's sites' and
 * the rest (unattributed: the subject's for the verdict); the subject's
 * view: the run judged again with CPython's share taken off each sample. */
#define LC_WHOSE_PASS_CYCLES 10   /* judged rounds of the attribution pass */
typedef struct lc_whose {
    int attempted, done;
    char why[512];               /* done 0: why not */
    int from_pass;               /* the data of a short pass with --where after the run (1), or the run's own */
    long pass_cycles;
    double pass_seconds;
    double excess[LC_NVALUES], cpython[LC_NVALUES], subject[LC_NVALUES], unattributed[LC_NVALUES];
    int covered[LC_NVALUES];     /* a meter the sites split */
    analysis *view;              /* the subject's view (allocated), NULL unless done */
    int judge_whole;             /* --judge whole */
    lc_whose_totals totals;
} lc_whose;
/* A run with a LEAK: whose it is, from r's --where data or a short pass
 * (a second worker); sets a->whose = w.  Nothing when nothing leaked. */
void lc_whose_attribute(const lc_request *q, const lc_run *r, analysis *a, lc_whose *w);
void lc_whose_free(lc_whose *w);
void lc_whose_take_info(lc_run *r, const char *key, const char *val);   /* run.c: the I records */
const char *lc_whose_issue(const char *version);   /* the CPython issue behind its per-import loss, or NULL */
/* The whole run judged again with shift[v] taken off every excess sample
 * of value v; whole: the run's own analysis (rss, malloc, heap LEAKs that
 * no subject part stands behind become CPython's). */
void lc_analyse_shifted(const lc_run *r, analysis *a, double max_bytes, const double shift[LC_NVALUES],
                        const analysis *whole);

void lc_analyse(const lc_run *r, analysis *a, double max_bytes);
const meter_result *lc_meter_result(const analysis *a, int value);   /* by enum lc_value */

/* --- reports ------------------------------------------------------------- */
/* The exit statuses (--help and leakcheck/README.md list the same). */
enum lc_exit {
    LC_EXIT_NO_LEAK = 0,      /* every meter that sees the subject's allocations judged "no leak" (run_rule) */
    LC_EXIT_LEAK = 1,         /* a bytes or count meter judged LEAK, or pyfini reported a leak on stderr */
    LC_EXIT_USAGE = 2,        /* usage error, or the subject failed (raised, missing module, config refused) */
    LC_EXIT_CRASH = 3,        /* the subject crashed, hung, broke the tool's descriptors, or a child of it failed */
    LC_EXIT_NOT_JUDGED = 4,   /* finished, nothing leaked, a meter that sees the subject inconclusive: never "no leak" */
    LC_EXIT_INTERRUPTED = 5,  /* SIGINT/SIGTERM: the partial report of the finished cycles */
};
int lc_exit_status(const lc_run *r, const analysis *a);
const char *lc_run_verdict(const lc_run *r, const analysis *a);   /* "LEAK", "no leak", "not judged", "crash", ... */
void lc_fmt_bytes(char *out, size_t n, double b, int sign);
void lc_fmt_value(char *out, size_t n, const lc_meter_def *m, double v, int sign);
const char *lc_verdict_mark(const meter_result *m);   /* "LEAK", "ok", "?" or "" */
const char *lc_signal_name(int sig);    /* "Segmentation fault" (sigdescr_np) */
/* "SIGSEGV" (sigabbrev_np) into out, "SIG?" for an unknown number; returns out */
const char *lc_signal_abbrev(int sig, char *out, size_t n);
/* What the worker's exit status says the subject did to the tool's
 * descriptors, when the worker confirmed it (LC_STDERR_BROKEN), or NULL. */
const char *lc_broken_text(const lc_run *r);
/* "AddressSanitizer: SEGV": the SUMMARY line of a sanitizer's report that
 * ended the worker (no signal; in the worker's last output) into out, or NULL. */
const char *lc_sanitizer_summary(const lc_run *r, char *out, size_t n);
void lc_config_description(char *out, size_t n, const interp_config *c);   /* "name: description" */
void lc_print_report(FILE *f, const lc_request *q, const lc_run *r, const analysis *a, int exit_status);
void lc_print_error(const lc_request *q, const lc_run *r);   /* a run that ended with an E record */
int lc_write_csv(const char *path, const lc_run *r);
void lc_print_json(const lc_request *q, const lc_run *r, const analysis *a, int exit_status);
struct json_t;
struct json_t *lc_python_json(const lc_request *q, const lc_run *r);
struct json_t *lc_json_str(const char *s);
void lc_json_print(struct json_t *o, size_t flags);   /* to stdout, a newline, then json_decref */

/* --junit (report_junit.c): the test cases are gathered while the modes run
 * and written once at the end. */
enum lc_case_result { LC_CASE_PASS, LC_CASE_FAILURE, LC_CASE_ERROR, LC_CASE_SKIPPED };
/* One test case; type and message say why it did not pass (NULL when it
 * did), text is the report (NULL: none).  The strings are copied. */
void lc_junit_add(const char *classname, const char *name, double seconds, enum lc_case_result result,
                  const char *type, const char *message, const char *text);
/* One check's test case (classname pyfini-leakcheck.CONFIG, named after
 * the subject), its result from the exit status, the text report as text. */
void lc_junit_check(const lc_request *q, const lc_run *r, const analysis *a, int exit_status, double seconds);
void lc_junit_python(const lc_run *r);   /* the CPython, for the suite's properties (first one told) */
/* Write the gathered cases to path (a temporary file renamed into place:
 * a failed write leaves no half file); 0, or -1 with err set. */
int lc_junit_write(const char *path, const char *mode, char *err, size_t errn);
double lc_now(void);   /* CLOCK_MONOTONIC, in seconds */
/* A file an option writes at the end (--junit, --plot): refused up front
 * (usage error) when it is a directory or its directory is not writable. */
void lc_check_output_path(const char *option, const char *path);

/* --plot (report_plot.c): 1 when built with cairo (why: its version), else
 * 0 (why: that the build has no cairo). */
int lc_plot_available(char *why, size_t n);
/* One check's meters per cycle; 0, or -1 with err set (nothing left at path). */
int lc_plot_check(const char *path, const lc_request *q, const lc_run *r, const analysis *a, char *err, size_t errn);
#define LC_PLOT_CONFIGS 2
#define LC_PLOT_SCAN_TOP 20   /* --scan --plot: the modules drawn, worst first */
typedef struct lc_plot_bar {
    const char *module;
    double loss[LC_PLOT_CONFIGS];          /* bytes lost per cycle (0: no LEAK cell) */
    const char *status[LC_PLOT_CONFIGS];   /* the table's cell */
} lc_plot_bar;
typedef struct lc_plot_scan_data {
    const char *title, *subtitle;
    const char *configs[LC_PLOT_CONFIGS];
    int nconfigs;
    const lc_plot_bar *bars;   /* worst first */
    size_t nbars;
} lc_plot_scan_data;
/* --scan: a bar chart of the modules' bytes lost per cycle; 0, or -1 with err set. */
int lc_plot_scan(const char *path, const lc_plot_scan_data *d, char *err, size_t errn);
void lc_print_subject(FILE *f, const lc_request *q);   /* "--import X --code '...'" or "(none: ...)" */

/* --- modes ---------------------------------------------------------------- */
int lc_demo(const lc_request *q);
int lc_scan(const lc_request *q);
long lc_cores(void);   /* the CPUs this process may run on: --jobs' default */

/* --- finding the worker (python.c) --------------------------------------- */
/* --python: path of a worker for that CPython (built into a cache once). */
int lc_worker_for_python(const char *want, char *out, size_t n, char *err, size_t errn);
int lc_default_worker(char *out, size_t n, char *err, size_t errn);
/* --version: the tool's version, then the CPython a run would use (the
 * build's, or --python's) and its worker, without building it; 0, or -1
 * with err set when --python names no usable CPython. */
int lc_print_version(FILE *f, const char *python, char *err, size_t errn);

/* The file outputs (--plot, --junit) are written to PATH.tmpPID and renamed
 * into place (a failed write leaves no half file) - unless PATH is a symbolic
 * link or exists as something other than a regular file (a device, a FIFO,
 * /dev/stdout): then it is written in place, so that it stays what it is.
 * 1: write in place. */
int lc_output_in_place(const char *path);

#endif
