/* run.c - start a worker for a request and gather its records (see
 * shared/lc_protocol.h) into an lc_run. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "driver.h"

extern char **environ;

#define LC_WORKER_ARGS (2 * LC_MAX_IMPORTS + 24)
#define LC_LATE_OUTPUT_S 2   /* output read after the records end (a grandchild may hold the pipe) */
#define LC_POLL_MAX_S 60   /* longest single wait in the read loop, seconds */
/* ... with --scan --jobs N > 1: the thread that takes SIGINT/SIGTERM leaves
   its wait at once, the others see the flag within this */
#define LC_POLL_PARALLEL_S 0.2
#define LC_READ_CHUNK 65536

double lc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *grow(void *p, size_t *cap, size_t need, size_t elsize)
{
    if (need <= *cap) return p;
    size_t c = *cap ? *cap * 2 : 64;
    while (c < need) c *= 2;
    void *q = realloc(p, c * elsize);
    if (!q) {
        fprintf(stderr, "pyfini-leakcheck: out of memory\n");
        exit(3);
    }
    *cap = c;
    return q;
}

/* --- SIGINT, SIGTERM: the run ends, its finished cycles are reported ------- */
static volatile sig_atomic_t lc_interrupt_signal;

static void on_interrupt(int sig) { lc_interrupt_signal = sig; }

int lc_interrupted(void) { return lc_interrupt_signal; }

static void catch_interrupts(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_interrupt;   /* no SA_RESTART: poll() returns EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* --- records -> lc_run ----------------------------------------------------- */
int lc_show_progress(const lc_request *q) { return !q->quiet && isatty(2); }

#define LC_PROGRESS_REDRAW_S 0.1   /* at most 10 redraws per second (and always the last cycle) */

/* One line on stderr, redrawn in place: cycle i/N, cycles/s, ETA and the
 * readings of the bytes meters that are not a part of another one (rss,
 * malloc, py ...), cut to the terminal's width so that it never wraps. */
static void progress(lc_run *r)
{
    if (!r->progress || r->ncyc == 0) return;
    long total = lc_schedule_length(&r->sched);
    double now = lc_now(), elapsed = now - r->started;
    if ((long)r->ncyc < total && now - r->drawn < LC_PROGRESS_REDRAW_S) return;
    r->drawn = now;
    const lc_cycle *c = &r->cyc[r->ncyc - 1];
    double rate = elapsed > 0 ? (double)r->ncyc / elapsed : 0;
    char line[512], eta[32] = "?";
    if (rate > 0) snprintf(eta, sizeof eta, "%.0f s", (double)(total - (long)r->ncyc) / rate);
    int k = snprintf(line, sizeof line, "[pyfini-leakcheck] cycle %zu/%ld%s  %.1f cycles/s  ETA %s", r->ncyc, total,
                     c->id.judged ? "" : " (warm-up)", rate, eta);
    for (size_t i = 0; i < LC_NMETERS && k > 0 && (size_t)k < sizeof line; i++) {
        const lc_meter_def *m = &lc_meters[i];
        if (!m->bytes || strchr(m->name, '.') || c->v[m->value] < 0) continue;
        char b[32];
        lc_fmt_bytes(b, sizeof b, (double)c->v[m->value], 0);
        k += snprintf(line + k, sizeof line - (size_t)k, "  %s %s", m->name, b);
    }
    struct winsize ws;
    size_t width = ioctl(2, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 ? ws.ws_col : 80;
    if (strlen(line) >= width) line[width - 1] = 0;
    fprintf(stderr, "\r\033[K%s", line);
    fflush(stderr);
}

static void take_info(lc_run *r, const char *key, const char *val)
{
    static const struct { const char *key; size_t off, size; } fields[] = {
        {"version", offsetof(lc_run, version), sizeof((lc_run *)0)->version},
        {"abiflags", offsetof(lc_run, abiflags), sizeof((lc_run *)0)->abiflags},
        {"executable", offsetof(lc_run, executable), sizeof((lc_run *)0)->executable},
        {"compiler", offsetof(lc_run, compiler), sizeof((lc_run *)0)->compiler},
        {"configs", offsetof(lc_run, configs), sizeof((lc_run *)0)->configs},
        {"where_symbols", offsetof(lc_run, where_note), sizeof((lc_run *)0)->where_note},
        {"where_python", offsetof(lc_run, where_python), sizeof((lc_run *)0)->where_python},
    };
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        if (!strcmp(key, fields[i].key)) lc_scopy((char *)r + fields[i].off, fields[i].size, val);
    if (!strcmp(key, "debug")) r->debug = atoi(val);
    if (!strcmp(key, "broken")) r->broken = atoi(val);
    if (!strcmp(key, "ignored_environment")) {
        size_t l = strlen(r->ignored_env);
        snprintf(r->ignored_env + l, sizeof r->ignored_env - l, "%s%s", l ? " " : "", val);
    }
}

/* An A record names a meter; "py" stands for all five py* values. */
static void take_avail(lc_run *r, const char *name, int available, const char *how)
{
    static const struct { const char *name; int first, last; } map[] = {
        {"rss", LC_V_RSS, LC_V_RSS},          {"malloc", LC_V_MALLOC, LC_V_MALLOC},
        {"py", LC_V_PY, LC_V_PY_OBMALLOC},    {"blocks", LC_V_BLOCKS, LC_V_BLOCKS},
        {"refs", LC_V_REFS, LC_V_REFS},       {"fds", LC_V_FDS, LC_V_FDS},
        {"heap", LC_V_HEAP, LC_V_HEAP_BLOCKS},
    };
    for (size_t i = 0; i < sizeof map / sizeof *map; i++) {
        if (strcmp(map[i].name, name)) continue;
        for (int v = map[i].first; v <= map[i].last; v++) {
            r->avail[v].known = 1;
            r->avail[v].available = available;
            lc_scopy(r->avail[v].how, sizeof r->avail[v].how, how);
        }
    }
}

static void take_site(lc_run *r, const lc_record *rec)
{
    lc_site s = {0};
    s.id = rec->u.site.site;
    lc_scopy(s.domain, sizeof s.domain, rec->u.site.domain);
    for (int k = 0; k < 2; k++) s.bytes[k] = rec->u.site.bytes[k], s.blocks[k] = rec->u.site.blocks[k];
    s.bytes_per_cycle = lc_schedule_excess(&r->sched, s.bytes[0], s.bytes[1]);
    s.blocks_per_cycle = lc_schedule_excess(&r->sched, s.blocks[0], s.blocks[1]);
    r->sites = grow(r->sites, &r->capsites, r->nsites + 1, sizeof *r->sites);
    r->sites[r->nsites++] = s;
}

/* F and P records: a C frame or a Python line of the last site */
static void take_site_text(lc_run *r, const lc_record *rec)
{
    if (!r->nsites) return;
    lc_site *s = &r->sites[r->nsites - 1];
    if (s->id != rec->u.frame.site) return;
    if (rec->type == 'F' && s->nframes < LC_SITE_FRAMES)
        lc_scopy(s->frames[s->nframes++], sizeof s->frames[0], rec->u.frame.text);
    else if (rec->type == 'P' && s->npyframes < LC_SITE_PYLINES)
        lc_scopy(s->pyframes[s->npyframes++], sizeof s->pyframes[0], rec->u.frame.text);
}

/* A C record is a reading of the run only as its next planned cycle (seq,
 * kind, round, judged as the schedule has them): one out of turn or beyond
 * the schedule (a subject writing to fd 3) is not, and the analysis, which
 * reads the cycles by their place in the schedule, never sees it. */
static int planned_cycle(const lc_run *r, const lc_cycle_id *id)
{
    long i = (long)r->ncyc;
    if (i >= lc_schedule_length(&r->sched) || id->seq != i + 1) return 0;
    lc_slot sl = lc_schedule_at(&r->sched, i);
    return id->kind == (sl.subject ? 'S' : 'B') && id->round == sl.round && id->judged == sl.judged;
}

static void take_cycle(lc_run *r, const lc_record *rec)
{
    if (!planned_cycle(r, &rec->u.cycle.id)) return;
    lc_cycle c = {rec->u.cycle.id, {0}, -1};
    memcpy(c.v, rec->u.cycle.v, sizeof c.v);
    r->cyc = grow(r->cyc, &r->capcyc, r->ncyc + 1, sizeof *r->cyc);
    r->cyc[r->ncyc++] = c;
    progress(r);
}

static void take_extension(lc_run *r, const lc_record *rec)
{
    r->extensions = grow(r->extensions, &r->capextensions, r->nextensions + 1, sizeof *r->extensions);
    lc_scopy(r->extensions[r->nextensions][0], LC_MODULE_NAME_MAX, rec->u.ext.module);
    lc_scopy(r->extensions[r->nextensions][1], LC_MODULE_NAME_MAX, rec->u.ext.path);
    r->nextensions++;
}

static void take_child(lc_run *r, const lc_record *rec)
{
    lc_children *c = &r->children;
    int ex = rec->u.child.exit_code, sig = rec->u.child.signal;
    c->total++;
    if (ex != 0) c->failed++;
    for (size_t i = 0; i < c->nends; i++)
        if (c->ends[i].exit_code == ex && c->ends[i].signal == sig) {
            c->ends[i].count++;
            return;
        }
    if (c->nends == LC_CHILD_ENDS_MAX) {
        c->other_ends++;
        return;
    }
    c->ends[c->nends++] = (lc_child_end){ex, sig, 1, rec->u.child.seq, rec->u.child.pid};
}

static void take_error(lc_run *r, const lc_record *rec)
{
    lc_scopy(r->error_kind, sizeof r->error_kind, lc_error_kind_name(rec->u.error.kind));
    r->error_refused = rec->u.error.refused;
    lc_scopy(r->error, sizeof r->error, rec->u.error.message);
    r->outcome = LC_OUT_ERROR;
}

void lc_run_take_record(lc_run *r, const char *line)
{
    lc_record rec;
    if (lc_decode(line, &rec) < 0) return;   /* not a record: ignored */
    switch (rec.type) {
    case 'I': take_info(r, rec.u.info.key, rec.u.info.value); break;
    case 'A': take_avail(r, rec.u.avail.meter, rec.u.avail.available, rec.u.avail.how); break;
    case 'R':
        memcpy(r->initial, rec.u.reading.v, sizeof r->initial);
        r->have_initial = 1;
        break;
    case 'B': r->begun = rec.u.cycle.id; break;
    case 'C': take_cycle(r, &rec); break;
    case 'O':
        if (r->ncyc && r->cyc[r->ncyc - 1].id.seq == rec.u.obm.seq) r->cyc[r->ncyc - 1].obm = rec.u.obm.blocks;
        break;
    case 'W': take_site(r, &rec); break;
    case 'F':
    case 'P': take_site_text(r, &rec); break;
    case 'X': take_extension(r, &rec); break;
    case 'K': take_child(r, &rec); break;
    case 'E': take_error(r, &rec); break;
    case 'D':   /* done only after every planned cycle: a 'D' the subject wrote to fd 3 is not */
        if ((long)r->ncyc >= r->expected_cycles) r->outcome = LC_OUT_DONE;
        break;
    }
}

/* --- the worker process ---------------------------------------------------- */
static void keep_tail(lc_run *r, const char *buf, size_t n)
{
    size_t cap = sizeof r->output_tail - 1, have = strlen(r->output_tail);
    if (n >= cap) {
        memcpy(r->output_tail, buf + n - cap, cap);
        r->output_tail[cap] = 0;
        return;
    }
    if (have + n > cap) {
        size_t drop = have + n - cap;
        memmove(r->output_tail, r->output_tail + drop, have - drop);
        have -= drop;
    }
    memcpy(r->output_tail + have, buf, n);
    r->output_tail[have + n] = 0;
}

/* The worker's argv for q (pointers into q and into num). */
static void worker_argv(const lc_request *q, char **argv, char num[2][32])
{
    int n = 0;
    argv[n++] = (char *)q->worker;
    if (q->list_extensions) {
        argv[n++] = "--list-extensions";
        argv[n] = NULL;
        return;
    }
    snprintf(num[0], 32, "%ld", q->cycles);
    snprintf(num[1], 32, "%ld", q->warmup);
    argv[n++] = "--config";
    argv[n++] = (char *)q->config->name;
    for (int i = 0; i < q->nimports; i++) argv[n++] = "--import", argv[n++] = (char *)q->imports[i];
    if (q->code) argv[n++] = "--code", argv[n++] = (char *)q->code;
    if (q->file) argv[n++] = "--file", argv[n++] = (char *)q->file;
    argv[n++] = "--cycles";
    argv[n++] = num[0];
    argv[n++] = "--warmup";
    argv[n++] = num[1];
    if (!q->baseline) argv[n++] = "--no-baseline";
    if (q->where) argv[n++] = "--where";
    if (q->no_wrapper) argv[n++] = "--no-allocator-wrapper";
    argv[n] = NULL;
}

/* Start the worker: stdin /dev/null, stdout into out, stderr into err,
 * records into rec. */
static int spawn_worker(lc_run *r, char *const argv[], pid_t *pid, int fds[3])
{
    int recp[2], outp[2], errp[2];
    if (pipe2(recp, O_CLOEXEC) < 0 || pipe2(outp, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0) {
        r->outcome = LC_OUT_SPAWN;
        snprintf(r->error, sizeof r->error, "pipe: %s", strerror(errno));
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, outp[1], 1);
    posix_spawn_file_actions_adddup2(&fa, errp[1], 2);
    posix_spawn_file_actions_adddup2(&fa, recp[1], LC_RECORD_FD);
    int rc = posix_spawn(pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(recp[1]);
    close(outp[1]);
    close(errp[1]);
    fds[0] = recp[0];
    fds[1] = outp[0];
    fds[2] = errp[0];
    if (rc == 0) return 0;
    r->outcome = LC_OUT_SPAWN;
    snprintf(r->error, sizeof r->error, "cannot start %s: %s", argv[0], strerror(rc));
    for (int i = 0; i < 3; i++) close(fds[i]);
    return -1;
}

/* a line of the worker's stderr, into the output tail */
static void tail_line(void *arg, const char *line)
{
    lc_run *r = arg;
    keep_tail(r, line, strlen(line));
    keep_tail(r, "\n", 1);
}

/* Records arrive in pieces: whole lines go to lc_run_take_record. */
typedef struct line_buf {
    char *s;
    size_t len, cap;
} line_buf;

static void feed(lc_run *r, line_buf *lb, const char *buf, size_t k)
{
    for (size_t i = 0; i < k; i++) {
        lb->s = grow(lb->s, &lb->cap, lb->len + 2, 1);
        if (buf[i] != '\n') {
            lb->s[lb->len++] = buf[i];
            continue;
        }
        lb->s[lb->len] = 0;
        lc_run_take_record(r, lb->s);
        lb->len = 0;
    }
}

/* Read the three pipes until the records end (then output for a little
 * longer) or no record came within the timeout; returns 1 on a timeout. */
static int gather(lc_run *r, const int fds[3])
{
    char *buf = malloc(LC_READ_CHUNK);   /* not static: --scan --jobs runs gathers in threads */
    if (!buf) {
        fprintf(stderr, "pyfini-leakcheck: out of memory\n");
        exit(3);
    }
    line_buf lb = {0};
    int open_[3] = {1, 1, 1}, hung = 0;
    double last = lc_now(), rec_closed_at = 0;
    while (open_[0] || open_[1] || open_[2]) {
        if (lc_interrupt_signal) break;
        if (!open_[0] && lc_now() - rec_closed_at > LC_LATE_OUTPUT_S) break;
        struct pollfd p[3];
        for (int i = 0; i < 3; i++) p[i] = (struct pollfd){open_[i] ? fds[i] : -1, POLLIN, 0};
        /* poll at most LC_POLL_MAX_S at a time: a huge --timeout must not
           overflow the int of poll() (the loop re-checks the time left) */
        double left_s = last + r->timeout_s - lc_now();
        double max_s = r->parallel ? LC_POLL_PARALLEL_S : LC_POLL_MAX_S;
        int left_ms = left_s > max_s ? (int)(max_s * 1000) : (int)(left_s * 1000);
        if (left_ms <= 0 && open_[0]) {
            hung = 1;
            break;
        }
        int n = poll(p, 3, open_[0] ? left_ms : (int)(max_s < 1 ? max_s * 1000 : 1000));
        if (n < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (int i = 1; i < 3; i++) {
            if (!p[i].revents) continue;
            ssize_t k = read(fds[i], buf, LC_READ_CHUNK);
            if (k <= 0) open_[i] = 0;
            else if (i == 1) keep_tail(r, buf, (size_t)k);
            else lc_output_feed(&r->err, buf, (size_t)k, tail_line, r);
        }
        if (p[0].revents) {
            ssize_t k = read(fds[0], buf, LC_READ_CHUNK);
            if (k <= 0) {
                open_[0] = 0;
                rec_closed_at = lc_now();
                continue;
            }
            last = lc_now();
            feed(r, &lb, buf, (size_t)k);
        }
    }
    lc_output_end(&r->err, tail_line, r);
    free(lb.s);
    free(buf);
    return hung;
}

/* How it ended, from the records and the exit status. */
static void finish(lc_run *r, pid_t pid, int hung)
{
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (r->progress) fprintf(stderr, "\r\033[K");
    if (WIFSIGNALED(status)) {
        r->signal = WTERMSIG(status);
        r->exit_status = -1;
    } else if (WIFEXITED(status)) {
        r->exit_status = WEXITSTATUS(status);
    }
    if (hung) r->outcome = LC_OUT_HANG;
    else if (r->signal || (r->outcome == LC_OUT_DONE && r->exit_status != 0)) r->outcome = LC_OUT_CRASH;
    else if (r->outcome != LC_OUT_DONE && r->outcome != LC_OUT_ERROR) r->outcome = LC_OUT_CRASH;
}

void lc_run_init(lc_run *r, const lc_request *q, double timeout, int progress_line)
{
    memset(r, 0, sizeof *r);
    r->sched = lc_schedule_make(q->warmup, q->cycles, lc_has_subject(q), q->baseline);
    r->expected_cycles = q->list_extensions ? 0 : lc_schedule_length(&r->sched);
    r->timeout_s = timeout;
    r->progress = progress_line;
    r->parallel = q->jobs > 1;
    r->started = lc_now();
    r->outcome = LC_OUT_CRASH;
    r->exit_status = -1;
    for (int i = 0; i < LC_NVALUES; i++) r->initial[i] = -1;
}

void lc_run_request(lc_run *r, const lc_request *q, double timeout, int progress_line)
{
    lc_run_init(r, q, timeout, progress_line);
    char *argv[LC_WORKER_ARGS], num[2][32];
    worker_argv(q, argv, num);
    pid_t pid;
    int fds[3];
    catch_interrupts();
    if (spawn_worker(r, argv, &pid, fds) < 0) return;
    int hung = gather(r, fds);
    if (hung || lc_interrupt_signal) kill(pid, SIGKILL);
    for (int i = 0; i < 3; i++) close(fds[i]);
    finish(r, pid, hung);
    if (lc_interrupt_signal) {
        r->outcome = LC_OUT_INTERRUPTED;
        r->interrupted = lc_interrupt_signal;
    }
}

void lc_run_free(lc_run *r)
{
    free(r->cyc);
    free(r->sites);
    free(r->extensions);
    lc_output_free(&r->err);
    r->cyc = NULL;
    r->sites = NULL;
    r->extensions = NULL;
}
