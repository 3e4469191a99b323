/* driver.c - pyfini-leakcheck: how much does one create-and-end cycle of a
 * CPython interpreter lose, is it a leak, and who allocated it?
 *
 * This process never embeds Python: it starts a worker (worker.c, linked to
 * one CPython) that runs the cycles and reports a reading of every meter
 * after each one, so that a crash or a hang of the subject is a finding
 * reported here, with the figures gathered until then.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lc_driver.h"

/* A JSON string of text that may not be UTF-8 (file names, a crashed
 * worker's output): jansson refuses invalid UTF-8, so such bytes become '?'. */
static json_t *lc_json_str(const char *s)
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

/* --- meters -------------------------------------------------------------- */
const lc_meter_def lc_meters[] = {
    {"rss", LC_V_RSS, 1, 4096,
     "resident set size of the worker process (/proc/self/statm), bytes. What the\n"
     "      system sees; includes abandoned obmalloc arenas. Noisy, one-page resolution."},
    {"malloc", LC_V_MALLOC, 1, 16,
     "bytes in use in the C library's malloc (glibc mallinfo2: uordblks + hblkhd),\n"
     "      chunk sizes with malloc's own headers. Sees plain malloc() of C extensions."},
    {"py", LC_V_PY, 1, 1,
     "bytes held through Python's allocators (the four rows below): exact requested\n"
     "      sizes, counted by a PyMem_SetAllocator wrapper installed before Py_Initialize."},
    {"py.raw", LC_V_PY_RAW, 1, 1,
     "the same for PYMEM_DOMAIN_RAW (PyMem_RawMalloc: interpreter and thread states,\n"
     "      an isolated interpreter's obmalloc state, buffers of C extensions)."},
    {"py.mem", LC_V_PY_MEM, 1, 1, "the same for PYMEM_DOMAIN_MEM (PyMem_Malloc)."},
    {"py.obj", LC_V_PY_OBJ, 1, 1, "the same for PYMEM_DOMAIN_OBJ (PyObject_Malloc: Python objects)."},
    {"py.obm", LC_V_PY_OBMALLOC, 1, 1,
     "obmalloc's own bookkeeping: RAW blocks pymalloc allocates for itself (arena\n"
     "      table, radix-tree arena map). Lost with an abandoned own-obmalloc state."},
    {"blocks", LC_V_BLOCKS, 0, 1,
     "blocks allocated through Python's allocators and not freed yet (all domains)."},
    {"refs", LC_V_REFS, 0, 1,
     "total reference count, sys.gettotalrefcount(): debug builds (Py_REF_DEBUG) only."},
    {"fds", LC_V_FDS, 0, 1, "open file descriptors of the worker (/proc/self/fd)."},
};
const size_t lc_nmeters = sizeof lc_meters / sizeof *lc_meters;

static const char *const config_names[] = {"legacy", "isolated", "own-obmalloc", "shared-obmalloc", NULL};
static const char *const config_descr[] = {
    "legacy: Py_NewInterpreter(), shared GIL, main obmalloc",
    "isolated: own GIL, own obmalloc, multi-phase extensions only (Py_NewInterpreterFromConfig)",
    "own-obmalloc: shared GIL, own obmalloc, multi-phase extensions only (Py_NewInterpreterFromConfig)",
    "shared-obmalloc: shared GIL, main obmalloc, multi-phase extensions only (Py_NewInterpreterFromConfig)",
};

void lc_fmt_bytes(char *out, size_t n, double b, int sign)
{
    const char *s = sign ? (b > 0 ? "+" : (b < 0 ? "-" : "")) : (b < 0 ? "-" : "");
    double a = fabs(b);
    if (!isfinite(b)) snprintf(out, n, "?");
    else if (a < 9.95 && a != floor(a)) snprintf(out, n, "%s%.1f B", s, a);
    else if (a < 999.5) snprintf(out, n, "%s%.0f B", s, a);
    else if (a < 999.5e3) snprintf(out, n, "%s%.1f kB", s, a / 1e3);
    else if (a < 999.5e6) snprintf(out, n, "%s%.2f MB", s, a / 1e6);
    else snprintf(out, n, "%s%.2f GB", s, a / 1e9);
}

static void fmt_value(char *out, size_t n, const lc_meter_def *m, double v, int sign)
{
    if (m->value == LC_V_RSS || m->value == LC_V_MALLOC || m->value == LC_V_PY || m->value == LC_V_PY_RAW
        || m->value == LC_V_PY_MEM || m->value == LC_V_PY_OBJ || m->value == LC_V_PY_OBMALLOC) {
        lc_fmt_bytes(out, n, v, sign);
        return;
    }
    if (!isfinite(v)) snprintf(out, n, "?");
    else if (fabs(v) < 9.95 && v != floor(v)) snprintf(out, n, sign ? "%+.1f" : "%.1f", v);
    else snprintf(out, n, sign ? "%+.0f" : "%.0f", v);
}

/* --- options ------------------------------------------------------------- */
#define MAX_IMPORTS 64
static struct {
    const char *config;
    const char *imports[MAX_IMPORTS];
    int nimports;
    const char *code, *file, *python, *csv;
    long cycles, warmup;
    int cycles_set, warmup_set;
    double max_bytes, timeout;
    int timeout_set;
    int json, where, scan, baseline, demo, no_wrapper;
} opt = {.config = "legacy", .cycles = 100, .warmup = 10, .timeout = 120, .baseline = 1};

static char worker_path[4096];

static void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "pyfini-leakcheck: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(pyfini-leakcheck --help explains the options)\n");
    va_end(ap);
    exit(2);
}

static void help(void)
{
    printf(
        "usage: pyfini-leakcheck [--config legacy|isolated|own-obmalloc|shared-obmalloc]\n"
        "                        [--import MOD]... [--code SRC] [--file F]\n"
        "                        [--cycles N] [--warmup W] [--no-baseline] [--python X.Y]\n"
        "                        [--max-bytes-per-cycle B] [--json] [--csv FILE] [--where]\n"
        "                        [--timeout S] [--scan] [--demo]\n"
        "\n"
        "Creates and ends CPython interpreters over and over, runs the subject in each,\n"
        "reads the meters below after every cycle, and judges per meter whether a cycle\n"
        "loses memory: LEAK, no leak or inconclusive.  The cycles run in a worker process:\n"
        "a crash or hang of the subject is reported, not suffered.\n"
        "\n"
        "The interpreter (--config, default legacy):\n");
    for (int i = 0; config_names[i]; i++) printf("  %s\n", config_descr[i]);
    printf(
        "  CPython 3.11 has only legacy interpreters.\n"
        "\n"
        "The subject, run in each interpreter in this order (none: judge the bare cycle):\n"
        "  --import MOD      import MOD (repeatable)\n"
        "  --code SRC        run SRC as the __main__ module's code\n"
        "  --file F          run the Python file F\n"
        "\n"
        "The run:\n"
        "  --cycles N        judged cycles (default 100)\n"
        "  --warmup W        cycles measured first but not judged (default 10)\n"
        "  --no-baseline     judge the subject's cycles as they are.  By default every\n"
        "                    subject cycle is paired with a bare cycle of the same config\n"
        "                    and the subject's EXCESS is judged, so that what CPython itself\n"
        "                    loses per cycle (3.12 and 3.13 do) is not blamed on the subject.\n"
        "  --python X.Y      run on another installed CPython (X.Y, X.Y.Z, X.Yd for a debug\n"
        "                    build, or the path of its python3.X-config); its worker is\n"
        "                    compiled once into ~/.cache/pyfini-leakcheck\n"
        "  --timeout S       a cycle that takes longer than S seconds is a hang (default 120)\n"
        "\n"
        "The meters, read after every cycle (a meter that cannot work on a build says so):\n");
    for (size_t i = 0; i < lc_nmeters; i++) printf("  %-7s %s\n", lc_meters[i].name, lc_meters[i].help);
    printf(
        "  time    wall time of one create + subject + end cycle.\n"
        "\n"
        "The verdict, per meter, over the judged cycles: the least-squares slope of the\n"
        "meter (per cycle) with a 99%% confidence bound (the widest of the regression's,\n"
        "the spread between up to 5 chunks of the run and, with a baseline, the spread of\n"
        "the block pairs: judged cycles run as k subject cycles, then k bare ones, k =\n"
        "cycles/10 up to 10).  LEAK: the whole bound lies above the\n"
        "allowed loss and the meter grew in every chunk (as in regrtest -R, one early jump\n"
        "is not a leak).  no leak: the bound lies below the allowed loss plus the meter's\n"
        "resolution per chunk, or the second half of the run alone shows no growth.\n"
        "Otherwise inconclusive (typical of RSS: page-sized steps, a wide bound).\n"
        "  --max-bytes-per-cycle B  allowed loss per cycle for bytes meters (default 0)\n"
        "\n"
        "Output:\n"
        "  --json            one JSON document on stdout instead of the report\n"
        "  --csv FILE        one row per cycle: readings and increases of every meter\n"
        "  --where           who allocated what is still held after the judged cycles:\n"
        "                    call stacks (libunwind, symbolised with elfutils libdw) of the\n"
        "                    blocks allocated through Python's allocators, grouped by site,\n"
        "                    excess bytes per cycle, top 10 per domain; and for own-obmalloc\n"
        "                    configs the obmalloc blocks still in use at each interpreter's end\n"
        "                    (why its arenas are abandoned).  Slower: every allocation is unwound.\n"
        "                    With each site, the Python traceback tracemalloc recorded for\n"
        "                    one of its live blocks (CPython 3.12+; tracemalloc's own tables\n"
        "                    are not counted, so the figures stay those of an untraced run).\n"
        "  --scan            every extension module of the Python (lib-dynload, site-packages,\n"
        "                    or only the --import modules given): does it import in a legacy\n"
        "                    and an isolated interpreter, refuse, crash, hang, lose memory?\n"
        "                    One table, worst first (--json: one document).  Few cycles per\n"
        "                    module (default 2 + 8), one worker process each, timeout 30 s.\n"
        "  --demo            bare legacy vs bare isolated interpreters, then --import json\n"
        "\n"
        "Exit status: 0 no leak, 1 a bytes meter (rss, malloc, py*) judged LEAK above\n"
        "--max-bytes-per-cycle, 2 usage error or the subject failed, 3 the subject crashed\n"
        "or hung.  A progress line is shown on a terminal only.\n");
}

static double parse_num(const char *name, const char *s, double min)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < min) usage_error("%s needs a number >= %g, not '%s'", name, min, s);
    return v;
}

static long parse_int(const char *name, const char *s, long min)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min) usage_error("%s needs an integer >= %ld, not '%s'", name, min, s);
    return v;
}

static void parse_args(int argc, char **argv)
{
    enum { O_CONFIG = 1000, O_IMPORT, O_CODE, O_FILE, O_CYCLES, O_WARMUP, O_PYTHON, O_MAXB, O_JSON, O_CSV,
           O_WHERE, O_SCAN, O_NOBASE, O_TIMEOUT, O_DEMO, O_HELP, O_VERSION, O_NOWRAP };
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
        {0, 0, 0, 0}};
    opterr = 0;
    for (;;) {
        int idx = 0;
        int c = getopt_long(argc, argv, "h", longopts, &idx);
        if (c == -1) break;
        switch (c) {
        case O_CONFIG: {
            int ok = 0;
            for (int i = 0; config_names[i]; i++) ok |= !strcmp(optarg, config_names[i]);
            if (!ok) usage_error("unknown --config '%s' (legacy, isolated, own-obmalloc, shared-obmalloc)", optarg);
            opt.config = optarg;
            break;
        }
        case O_IMPORT:
            if (opt.nimports == MAX_IMPORTS) usage_error("at most %d --import options", MAX_IMPORTS);
            if (!*optarg) usage_error("--import needs a module name");
            opt.imports[opt.nimports++] = optarg;
            break;
        case O_CODE:
            if (opt.code) usage_error("--code given twice");
            opt.code = optarg;
            break;
        case O_FILE:
            if (opt.file) usage_error("--file given twice");
            opt.file = optarg;
            break;
        case O_CYCLES: opt.cycles = parse_int("--cycles", optarg, 1); opt.cycles_set = 1; break;
        case O_WARMUP: opt.warmup = parse_int("--warmup", optarg, 0); opt.warmup_set = 1; break;
        case O_PYTHON: opt.python = optarg; break;
        case O_MAXB: opt.max_bytes = parse_num("--max-bytes-per-cycle", optarg, 0); break;
        case O_JSON: opt.json = 1; break;
        case O_CSV: opt.csv = optarg; break;
        case O_WHERE: opt.where = 1; break;
        case O_SCAN: opt.scan = 1; break;
        case O_NOBASE: opt.baseline = 0; break;
        case O_TIMEOUT: opt.timeout = parse_num("--timeout", optarg, 0.1); opt.timeout_set = 1; break;
        case O_DEMO: opt.demo = 1; break;
        case O_NOWRAP: opt.no_wrapper = 1; break;
        case 'h':
        case O_HELP: help(); exit(0);
        case O_VERSION: printf("pyfini-leakcheck %s\n", LC_VERSION); exit(0);
        case ':': usage_error("option '%s' needs a value", argv[optind - 1]);
        default:
            if (optopt >= O_CONFIG) usage_error("option '%s' needs a value", argv[optind - 1]);
            usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) usage_error("unexpected argument '%s' (a module is given with --import)", argv[optind]);
    if (opt.file && access(opt.file, R_OK) != 0) usage_error("--file %s: %s", opt.file, strerror(errno));
    if (opt.where && opt.no_wrapper) usage_error("--where needs the allocator wrapper: drop --no-allocator-wrapper");
    if (opt.scan && (opt.code || opt.file)) usage_error("--scan imports modules: --code and --file do not apply");
    if (opt.demo && (opt.scan || opt.nimports || opt.code || opt.file))
        usage_error("--demo runs its own subjects: no --scan, --import, --code or --file");
}

/* --- analysis ------------------------------------------------------------ */
typedef struct meter_result {
    const lc_meter_def *def;
    int available;
    const char *how;
    lc_judgement subject, bare, excess;
    int have_subject, have_bare, have_excess;
    const lc_judgement *judged;   /* what the verdict is about */
    enum lc_verdict verdict;
} meter_result;

typedef struct analysis {
    meter_result m[16];
    size_t nm;
    double time_subject_ms, time_bare_ms;
    long n_subject, n_bare, rounds_judged;
    int leak;                      /* a bytes meter judged LEAK */
    int inconclusive;
    int64_t obm_min, obm_max;
    double obm_mean;
    long obm_n;
} analysis;

static int has_subject(void) { return opt.nimports || opt.code || opt.file; }

static void analyse(const lc_run *r, analysis *a, double max_bytes)
{
    memset(a, 0, sizeof *a);
    size_t n = r->ncyc;
    double *xs = calloc(n + 1, sizeof *xs), *xb = calloc(n + 1, sizeof *xb), *xe = calloc(n + 1, sizeof *xe);
    double ts = 0, tb = 0;
    long ns = 0, nb = 0;
    a->obm_min = INT64_MAX;
    a->obm_max = -1;
    for (size_t i = 0; i < n; i++) {
        const lc_cycle *c = &r->cyc[i];
        if (!c->judged) continue;
        if (c->kind == 'S') ts += (double)c->v[LC_V_TIME_NS], ns++;
        else tb += (double)c->v[LC_V_TIME_NS], nb++;
        if (c->obm >= 0) {
            if (c->obm < a->obm_min) a->obm_min = c->obm;
            if (c->obm > a->obm_max) a->obm_max = c->obm;
            a->obm_mean += (double)c->obm;
            a->obm_n++;
        }
    }
    if (a->obm_n) a->obm_mean /= (double)a->obm_n;
    a->time_subject_ms = ns ? ts / (double)ns / 1e6 : NAN;
    a->time_bare_ms = nb ? tb / (double)nb / 1e6 : NAN;
    a->n_subject = ns;
    a->n_bare = nb;
    int paired = ns && nb;
    for (size_t mi = 0; mi < lc_nmeters; mi++) {
        meter_result *m = &a->m[a->nm++];
        m->def = &lc_meters[mi];
        int v = m->def->value;
        m->available = r->avail[v].known ? r->avail[v].available : 1;
        m->how = r->avail[v].how;
        if (!m->available || !r->have_initial || r->initial[v] < 0) {
            m->available = 0;
            continue;
        }
        size_t cs = 0, cb = 0, ce = 0;
        double thr = m->def->bytes ? max_bytes : 0, k = 1;
        if (paired) {
            /* judged cycles come as blocks: k subject cycles, then k bare ones */
            size_t i = 0;
            while (i < n) {
                if (!r->cyc[i].judged || r->cyc[i].kind != 'S') {
                    i++;
                    continue;
                }
                size_t s0 = i;
                while (i < n && r->cyc[i].judged && r->cyc[i].kind == 'S') i++;
                size_t b0 = i;
                while (i < n && r->cyc[i].judged && r->cyc[i].kind == 'B') i++;
                if (i - b0 != b0 - s0) break;   /* an unfinished block (crash) */
                k = (double)(b0 - s0);
                double gs = (double)(r->cyc[b0 - 1].v[v] - (s0 ? r->cyc[s0 - 1].v[v] : r->initial[v]));
                double gb = (double)(r->cyc[i - 1].v[v] - r->cyc[b0 - 1].v[v]);
                xs[cs++] = gs / k;
                xb[cb++] = gb / k;
                xe[ce++] = (gs - gb) / k;
            }
            if (cs) lc_judge(xs, cs, k, m->def->resolution, thr, 1, &m->subject), m->have_subject = 1;
            if (cb) lc_judge(xb, cb, k, m->def->resolution, thr, 1, &m->bare), m->have_bare = 1;
            if (ce) lc_judge(xe, ce, k, m->def->resolution, thr, 1, &m->excess), m->have_excess = 1;
        } else {
            for (size_t i = 0; i < n; i++) {
                const lc_cycle *c = &r->cyc[i];
                int64_t prev = i ? r->cyc[i - 1].v[v] : r->initial[v];
                if (!c->judged) continue;
                if (c->kind == 'S') xs[cs++] = (double)(c->v[v] - prev);
                else xb[cb++] = (double)(c->v[v] - prev);
            }
            if (cs) lc_judge(xs, cs, 1, m->def->resolution, thr, 0, &m->subject), m->have_subject = 1;
            if (cb) lc_judge(xb, cb, 1, m->def->resolution, thr, 0, &m->bare), m->have_bare = 1;
        }
        m->judged = m->have_excess ? &m->excess : (m->have_subject ? &m->subject : (m->have_bare ? &m->bare : NULL));
        if (!m->judged) {
            m->verdict = LC_TOO_FEW;
            continue;
        }
        m->verdict = m->judged->verdict;
        if (m->verdict == LC_LEAK && m->def->bytes) a->leak = 1;
        if (m->verdict == LC_INCONCLUSIVE) a->inconclusive = 1;
    }
    a->rounds_judged = ns > nb ? ns : nb;
    free(xs);
    free(xb);
    free(xe);
}

/* --- reports ------------------------------------------------------------- */
static const char *signal_name(int sig)
{
    const char *d = sigdescr_np(sig);
    return d ? d : "unknown signal";
}

static void print_subject(FILE *f)
{
    if (!has_subject()) {
        fprintf(f, "(none: the bare cycle itself is judged)");
        return;
    }
    const char *sep = "";
    for (int i = 0; i < opt.nimports; i++) fprintf(f, "%s--import %s", sep, opt.imports[i]), sep = " ";
    if (opt.code) fprintf(f, "%s--code '%s'", sep, opt.code), sep = " ";
    if (opt.file) fprintf(f, "%s--file %s", sep, opt.file);
}

static const char *config_description(const char *name)
{
    for (int i = 0; config_names[i]; i++)
        if (!strcmp(name, config_names[i])) return config_descr[i];
    return name;
}

static void print_meter_table(FILE *f, const analysis *a, int paired)
{
    if (paired)
        fprintf(f, "%-8s %14s %14s   %-28s %s\n", "meter", "subject/cycle", "bare/cycle", "excess/cycle ± 99% bound",
                "verdict");
    else
        fprintf(f, "%-8s   %-28s %s\n", "meter", "per cycle ± 99% bound", "verdict");
    for (size_t i = 0; i < a->nm; i++) {
        const meter_result *m = &a->m[i];
        if (!m->available) {
            fprintf(f, "%-8s unavailable: %s\n", m->def->name, m->how && *m->how ? m->how : "not reported by the worker");
            continue;
        }
        char s[32] = "", b[32] = "", j[32] = "", bd[32] = "", col[64];
        if (m->have_subject) fmt_value(s, sizeof s, m->def, m->subject.slope, 1);
        if (m->have_bare) fmt_value(b, sizeof b, m->def, m->bare.slope, 1);
        if (!m->judged) {
            fprintf(f, "%-8s (no judged cycle)\n", m->def->name);
            continue;
        }
        fmt_value(j, sizeof j, m->def, m->judged->slope, 1);
        fmt_value(bd, sizeof bd, m->def, m->judged->bound, 0);
        snprintf(col, sizeof col, "%s ± %s", j, bd);
        if (paired)
            fprintf(f, "%-8s %14s %14s   %-28s %s\n", m->def->name, s, b, col, lc_verdict_name(m->verdict));
        else
            fprintf(f, "%-8s   %-28s %s\n", m->def->name, col, lc_verdict_name(m->verdict));
    }
}

static void print_where(FILE *f, const lc_run *r, const analysis *a)
{
    if (a->obm_n)
        fprintf(f, "\nobmalloc blocks still in use when each interpreter ended (judged cycles): "
                   "min %lld, mean %.1f, max %lld%s\n",
                (long long)a->obm_min, a->obm_mean, (long long)a->obm_max,
                a->obm_max > 0 ? "\n  (an own-obmalloc interpreter whose blocks are not all freed abandons its arenas)"
                               : "\n  (none: the interpreter's arenas can be freed)");
    long ns = a->n_subject ? a->n_subject : a->n_bare, nb = a->n_subject ? a->n_bare : 0;
    fprintf(f, "\nwhere: allocating call stacks of the bytes still held after the judged cycles,\n"
               "excess bytes per cycle%s, top 10 per domain\n",
            nb ? " (subject cycles' minus bare cycles')" : "");
    if (r->where_note[0]) fprintf(f, "  (symbols unavailable: %s)\n", r->where_note);
    if (!r->nsites) {
        fprintf(f, "  nothing: no block allocated through Python's allocators during a judged cycle is still held%s\n",
                nb ? " beyond the bare cycles'" : "");
        return;
    }
    for (size_t i = 0; i < r->nsites; i++) {
        const lc_site *s = &r->sites[i];
        double ex = ns ? (double)s->bytes[0] / (double)ns : 0, exb = ns ? (double)s->blocks[0] / (double)ns : 0;
        if (nb) ex -= (double)s->bytes[1] / (double)nb, exb -= (double)s->blocks[1] / (double)nb;
        char bb[32];
        lc_fmt_bytes(bb, sizeof bb, ex, 1);
        fprintf(f, "  #%zu %s/cycle in %.2f blocks/cycle, domain %s\n", i + 1, bb, exb, s->domain);
        for (int k = 0; k < s->nframes; k++) fprintf(f, "       %s %s\n", k ? "  " : "at", s->frames[k]);
        if (s->npyframes) fprintf(f, "       Python (tracemalloc, innermost first):\n");
        for (int k = 0; k < s->npyframes; k++) fprintf(f, "          %s\n", s->pyframes[k]);
    }
    fprintf(f, "  (plain malloc() calls are not attributed: see the malloc meter)\n");
    if (!strncmp(r->where_python, "unavailable", 11))
        fprintf(f, "  (Python lines %s)\n", r->where_python);
}

static void print_crash(FILE *f, const lc_run *r)
{
    const char *what = r->begun_kind == 'S' ? "a subject cycle" : "a bare cycle";
    long round = r->begun_round;
    const char *phase = r->begun_judged ? "judged" : "warm-up";
    if (r->outcome == LC_OUT_HANG)
        fprintf(f, "HANG: cycle %ld (%s, round %ld, %s) did not finish within %g s: the worker was killed\n",
                r->begun_seq, what, round + 1, phase, r->timeout_s);
    else if (r->signal)
        fprintf(f, "CRASH: the worker was killed by signal %d (%s) in cycle %ld (%s, round %ld, %s)\n", r->signal,
                signal_name(r->signal), r->begun_seq, what, round + 1, phase);
    else
        fprintf(f, "CRASH: the worker exited with status %d without finishing, in cycle %ld (%s, round %ld, %s)\n",
                r->exit_status, r->begun_seq, what, round + 1, phase);
    if (!r->begun_seq) fprintf(f, "  (before the first cycle began: while starting CPython)\n");
    if (r->ncyc) {
        fprintf(f, "last cycles finished (increase of each meter over the cycle):\n");
        fprintf(f, "  %6s %-8s %10s %12s %12s %12s %10s\n", "cycle", "kind", "ms", "rss", "malloc", "py", "blocks");
        for (size_t i = r->ncyc > 6 ? r->ncyc - 6 : 0; i < r->ncyc; i++) {
            const lc_cycle *c = &r->cyc[i];
            char cols[4][32];
            static const int vals[4] = {LC_V_RSS, LC_V_MALLOC, LC_V_PY, LC_V_BLOCKS};
            for (int k = 0; k < 4; k++) {
                int64_t prev = i ? r->cyc[i - 1].v[vals[k]] : r->initial[vals[k]];
                if (c->v[vals[k]] < 0 || prev < 0) lc_scopy(cols[k], sizeof cols[k], "n/a");
                else if (k == 3) snprintf(cols[k], sizeof cols[k], "%+lld", (long long)(c->v[vals[k]] - prev));
                else lc_fmt_bytes(cols[k], sizeof cols[k], (double)(c->v[vals[k]] - prev), 1);
            }
            fprintf(f, "  %6ld %-8s %10.2f %12s %12s %12s %10s\n", c->seq, c->kind == 'S' ? "subject" : "bare",
                    (double)c->v[LC_V_TIME_NS] / 1e6, cols[0], cols[1], cols[2], cols[3]);
        }
    }
    if (r->output_tail[0]) {
        fprintf(f, "last output of the worker:\n");
        const char *p = r->output_tail;
        int lines = 0;
        for (const char *q = p; *q; q++) lines += *q == '\n';
        for (; *p && lines > 15; p++)
            if (*p == '\n') lines--;
        while (*p) {
            const char *e = strchr(p, '\n');
            int len = e ? (int)(e - p) : (int)strlen(p);
            fprintf(f, "  | %.*s\n", len, p);
            p += len + (e != NULL);
        }
    }
}

static void print_report(FILE *f, const lc_run *r, const analysis *a, int exit_status)
{
    fprintf(f, "pyfini-leakcheck: CPython %s%s (%s build) %s\n", r->version, r->abiflags, r->debug ? "debug" : "release",
            r->executable);
    fprintf(f, "config   %s\n", config_description(opt.config));
    fprintf(f, "subject  ");
    print_subject(f);
    fprintf(f, "\n");
    int paired = has_subject() && opt.baseline;
    if (paired) {
        long k = opt.cycles / 10 < 1 ? 1 : (opt.cycles / 10 > 10 ? 10 : opt.cycles / 10);
        fprintf(f, "cycles   %ld warm-up + %ld judged rounds; a round = 1 subject + 1 bare cycle (judged: blocks of %ld\n"
                   "         subject cycles, then %ld bare ones); judged is the subject's excess over the bare cycle\n",
                opt.warmup, opt.cycles, k, k);
    } else {
        fprintf(f, "cycles   %ld warm-up + %ld judged %s\n", opt.warmup, opt.cycles,
                has_subject() ? "subject cycles (--no-baseline: raw figures judged)" : "bare cycles");
    }
    if (r->ignored_env[0]) fprintf(f, "note     ignored from the environment: %s\n", r->ignored_env);
    if (a->n_subject || a->n_bare) {
        fprintf(f, "time     ");
        if (a->n_subject) fprintf(f, "subject %.2f ms/cycle", a->time_subject_ms);
        if (a->n_subject && a->n_bare) fprintf(f, ", ");
        if (a->n_bare) fprintf(f, "bare %.2f ms/cycle", a->time_bare_ms);
        fprintf(f, "\n");
    }
    fprintf(f, "\n");
    if (a->rounds_judged) print_meter_table(f, a, paired);
    else fprintf(f, "(no judged cycle finished)\n");
    if (opt.where && r->outcome == LC_OUT_DONE) print_where(f, r, a);
    fprintf(f, "\n");
    if (r->outcome == LC_OUT_CRASH || r->outcome == LC_OUT_HANG) {
        print_crash(f, r);
        fprintf(f, "subject: ");
        print_subject(f);
        fprintf(f, ", config %s, CPython %s%s; figures above: %zu cycles finished\n", opt.config, r->version,
                r->abiflags, r->ncyc);
    } else {
        fprintf(f, "verdict: ");
        if (a->leak) {
            fprintf(f, "LEAK:");
            const char *sep = " ";
            for (size_t i = 0; i < a->nm; i++) {
                const meter_result *m = &a->m[i];
                if (m->verdict != LC_LEAK || !m->def->bytes) continue;
                char b[32];
                fmt_value(b, sizeof b, m->def, m->judged->slope, 1);
                fprintf(f, "%s%s %s/cycle", sep, m->def->name, b);
                sep = ", ";
            }
            fprintf(f, "%s\n", paired ? " beyond the bare cycle" : "");
        } else {
            fprintf(f, "no leak%s\n", a->inconclusive ? " (some meters inconclusive: see above)" : "");
        }
    }
    fprintf(f, "exit status %d\n", exit_status);
}

static json_t *jnum(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *judgement_json(const lc_judgement *j)
{
    json_t *o = json_object();
    json_object_set_new(o, "n", json_integer((json_int_t)j->n));
    json_object_set_new(o, "per_cycle", jnum(j->slope));
    json_object_set_new(o, "bound", jnum(j->bound));
    json_object_set_new(o, "lower", jnum(j->slope - j->bound));
    json_object_set_new(o, "upper", jnum(j->slope + j->bound));
    json_object_set_new(o, "mean", jnum(j->mean));
    json_object_set_new(o, "floor", jnum(j->floor));
    json_t *ch = json_array();
    for (int c = 0; c < j->nchunks; c++) json_array_append_new(ch, jnum(j->chunk_growth[c]));
    json_object_set_new(o, "chunk_growth", ch);
    json_object_set_new(o, "late_per_cycle", jnum(j->late_slope));
    json_object_set_new(o, "late_bound", jnum(j->late_bound));
    json_object_set_new(o, "verdict", lc_json_str(lc_verdict_name(j->verdict)));
    return o;
}

static json_t *python_json(const lc_run *r)
{
    json_t *py = json_object();
    json_object_set_new(py, "version", lc_json_str(r->version));
    json_object_set_new(py, "abiflags", lc_json_str(r->abiflags));
    json_object_set_new(py, "debug", json_boolean(r->debug));
    json_object_set_new(py, "executable", lc_json_str(r->executable));
    json_object_set_new(py, "compiler", lc_json_str(r->compiler));
    json_t *cf = json_array();
    char tmp[256];
    lc_scopy(tmp, sizeof tmp, r->configs);
    for (char *save = NULL, *t = strtok_r(tmp, " ", &save); t; t = strtok_r(NULL, " ", &save))
        json_array_append_new(cf, lc_json_str(t));
    json_object_set_new(py, "configs", cf);
    json_object_set_new(py, "worker", lc_json_str(worker_path));
    return py;
}

static json_t *crash_json(const lc_run *r)
{
    json_t *c = json_object();
    json_object_set_new(c, "kind", lc_json_str(r->outcome == LC_OUT_HANG ? "hang" : "crash"));
    json_object_set_new(c, "signal", r->signal ? json_integer(r->signal) : json_null());
    json_object_set_new(c, "signal_name", r->signal ? lc_json_str(signal_name(r->signal)) : json_null());
    json_object_set_new(c, "exit_status", r->exit_status >= 0 ? json_integer(r->exit_status) : json_null());
    json_object_set_new(c, "cycle", json_integer(r->begun_seq));
    json_object_set_new(c, "cycle_kind", lc_json_str(r->begun_kind == 'S' ? "subject" : "bare"));
    json_object_set_new(c, "round", json_integer(r->begun_seq ? r->begun_round + 1 : 0));
    json_object_set_new(c, "phase", lc_json_str(r->begun_judged ? "judged" : "warmup"));
    json_object_set_new(c, "cycles_finished", json_integer((json_int_t)r->ncyc));
    json_object_set_new(c, "output_tail", lc_json_str(r->output_tail));
    return c;
}

static json_t *report_json(const lc_run *r, const analysis *a, int exit_status)
{
    json_t *o = json_object();
    json_object_set_new(o, "tool", lc_json_str("pyfini-leakcheck"));
    json_object_set_new(o, "tool_version", lc_json_str(LC_VERSION));
    json_object_set_new(o, "python", python_json(r));
    json_object_set_new(o, "config", lc_json_str(opt.config));
    json_object_set_new(o, "config_description", lc_json_str(config_description(opt.config)));
    json_t *subj = json_object(), *imps = json_array();
    for (int i = 0; i < opt.nimports; i++) json_array_append_new(imps, lc_json_str(opt.imports[i]));
    json_object_set_new(subj, "imports", imps);
    json_object_set_new(subj, "code", opt.code ? lc_json_str(opt.code) : json_null());
    json_object_set_new(subj, "file", opt.file ? lc_json_str(opt.file) : json_null());
    json_object_set_new(o, "subject", subj);
    int paired = has_subject() && opt.baseline;
    json_object_set_new(o, "baseline", json_boolean(paired));
    json_object_set_new(o, "judged", lc_json_str(paired ? "excess" : "raw"));
    json_object_set_new(o, "warmup", json_integer(opt.warmup));
    json_object_set_new(o, "cycles", json_integer(opt.cycles));
    json_object_set_new(o, "max_bytes_per_cycle", json_real(opt.max_bytes));
    json_t *t = json_object();
    json_object_set_new(t, "subject_ms", a->n_subject ? jnum(a->time_subject_ms) : json_null());
    json_object_set_new(t, "bare_ms", a->n_bare ? jnum(a->time_bare_ms) : json_null());
    json_object_set_new(o, "time_per_cycle", t);
    json_t *ms = json_object();
    for (size_t i = 0; i < a->nm; i++) {
        const meter_result *m = &a->m[i];
        json_t *mj = json_object();
        json_object_set_new(mj, "available", json_boolean(m->available));
        json_object_set_new(mj, "how", lc_json_str(m->how ? m->how : ""));
        json_object_set_new(mj, "bytes_meter", json_boolean(m->def->bytes));
        json_object_set_new(mj, "resolution", json_real(m->def->resolution));
        if (m->available && m->judged) {
            if (m->have_subject) json_object_set_new(mj, "subject", judgement_json(&m->subject));
            if (m->have_bare) json_object_set_new(mj, "bare", judgement_json(&m->bare));
            if (m->have_excess) json_object_set_new(mj, "excess", judgement_json(&m->excess));
            json_object_set_new(mj, "judged", lc_json_str(m->have_excess ? "excess" : (m->have_subject ? "subject" : "bare")));
            json_object_set_new(mj, "verdict", lc_json_str(lc_verdict_name(m->verdict)));
        } else {
            json_object_set_new(mj, "verdict", lc_json_str(m->available ? "no judged cycle" : "unavailable"));
        }
        json_object_set_new(ms, m->def->name, mj);
    }
    json_object_set_new(o, "meters", ms);
    if (a->obm_n) {
        json_t *ob = json_object();
        json_object_set_new(ob, "min", json_integer(a->obm_min));
        json_object_set_new(ob, "max", json_integer(a->obm_max));
        json_object_set_new(ob, "mean", json_real(a->obm_mean));
        json_object_set_new(ob, "cycles", json_integer(a->obm_n));
        json_object_set_new(o, "obmalloc_blocks_at_end", ob);
    }
    if (opt.where && r->outcome == LC_OUT_DONE) {
        json_t *w = json_array();
        long ns = a->n_subject ? a->n_subject : a->n_bare, nb = a->n_subject ? a->n_bare : 0;
        for (size_t i = 0; i < r->nsites; i++) {
            const lc_site *s = &r->sites[i];
            double ex = (double)s->bytes[0] / (double)ns, exb = (double)s->blocks[0] / (double)ns;
            if (nb) ex -= (double)s->bytes[1] / (double)nb, exb -= (double)s->blocks[1] / (double)nb;
            json_t *sj = json_object(), *fr = json_array();
            json_object_set_new(sj, "domain", lc_json_str(s->domain));
            json_object_set_new(sj, "bytes_per_cycle", json_real(ex));
            json_object_set_new(sj, "blocks_per_cycle", json_real(exb));
            json_object_set_new(sj, "subject_bytes_held", json_integer(s->bytes[0]));
            json_object_set_new(sj, "bare_bytes_held", json_integer(s->bytes[1]));
            for (int k = 0; k < s->nframes; k++) json_array_append_new(fr, lc_json_str(s->frames[k]));
            json_object_set_new(sj, "frames", fr);
            json_t *pf = json_array();
            for (int k = 0; k < s->npyframes; k++) json_array_append_new(pf, lc_json_str(s->pyframes[k]));
            json_object_set_new(sj, "python_frames", pf);
            json_array_append_new(w, sj);
        }
        json_object_set_new(o, "where", w);
        json_object_set_new(o, "where_python", lc_json_str(r->where_python));
    }
    const char *verdict = "no leak";
    if (r->outcome == LC_OUT_CRASH) verdict = "crash";
    else if (r->outcome == LC_OUT_HANG) verdict = "hang";
    else if (a->leak) verdict = "LEAK";
    json_object_set_new(o, "verdict", lc_json_str(verdict));
    json_t *lm = json_array();
    for (size_t i = 0; i < a->nm; i++)
        if (a->m[i].verdict == LC_LEAK && a->m[i].available) json_array_append_new(lm, lc_json_str(a->m[i].def->name));
    json_object_set_new(o, "leaking_meters", lm);
    json_object_set_new(o, "crash", (r->outcome == LC_OUT_CRASH || r->outcome == LC_OUT_HANG) ? crash_json(r) : json_null());
    json_object_set_new(o, "cycles_finished", json_integer((json_int_t)r->ncyc));
    json_object_set_new(o, "exit_status", json_integer(exit_status));
    return o;
}

static int write_csv(const char *path, const lc_run *r)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "cycle,round,kind,phase,time_ms");
    for (size_t k = 0; k < lc_nmeters; k++) fprintf(f, ",%s,%s_increase", lc_meters[k].name, lc_meters[k].name);
    fprintf(f, ",obmalloc_blocks_at_end\n");
    for (size_t i = 0; i < r->ncyc; i++) {
        const lc_cycle *c = &r->cyc[i];
        fprintf(f, "%ld,%ld,%s,%s,%.3f", c->seq, c->round + 1, c->kind == 'S' ? "subject" : "bare",
                c->judged ? "judged" : "warmup", (double)c->v[LC_V_TIME_NS] / 1e6);
        for (size_t k = 0; k < lc_nmeters; k++) {
            int v = lc_meters[k].value;
            int64_t prev = i ? r->cyc[i - 1].v[v] : r->initial[v];
            if (c->v[v] < 0 || prev < 0) fprintf(f, ",,");
            else fprintf(f, ",%lld,%lld", (long long)c->v[v], (long long)(c->v[v] - prev));
        }
        if (c->obm >= 0) fprintf(f, ",%lld\n", (long long)c->obm);
        else fprintf(f, ",\n");
    }
    return fclose(f);
}

/* --- one run ------------------------------------------------------------- */
static void build_argv(char **argv, int *argc, const char *config, const char *const *imports, int nimports,
                       const char *code, const char *file, long cycles, long warmup, int baseline, int where)
{
    static char cyc_s[32], warm_s[32];
    snprintf(cyc_s, sizeof cyc_s, "%ld", cycles);
    snprintf(warm_s, sizeof warm_s, "%ld", warmup);
    int n = 0;
    argv[n++] = worker_path;
    argv[n++] = "--config";
    argv[n++] = (char *)config;
    for (int i = 0; i < nimports; i++) argv[n++] = "--import", argv[n++] = (char *)imports[i];
    if (code) argv[n++] = "--code", argv[n++] = (char *)code;
    if (file) argv[n++] = "--file", argv[n++] = (char *)file;
    argv[n++] = "--cycles";
    argv[n++] = cyc_s;
    argv[n++] = "--warmup";
    argv[n++] = warm_s;
    if (!baseline) argv[n++] = "--no-baseline";
    if (where) argv[n++] = "--where";
    if (opt.no_wrapper) argv[n++] = "--no-allocator-wrapper";
    static char block_s[32];
    long block = cycles / 10;
    if (block < 1) block = 1;
    if (block > 10) block = 10;
    snprintf(block_s, sizeof block_s, "%ld", block);
    argv[n++] = "--block";
    argv[n++] = block_s;
    argv[n] = NULL;
    *argc = n;
}

static void start_run(lc_run *r, long cycles, long warmup, int subject, int baseline, double timeout, int progress)
{
    memset(r, 0, sizeof *r);
    r->cycles = cycles;
    r->warmup = warmup;
    r->subject = subject;
    r->baseline = baseline;
    r->timeout_s = timeout;
    r->progress = progress;
}

static int exit_status_of(const lc_run *r, const analysis *a)
{
    switch (r->outcome) {
    case LC_OUT_ERROR:
    case LC_OUT_SPAWN: return 2;
    case LC_OUT_CRASH:
    case LC_OUT_HANG: return 3;
    case LC_OUT_DONE: return a->leak ? 1 : 0;
    }
    return 3;
}

static int run_check(void)
{
    char *argv[200];
    int argc;
    build_argv(argv, &argc, opt.config, opt.imports, opt.nimports, opt.code, opt.file, opt.cycles, opt.warmup,
               opt.baseline, opt.where);
    lc_run r;
    start_run(&r, opt.cycles, opt.warmup, has_subject(), opt.baseline, opt.timeout, isatty(2));
    lc_run_worker(&r, argv);
    if (r.outcome == LC_OUT_ERROR || r.outcome == LC_OUT_SPAWN) {
        fprintf(stderr, "pyfini-leakcheck: %s\n", r.error);
        if (!strcmp(r.error_kind, "internal") && r.output_tail[0]) fprintf(stderr, "%s\n", r.output_tail);
        if (opt.json) {
            json_t *o = json_object();
            json_object_set_new(o, "tool", lc_json_str("pyfini-leakcheck"));
            json_object_set_new(o, "verdict", lc_json_str("error"));
            json_object_set_new(o, "error_kind", lc_json_str(r.error_kind[0] ? r.error_kind : "spawn"));
            json_object_set_new(o, "error", lc_json_str(r.error));
            json_object_set_new(o, "exit_status", json_integer(2));
            json_dumpf(o, stdout, JSON_INDENT(2));
            printf("\n");
            json_decref(o);
        }
        lc_run_free(&r);
        return 2;
    }
    analysis a;
    analyse(&r, &a, opt.max_bytes);
    int status = exit_status_of(&r, &a);
    if (opt.csv && write_csv(opt.csv, &r) != 0) fprintf(stderr, "pyfini-leakcheck: --csv %s: %s\n", opt.csv, strerror(errno));
    if (opt.json) {
        json_t *o = report_json(&r, &a, status);
        json_dumpf(o, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
        printf("\n");
        json_decref(o);
    } else {
        print_report(stdout, &r, &a, status);
    }
    lc_run_free(&r);
    return status;
}

/* --- --demo -------------------------------------------------------------- */
static int run_demo(void)
{
    struct { const char *config; const char *import; } runs[] = {
        {"legacy", NULL}, {"isolated", NULL}, {"legacy", "json"}, {"isolated", "json"}};
    long cycles = opt.cycles_set ? opt.cycles : 40, warmup = opt.warmup_set ? opt.warmup : 5;
    printf("pyfini-leakcheck --demo: what one create-and-end cycle of an interpreter loses\n");
    printf("(%ld warm-up + %ld judged cycles each; with --import json, the excess over a bare cycle is judged)\n\n",
           warmup, cycles);
    int worst = 0, header = 0;
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        char *argv[64];
        int argc;
        const char *imp[1] = {runs[i].import};
        build_argv(argv, &argc, runs[i].config, imp, runs[i].import ? 1 : 0, NULL, NULL, cycles, warmup, 1, 0);
        lc_run r;
        start_run(&r, cycles, warmup, runs[i].import != NULL, 1, opt.timeout, isatty(2));
        lc_run_worker(&r, argv);
        char label[64];
        snprintf(label, sizeof label, "%s %s", runs[i].config, runs[i].import ? "--import json" : "bare");
        if (!header && r.version[0]) {
            printf("CPython %s%s (%s build)\n\n", r.version, r.abiflags, r.debug ? "debug" : "release");
            printf("%-24s %9s  %-20s %-20s %-20s %s\n", "cycle", "ms/cycle", "rss/cycle", "malloc/cycle", "py/cycle",
                   "verdict");
            header = 1;
        }
        if (r.outcome != LC_OUT_DONE) {
            if (r.outcome == LC_OUT_ERROR) printf("%-24s not run: %s\n", label, r.error);
            else printf("%-24s %s\n", label, r.outcome == LC_OUT_HANG ? "HANG" : "CRASH");
            if (r.outcome != LC_OUT_ERROR && worst < 3) worst = 3;
            lc_run_free(&r);
            continue;
        }
        analysis a;
        analyse(&r, &a, 0);
        char cols[3][40];
        const int which[3] = {0, 1, 2};   /* rss, malloc, py */
        for (int k = 0; k < 3; k++) {
            const meter_result *m = &a.m[which[k]];
            char v[24] = "n/a";
            if (m->available && m->judged) fmt_value(v, sizeof v, m->def, m->judged->slope, 1);
            snprintf(cols[k], sizeof cols[k], "%s %s", v,
                     m->available && m->judged ? (m->verdict == LC_LEAK ? "LEAK" : (m->verdict == LC_NO_LEAK ? "ok" : "?")) : "");
        }
        double ms = runs[i].import ? a.time_subject_ms : a.time_bare_ms;
        printf("%-24s %9.2f  %-20s %-20s %-20s %s\n", label, ms, cols[0], cols[1], cols[2],
               a.leak ? "LEAK" : "no leak");
        if (a.leak && worst < 1) worst = 1;
        lc_run_free(&r);
    }
    printf("\nper cycle: least-squares slope over the judged cycles (for --import json: beyond the bare cycle).\n"
           "ok / LEAK / ? = no leak / LEAK / inconclusive for that meter.  Details of one line:\n"
           "  pyfini-leakcheck --config isolated [--import json] [--where]\n");
    return worst;
}

/* --- --scan -------------------------------------------------------------- */
typedef struct scan_cell {
    int ran;
    int severity;          /* 5 crash, 4 hang, 3 leak, 2 error, 1 refuses, 0 ok */
    char status[48];
    char message[600];
    double py_per_cycle, malloc_per_cycle, loss;
    int py_known;
} scan_cell;

typedef struct scan_row {
    char name[256], path[1024];
    scan_cell cell[2];     /* legacy, isolated */
    int severity;
    double loss;
} scan_row;

static void scan_one(scan_row *row, int k, const char *config, long cycles, long warmup, double timeout)
{
    scan_cell *c = &row->cell[k];
    char *argv[64];
    int argc;
    const char *imp[1] = {row->name};
    build_argv(argv, &argc, config, imp, 1, NULL, NULL, cycles, warmup, 1, 0);
    lc_run r;
    start_run(&r, cycles, warmup, 1, 1, timeout, 0);
    lc_run_worker(&r, argv);
    c->ran = 1;
    if (r.outcome == LC_OUT_CRASH) {
        c->severity = 5;
        if (r.signal) snprintf(c->status, sizeof c->status, "CRASH %s", sigabbrev_np(r.signal) ? sigabbrev_np(r.signal) : "?");
        else snprintf(c->status, sizeof c->status, "CRASH exit %d", r.exit_status);
        const char *t = r.output_tail;
        size_t L = strlen(t);
        while (L && t[L - 1] == '\n') L--;
        size_t s = L;
        while (s && t[s - 1] != '\n') s--;
        snprintf(c->message, sizeof c->message, "cycle %ld: %.*s", r.begun_seq, (int)(L - s), t + s);
    } else if (r.outcome == LC_OUT_HANG) {
        c->severity = 4;
        snprintf(c->status, sizeof c->status, "HANG");
        snprintf(c->message, sizeof c->message, "cycle %ld did not end within %g s", r.begun_seq, timeout);
    } else if (r.outcome == LC_OUT_ERROR || r.outcome == LC_OUT_SPAWN) {
        int refuses = strstr(r.error, "subinterpreter") || strstr(r.error, "sub-interpreter")
                      || strstr(r.error, "per-interpreter GIL") || strstr(r.error, "isolated interpreter");
        c->severity = refuses ? 1 : 2;
        lc_scopy(c->status, sizeof c->status, refuses ? "refuses" : "error");
        const char *m = strstr(r.error, ": ");
        const char *m2 = m ? strstr(m + 2, ": ") : NULL;   /* "cycle N: import X: Type: msg" */
        lc_scopy(c->message, sizeof c->message, m2 ? m2 + 2 : r.error);
    } else {
        analysis a;
        analyse(&r, &a, 0);
        /* LEAK: any bytes meter but RSS (too coarse for a few cycles) */
        const meter_result *worst = NULL;
        for (size_t i = 0; i < a.nm; i++) {
            const meter_result *m = &a.m[i];
            if (!m->def->bytes || m->def->value == LC_V_RSS || !m->available || !m->judged) continue;
            if (m->def->value == LC_V_PY) {
                c->py_known = 1;
                c->py_per_cycle = m->judged->slope;
            }
            if (m->def->value == LC_V_MALLOC) c->malloc_per_cycle = m->judged->slope;
            if (m->verdict == LC_LEAK && m->def->value != LC_V_PY && (!worst || m->judged->slope > worst->judged->slope))
                worst = m;
        }
        if (worst) {
            char b[32];
            lc_fmt_bytes(b, sizeof b, worst->judged->slope, 1);
            c->severity = 3;
            c->loss = worst->judged->slope;
            snprintf(c->status, sizeof c->status, "LEAK %s/cycle", b);
            snprintf(c->message, sizeof c->message, "%s grows %s per cycle beyond the bare cycle", worst->def->name, b);
        } else {
            c->severity = 0;
            lc_scopy(c->status, sizeof c->status, "ok");
        }
    }
    lc_run_free(&r);
}

static int cmp_rows(const void *x, const void *y)
{
    const scan_row *a = x, *b = y;
    if (a->severity != b->severity) return b->severity - a->severity;
    if (a->loss != b->loss) return a->loss < b->loss ? 1 : -1;
    return strcmp(a->name, b->name);
}

static int run_scan(void)
{
    char *argv[16];
    int argc = 0;
    argv[argc++] = worker_path;
    argv[argc++] = "--list-extensions";
    argv[argc] = NULL;
    lc_run lr;
    start_run(&lr, 0, 0, 0, 0, 60, 0);
    lc_run_worker(&lr, argv);
    if (lr.outcome != LC_OUT_DONE) {
        fprintf(stderr, "pyfini-leakcheck: listing extension modules failed: %s\n", lr.error[0] ? lr.error : lr.output_tail);
        lc_run_free(&lr);
        return lr.outcome == LC_OUT_ERROR ? 2 : 3;
    }
    int isolated_ok = strstr(lr.configs, "isolated") != NULL;
    size_t n = opt.nimports ? (size_t)opt.nimports : lr.nextensions;
    scan_row *rows = calloc(n ? n : 1, sizeof *rows);
    for (size_t i = 0; i < n; i++) {
        if (opt.nimports) {
            lc_scopy(rows[i].name, sizeof rows[i].name, opt.imports[i]);
            for (size_t j = 0; j < lr.nextensions; j++)
                if (!strcmp(lr.extensions[j][0], opt.imports[i])) lc_scopy(rows[i].path, sizeof rows[i].path, lr.extensions[j][1]);
        } else {
            lc_scopy(rows[i].name, sizeof rows[i].name, lr.extensions[i][0]);
            lc_scopy(rows[i].path, sizeof rows[i].path, lr.extensions[i][1]);
        }
    }
    long cycles = opt.cycles_set ? opt.cycles : 8, warmup = opt.warmup_set ? opt.warmup : 2;
    double timeout = opt.timeout_set ? opt.timeout : 30;
    const char *cfgs[2] = {"legacy", "isolated"};
    int tty = isatty(2);
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < 2; k++) {
            if (k == 1 && !isolated_ok) {
                snprintf(rows[i].cell[k].status, sizeof rows[i].cell[k].status, "n/a");
                snprintf(rows[i].cell[k].message, sizeof rows[i].cell[k].message, "CPython %s has only legacy interpreters", lr.version);
                continue;
            }
            if (tty) fprintf(stderr, "\r\033[K[pyfini-leakcheck] scan %zu/%zu %s (%s)", i + 1, n, rows[i].name, cfgs[k]), fflush(stderr);
            scan_one(&rows[i], k, cfgs[k], cycles, warmup, timeout);
            if (rows[i].cell[k].severity > rows[i].severity) rows[i].severity = rows[i].cell[k].severity;
            if (rows[i].cell[k].severity == 3 && rows[i].cell[k].loss > rows[i].loss) rows[i].loss = rows[i].cell[k].loss;
        }
    }
    if (tty) fprintf(stderr, "\r\033[K");
    qsort(rows, n, sizeof *rows, cmp_rows);
    int status = 0;
    for (size_t i = 0; i < n; i++) {
        if (rows[i].severity >= 4) status = 3;
        else if (rows[i].severity == 3 && status < 1) status = 1;
    }
    if (opt.json) {
        json_t *o = json_object(), *arr = json_array();
        json_object_set_new(o, "tool", lc_json_str("pyfini-leakcheck"));
        json_object_set_new(o, "tool_version", lc_json_str(LC_VERSION));
        json_object_set_new(o, "mode", lc_json_str("scan"));
        json_object_set_new(o, "python", python_json(&lr));
        json_object_set_new(o, "warmup", json_integer(warmup));
        json_object_set_new(o, "cycles", json_integer(cycles));
        for (size_t i = 0; i < n; i++) {
            json_t *rj = json_object();
            json_object_set_new(rj, "module", lc_json_str(rows[i].name));
            json_object_set_new(rj, "path", lc_json_str(rows[i].path));
            for (int k = 0; k < 2; k++) {
                const scan_cell *c = &rows[i].cell[k];
                json_t *cj = json_object();
                json_object_set_new(cj, "status", lc_json_str(c->status));
                json_object_set_new(cj, "message", lc_json_str(c->message));
                json_object_set_new(cj, "py_per_cycle", c->ran && c->severity <= 3 && c->py_known ? json_real(c->py_per_cycle) : json_null());
                json_object_set_new(cj, "malloc_per_cycle", c->ran && (c->severity == 0 || c->severity == 3) ? json_real(c->malloc_per_cycle) : json_null());
                json_object_set_new(rj, cfgs[k], cj);
            }
            json_array_append_new(arr, rj);
        }
        json_object_set_new(o, "modules", arr);
        json_object_set_new(o, "exit_status", json_integer(status));
        json_dumpf(o, stdout, JSON_INDENT(2));
        printf("\n");
        json_decref(o);
    } else {
        printf("pyfini-leakcheck --scan: CPython %s%s (%s build), %zu extension modules, %ld warm-up + %ld judged "
               "cycles each (excess over a bare cycle)\n\n", lr.version, lr.abiflags, lr.debug ? "debug" : "release", n,
               warmup, cycles);
        printf("%-36s %-22s %-22s\n", "module", "legacy", "isolated");
        for (size_t i = 0; i < n; i++) printf("%-36s %-22s %-22s\n", rows[i].name, rows[i].cell[0].status, rows[i].cell[1].status);
        int notes = 0;
        for (size_t i = 0; i < n; i++)
            for (int k = 0; k < 2; k++) {
                const scan_cell *c = &rows[i].cell[k];
                if (!c->message[0] || !c->ran) continue;
                if (!notes++) printf("\nnotes:\n");
                printf("  %s (%s): %s\n", rows[i].name, cfgs[k], c->message);
            }
        printf("\nLEAK = Python's allocators or malloc grew in every chunk beyond the bare cycle (few cycles: "
               "check one module with --import for a full verdict).\nexit status %d\n", status);
    }
    free(rows);
    lc_run_free(&lr);
    return status;
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    char err[4096];
    int rc = opt.python ? lc_worker_for_python(opt.python, worker_path, sizeof worker_path, err, sizeof err)
                        : lc_default_worker(worker_path, sizeof worker_path, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "pyfini-leakcheck: %s\n", err);
        return 2;
    }
    if (opt.csv) {
        FILE *f = fopen(opt.csv, "a");
        if (!f) usage_error("--csv %s: %s", opt.csv, strerror(errno));
        fclose(f);
    }
    if (opt.demo) return run_demo();
    if (opt.scan) return run_scan();
    return run_check();
}
