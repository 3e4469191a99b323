/* lc_python.c - which worker runs the cycles: the one built with pyfini for
 * the build's CPython, or, for --python X.Y, one compiled once for that
 * CPython into a cache directory (found the way tools/find-pythons finds
 * Pythons: pythonX.Y-config on PATH, then pyenv versions). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lc_driver.h"

extern char **environ;

#ifndef LC_WORKER_PATH
#error LC_WORKER_PATH must name the built worker
#endif

static const char *const worker_sources[] = {"worker.c", "lc_alloc.c", "lc_symbols.c"};

/* Run argv, return its stdout (malloc'd, trailing whitespace removed) or NULL. */
static char *capture(char *const argv[], int *status)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) return NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    if (rc != 0) {
        close(p[0]);
        return NULL;
    }
    size_t n = 0, cap = 4096;
    char *buf = malloc(cap);
    ssize_t k;
    while (buf && (k = read(p[0], buf + n, cap - n - 1)) > 0) {
        n += (size_t)k;
        if (n + 1 == cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
    }
    close(p[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    if (status) *status = st;
    if (!buf) return NULL;
    buf[n] = 0;
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) buf[--n] = 0;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static char *config_query(const char *config, const char *a1, const char *a2)
{
    char *argv[] = {(char *)config, (char *)a1, (char *)a2, NULL};
    return capture(argv, NULL);
}

/* Version (from patchlevel.h) and ABI flags of a python3.X-config. */
static int config_version(const char *config, char *ver, size_t vn, char *abi, size_t an)
{
    char *inc = config_query(config, "--includes", NULL);
    if (!inc) return -1;
    char dir[PATH_MAX] = "";
    if (sscanf(inc, "-I%4095s", dir) != 1) {
        free(inc);
        return -1;
    }
    free(inc);
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/patchlevel.h", dir);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512];
    int ok = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "#define PY_VERSION \"%63[^\"]\"", ver) == 1) {
            ok = 0;
            break;
        }
    fclose(f);
    (void)vn;
    char *a = config_query(config, "--abiflags", NULL);
    snprintf(abi, an, "%s", a ? a : "");
    free(a);
    return ok;
}

/* want: "3.12", "3.14d", "3.12.1", or a path to a python3.X-config. */
static int find_config(const char *want, char *out, size_t n, char *ver, char *abi, char *err, size_t errn)
{
    if (strchr(want, '/')) {
        if (access(want, X_OK) != 0) {
            snprintf(err, errn, "--python %s: not an executable python3.X-config", want);
            return -1;
        }
        if (config_version(want, ver, 64, abi, 16) < 0) {
            snprintf(err, errn, "--python %s: does not answer like a python3.X-config (no headers?)", want);
            return -1;
        }
        snprintf(out, n, "%s", want);
        return 0;
    }
    int major, minor, patch = -1, pos = 0;
    char dbg[4] = "";
    if (sscanf(want, "%d.%d%n", &major, &minor, &pos) < 2) goto bad;
    if (want[pos] == '.') {
        int p2 = 0;
        if (sscanf(want + pos, ".%d%n", &patch, &p2) < 1) goto bad;
        pos += p2;
    }
    if (want[pos] == 'd') dbg[0] = 'd', pos++;
    if (want[pos] != 0 || major != 3 || minor < 11) goto bad;

    char name[64];
    snprintf(name, sizeof name, "python%d.%d%s-config", major, minor, dbg);
    /* candidates: PATH, then pyenv */
    char cands[64][PATH_MAX];
    int nc = 0;
    const char *path = getenv("PATH");
    char *pcopy = strdup(path ? path : "/usr/bin:/bin");
    for (char *save = NULL, *d = strtok_r(pcopy, ":", &save); d && nc < 64; d = strtok_r(NULL, ":", &save)) {
        snprintf(cands[nc], PATH_MAX, "%s/%s", d, name);
        if (access(cands[nc], X_OK) == 0) nc++;
    }
    free(pcopy);
    const char *pyenv = getenv("PYENV_ROOT");
    const char *home = getenv("HOME");
    char pat[PATH_MAX];
    if (pyenv) snprintf(pat, sizeof pat, "%s/versions/*/bin/%s", pyenv, name);
    else snprintf(pat, sizeof pat, "%s/.pyenv/versions/*/bin/%s", home ? home : "/root", name);
    glob_t g;
    if (glob(pat, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc && nc < 64; i++) snprintf(cands[nc++], PATH_MAX, "%s", g.gl_pathv[i]);
        globfree(&g);
    }
    char seen_versions[1024] = "";
    for (int i = 0; i < nc; i++) {
        char v[64] = "", a[16] = "";
        if (config_version(cands[i], v, sizeof v, a, sizeof a) < 0) continue;
        size_t l = strlen(seen_versions);
        snprintf(seen_versions + l, sizeof seen_versions - l, "%s%s%s", l ? ", " : "", v, a);
        if (strcmp(a, dbg) != 0) continue;
        if (patch >= 0) {
            char exact[32];
            snprintf(exact, sizeof exact, "%d.%d.%d", major, minor, patch);
            if (strcmp(v, exact) != 0) continue;
        }
        char *real = realpath(cands[i], NULL);
        int w = snprintf(out, n, "%s", real ? real : cands[i]);
        free(real);
        if (w < 0 || (size_t)w >= n) continue;   /* path too long for out */
        strcpy(ver, v);
        strcpy(abi, a);
        return 0;
    }
    if (seen_versions[0])
        snprintf(err, errn, "--python %s: no such CPython found (found %s via %s)", want, seen_versions, name);
    else
        snprintf(err, errn, "--python %s: no %s on PATH or in pyenv (install python%d.%d%s-dev, or pass the path "
                 "of a python3.X-config)", want, name, major, minor, dbg[0] ? "-dbg" : "");
    return -1;
bad:
    snprintf(err, errn, "--python '%s': expected X.Y, X.Y.Z, X.Yd (debug build) or a path to python3.X-config", want);
    return -1;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static int mkdirs(const char *dir)
{
    char tmp[PATH_MAX];
    lc_scopy(tmp, sizeof tmp, dir);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) < 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    return (mkdir(tmp, 0755) < 0 && errno != EEXIST) ? -1 : 0;
}

/* split a config script's output on blanks into argv (appending) */
static void split_into(char **argv, int *argc, int max, char *s)
{
    for (char *save = NULL, *t = strtok_r(s, " \t\n", &save); t && *argc < max - 1; t = strtok_r(NULL, " \t\n", &save))
        argv[(*argc)++] = t;
}

static int build_worker(const char *config, const char *ver, const char *abi, const char *exe_path,
                        char *err, size_t errn)
{
    char dir[PATH_MAX];
    lc_scopy(dir, sizeof dir, exe_path);
    *strrchr(dir, '/') = 0;
    if (mkdirs(dir) < 0) {
        snprintf(err, errn, "cannot create %s: %s", dir, strerror(errno));
        return -1;
    }
    char *inc = config_query(config, "--includes", NULL);
    char *ld = config_query(config, "--ldflags", "--embed");
    char *eprefix = config_query(config, "--exec-prefix", NULL);
    if (!inc || !ld || !eprefix) {
        snprintf(err, errn, "%s does not answer --includes/--ldflags --embed", config);
        free(inc), free(ld), free(eprefix);
        return -1;
    }
    int major = 0, minor = 0;
    sscanf(ver, "%d.%d", &major, &minor);
    char exe_def[PATH_MAX + 64], srcs[3][PATH_MAX], out_tmp[PATH_MAX + 16], incdir[PATH_MAX + 4];
    snprintf(exe_def, sizeof exe_def, "-DLC_PYTHON_EXECUTABLE=\"%s/bin/python%d.%d%s\"", eprefix, major, minor, abi);
    snprintf(incdir, sizeof incdir, "-I%s", LC_SOURCE_DIR);
    snprintf(out_tmp, sizeof out_tmp, "%s.tmp%d", exe_path, (int)getpid());
    char *argv[256];
    int argc = 0;
    argv[argc++] = (char *)LC_C_COMPILER;
    argv[argc++] = "-std=c11";
    argv[argc++] = "-O2";
    argv[argc++] = "-g";
    argv[argc++] = exe_def;
    argv[argc++] = incdir;
    split_into(argv, &argc, 200, inc);
    for (int i = 0; i < 3; i++) {
        snprintf(srcs[i], PATH_MAX, "%s/%s", LC_SOURCE_DIR, worker_sources[i]);
        argv[argc++] = srcs[i];
    }
    argv[argc++] = "-o";
    argv[argc++] = out_tmp;
    int ld_start = argc;
    split_into(argv, &argc, 220, ld);
    char rpaths[16][PATH_MAX + 16];
    int nr = 0;
    for (int i = ld_start, end = argc; i < end && nr < 16; i++)
        if (!strncmp(argv[i], "-L", 2)) {
            snprintf(rpaths[nr], sizeof rpaths[nr], "-Wl,-rpath,%s", argv[i] + 2);
            argv[argc++] = rpaths[nr++];
        }
    char libs[] = LC_WORKER_LIBS;
    split_into(argv, &argc, 250, libs);
    argv[argc] = NULL;

    char log[PATH_MAX + 8];
    snprintf(log, sizeof log, "%s.log", exe_path);
    fprintf(stderr, "pyfini-leakcheck: building the worker for CPython %s%s (once) in %s\n", ver, abi, dir);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (fd >= 0) {
        posix_spawn_file_actions_adddup2(&fa, fd, 1);
        posix_spawn_file_actions_adddup2(&fa, fd, 2);
    }
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (fd >= 0) close(fd);
    int st = 0;
    if (rc == 0)
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    free(inc), free(ld), free(eprefix);
    if (rc != 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        snprintf(err, errn, "building the worker for CPython %s%s failed (%s); see %s", ver, abi,
                 rc ? strerror(rc) : "compiler error", log);
        unlink(out_tmp);
        return -1;
    }
    if (rename(out_tmp, exe_path) < 0) {
        snprintf(err, errn, "rename %s: %s", out_tmp, strerror(errno));
        return -1;
    }
    return 0;
}

int lc_default_worker(char *out, size_t n, char *err, size_t errn)
{
    if (access(LC_WORKER_PATH, X_OK) == 0) {
        snprintf(out, n, "%s", LC_WORKER_PATH);
        return 0;
    }
    snprintf(err, errn, "the worker %s is missing: rebuild pyfini (cmake --build build)", LC_WORKER_PATH);
    return -1;
}

int lc_worker_for_python(const char *want, char *out, size_t n, char *err, size_t errn)
{
    char config[PATH_MAX], ver[64] = "", abi[16] = "";
    if (find_config(want, config, sizeof config, ver, abi, err, errn) < 0) return -1;
    char *a = realpath(config, NULL), *b = realpath(LC_BUILD_PYTHON_CONFIG, NULL);
    int same = a && b && strcmp(a, b) == 0;
    free(a);
    free(b);
    if (same) return lc_default_worker(out, n, err, errn);

    uint64_t h = 1469598103934665603ull;
    h = fnv(h, config, strlen(config));
    h = fnv(h, LC_VERSION, strlen(LC_VERSION));
    for (int i = 0; i < 3; i++) {
        char p[PATH_MAX];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", LC_SOURCE_DIR, worker_sources[i]);
        if (stat(p, &st) < 0) {
            snprintf(err, errn, "--python %s: the worker's source %s is gone, so no worker can be built for "
                     "CPython %s%s (build pyfini with -DPYFINI_PYTHON_CONFIG=%s instead)", want, p, ver, abi, config);
            return -1;
        }
        h = fnv(h, &st.st_mtim, sizeof st.st_mtim);
        h = fnv(h, &st.st_size, sizeof st.st_size);
    }
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char base[PATH_MAX];
    if (xdg && *xdg) snprintf(base, sizeof base, "%s/pyfini-leakcheck", xdg);
    else snprintf(base, sizeof base, "%s/.cache/pyfini-leakcheck", home && *home ? home : "/tmp");
    int k = snprintf(out, n, "%s/%s%s-%016llx/pyfini-leakcheck-worker", base, ver, abi, (unsigned long long)h);
    if (k < 0 || (size_t)k >= n) {
        snprintf(err, errn, "cache path too long");
        return -1;
    }
    if (access(out, X_OK) == 0) return 0;
    return build_worker(config, ver, abi, out, err, errn);
}
