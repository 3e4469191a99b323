/* main.c - pyfini-leakcheck's worker: embeds one CPython, runs interpreter
 * cycles and reports a reading of every meter after each cycle.
 *
 * Started by the driver (driver/), never by hand: it writes records (see
 * shared/lc_protocol.h) to file descriptor LC_RECORD_FD.  A crash of this
 * process is a finding the driver reports; bad input is reported with an E
 * record and exit status 2.  The parts: see worker.h.
 *
 * usage: pyfini-leakcheck-worker [--config NAME] [--import MOD]... [--code SRC]
 *            [--file F] [--cycles N] [--warmup W] [--no-baseline] [--where]
 *            [--no-allocator-wrapper] [--list-extensions]
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lc_alloc.h"
#include "lc_heap.h"
#include "lc_util.h"
#include "worker.h"

#ifndef LC_PYTHON_EXECUTABLE
#define LC_PYTHON_EXECUTABLE ""
#endif

/* --- the tool's descriptors ------------------------------------------------ */
/* The record pipe and stderr as the driver gave them: a subject that closes
 * or replaces one is told apart from a crash (lc_worker_exit). */
static struct stat wk_fd_at_start[2];   /* [0] LC_RECORD_FD, [1] stderr */

static void wk_fds_remember(void)
{
    if (fstat(LC_RECORD_FD, &wk_fd_at_start[0]) < 0) wk_fd_at_start[0].st_ino = 0;
    if (fstat(2, &wk_fd_at_start[1]) < 0) wk_fd_at_start[1].st_ino = 0;
}

/* 0, or the exit status that says what the subject did to fd. */
static int wk_fd_changed(int which)
{
    int fd = which ? 2 : LC_RECORD_FD;
    struct stat st;
    const struct stat *was = &wk_fd_at_start[which];
    if (fstat(fd, &st) < 0)
        return which ? LC_WK_EXIT_STDERR_CLOSED : LC_WK_EXIT_RECORD_CLOSED;
    if (was->st_ino && (st.st_dev != was->st_dev || st.st_ino != was->st_ino))
        return which ? LC_WK_EXIT_STDERR_REPLACED : LC_WK_EXIT_RECORD_REPLACED;
    return 0;
}

/* Exit with code (lc_worker_exit), confirmed through the descriptor that
 * still works (see LC_STDERR_BROKEN). */
static void wk_broken(int code)
{
    if (code == LC_WK_EXIT_STDERR_CLOSED || code == LC_WK_EXIT_STDERR_REPLACED) {
        if (!wk_fd_changed(0)) {
            lc_line l;
            char v[16];
            snprintf(v, sizeof v, "%d", code);
            lc_enc_info(&l, "broken", v);
            wk_emit(&l);
        }
    } else if (!wk_fd_changed(1)) {
        char m[96];
        int n = snprintf(m, sizeof m, "\n" LC_STDERR_BROKEN "%d\n", code);
        if (write(2, m, (size_t)n) < 0) {}
    }
    _exit(code);
}

/* After the subject ran: are the record pipe and stderr still the driver's? */
static void wk_fds_check(void)
{
    for (int which = 0; which < 2; which++) {
        int code = wk_fd_changed(which);
        if (code) wk_broken(code);
    }
}

/* --- the subject's children ---------------------------------------------- */
/* The worker is the reaper of every process the subject forks (and of their
 * children: PR_SET_CHILD_SUBREAPER): each one's end is a K record, collected
 * after every cycle and, at the end, waited for LC_CHILD_WAIT_S at most (then
 * killed: the K record says signal 9). */
#define LC_CHILD_WAIT_S 5
static pid_t wk_pid;   /* the worker; a forked child is not */

static void wk_children_start(void)
{
    wk_pid = getpid();
    (void)prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
}

static void wk_emit_child(long seq, pid_t pid, int st);

/* Collect the children that ended; returns 1 if none is left. */
static int wk_children_collect(long seq)
{
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid > 0) {
            wk_emit_child(seq, pid, st);
            continue;
        }
        return pid < 0 && errno == ECHILD;
    }
}

/* The children of the worker still running (/proc/self/task/TID/children). */
static void wk_children_kill(void)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/self/task/%ld/children", (long)wk_pid);
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    for (char *save = NULL, *t = strtok_r(buf, " \n", &save); t; t = strtok_r(NULL, " \n", &save))
        kill((pid_t)atol(t), SIGKILL);
}

static void wk_children_end(long seq)
{
    struct timespec pause = {0, 10 * 1000 * 1000};
    for (int i = 0; i < LC_CHILD_WAIT_S * 100; i++) {
        if (wk_children_collect(seq)) return;
        nanosleep(&pause, NULL);
    }
    /* again and again: a child killed here may leave children of its own,
       which come to the worker (its subreaper) only then */
    for (;;) {
        wk_children_kill();
        if (wk_children_collect(seq)) return;
        nanosleep(&pause, NULL);
    }
}

/* --- records ------------------------------------------------------------- */
void wk_emit(const lc_line *l)
{
    if (getpid() != wk_pid) _exit(LC_WK_EXIT_FORKED_CHILD);   /* a forked child never writes records */
    int code = wk_fd_changed(0);
    if (code) wk_broken(code);
    for (size_t off = 0; off < l->n;) {
        ssize_t w = write(LC_RECORD_FD, l->s + off, l->n - off);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EBADF) wk_broken(LC_WK_EXIT_RECORD_CLOSED);
            _exit(LC_WK_EXIT_DRIVER_GONE);
        }
        off += (size_t)w;
    }
}

static void wk_emit_child(long seq, pid_t pid, int st)
{
    lc_line l;
    lc_enc_child(&l, seq, (long)pid, WIFEXITED(st) ? WEXITSTATUS(st) : -1, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    wk_emit(&l);
}

/* RLIMIT_DATA as wk_limits() set it (twice --max-rss), 0 none: an
 * allocation it refused is said as such, else a MemoryError or CPython's
 * "memory allocation failed" would not say that the limit is the tool's. */
static long long wk_data_limit;

void wk_fail(enum lc_error_kind kind, int refused, const char *fmt, ...)
{
    char msg[LC_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (wk_data_limit && n >= 0 && (size_t)n < sizeof msg &&
        (strstr(msg, "MemoryError") || strstr(msg, "memory allocation failed") || strstr(msg, "out of memory")))
        snprintf(msg + n, sizeof msg - (size_t)n,
                 " (the worker's data segment is limited to %lld bytes, RLIMIT_DATA at twice --max-rss; --max-rss 0 "
                 "lifts it)", wk_data_limit);
    lc_line l;
    lc_enc_error(&l, kind, refused, msg);
    wk_emit(&l);
    _exit(LC_WK_EXIT_FAILED);
}

void wk_info(const char *key, const char *fmt, ...)
{
    char value[LC_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof value, fmt, ap);
    va_end(ap);
    lc_line l;
    lc_enc_info(&l, key, value);
    wk_emit(&l);
}

/* The cycle marker on stderr (LC_STDERR_MARK): what the subject writes
 * after it belongs to cycle seq.  The leading newline ends a line the
 * previous cycle left unfinished. */
static void wk_stderr_mark(long seq)
{
    char m[96];
    int n = snprintf(m, sizeof m, "\n" LC_STDERR_MARK "%ld\n", seq);
    fflush(stderr);
    for (int off = 0; off < n;) {
        ssize_t w = write(2, m + off, (size_t)(n - off));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;   /* see the stderr check after the cycle */
        off += (int)w;
    }
}

/* --- one cycle ----------------------------------------------------------- */
static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void new_interpreter(const interp_config *c, PyThreadState **ts)
{
    PyStatus st = interp_config_create(c, ts);
    if (!PyStatus_Exception(st)) return;
    if (c->legacy) {
        char err[LC_MESSAGE_MAX / 2] = "Py_NewInterpreter() returned NULL";
        if (PyErr_Occurred()) wk_describe_exception(err, sizeof err);
        wk_fail(LC_ERR_CONFIG, 0, "cannot create a legacy interpreter: %s", err);
    }
    /* refused = 1: the scan has always shown an isolated interpreter that
       cannot be created as the config refusing the module */
    wk_fail(LC_ERR_CONFIG, 1, "cannot create a %s interpreter: %s%s%s", c->name, st.func ? st.func : "",
            st.func ? ": " : "", st.err_msg ? st.err_msg : "(no message)");
}

static int uses_own_obmalloc(const interp_config *c) { return !c->legacy && !c->use_main_obmalloc; }

/* Cycle seq (1-based) at slot sl of the schedule: B record, create the
 * interpreter, run the subject, end it, C (and O) record.  pass: a cycle of
 * --where's Python-lines pass instead (no record, not measured; the same
 * code path, so that the call stacks are those of the judged cycles):
 * 1 traced by tracemalloc (Python's allocators' sites), 2 with the C trace
 * function that gives C-heap sites their Python line (it changes the
 * interpreter loop's code path, so not in the same cycle as 1). */
static void cycle(const wk_request *q, PyThreadState *main_tstate, long seq, const lc_slot *sl, int pass)
{
    char err[LC_MESSAGE_MAX];
    int64_t v[LC_NVALUES];
    PyThreadState *ts = NULL;
    lc_cycle_id id = {seq, sl->subject ? 'S' : 'B', sl->round, sl->judged};
    lc_line l;
    lc_enc_begin(&l, &id);
    if (!pass) wk_emit(&l), wk_stderr_mark(seq);
    if (q->where) lc_alloc_recheck_tracemalloc();
    int where_obm = !pass && q->where && uses_own_obmalloc(q->config);
    if (where_obm) lc_alloc_obm_begin(PyThreadState_GetInterpreter(main_tstate), (uint32_t)seq);
    if (pass == 1) {
        lc_alloc_set_recording(3);
    } else if (pass == 2) {
        lc_heap_set_recording(3);
    } else if (sl->judged) {
        lc_alloc_set_recording(sl->side == 0 ? 1 : 2);
        lc_heap_set_recording(sl->side == 0 ? 1 : 2);
    }
    int64_t t0 = now_ns();
    new_interpreter(q->config, &ts);
    if (pass == 2) wk_heap_lines_attach();
    int refused = 0;
    int rc = sl->subject ? wk_run_subject(q, err, sizeof err, &refused) : 0;
    Py_EndInterpreter(ts);
    int64_t t1 = now_ns();
    lc_alloc_set_recording(0);
    lc_heap_set_recording(0);
    if (pass == 2) wk_heap_lines_detach();
    int64_t obm = where_obm ? lc_alloc_obm_end() : -1;
    PyThreadState_Swap(main_tstate);
    if (!pass) wk_settle_shared();
    wk_fds_check();
    wk_children_collect(seq);
    /* in an interpreter that is not legacy, a failure may be its refusal */
    if (rc < 0)
        wk_fail(LC_ERR_SUBJECT, refused || !q->config->legacy, "the subject failed in cycle %ld (%s interpreter): %s",
                seq, q->config->name, err);
    if (pass) return;
    wk_reading(q, v);
    v[LC_V_TIME_NS] = t1 - t0;
    lc_enc_cycle(&l, &id, v);
    wk_emit(&l);
    if (obm >= 0) {
        lc_enc_obm(&l, seq, obm);
        wk_emit(&l);
    }
}

/* --- start-up ------------------------------------------------------------ */
static long parse_count(const char *opt_name, const char *s, long min)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < min || v > LC_CYCLES_MAX)
        wk_fail(LC_ERR_USAGE, 0, "%s needs an integer from %ld to %ld, not '%s'", opt_name, min, LC_CYCLES_MAX, s);
    return v;
}

/* One option with its value val (NULL: none given); returns how many
 * arguments it took. */
static int parse_option(wk_request *q, const char *a, const char *val)
{
    static const char *const flags[] = {"--no-baseline", "--no-allocator-wrapper", "--where", "--list-extensions"};
    int *const flag_of[] = {&q->baseline, &q->no_wrapper, &q->where, &q->list_extensions};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
        if (!strcmp(a, flags[i])) {
            *flag_of[i] = i != 0;   /* --no-baseline clears */
            return 1;
        }
    if (!val) {
        if (!strcmp(a, "--config") || !strcmp(a, "--import") || !strcmp(a, "--code") || !strcmp(a, "--file")
            || !strcmp(a, "--cycles") || !strcmp(a, "--warmup") || !strcmp(a, "--driver-pid")
            || !strcmp(a, "--max-rss") || !strcmp(a, "--block") || !strcmp(a, "--early-stop"))
            wk_fail(LC_ERR_USAGE, 0, "option %s needs a value", a);
        wk_fail(LC_ERR_USAGE, 0, "unknown worker option '%s'", a);
    }
    if (!strcmp(a, "--config")) {
        char names[128];
        interp_config_list(names, sizeof names, ", ");
        if (!(q->config = interp_config_find(val))) wk_fail(LC_ERR_USAGE, 0, "unknown config '%s' (%s)", val, names);
    } else if (!strcmp(a, "--import")) {
        if (q->nimports == LC_MAX_IMPORTS) wk_fail(LC_ERR_USAGE, 0, "at most %d --import options", LC_MAX_IMPORTS);
        q->imports[q->nimports++] = val;
    } else if (!strcmp(a, "--code")) {
        q->code = val;
    } else if (!strcmp(a, "--file")) {
        q->file = val;
    } else if (!strcmp(a, "--cycles")) {
        q->cycles = parse_count(a, val, 1);
    } else if (!strcmp(a, "--warmup")) {
        q->warmup = parse_count(a, val, 0);
    } else if (!strcmp(a, "--block")) {
        q->block = parse_count(a, val, 1);
    } else if (!strcmp(a, "--early-stop")) {
        q->early_stop = parse_count(a, val, 1);
    } else if (!strcmp(a, "--driver-pid")) {
        q->driver_pid = parse_count(a, val, 1);
    } else if (!strcmp(a, "--max-rss")) {
        char *end;
        errno = 0;
        q->max_rss = strtoll(val, &end, 10);
        if (errno || *end || end == val || q->max_rss < 0) wk_fail(LC_ERR_USAGE, 0, "--max-rss needs bytes, not '%s'", val);
    } else {
        wk_fail(LC_ERR_USAGE, 0, "unknown worker option '%s'", a);
    }
    return 2;
}

static void parse_args(wk_request *q, int argc, char **argv)
{
    for (int i = 1; i < argc;) i += parse_option(q, argv[i], i + 1 < argc ? argv[i + 1] : NULL);
}

/* AddressSanitizer's shadow memory and quarantine make the data segment
 * tell nothing of the subject: no RLIMIT_DATA under it. */
#if defined(__SANITIZE_ADDRESS__)
#define WK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WK_ASAN 1
#endif
#endif
#ifndef WK_ASAN
#define WK_ASAN 0
#endif

/* The driver watches the worker's resident set (--max-rss) and kills it
 * above the limit; RLIMIT_DATA at twice the limit is the backstop for an
 * allocation faster than its polling (a malloc() that fails there is the
 * subject's MemoryError).  And the worker dies with the driver: the
 * driver's pid checked after PR_SET_PDEATHSIG, since a driver gone before
 * it is set sends no signal. */
static void wk_limits(const wk_request *q)
{
    if (q->driver_pid && getppid() != (pid_t)q->driver_pid) _exit(LC_WK_EXIT_DRIVER_GONE);
    if (q->max_rss > 0 && !WK_ASAN && q->max_rss <= (long long)(RLIM_INFINITY / 4)) {
        struct rlimit rl;
        if (getrlimit(RLIMIT_DATA, &rl) == 0) {
            rlim_t want = (rlim_t)q->max_rss * 2;
            if (rl.rlim_max == RLIM_INFINITY || want < rl.rlim_max) rl.rlim_cur = want;
            if (setrlimit(RLIMIT_DATA, &rl) == 0 && rl.rlim_cur == want) wk_data_limit = (long long)want;
        }
    }
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) wk_fail(LC_ERR_USAGE, 0, "--file %s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) wk_fail(LC_ERR_INTERNAL, 0, "out of memory reading %s", path);
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        cap *= 2;
        buf = realloc(buf, cap);
    }
    if (ferror(f)) wk_fail(LC_ERR_USAGE, 0, "--file %s: read error", path);
    fclose(f);
    buf[n] = 0;
    return buf;
}

static void check_status(PyStatus st, const char *what)
{
    if (PyStatus_Exception(st)) wk_fail(LC_ERR_INTERNAL, 0, "%s: %s", what, st.err_msg ? st.err_msg : "?");
}

static PyThreadState *init_python(const wk_request *q)
{
    /* Anything that would replace the allocators after lc_alloc_install(). */
    static const char *const env[] = {"PYTHONMALLOC", "PYTHONDEVMODE", "PYTHONTRACEMALLOC", "PYTHONMALLOCSTATS"};
    for (size_t i = 0; i < sizeof env / sizeof *env; i++)
        if (getenv(env[i])) {
            wk_info("ignored_environment", "%s", env[i]);
            unsetenv(env[i]);
        }
    if (!q->no_wrapper) lc_alloc_install(q->where);
    if (q->where) lc_heap_where_enable();

    PyPreConfig pre;
    PyPreConfig_InitPythonConfig(&pre);
    pre.allocator = PYMEM_ALLOCATOR_NOT_SET;
    pre.dev_mode = 0;
    check_status(Py_PreInitialize(&pre), "Py_PreInitialize");

    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.parse_argv = 0;
    config.install_signal_handlers = 0;
    config.use_hash_seed = 1;
    config.hash_seed = 0;
    config.dev_mode = 0;
    config.tracemalloc = 0;
    config.buffered_stdio = 0;
    const char *exe = LC_PYTHON_EXECUTABLE;
    if (exe[0] && access(exe, X_OK) == 0)
        check_status(PyConfig_SetBytesString(&config, &config.program_name, exe), "PyConfig");
    PyStatus st = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    check_status(st, "Py_InitializeFromConfig");
    return PyThreadState_Get();
}

static const char *sys_str(const char *name)
{
    PyObject *o = PySys_GetObject(name);   /* borrowed */
    const char *s = o ? PyUnicode_AsUTF8(o) : NULL;
    PyErr_Clear();
    return s ? s : "";
}

static void report_info(const wk_request *q)
{
    wk_info("version", "%s", PY_VERSION);
    wk_info("hexversion", "0x%08lx", (unsigned long)PY_VERSION_HEX);
#ifdef Py_DEBUG
    wk_info("debug", "1");
#else
    wk_info("debug", "0");
#endif
    wk_info("abiflags", "%s", sys_str("abiflags"));
    wk_info("executable", "%s", sys_str("executable"));
    wk_info("compiler", "%s", Py_GetCompiler());
    char configs[128] = "";
    for (int i = 0; i < INTERP_NCONFIGS; i++)
        if (interp_config_available(&interp_configs[i]))
            snprintf(configs + strlen(configs), sizeof configs - strlen(configs), "%s%s", i ? " " : "",
                     interp_configs[i].name);
    wk_info("configs", "%s", configs);
    wk_meters_report(q);
}

/* --early-stop's socket (LC_CONTROL_FD), as it was at the start: a
 * descriptor the subject closed or replaced is not asked (every planned
 * round runs). */
static struct stat wk_control_at_start;

static int control_open(void)
{
    if (fstat(LC_CONTROL_FD, &wk_control_at_start) < 0 || !S_ISSOCK(wk_control_at_start.st_mode)) return 0;
    (void)fcntl(LC_CONTROL_FD, F_SETFD, FD_CLOEXEC);   /* not the subject's exec'd children's */
    return 1;
}

/* The driver's answer: 1 go on, 0 stop.  Anything else (the descriptor
 * gone or replaced, end of file, an unknown byte): go on, and ask no more. */
static int control_ask(int *asking)
{
    struct stat st;
    char c = 0;
    if (fstat(LC_CONTROL_FD, &st) < 0 || st.st_dev != wk_control_at_start.st_dev
        || st.st_ino != wk_control_at_start.st_ino) {
        *asking = 0;
        return 1;
    }
    ssize_t k;
    do k = read(LC_CONTROL_FD, &c, 1);
    while (k < 0 && errno == EINTR);
    if (k == 1 && c == LC_CONTROL_STOP) return 0;
    if (k != 1 || c != LC_CONTROL_GO_ON) *asking = 0;
    return 1;
}

/* Runs the cycles the schedule lists (all from here: --where then sees the
 * same call stacks in subject and bare cycles). */
static void run_cycles(const wk_request *q, PyThreadState *main_tstate)
{
    int64_t v[LC_NVALUES];
    /* 3.11: the shared tables settled (and the interned dict found, which
       reads /proc/self/maps) before the first reading, not in cycle 1 */
    wk_settle_shared();
    wk_reading(q, v);
    v[LC_V_TIME_NS] = 0;
    lc_line l;
    lc_enc_reading(&l, v);
    wk_emit(&l);
    lc_schedule s = lc_schedule_make_block(q->warmup, q->cycles, wk_has_subject(q), q->baseline, q->block);
    long n = lc_schedule_length(&s);
    lc_slot sl = {0};
    int asking = q->early_stop > 0 && control_open();
    /* after the judged cycles, --where's Python-lines pass (LC_PY_PASS_CYCLES
       subject cycles traced by tracemalloc), through the same call */
    int traced = 0, heap = 0;
    for (long i = 0; i < n + (q->where ? LC_PY_PASS_CYCLES + 1 : 0); i++) {
        if (i == n) {
            traced = wk_start_tracemalloc();
            heap = wk_start_heap_lines();
            if (!traced && !heap) break;
            lc_alloc_samples_reset();
            sl.subject = wk_has_subject(q);
        }
        int pass = i < n ? 0 : i < n + LC_PY_PASS_CYCLES ? 1 : 2;
        if ((pass == 1 && !traced) || (pass == 2 && !heap)) continue;
        if (i < n) sl = lc_schedule_at(&s, i);
        cycle(q, main_tstate, i + 1, &sl, pass);
        /* --early-stop: after every q->early_stop judged rounds (k = 1: a
           round ends with its bare cycle), the driver says go on or stop */
        long rounds = sl.round + 1 - q->warmup;
        if (asking && i < n && sl.judged && rounds % q->early_stop == 0 && rounds < q->cycles
            && (!s.paired || !sl.subject)) {
            int go = control_ask(&asking);
            if (!go) {
                s = lc_schedule_make_block(q->warmup, rounds, wk_has_subject(q), q->baseline, q->block);
                n = i + 1;   /* the --where passes, if any, follow from here */
            }
        }
    }
    wk_children_end(lc_schedule_length(&s));
    if (q->where) wk_report_where(&s);
}

int main(int argc, char **argv)
{
    (void)prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);   /* checked in wk_limits() */
    if (fcntl(LC_RECORD_FD, F_GETFD) < 0) {
        fprintf(stderr, "pyfini-leakcheck-worker: started by pyfini-leakcheck only (no record descriptor %d)\n",
                LC_RECORD_FD);
        return 2;
    }
    wk_fds_remember();
    wk_children_start();
    wk_meters_open();
    wk_request q = {.config = &interp_configs[INTERP_LEGACY], .cycles = 100, .warmup = 10, .baseline = 1};
    parse_args(&q, argc, argv);
    wk_limits(&q);
    if (q.early_stop && q.block != 1) wk_fail(LC_ERR_USAGE, 0, "--early-stop needs --block 1");
    if (q.where && q.no_wrapper)
        wk_fail(LC_ERR_USAGE, 0, "--where needs the allocator wrapper (drop --no-allocator-wrapper)");
    if (q.file) q.file_src = read_file(q.file);
    if (PY_VERSION_HEX < q.config->min_hexversion)
        wk_fail(LC_ERR_USAGE, 0, "config '%s' needs CPython %lu.%lu or newer: CPython %s has only legacy interpreters "
                "(Py_NewInterpreter)", q.config->name, q.config->min_hexversion >> 24,
                (q.config->min_hexversion >> 16) & 0xff, PY_VERSION);
    PyThreadState *main_tstate = init_python(&q);
    report_info(&q);
    if (q.list_extensions) {
        wk_list_extensions();
    } else {
        wk_precheck_subject(&q);
        run_cycles(&q, main_tstate);
    }
    lc_line l;
    lc_enc_done(&l);
    wk_emit(&l);
    /* No Py_FinalizeEx(): what the cycles left behind is what was measured,
     * and finalizing it can only add noise (or crash on old versions). */
    _exit(0);
}
