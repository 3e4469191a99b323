/* run.c - start a worker for a request and gather its records (see
 * shared/lc_protocol.h) into an lc_run. */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
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
#define LC_RSS_POLL_S 0.02   /* --max-rss: the worker's VmRSS is read this often while records are awaited */
#define LC_GROUP_END_S 2     /* longest wait for the killed worker's group to be gone */

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

/* --- SIGINT, SIGTERM, SIGHUP: the run ends, its finished cycles are reported */
/* SIGHUP too: a closed terminal or ssh session must not leave what the
   subject started running (its default action skips every kill of ours). */
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
    sigaction(SIGHUP, &sa, NULL);
}

/* --- records -> lc_run ----------------------------------------------------- */
int lc_show_progress(const lc_request *q) { return !q->quiet && isatty(2); }

#define LC_PROGRESS_REDRAW_S 0.1   /* at most 10 redraws per second (and always the last cycle) */

/* One line on stderr, redrawn in place: cycle i/N and what N counts, cycles/s, ETA and the
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
    char line[512], eta[32] = "?", what[96] = "", warm[40] = "";
    if (rate > 0) snprintf(eta, sizeof eta, "%.0f s", (double)(total - (long)r->ncyc) / rate);
    /* what N counts: the rounds of --warmup and --cycles, two cycles each
       (subject, bare) in a paired run: "= 2 x (5 warm-up + 40)" */
    if (r->sched.warmup > 0) snprintf(warm, sizeof warm, "%ld warm-up + ", r->sched.warmup);
    if (r->sched.paired)
        snprintf(what, sizeof what, " = 2 x (%s%ld)", warm, r->sched.cycles);
    else if (warm[0])
        snprintf(what, sizeof what, " = %s%ld", warm, r->sched.cycles);
    int k = snprintf(line, sizeof line, "[pyfini-leakcheck] cycle %zu/%ld%s%s  %.1f cycles/s  ETA %s", r->ncyc,
                     total, what, c->id.judged ? "" : " (warm-up)", rate, eta);
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
    if (!strncmp(key, "whose", 5)) lc_whose_take_info(r, key, val);
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

_Static_assert(LC_RUN_SIG_MAX >= LC_NMETERS + 1, "lc_run.last_sig holds every meter's verdict and the run's");

/* --early-stop: the verdict of the run so far, as the final analysis
 * would give it: -1 undecided (not judged), else LC_LEAK or LC_NO_LEAK;
 * sig = every meter's verdict and the run's. */
static int verdict_so_far(const lc_run *r, int sig[LC_RUN_SIG_MAX])
{
    analysis a;
    lc_analyse(r, &a, r->max_bytes);
    int v = a.leak || r->err.leak_reports ? LC_LEAK : a.no_leak ? LC_NO_LEAK : -1;
    memset(sig, 0, sizeof(int) * LC_RUN_SIG_MAX);
    for (size_t i = 0; i < LC_NMETERS; i++) sig[i] = a.m[i].def->exact && a.m[i].available ? (int)a.m[i].verdict : -2;
    sig[LC_NMETERS] = v;
    return v;
}

/* The control socket is of no more use: the worker, reading end of file
 * or never asking again, runs every planned round. */
static void early_stop_lost(lc_run *r)
{
    if (r->ctl_fd < 0) return;
    close(r->ctl_fd);
    r->ctl_fd = -1;
    r->control_lost = 1;
}

/* After a cycle record: at a checkpoint (every LC_EARLY_STOP_ROUNDS judged
 * rounds, the last planned one excepted) tell the worker to stop when the
 * run's verdict is decided and it and every exact meter's verdict are what
 * the previous checkpoint said; else to go on. */
static void early_stop_check(lc_run *r)
{
    long warm = lc_schedule_warmup_length(&r->sched), per = r->sched.paired ? 2 : 1;
    long judged = (long)r->ncyc - warm;
    if (r->ctl_fd < 0 || judged <= 0 || judged % (per * LC_EARLY_STOP_ROUNDS) != 0) return;
    long rounds = judged / per;
    if (rounds >= r->rounds_cap) return;
    int sig[LC_RUN_SIG_MAX];
    int v = verdict_so_far(r, sig);
    int stop = v >= 0 && r->have_last_sig && !memcmp(sig, r->last_sig, sizeof sig);
    memcpy(r->last_sig, sig, sizeof sig);
    r->have_last_sig = 1;
    char c = stop ? LC_CONTROL_STOP : LC_CONTROL_GO_ON;
    /* never blocking: in step there is at most one unread byte; a full
       buffer means the worker stopped asking (the subject replaced its
       descriptor while another process holds the socket) - as a lost peer */
    if (send(r->ctl_fd, &c, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {   /* the worker runs to the cap */
        early_stop_lost(r);
        return;
    }
    r->checkpoints++;
    if (!stop) return;
    r->stopped_at = rounds;
    r->sched = lc_schedule_make_block(r->sched.warmup, rounds, r->sched.subject, r->sched.paired,
                                      r->sched.block);
    r->expected_cycles = lc_schedule_length(&r->sched);
}

static void take_cycle(lc_run *r, const lc_record *rec)
{
    if (!planned_cycle(r, &rec->u.cycle.id)) {
        /* out of step (a subject writing to the record descriptor): no
           checkpoint can be judged any more - let the worker run to the
           cap instead of waiting for an answer (a hang after --timeout) */
        if (rec->u.cycle.id.seq > (long)r->ncyc) early_stop_lost(r);
        return;
    }
    lc_cycle c = {rec->u.cycle.id, {0}, -1};
    memcpy(c.v, rec->u.cycle.v, sizeof c.v);
    r->cyc = grow(r->cyc, &r->capcyc, r->ncyc + 1, sizeof *r->cyc);
    r->cyc[r->ncyc++] = c;
    early_stop_check(r);
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
    if (have + n > cap) r->tail_cut = 1;
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
static void worker_argv(const lc_request *q, char **argv, char num[4][32])
{
    int n = 0;
    argv[n++] = (char *)q->worker;
    /* the driver's pid: the worker checks it after PR_SET_PDEATHSIG (a
       driver gone before that is not signalled); its memory backstop */
    snprintf(num[2], 32, "%ld", (long)getpid());
    argv[n++] = "--driver-pid";
    argv[n++] = num[2];
    snprintf(num[3], 32, "%lld", q->max_rss);
    argv[n++] = "--max-rss";
    argv[n++] = num[3];
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
    if (q->early_stop) {   /* blocks of 1: a run stopped after any round is whole */
        _Static_assert(LC_EARLY_STOP_ROUNDS == 5, "the worker's --early-stop argument below");
        argv[n++] = "--block";
        argv[n++] = "1";
        argv[n++] = "--early-stop";
        argv[n++] = "5";   /* a literal: --scan --jobs builds argvs in threads */
    }
    if (q->where) argv[n++] = "--where";
    if (q->no_wrapper) argv[n++] = "--no-allocator-wrapper";
    argv[n] = NULL;
}

/* --- the worker's process group -------------------------------------------- */
/* Every worker leads a process group of its own (POSIX_SPAWN_SETPGROUP: set
 * before it runs a single instruction, so no kill(-pgid) ever misses it):
 * what the subject starts without setsid() - fork, subprocess, os.system's
 * "cmd &", their children - is in it.  The driver kills the whole group
 * (kill(-pgid, SIGKILL)) whenever a run ends: timeout, memory limit,
 * interrupt, the worker's own end, and this process's exit (atexit).  It is
 * a subreaper (PR_SET_CHILD_SUBREAPER), so the group's orphans become its
 * children and it reaps them; the worker, a zombie until then, is reaped
 * last, so its pid - the group's id - cannot be reused meanwhile.  A process
 * that left the group (setsid(), setpgid()) is out of the group's reach, but
 * comes to the driver when its parent ends: killed too (sweep_orphans).  A
 * driver killed by SIGKILL kills nothing (the worker ends by
 * PR_SET_PDEATHSIG, what the subject started stays). */
typedef struct lc_worker {
    pid_t pid;      /* also the group's id */
    int pidfd;      /* pidfd_open() (Linux 5.3): readable when it ended; -1: waitid polling */
    int ended;      /* it ended (a zombie: not reaped yet) */
} lc_worker;

#define LC_GROUPS_MAX 1024   /* workers running at once (--scan --jobs) that atexit kills */
static pid_t live_groups[LC_GROUPS_MAX];
static pthread_mutex_t groups_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t groups_once = PTHREAD_ONCE_INIT;

static void kill_live_groups(void)   /* atexit: a driver that exits mid-run (out of memory) */
{
    for (int i = 0; i < LC_GROUPS_MAX; i++)
        if (live_groups[i] > 0) kill(-live_groups[i], SIGKILL);
}

/* What was this process's before its first worker: the children it had
 * (a shell's "cmd & exec pyfini-leakcheck" leaves cmd to it) and the time
 * (clock ticks since boot, as /proc/PID/stat's starttime): sweep_orphans()
 * leaves those alone - they are not the run's.  An inherited child is never
 * reaped by us, so its pid stays its own. */
#define LC_INHERITED_MAX 256
static pid_t inherited[LC_INHERITED_MAX];
static int ninherited;
static unsigned long long groups_start_ticks;

static int proc_stat(pid_t pid, long *ppid, long *pgrp, unsigned long long *start);

static unsigned long long boot_ticks(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_BOOTTIME, &ts) < 0) return 0;
    long hz = sysconf(_SC_CLK_TCK);
    return (unsigned long long)ts.tv_sec * (unsigned long long)(hz > 0 ? hz : 100) +
           (unsigned long long)ts.tv_nsec / (1000000000ULL / (unsigned long long)(hz > 0 ? hz : 100));
}

static void groups_init(void)
{
    atexit(kill_live_groups);
    groups_start_ticks = boot_ticks();
    pid_t self = getpid();
    DIR *d = opendir("/proc");
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        pid_t pid = (pid_t)atol(e->d_name);
        long ppid, pgrp;
        if (proc_stat(pid, &ppid, &pgrp, NULL) == 0 && ppid == (long)self && ninherited < LC_INHERITED_MAX)
            inherited[ninherited++] = pid;
    }
    if (d) closedir(d);
    (void)prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
}

static int not_the_runs(pid_t pid, unsigned long long start)
{
    for (int i = 0; i < ninherited; i++)
        if (inherited[i] == pid) return 1;
    return start < groups_start_ticks;   /* started before any worker could have */
}

static void group_live_locked(pid_t g, int live)
{
    for (int i = 0; i < LC_GROUPS_MAX; i++)
        if (live ? live_groups[i] == 0 : live_groups[i] == g) {
            live_groups[i] = live ? g : 0;
            break;
        }
}

static int open_pidfd(pid_t pid)
{
#ifdef SYS_pidfd_open
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd >= 0) fcntl(fd, F_SETFD, FD_CLOEXEC);
    return fd;
#else
    (void)pid;
    return -1;
#endif
}

/* Has the worker ended?  Without a pidfd: waitid(WNOHANG | WNOWAIT), which
 * leaves it a zombie. */
static int worker_ended(lc_worker *w)
{
    if (w->ended || w->pidfd >= 0) return w->ended;
    siginfo_t si;
    memset(&si, 0, sizeof si);
    if (waitid(P_PID, (id_t)w->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == w->pid) w->ended = 1;
    return w->ended;
}

/* /proc/PID/file into buf (NUL-terminated); its length, -1 gone. */
static ssize_t read_proc(pid_t pid, const char *file, char *buf, size_t n)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/%s", (long)pid, file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t k = read(fd, buf, n - 1);
    close(fd);
    if (k <= 0) return -1;
    buf[k] = 0;
    return k;
}

/* The worker's resident set (VmRSS of /proc/PID/status), bytes; -1 unknown. */
static long long worker_rss(pid_t pid)
{
    char buf[4096];
    if (read_proc(pid, "status", buf, sizeof buf) < 0) return -1;
    const char *v = strstr(buf, "\nVmRSS:");
    long long kb;
    return v && sscanf(v + 7, "%lld", &kb) == 1 ? kb * 1024 : -1;
}

/* A process's parent, process group and (start not NULL) start time in
 * clock ticks since boot (/proc/PID/stat, fields 4, 5 and 22); 0 or -1 gone. */
static int proc_stat(pid_t pid, long *ppid, long *pgrp, unsigned long long *start)
{
    char buf[1024], state;
    if (read_proc(pid, "stat", buf, sizeof buf) < 0) return -1;
    const char *rp = strrchr(buf, ')');   /* after the command's name, which may hold anything */
    if (!rp) return -1;
    if (!start) return sscanf(rp + 1, " %c %ld %ld", &state, ppid, pgrp) == 3 ? 0 : -1;
    return sscanf(rp + 1, " %c %ld %ld %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu",
                  &state, ppid, pgrp, start) == 4 ? 0 : -1;
}

/* The processes of group g other than its leader: how many are there;
 * those that are this process's children and ended are reaped (killed:
 * counted in r->group_killed). */
static int group_reap(lc_run *r, pid_t g)
{
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int there = 0;
    pid_t self = getpid();
    for (struct dirent *e; (e = readdir(d));) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        pid_t pid = (pid_t)atol(e->d_name);
        long ppid, pgrp;
        if (pid == g || proc_stat(pid, &ppid, &pgrp, NULL) < 0 || pgrp != (long)g) continue;
        int st;
        if (ppid == (long)self && waitpid(pid, &st, WNOHANG) == pid) {
            if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) r->group_killed++;
            continue;
        }
        there++;
    }
    closedir(d);
    return there;
}

/* This process's children other than its workers (live_groups): what
 * left a worker's group (setsid(), setpgid()) and came to the driver, a
 * subreaper, when its parent ended - a run's leftovers, since the driver's
 * only other children are python.c's compilers, run and waited for before
 * any worker, and what it had before its first worker (not_the_runs: left
 * alone).  Killed and reaped (r->escaped_killed) until none is left (a
 * killed one's children come next), LC_GROUP_END_S at most.  Under
 * groups_lock, which spawn_worker() holds from posix_spawn() until the new
 * worker is in live_groups. */
static void sweep_orphans(lc_run *r)
{
    struct timespec pause = {0, 2 * 1000 * 1000};
    pid_t self = getpid();
    for (double t0 = lc_now(); lc_now() - t0 < LC_GROUP_END_S; nanosleep(&pause, NULL)) {
        int there = 0;
        pthread_mutex_lock(&groups_lock);
        DIR *d = opendir("/proc");
        for (struct dirent *e; d && (e = readdir(d));) {
            if (!isdigit((unsigned char)e->d_name[0])) continue;
            pid_t pid = (pid_t)atol(e->d_name);
            long ppid, pgrp;
            unsigned long long start;
            if (proc_stat(pid, &ppid, &pgrp, &start) < 0 || ppid != (long)self || not_the_runs(pid, start)) continue;
            int worker = 0;
            for (int i = 0; i < LC_GROUPS_MAX && !worker; i++) worker = live_groups[i] == pid;
            if (worker) continue;
            int st;
            kill(pid, SIGKILL);
            if (waitpid(pid, &st, WNOHANG) == pid) {
                if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) r->escaped_killed++;
            } else {
                there++;
            }
        }
        if (d) closedir(d);
        pthread_mutex_unlock(&groups_lock);
        if (!there) break;
    }
}

/* The run is over: the worker's whole group killed and gone (what the
 * subject left running, up to LC_GROUP_END_S), then the worker reaped. */
static void end_worker(lc_run *r, lc_worker *w, int *status)
{
    siginfo_t si;
    kill(-w->pid, SIGKILL);
    for (;;) {   /* the worker dead, still a zombie: the group's id stays ours */
        memset(&si, 0, sizeof si);
        int rc = w->pidfd >= 0 ? waitid(P_PIDFD, (id_t)w->pidfd, &si, WEXITED | WNOWAIT)
                               : waitid(P_PID, (id_t)w->pid, &si, WEXITED | WNOWAIT);
        if (rc == 0 || errno != EINTR) break;
    }
    struct timespec pause = {0, 2 * 1000 * 1000};
    for (double t0 = lc_now(); group_reap(r, w->pid) && lc_now() - t0 < LC_GROUP_END_S;) {
        kill(-w->pid, SIGKILL);
        nanosleep(&pause, NULL);
    }
    pthread_mutex_lock(&groups_lock);   /* reaped and out of live_groups at once (see sweep_orphans) */
    while (waitpid(w->pid, status, 0) < 0 && errno == EINTR) {}
    group_live_locked(w->pid, 0);
    pthread_mutex_unlock(&groups_lock);
    if (w->pidfd >= 0) close(w->pidfd);
    sweep_orphans(r);
}

/* Start the worker: stdin /dev/null, stdout into out, stderr into err,
 * records into rec; its own process group, every signal at its default and
 * none blocked (a signal the driver was started ignoring is not ignored by
 * the subject). */
static int spawn_worker(lc_run *r, char *const argv[], lc_worker *w, int fds[3])
{
    pthread_once(&groups_once, groups_init);
    int p[4][2] = {{-1, -1}, {-1, -1}, {-1, -1}, {-1, -1}}, *recp = p[0], *outp = p[1], *errp = p[2], *ctl = p[3];
    const char *what = "pipe";
    if (pipe2(recp, O_CLOEXEC) < 0 || pipe2(outp, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0
        || (r->rounds_cap && (what = "socketpair", socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctl) < 0))) {
        int e = errno;
        for (int i = 0; i < 4; i++)   /* what was opened before the failure */
            for (int j = 0; j < 2; j++)
                if (p[i][j] >= 0) close(p[i][j]);
        r->outcome = LC_OUT_SPAWN;
        snprintf(r->error, sizeof r->error, "%s: %s", what, strerror(e));
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, outp[1], 1);
    posix_spawn_file_actions_adddup2(&fa, errp[1], 2);
    posix_spawn_file_actions_adddup2(&fa, recp[1], LC_RECORD_FD);
    if (ctl[1] >= 0) posix_spawn_file_actions_adddup2(&fa, ctl[1], LC_CONTROL_FD);
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    sigdelset(&all, SIGKILL);
    sigdelset(&all, SIGSTOP);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &all);
    posix_spawnattr_setpgroup(&at, 0);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    pthread_mutex_lock(&groups_lock);
    int rc = posix_spawn(&w->pid, argv[0], &fa, &at, argv, environ);
    if (rc == 0) group_live_locked(w->pid, 1);
    pthread_mutex_unlock(&groups_lock);
    posix_spawnattr_destroy(&at);
    posix_spawn_file_actions_destroy(&fa);
    close(recp[1]);
    close(outp[1]);
    close(errp[1]);
    if (ctl[1] >= 0) close(ctl[1]);
    r->ctl_fd = rc == 0 ? ctl[0] : -1;
    if (rc != 0 && ctl[0] >= 0) close(ctl[0]);
    fds[0] = recp[0];
    fds[1] = outp[0];
    fds[2] = errp[0];
    if (rc == 0) {
        w->pidfd = open_pidfd(w->pid);   /* our child, not reaped: its pid is still its own */
        w->ended = 0;
        return 0;
    }
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

enum gather_end { GATHER_DONE, GATHER_HUNG, GATHER_MEMORY, GATHER_INTERRUPTED };

/* Read the three pipes until the worker ended and its output closed (or
 * LC_LATE_OUTPUT_S after its end or the end of the records: a process that
 * left the group may hold a pipe), or no record came within the timeout;
 * with --max-rss, the worker's resident set is read every LC_RSS_POLL_S. */
static enum gather_end gather(lc_run *r, const int fds[3], lc_worker *w)
{
    char *buf = malloc(LC_READ_CHUNK);   /* not static: --scan --jobs runs gathers in threads */
    if (!buf) {
        fprintf(stderr, "pyfini-leakcheck: out of memory\n");
        exit(3);
    }
    line_buf lb = {0};
    int open_[3] = {1, 1, 1}, killed = 0;
    enum gather_end end = GATHER_DONE;
    double last = lc_now(), over_at = 0, rss_at = 0;
    for (;;) {
        if (lc_interrupt_signal) {
            end = GATHER_INTERRUPTED;
            break;
        }
        double now = lc_now();
        if ((worker_ended(w) || !open_[0]) && !over_at) over_at = now;
        if (!open_[0] && !open_[1] && !open_[2] && worker_ended(w)) break;
        if (over_at && worker_ended(w) && now - over_at > LC_LATE_OUTPUT_S) break;
        /* no record within the timeout, and the worker has not ended (also
           after the records closed: a subject that closed fd 3 and went on) */
        double left_s = last + r->timeout_s - now;
        if (left_s <= 0 && !worker_ended(w)) {
            end = GATHER_HUNG;
            break;
        }
        if (r->max_rss > 0 && !worker_ended(w) && now - rss_at >= LC_RSS_POLL_S) {
            rss_at = now;
            long long rss = worker_rss(w->pid);
            if (rss > r->max_rss) {
                r->rss_at_kill = rss;
                end = GATHER_MEMORY;
                break;
            }
        }
        struct pollfd p[4];
        for (int i = 0; i < 3; i++) p[i] = (struct pollfd){open_[i] ? fds[i] : -1, POLLIN, 0};
        p[3] = (struct pollfd){w->pidfd >= 0 && !w->ended ? w->pidfd : -1, POLLIN, 0};
        /* poll at most LC_POLL_MAX_S at a time: a huge --timeout must not
           overflow the int of poll() (the loop re-checks the time left) */
        double max_s = r->parallel ? LC_POLL_PARALLEL_S : LC_POLL_MAX_S;
        if (over_at) max_s = max_s < 1 ? max_s : 1;
        if (w->pidfd < 0 && max_s > 0.1) max_s = 0.1;   /* no pidfd: waitid polling */
        if (r->max_rss > 0 && max_s > LC_RSS_POLL_S) max_s = LC_RSS_POLL_S;
        double wait_s = left_s > max_s ? max_s : left_s;
        int n = poll(p, 4, wait_s > 0 ? (int)(wait_s * 1000) + 1 : 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (p[3].revents) w->ended = 1;
        if (w->ended && !killed) {   /* what it left running: killed now, so that the pipes close */
            killed = 1;
            kill(-w->pid, SIGKILL);
        }
        for (int i = 1; i < 3; i++) {
            if (!p[i].revents) continue;
            ssize_t k = read(fds[i], buf, LC_READ_CHUNK);
            if (k <= 0) {
                open_[i] = 0;
                continue;
            }
            if (i == 1) {
                r->stdout_bytes += k;
                keep_tail(r, buf, (size_t)k);
            } else {
                r->stderr_bytes += k;
                lc_output_feed(&r->err, buf, (size_t)k, tail_line, r);
            }
        }
        if (p[0].revents) {
            ssize_t k = read(fds[0], buf, LC_READ_CHUNK);
            if (k <= 0) {
                open_[0] = 0;
                continue;
            }
            last = lc_now();
            feed(r, &lb, buf, (size_t)k);
        }
    }
    lc_output_end(&r->err, tail_line, r);
    free(lb.s);
    free(buf);
    return end;
}

/* How it ended, from the records and the exit status. */
static void finish(lc_run *r, int status, enum gather_end end)
{
    if (r->progress) fprintf(stderr, "\r\033[K");
    if (WIFSIGNALED(status)) {
        r->signal = WTERMSIG(status);
        r->exit_status = -1;
    } else if (WIFEXITED(status)) {
        r->exit_status = WEXITSTATUS(status);
    }
    if (end == GATHER_HUNG) r->outcome = LC_OUT_HANG;
    else if (end == GATHER_MEMORY) r->outcome = LC_OUT_MEMORY;
    else if (r->signal || (r->outcome == LC_OUT_DONE && r->exit_status != 0)) r->outcome = LC_OUT_CRASH;
    else if (r->outcome != LC_OUT_DONE && r->outcome != LC_OUT_ERROR) r->outcome = LC_OUT_CRASH;
}

void lc_run_init(lc_run *r, const lc_request *q, double timeout, int progress_line)
{
    memset(r, 0, sizeof *r);
    r->sched = lc_schedule_make_block(q->warmup, q->cycles, lc_has_subject(q), q->baseline, q->early_stop ? 1 : 0);
    r->ctl_fd = -1;
    r->max_bytes = q->max_bytes;
    r->rounds_cap = q->early_stop && !q->list_extensions ? q->cycles : 0;
    r->expected_cycles = q->list_extensions ? 0 : lc_schedule_length(&r->sched);
    r->timeout_s = timeout;
    r->max_rss = q->max_rss;
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
    char *argv[LC_WORKER_ARGS], num[4][32];
    worker_argv(q, argv, num);
    lc_worker w = {0};
    int fds[3];
    catch_interrupts();
    if (spawn_worker(r, argv, &w, fds) < 0) return;
    enum gather_end end = gather(r, fds, &w);
    int status = 0;
    end_worker(r, &w, &status);   /* the whole group killed, whatever the end */
    for (int i = 0; i < 3; i++) close(fds[i]);
    if (r->ctl_fd >= 0) close(r->ctl_fd);
    r->ctl_fd = -1;
    finish(r, status, end);
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
