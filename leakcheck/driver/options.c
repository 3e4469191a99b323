/* options.c - the options of pyfini-leakcheck, into one lc_request. */
#define _GNU_SOURCE
#include <errno.h>
#include <ctype.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"

/* Inside lc_parse_args_try(): where a usage error or --help goes back to
 * (1 --help, 2 usage error), and the message; NULL outside it. */
static jmp_buf *parse_return;
static char *parse_err;
static size_t parse_errn;

void lc_usage_error(const char *fmt, ...)
{
    char msg[LC_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (parse_return) {
        lc_scopy(parse_err, parse_errn, msg);
        longjmp(*parse_return, 2);
    }
    fprintf(stderr, "pyfini-leakcheck: %s\n(pyfini-leakcheck --help explains the options)\n", msg);
    exit(2);
}

/* --- --help: one function per part ---------------------------------------- */
static void help_usage_and_configs(void)
{
    char names[128];
    interp_config_list(names, sizeof names, "|");
    printf(
        "usage: pyfini-leakcheck [--config %s]\n"
        "                        [--import MOD]... [--code SRC] [--file F]\n"
        "                        [--cycles N] [--warmup W] [--no-baseline] [--python X.Y]\n"
        "                        [--max-bytes-per-cycle B] [--json] [--csv FILE] [--junit FILE]\n"
        "                        [--plot FILE.svg] [--where] [--judge subject|whole] [--timeout S]\n"
        "                        [--max-rss SIZE] [--early-stop]\n"
        "                        [--no-allocator-wrapper] [--quiet] [--scan [--jobs N]] [--demo]\n"
        "       pyfini-leakcheck --version [--python X.Y] | --help\n"
        "\n"
        "Creates and ends CPython interpreters over and over, runs the subject in each,\n"
        "reads the meters below after every cycle, and judges per meter whether a cycle\n"
        "loses memory: LEAK, no leak or inconclusive.  The cycles run in a worker process:\n"
        "a crash or hang of the subject is reported, not suffered.\n"
        "\n"
        "The interpreter (--config, default legacy):\n", names);
    for (int i = 0; i < INTERP_NCONFIGS; i++) {
        char descr[256];
        lc_config_description(descr, sizeof descr, &interp_configs[i]);
        printf("  %s\n", descr);
    }
    printf("  CPython 3.11 has only legacy interpreters.\n\n");
}

static void help_subject_and_run(void)
{
    char ram[32];
    lc_fmt_bytes(ram, sizeof ram, (double)lc_default_max_rss(), 0);
    printf(
        "The subject, run in each interpreter in this order (none: judge the bare cycle):\n"
        "  --import MOD      import MOD (repeatable)\n"
        "  --code SRC        run SRC as the __main__ module's code\n"
        "  --file F          run the Python file F\n"
        "\n"
        "The run:\n"
        "  --cycles N        judged cycles (default 100; --cycles and --warmup: at most 10^9)\n"
        "  --warmup W        cycles measured first but not judged (default 10)\n"
        "  --early-stop      --cycles is a cap: the run is judged after every %d judged\n"
        "                    cycles (blocks of 1) and ends as soon as its verdict is LEAK or\n"
        "                    no leak, with the same verdict of every exact meter, at two\n"
        "                    such points in a row (at %d cycles at the earliest); the noisy\n"
        "                    meters (rss, malloc) of the shorter run may read inconclusive,\n"
        "                    which never makes \"no leak\" (the pytest plugin's default)\n"
        "  --no-baseline     judge the subject's cycles as they are.  By default every\n"
        "                    subject cycle is paired with a bare cycle of the same config\n"
        "                    and the subject's EXCESS is judged, so that what CPython itself\n"
        "                    loses per cycle (3.12 and 3.13 do) is not blamed on the subject.\n"
        "  --python X.Y      run on another installed CPython (X.Y, X.Y.Z, X.Yd for a debug\n"
        "                    build, or the path of its python3.X-config); its worker is\n"
        "                    compiled once into ~/.cache/pyfini-leakcheck\n"
        "  --timeout S       a cycle that takes longer than S seconds is a hang (default 120)\n"
        "  --max-rss SIZE    the worker's resident set may not grow beyond SIZE bytes (K, M,\n"
        "                    G: 1024, 1024^2, 1024^3; default half the machine's RAM, here\n"
        "                    %s; 0 no limit): above it the worker and every process of its\n"
        "                    group are killed, the verdict is \"memory limit\" (exit 3)\n"
        "  --no-allocator-wrapper  do not wrap Python's allocators: undistorted rss and\n"
        "                    malloc figures, but the py* and blocks meters are off\n"
        "\n", LC_EARLY_STOP_ROUNDS, LC_EARLY_STOP_EARLIEST, ram);
}

static void help_meters_and_verdict(void)
{
    printf("The meters, read after every cycle (a meter that cannot work on a build says so):\n");
    for (size_t i = 0; i < LC_NMETERS; i++) printf("  %-11s %s\n", lc_meters[i].name, lc_meters[i].help);
    printf(
        "  time    wall time of one create + subject + end cycle.\n"
        "\n"
        "The verdict, per meter, over the judged cycles: the least-squares slope of the\n"
        "meter (per cycle) with a 99%% confidence bound (the widest of the regression's,\n"
        "the spread between up to %d chunks of the run and, with a baseline, the spread of\n"
        "the block pairs: judged cycles run as k subject cycles, then k bare ones, k =\n"
        "cycles/%d up to %d).  LEAK: the whole bound lies above the\n"
        "allowed loss and the meter grew in every chunk (as in regrtest -R, one early jump\n"
        "is not a leak).  no leak: the bound lies below the allowed loss plus the meter's\n"
        "resolution per chunk, or the second half of the run alone shows no growth.\n"
        "Otherwise inconclusive (typical of RSS: page-sized steps, a wide bound).\n"
        "Exact meters (heap*, py*, blocks, refs, fds count every unit) follow the exact\n"
        "rule: every chunk must grow by more than the allowed loss PER CYCLE (with a\n"
        "baseline: the excess over the bare cycles); a steady loss has bound 0, so it is\n"
        "LEAK or no leak - inconclusive only when the program itself is noisy.\n"
        "  --max-bytes-per-cycle B  allowed loss per cycle for bytes meters (default 0)\n"
        "\n", LC_CHUNKS_MAX, LC_BLOCK_DIVISOR, LC_BLOCK_MAX);
}

static void help_output(void)
{
    printf(
        "Output:\n"
        "  --json            one JSON document on stdout instead of the report\n"
        "  --csv FILE        one row per cycle: readings and increases of every meter\n"
        "  --junit FILE      a JUnit XML report for CI: one test case per config and subject\n"
        "                    (--scan: per module and config; --demo: per line).  LEAK is a\n"
        "                    failure; a crash, hang or failed subject an error; not judged\n"
        "                    is skipped, never passed; the report is the test case's text\n"
        "  --plot FILE.svg   a picture of the run (SVG, drawn with cairo): one panel per judged\n"
        "                    meter, its growth per round over the subject's and over the bare\n"
        "                    cycles, warm-up shaded, the least-squares lines, the slope's 99%%\n"
        "                    bound as a wedge, a red LEAK badge.  --scan: a bar chart of the\n"
        "                    %d modules that lost the most bytes per cycle, one bar per config\n"
        "  --quiet           no progress line.  Without it, on a terminal only, one line on\n"
        "                    stderr is redrawn in place: cycle i/N = 2 x (W warm-up + C) (the\n"
        "                    rounds of --warmup and --cycles, 2 cycles each when subject and\n"
        "                    bare cycles pair), cycles/s, ETA, the readings of the bytes meters\n"
        "  --where           who allocated what is still held after the judged cycles:\n"
        "                    call stacks (libunwind, symbolised with elfutils libdw) of the\n"
        "                    blocks allocated through Python's allocators and of plain C-heap\n"
        "                    blocks (malloc & co, C++ new), grouped by site, excess bytes per\n"
        "                    cycle, top %d per domain; and for own-obmalloc configs the\n"
        "                    obmalloc blocks still in use at each interpreter's end (why its\n"
        "                    arenas are abandoned).  Slower: every allocation is unwound.\n"
        "                    With each site, its Python lines from a few more cycles: for\n"
        "                    Python's allocators the traceback tracemalloc recorded for one\n"
        "                    of its live blocks (CPython 3.12 and 3.13), for the C heap the\n"
        "                    line that called into C code (every CPython); neither is counted.\n"
        "  --scan            every extension module of the Python (lib-dynload, site-packages,\n"
        "                    or only the --import modules given): does it import in a legacy\n"
        "                    and an isolated interpreter, refuse, crash, hang, lose memory?\n"
        "                    One table, worst first (--json: one document).  Few cycles per\n"
        "                    module (default 2 + 8), one worker process each, timeout 30 s.\n"
        "                    --config C: that config's column only; --no-baseline and\n"
        "                    --max-bytes-per-cycle apply to every row.  Exit status: 3 a\n"
        "                    module crashed or hung, 2 one failed (not found, raised), 1\n"
        "                    one leaks, 4 one was not judged, else 0.\n"
        "  --jobs N          --scan: N modules at a time, each in its own worker process\n"
        "                    (default: the cores this process may run on, here %ld).  The table\n"
        "                    is the one a serial run (--jobs 1) prints: same rows, same order\n"
        "  --demo            bare legacy vs bare isolated interpreters, then --import json\n"
        "\n"
        "The run's verdict: LEAK if a bytes meter (rss, malloc, heap*, py*) judged LEAK, or a\n"
        "count meter (fds; blocks, heap.blocks, refs when --max-bytes-per-cycle is 0), or\n"
        "pyfini reported a leak on the subject's stderr.  An exact meter's LEAK needs every\n"
        "block pair to grow and its own level to grow in every chunk, or (bytes) a count of\n"
        "blocks growing with it: else inconclusive (no LEAK from noise).  \"no leak\" only if\n"
        "every meter that sees the subject's allocations judged \"no leak\": py, heap.plain,\n"
        "blocks, heap.blocks, refs, fds (rss where py is off, malloc where heap is off) - a\n"
        "zero part (py.raw) never stands for its inconclusive whole (py); otherwise \"not\n"
        "judged\": never read as a pass.\n"
        "\n"
        "Whose loss: a run with a LEAK splits the excess per cycle of py*, blocks,\n"
        "heap.plain and heap.blocks by where each still-held block was allocated: CPython's\n"
        "share (every C frame in libpython, the standard library's extension modules or\n"
        "libc & co, and the innermost Python frame in the standard library or the import\n"
        "machinery), the subject's (a C frame in any other object, or a Python line of\n"
        "its own) and the rest, unattributed (counted as the subject's).  It uses\n"
        "--where's data, or (without --where) a short second run with --where after the\n"
        "first (%d rounds; only when a LEAK was found).\n"
        "  --judge WHAT      what the exit status judges: 'whole' (default) the whole excess\n"
        "                    over the bare cycle; 'subject' the subject's share: the run\n"
        "                    judged again without CPython's share.  Not the default: an\n"
        "                    object the standard library allocated and the subject keeps\n"
        "                    reads as CPython's (a false \"no leak\"; leakcheck/README.md).\n"
        "                    A LEAK whose split could not be made stays LEAK (the report\n"
        "                    says why)\n"
        "\n"
        "Exit status:\n"
        "  0  no leak\n"
        "  1  LEAK: a bytes meter judged LEAK above --max-bytes-per-cycle, a count meter\n"
        "     LEAK (see above), or pyfini's leak report on the subject's stderr\n"
        "  2  usage error (e.g. --cycles below %ld), or the subject failed (raised,\n"
        "     missing module, syntax error, a config the Python does not have)\n"
        "  3  the subject crashed or hung; went above --max-rss (\"memory limit\"); ended\n"
        "     the process itself (os._exit); closed or replaced the tool's record pipe\n"
        "     (fd 3) or the worker's stderr (fd 2); or a process it forked did not exit\n"
        "     0: the report says which, in which cycle\n"
        "  4  not judged: the run finished, nothing leaked, but a meter that sees the\n"
        "     subject's allocations was inconclusive\n"
        "  5  interrupted (SIGINT, SIGTERM, SIGHUP): the report of the finished cycles, marked\n"
        "     INTERRUPTED, not a verdict; the worker is killed\n"
        "\n"
        "  --version         the version, then the CPython a run would use (the build's,\n"
        "                    or that of --python X.Y) and its worker\n"
        "  --help            this text\n", LC_PLOT_SCAN_TOP, LC_SITES_PER_DOMAIN, lc_cores(), LC_WHOSE_PASS_CYCLES,
        lc_schedule_min_cycles(1, 1));
}

static void help(void)
{
    help_usage_and_configs();
    help_subject_and_run();
    help_meters_and_verdict();
    help_output();
}

/* --- parsing ---------------------------------------------------------------- */
static double parse_num(const char *name, const char *s, double min)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < min)
        lc_usage_error("%s needs a number >= %g, not '%s'", name, min, s);
    return v;
}

/* --max-rss: bytes, or a whole number with K, M or G (1024-based) */
static long long parse_size(const char *name, const char *s)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    long long mult = 1;
    if (end != s && *end && !end[1]) {
        switch (*end) {
        case 'K': case 'k': mult = 1LL << 10, end++; break;
        case 'M': case 'm': mult = 1LL << 20, end++; break;
        case 'G': case 'g': mult = 1LL << 30, end++; break;
        }
    }
    if (errno || end == s || *end || v < 0 || !isdigit((unsigned char)s[0]) || v > LLONG_MAX / mult)
        lc_usage_error("%s needs a size in bytes (a whole number >= 0, optionally with K, M or G), not '%s'", name, s);
    return v * mult;
}

long long lc_default_max_rss(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (long long)pages * page / 2 : 0;
}

static long parse_int(const char *name, const char *s, long min)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min) lc_usage_error("%s needs an integer >= %ld, not '%s'", name, min, s);
    return v;
}

enum { O_CONFIG = 1000, O_IMPORT, O_CODE, O_FILE, O_CYCLES, O_WARMUP, O_PYTHON, O_MAXB, O_JSON, O_CSV,
       O_WHERE, O_SCAN, O_NOBASE, O_TIMEOUT, O_DEMO, O_HELP, O_VERSION, O_NOWRAP, O_JUNIT, O_QUIET, O_JUDGE,
       O_PLOT, O_JOBS, O_MAXRSS, O_EARLY, O_LAST = O_EARLY };

static void set_config(lc_request *q, const char *name)
{
    char names[128];
    interp_config_list(names, sizeof names, ", ");
    if (!(q->config = interp_config_find(name))) lc_usage_error("unknown --config '%s' (%s)", name, names);
}

static void set_once(const char **field, const char *opt_name, const char *val)
{
    if (*field) lc_usage_error("%s given twice", opt_name);
    *field = val;
}

/* The options with a value. */
static void apply_value(lc_request *q, int c, const char *val)
{
    switch (c) {
    case O_CONFIG: set_config(q, val), q->config_set = 1; break;
    case O_IMPORT:
        if (q->nimports == LC_MAX_IMPORTS) lc_usage_error("at most %d --import options", LC_MAX_IMPORTS);
        if (!*val) lc_usage_error("--import needs a module name");
        q->imports[q->nimports++] = val;
        break;
    case O_CODE: set_once(&q->code, "--code", val); break;
    case O_FILE: set_once(&q->file, "--file", val); break;
    case O_CYCLES: q->cycles = parse_int("--cycles", val, 1), q->cycles_set = 1; break;
    case O_WARMUP: q->warmup = parse_int("--warmup", val, 0), q->warmup_set = 1; break;
    case O_PYTHON: q->python = val; break;
    case O_JUDGE:
        if (!strcmp(val, "whole")) q->judge_whole = 1;
        else if (!strcmp(val, "subject")) q->judge_whole = 0;
        else lc_usage_error("--judge needs 'subject' or 'whole', not '%s'", val);
        break;
    case O_MAXB: q->max_bytes = parse_num("--max-bytes-per-cycle", val, 0); break;
    case O_CSV: q->csv = val; break;
    case O_JUNIT:
        set_once(&q->junit, "--junit", val);
        if (!*val) lc_usage_error("--junit needs a file name");
        break;
    case O_PLOT:
        set_once(&q->plot, "--plot", val);
        if (!*val) lc_usage_error("--plot needs a file name");
        break;
    case O_JOBS: q->jobs = parse_int("--jobs", val, 1); break;
    case O_MAXRSS: q->max_rss = parse_size("--max-rss", val); break;
    case O_TIMEOUT: q->timeout = parse_num("--timeout", val, 0.1), q->timeout_set = 1; break;
    }
}

/* One option (getopt_long's return c); flags set fields, --help exits. */
static void apply_option(lc_request *q, int c, char **argv)
{
    switch (c) {
    case O_JSON: q->json = 1; break;
    case O_WHERE: q->where = 1; break;
    case O_SCAN: q->scan = 1; break;
    case O_NOBASE: q->baseline = 0; break;
    case O_DEMO: q->demo = 1; break;
    case O_NOWRAP: q->no_wrapper = 1; break;
    case O_QUIET: q->quiet = 1; break;
    case O_EARLY: q->early_stop = 1; break;
    case 'h':
    case O_HELP:
        help();
        if (parse_return) longjmp(*parse_return, 1);
        exit(0);
    case O_VERSION: q->version = 1; break;
    case ':': lc_usage_error("option '%s' needs a value", argv[optind - 1]);
    default:
        if (c >= O_CONFIG && c <= O_LAST) {
            apply_value(q, c, optarg);
            break;
        }
        if (optopt >= O_CONFIG) {
            /* getopt_long's '?' for an option it knows: "--json=x" (a value
             * to an option that takes none) or a value left out */
            const char *arg = argv[optind - 1], *eq = strchr(arg, '=');
            if (eq) lc_usage_error("option '%.*s' takes no value (given '%s')", (int)(eq - arg), arg, eq + 1);
            lc_usage_error("option '%s' needs a value", arg);
        }
        lc_usage_error("unknown option '%s'", argv[optind - 1]);
    }
}

/* Options that do not go together, and a --file that cannot be read. */
static void check_request(const lc_request *q)
{
    long min = lc_schedule_min_cycles(lc_has_subject(q) || q->scan || q->demo, q->baseline);
    if (q->cycles > LC_CYCLES_MAX || q->warmup > LC_CYCLES_MAX)
        lc_usage_error("--cycles and --warmup are at most %ld, not %ld", LC_CYCLES_MAX,
                       q->cycles > q->warmup ? q->cycles : q->warmup);
    if (q->cycles_set && q->cycles < min)
        lc_usage_error("--cycles %ld is too few to judge: a verdict needs at least %ld judged cycles "
                       "(%d samples per meter)", q->cycles, min, LC_MIN_SAMPLES);
    if (q->file && access(q->file, R_OK) != 0) lc_usage_error("--file %s: %s", q->file, strerror(errno));
    if (q->where && q->no_wrapper) lc_usage_error("--where needs the allocator wrapper: drop --no-allocator-wrapper");
    if (q->scan && (q->code || q->file)) lc_usage_error("--scan imports modules: --code and --file do not apply");
    if (q->scan && q->where)
        lc_usage_error("--scan runs few cycles per module and no --where: run --import MOD --where for one row");
    if (q->scan && q->csv) lc_usage_error("--scan writes no --csv: run --import MOD --csv FILE for one row");
    if (q->early_stop && q->demo) lc_usage_error("--demo runs its own schedule: no --early-stop");
    if (q->early_stop && q->scan && (!q->cycles_set || q->cycles <= LC_EARLY_STOP_EARLIEST))
        lc_usage_error("--scan --early-stop: %s judged cycles never stop early (the earliest stop is after %d "
                       "rounds): give --cycles above %d", q->cycles_set ? "these" : "the scan's default",
                       LC_EARLY_STOP_EARLIEST, LC_EARLY_STOP_EARLIEST);
    if (q->jobs && !q->scan) lc_usage_error("--jobs %ld: only --scan runs workers in parallel", q->jobs);
    if (q->plot && q->demo) lc_usage_error("--demo draws no --plot: run one check or --scan with --plot");
    char why[256];
    if (q->plot && !lc_plot_available(why, sizeof why)) lc_usage_error("--plot %s: %s", q->plot, why);
    if (q->demo && (q->scan || q->nimports || q->code || q->file))
        lc_usage_error("--demo runs its own subjects: no --scan, --import, --code or --file");
}

int lc_parse_args_try(lc_request *q, int argc, char **argv, char *err, size_t errn)
{
    static const struct option longopts[] = {
        {"config", required_argument, 0, O_CONFIG},   {"import", required_argument, 0, O_IMPORT},
        {"code", required_argument, 0, O_CODE},       {"file", required_argument, 0, O_FILE},
        {"cycles", required_argument, 0, O_CYCLES},   {"warmup", required_argument, 0, O_WARMUP},
        {"python", required_argument, 0, O_PYTHON},   {"max-bytes-per-cycle", required_argument, 0, O_MAXB},
        {"json", no_argument, 0, O_JSON},             {"csv", required_argument, 0, O_CSV},
        {"where", no_argument, 0, O_WHERE},           {"scan", no_argument, 0, O_SCAN},
        {"no-baseline", no_argument, 0, O_NOBASE},    {"timeout", required_argument, 0, O_TIMEOUT},
        {"demo", no_argument, 0, O_DEMO},             {"help", no_argument, 0, O_HELP},
        {"version", no_argument, 0, O_VERSION},       {"no-allocator-wrapper", no_argument, 0, O_NOWRAP},
        {"junit", required_argument, 0, O_JUNIT},      {"quiet", no_argument, 0, O_QUIET},
        {"judge", required_argument, 0, O_JUDGE},
        {"plot", required_argument, 0, O_PLOT},       {"jobs", required_argument, 0, O_JOBS},
        {"max-rss", required_argument, 0, O_MAXRSS},  {"early-stop", no_argument, 0, O_EARLY},
        {0, 0, 0, 0}};
    memset(q, 0, sizeof *q);
    q->config = &interp_configs[INTERP_LEGACY];
    q->cycles = 100;
    q->warmup = 10;
    q->timeout = 120;
    q->max_rss = lc_default_max_rss();
    q->baseline = 1;
    /* the whole excess by default: the split (whose.c) blames CPython for an object the
       standard library allocated and the subject keeps (os.path.join's string: a
       review found "no leak", exit 0, under --judge subject) */
    q->judge_whole = 1;
    err[0] = 0;
    jmp_buf back;
    int rc = setjmp(back);
    if (rc) {
        parse_return = NULL;
        return rc;
    }
    parse_return = &back, parse_err = err, parse_errn = errn;
    opterr = 0;
    optind = 0;   /* glibc: 0 starts getopt afresh (a second parse in one process) */
    for (int c; (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1;) apply_option(q, c, argv);
    if (optind < argc) lc_usage_error("unexpected argument '%s' (a module is given with --import)", argv[optind]);
    if (!q->version) check_request(q);   /* --version runs nothing: only --python matters */
    parse_return = NULL;
    return 0;
}

void lc_parse_args(lc_request *q, int argc, char **argv)
{
    char err[LC_MESSAGE_MAX];
    int rc = lc_parse_args_try(q, argc, argv, err, sizeof err);
    if (rc == 1) exit(0);
    if (rc == 2) lc_usage_error("%s", err);
}
