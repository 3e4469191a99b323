/* lc_run.c - start a worker and gather its records (see lc_protocol.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lc_driver.h"

extern char **environ;

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int value_of_meter(const char *name, int out[5])
{
    static const struct { const char *name; int v[5]; } map[] = {
        {"rss", {LC_V_RSS, -1}},
        {"malloc", {LC_V_MALLOC, -1}},
        {"py", {LC_V_PY, LC_V_PY_RAW, LC_V_PY_MEM, LC_V_PY_OBJ, LC_V_PY_OBMALLOC}},
        {"blocks", {LC_V_BLOCKS, -1}},
        {"refs", {LC_V_REFS, -1}},
        {"fds", {LC_V_FDS, -1}},
    };
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (!strcmp(map[i].name, name)) {
            memcpy(out, map[i].v, sizeof map[i].v);
            if (i != 2) out[1] = out[2] = out[3] = out[4] = -1;
            return 0;
        }
    return -1;
}

static int parse_values(const char *s, int64_t v[LC_NVALUES])
{
    for (int i = 0; i < LC_NVALUES; i++) {
        char *end;
        while (*s == ' ') s++;
        errno = 0;
        v[i] = strtoll(s, &end, 10);
        if (end == s || errno) return -1;
        s = end;
    }
    return 0;
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

static void progress(lc_run *r)
{
    if (!r->progress || r->ncyc == 0) return;
    const lc_cycle *c = &r->cyc[r->ncyc - 1];
    long total = r->warmup + r->cycles;
    fprintf(stderr, "\r\033[K[pyfini-leakcheck] round %ld/%ld%s  %s cycle %.1f ms", c->round + 1, total,
            c->judged ? "" : " (warm-up)", c->kind == 'S' ? "subject" : "bare", (double)c->v[LC_V_TIME_NS] / 1e6);
    fflush(stderr);
}

static void handle_line(lc_run *r, char *line)
{
    char *sp = strchr(line, ' ');
    const char *rest = sp ? sp + 1 : "";
    switch (line[0]) {
    case 'I': {
        char key[64] = "";
        int off = 0;
        if (sscanf(rest, "%63s %n", key, &off) < 1) return;
        const char *val = rest + off;
        if (!strcmp(key, "version")) lc_scopy(r->version, sizeof r->version, val);
        else if (!strcmp(key, "abiflags")) lc_scopy(r->abiflags, sizeof r->abiflags, val);
        else if (!strcmp(key, "executable")) lc_scopy(r->executable, sizeof r->executable, val);
        else if (!strcmp(key, "compiler")) lc_scopy(r->compiler, sizeof r->compiler, val);
        else if (!strcmp(key, "configs")) lc_scopy(r->configs, sizeof r->configs, val);
        else if (!strcmp(key, "debug")) r->debug = atoi(val);
        else if (!strcmp(key, "where_symbols")) lc_scopy(r->where_note, sizeof r->where_note, val);
        else if (!strcmp(key, "where_python")) lc_scopy(r->where_python, sizeof r->where_python, val);
        else if (!strcmp(key, "ignored_environment")) {
            size_t l = strlen(r->ignored_env);
            snprintf(r->ignored_env + l, sizeof r->ignored_env - l, "%s%s", l ? " " : "", val);
        }
        break;
    }
    case 'A': {
        char name[32];
        int avail = 0, off = 0, vals[5];
        if (sscanf(rest, "%31s %d %n", name, &avail, &off) < 2) return;
        if (value_of_meter(name, vals) < 0) return;
        for (int i = 0; i < 5 && vals[i] >= 0; i++) {
            r->avail[vals[i]].known = 1;
            r->avail[vals[i]].available = avail;
            lc_scopy(r->avail[vals[i]].how, sizeof r->avail[vals[i]].how, rest + off);
        }
        break;
    }
    case 'R':
        if (parse_values(rest + 4, r->initial) == 0) r->have_initial = 1;   /* "0 - " */
        break;
    case 'B': {
        char k = 0;
        long round = 0;
        int judged = 0;
        if (sscanf(rest, "%ld %c %ld %d", &r->begun_seq, &k, &round, &judged) == 4) {
            r->begun_kind = k;
            r->begun_round = round;
            r->begun_judged = judged;
        }
        break;
    }
    case 'C': {
        lc_cycle c = {0};
        int off = 0;
        if (sscanf(rest, "%ld %c %ld %d %n", &c.seq, &c.kind, &c.round, &c.judged, &off) < 4) return;
        if (parse_values(rest + off, c.v) < 0) return;
        c.obm = -1;
        r->cyc = grow(r->cyc, &r->capcyc, r->ncyc + 1, sizeof *r->cyc);
        r->cyc[r->ncyc++] = c;
        progress(r);
        break;
    }
    case 'O': {
        long seq;
        int64_t n;
        if (sscanf(rest, "%ld %" SCNd64, &seq, &n) == 2 && r->ncyc && r->cyc[r->ncyc - 1].seq == seq)
            r->cyc[r->ncyc - 1].obm = n;
        break;
    }
    case 'W': {
        lc_site s = {0};
        if (sscanf(rest, "%u %7s %" SCNd64 " %" SCNd64 " %" SCNd64 " %" SCNd64, &s.id, s.domain, &s.bytes[0],
                   &s.blocks[0], &s.bytes[1], &s.blocks[1]) != 6)
            return;
        r->sites = grow(r->sites, &r->capsites, r->nsites + 1, sizeof *r->sites);
        r->sites[r->nsites++] = s;
        break;
    }
    case 'F':   /* "F id k text": a C frame of the last site */
    case 'P': { /* "P id k text": a Python line of the last site */
        unsigned id;
        int k, off = 0;
        if (sscanf(rest, "%u %d %n", &id, &k, &off) < 2 || !r->nsites) return;
        lc_site *s = &r->sites[r->nsites - 1];
        if (s->id != id) return;
        if (line[0] == 'F' && s->nframes < 12)
            lc_scopy(s->frames[s->nframes++], sizeof s->frames[0], rest + off);
        else if (line[0] == 'P' && s->npyframes < 10)
            lc_scopy(s->pyframes[s->npyframes++], sizeof s->pyframes[0], rest + off);
        break;
    }
    case 'X': {
        char name[1024];
        int off = 0;
        if (sscanf(rest, "%1023s %n", name, &off) < 1) return;
        r->extensions = grow(r->extensions, &r->capextensions, r->nextensions + 1, sizeof *r->extensions);
        lc_scopy(r->extensions[r->nextensions][0], 1024, name);
        lc_scopy(r->extensions[r->nextensions][1], 1024, rest + off);
        r->nextensions++;
        break;
    }
    case 'E': {
        int off = 0;
        sscanf(rest, "%31s %n", r->error_kind, &off);
        lc_scopy(r->error, sizeof r->error, rest + off);
        r->outcome = LC_OUT_ERROR;
        break;
    }
    case 'D':
        r->outcome = LC_OUT_DONE;
        break;
    default:
        break;
    }
}

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

void lc_run_worker(lc_run *r, char *const argv[])
{
    int recp[2], outp[2];
    r->outcome = LC_OUT_CRASH;
    r->exit_status = -1;
    r->begun_seq = 0;
    for (int i = 0; i < LC_NVALUES; i++) r->initial[i] = -1;
    if (pipe2(recp, O_CLOEXEC) < 0 || pipe2(outp, O_CLOEXEC) < 0) {
        r->outcome = LC_OUT_SPAWN;
        snprintf(r->error, sizeof r->error, "pipe: %s", strerror(errno));
        return;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, outp[1], 1);
    posix_spawn_file_actions_adddup2(&fa, outp[1], 2);
    posix_spawn_file_actions_adddup2(&fa, recp[1], LC_RECORD_FD);
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(recp[1]);
    close(outp[1]);
    if (rc != 0) {
        r->outcome = LC_OUT_SPAWN;
        snprintf(r->error, sizeof r->error, "cannot start %s: %s", argv[0], strerror(rc));
        close(recp[0]);
        close(outp[0]);
        return;
    }
    char *line = NULL;
    size_t len = 0, cap = 0;
    int rec_open = 1, out_open = 1, hung = 0;
    double last = mono_s(), rec_closed_at = 0;
    while (rec_open || out_open) {
        /* output after the records end: at most 2 s more (a grandchild may hold it) */
        if (!rec_open && mono_s() - rec_closed_at > 2) break;
        struct pollfd p[2] = {{rec_open ? recp[0] : -1, POLLIN, 0}, {out_open ? outp[0] : -1, POLLIN, 0}};
        int left_ms = (int)((last + r->timeout_s - mono_s()) * 1000);
        if (left_ms <= 0 && rec_open) {
            kill(pid, SIGKILL);
            hung = 1;
            break;
        }
        int n = poll(p, 2, rec_open ? left_ms : 1000);
        if (n < 0) {
            if (errno == EINTR) continue;
            break;
        }
        char buf[65536];
        if (p[1].revents) {
            ssize_t k = read(outp[0], buf, sizeof buf);
            if (k <= 0) out_open = 0;
            else keep_tail(r, buf, (size_t)k);
        }
        if (p[0].revents) {
            ssize_t k = read(recp[0], buf, sizeof buf);
            if (k <= 0) {
                rec_open = 0;
                rec_closed_at = mono_s();
                continue;
            }
            last = mono_s();
            for (ssize_t i = 0; i < k; i++) {
                if (buf[i] == '\n') {
                    line = grow(line, &cap, len + 1, 1);
                    line[len] = 0;
                    handle_line(r, line);
                    len = 0;
                } else {
                    line = grow(line, &cap, len + 2, 1);
                    line[len++] = buf[i];
                }
            }
        }
    }
    free(line);
    close(recp[0]);
    close(outp[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (r->progress) fprintf(stderr, "\r\033[K");
    if (WIFSIGNALED(status)) {
        r->signal = WTERMSIG(status);
        r->exit_status = -1;
    } else if (WIFEXITED(status)) {
        r->exit_status = WEXITSTATUS(status);
    }
    if (hung) {
        r->outcome = LC_OUT_HANG;
    } else if (r->signal || (r->outcome == LC_OUT_DONE && r->exit_status != 0)) {
        r->outcome = LC_OUT_CRASH;
    } else if (r->outcome != LC_OUT_DONE && r->outcome != LC_OUT_ERROR) {
        r->outcome = LC_OUT_CRASH;
    }
}

void lc_run_free(lc_run *r)
{
    free(r->cyc);
    free(r->sites);
    free(r->extensions);
    r->cyc = NULL;
    r->sites = NULL;
    r->extensions = NULL;
}
