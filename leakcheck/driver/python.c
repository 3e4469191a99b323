/* python.c - which worker runs the cycles: the one built with pyfini for
 * the build's CPython, or, for --python X.Y, one compiled once for that
 * CPython into a cache directory (found and chosen as tools/find-pythons
 * --choose X.Y does: pythonX.Y-config on PATH, then pyenv versions, the
 * newest; the test leakcheck.python_choice compares the two). */
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

#include "driver.h"

extern char **environ;

#ifndef LC_WORKER_PATH
#error LC_WORKER_PATH must name the built worker
#endif

/* Where the worker and its sources are: in the build tree (the paths named
 * at build time) when this is the tool the build made (LC_BUILD_TOOL_PATH),
 * else in an installed copy (cmake --install), at fixed places relative to
 * the tool's own directory: LC_INSTALL_WORKER_REL, LC_INSTALL_SOURCE_REL
 * (cmake/PyfiniInstall.cmake installs them there). */
#define LC_SOURCE_DIR_MAX (PATH_MAX - 256)   /* room for a file name below it */
typedef struct lc_layout {
    char worker[PATH_MAX], source[LC_SOURCE_DIR_MAX];
    int installed;
} lc_layout;

static void canonical(char *path, size_t n)
{
    char *c = realpath(path, NULL);
    if (c && strlen(c) < n) strcpy(path, c);
    free(c);
}

static const lc_layout *layout(void)
{
    static lc_layout L;
    static int done;
    if (done) return &L;
    done = 1;
    char *self = realpath("/proc/self/exe", NULL), *built = realpath(LC_BUILD_TOOL_PATH, NULL);
    char *slash = self ? strrchr(self, '/') : NULL;
    if (slash && (!built || strcmp(self, built) != 0) && strlen(self) < LC_SOURCE_DIR_MAX - 64) {
        *slash = 0;
        snprintf(L.worker, sizeof L.worker, "%s/%s", self, LC_INSTALL_WORKER_REL);
        snprintf(L.source, sizeof L.source, "%.*s/%s", LC_SOURCE_DIR_MAX - 64, self, LC_INSTALL_SOURCE_REL);
        canonical(L.worker, sizeof L.worker);   /* PREFIX/bin/../libexec -> PREFIX/libexec */
        canonical(L.source, sizeof L.source);
        L.installed = 1;
    } else {
        lc_scopy(L.worker, sizeof L.worker, LC_WORKER_PATH);
        lc_scopy(L.source, sizeof L.source, LC_SOURCE_DIR);
    }
    free(self);
    free(built);
    return &L;
}

/* The C compiler of the build, or cc where it is gone (an installed copy
 * on another machine). */
static const char *c_compiler(void) { return access(LC_C_COMPILER, X_OK) == 0 ? LC_C_COMPILER : "cc"; }

/* The worker's files below the source directory (leakcheck/) and its headers: a
 * change in any of them builds a new worker; the .c files are compiled. */
static const char *const worker_files[] = {
    "worker/main.c", "worker/meters.c", "worker/subject.c", "worker/where.c", "worker/whose.c", "worker/lc_alloc.c",
    "worker/lc_meter.c", "worker/symbols.c", "worker/lc_heap.c", "worker/settle.c", "shared/lc_protocol.c",
    "shared/lc_schedule.c",
    "worker/worker.h", "worker/whose.h", "worker/lc_alloc.h", "worker/lc_meter.h", "worker/symbols.h", "worker/lc_heap.h",
    "worker/lc_heap.dynlist", "shared/lc_protocol.h",
    "shared/lc_schedule.h", "shared/lc_util.h", "../common/interp_configs.h"};
#define LC_NWORKER_FILES (sizeof worker_files / sizeof *worker_files)
static const char *const worker_include_dirs[] = {"worker", "shared", "../common"};
#define LC_MAX_CANDIDATES 64
#define LC_COMPILER_ARGS 256

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

/* The version in patchlevel.h of the headers in dir into ver (64 bytes). */
static int header_version(const char *dir, char *ver)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/patchlevel.h", dir);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512];
    int ok = -1;
    while (ok < 0 && fgets(line, sizeof line, f))
        if (sscanf(line, "#define PY_VERSION \"%63[^\"]\"", ver) == 1) ok = 0;
    fclose(f);
    return ok;
}

/* Version (from patchlevel.h) and ABI flags of a python3.X-config. */
static int config_version(const char *config, char *ver, char *abi, size_t an)
{
    char *inc = config_query(config, "--includes", NULL);
    if (!inc) return -1;
    char dir[PATH_MAX] = "";
    int ok = sscanf(inc, "-I%4095s", dir) == 1 ? header_version(dir, ver) : -1;
    free(inc);
    char *a = config_query(config, "--abiflags", NULL);
    snprintf(abi, an, "%s", a ? a : "");
    free(a);
    return ok;
}

#define LC_PY_MIN_MINOR 11   /* pyfini needs CPython 3.11 or newer */

static int too_old(int major, int minor) { return major < 3 || (major == 3 && minor < LC_PY_MIN_MINOR); }

/* A path to a python3.X-config: its version and ABI flags. */
static int config_from_path(const char *want, char *out, size_t n, char *ver, char *abi, char *err, size_t errn)
{
    if (access(want, X_OK) != 0) {
        snprintf(err, errn, "--python %s: not an executable python3.X-config", want);
        return -1;
    }
    if (config_version(want, ver, abi, 16) < 0) {
        snprintf(err, errn, "--python %s: does not answer like a python3.X-config (no headers?)", want);
        return -1;
    }
    int major = 0, minor = 0;
    if (sscanf(ver, "%d.%d", &major, &minor) != 2 || too_old(major, minor)) {
        snprintf(err, errn, "--python %s: CPython %s: pyfini needs CPython 3.%d or newer", want, ver, LC_PY_MIN_MINOR);
        return -1;
    }
    snprintf(out, n, "%s", want);
    return 0;
}

typedef struct wanted {
    int major, minor, patch;   /* patch -1: any */
    char abi[4];               /* ABI flags: "d" for a debug build */
    char name[64];             /* python3.Xd-config */
} wanted;

/* "3.12", "3.14d", "3.12.1" (or 9.9: of the form, found nowhere); -1 not of
   that form, -2 older than 3.11 */
static int parse_wanted(const char *want, wanted *w)
{
    int pos = 0, na = 0;
    w->patch = -1;
    w->abi[0] = 0;
    if (sscanf(want, "%d.%d%n", &w->major, &w->minor, &pos) < 2) return -1;
    if (want[pos] == '.') {
        int p2 = 0;
        if (sscanf(want + pos, ".%d%n", &w->patch, &p2) < 1) return -1;
        pos += p2;
    }
    while (want[pos] >= 'a' && want[pos] <= 'z' && na < 3) w->abi[na++] = want[pos++];
    w->abi[na] = 0;
    if (want[pos] != 0 || w->major < 2 || w->minor < 0) return -1;
    if (too_old(w->major, w->minor)) return -2;
    snprintf(w->name, sizeof w->name, "python%d.%d%s-config", w->major, w->minor, w->abi);
    return 0;
}

/* The executables matching the glob pattern pat, appended to cands (each
   script once; pyenv's shims skipped: each stands for a Python found in pyenv's
   versions or later on PATH). */
static void add_matches(const char *pat, char cands[][PATH_MAX], int *nc, int max)
{
    glob_t g;
    if (glob(pat, 0, NULL, &g) != 0) return;
    for (size_t i = 0; i < g.gl_pathc && *nc < max; i++) {
        const char *c = g.gl_pathv[i];
        char ri[PATH_MAX], rj[PATH_MAX];
        /* a script once, by its real path (/bin = /usr/bin): the first path stays */
        int dup = strstr(c, "/shims/") != NULL || strlen(c) >= PATH_MAX || access(c, X_OK) != 0 || !realpath(c, ri);
        for (int j = 0; j < *nc && !dup; j++) dup = realpath(cands[j], rj) && strcmp(ri, rj) == 0;
        if (!dup) snprintf(cands[(*nc)++], PATH_MAX, "%s", c);
    }
    globfree(&g);
}

/* Executables matching the glob pattern name on PATH (in its order), then in
   pyenv's versions. */
static int candidates(const char *name, char cands[][PATH_MAX], int max)
{
    int nc = 0;
    const char *path = getenv("PATH");
    char *pcopy = strdup(path && *path ? path : "/usr/bin:/bin");
    char pat[PATH_MAX];
    for (char *save = NULL, *d = strtok_r(pcopy, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(pat, sizeof pat, "%s/%s", d, name);
        add_matches(pat, cands, &nc, max);
    }
    free(pcopy);
    const char *pyenv = getenv("PYENV_ROOT"), *home = getenv("HOME");
    if (pyenv) snprintf(pat, sizeof pat, "%s/versions/*/bin/%s", pyenv, name);
    else snprintf(pat, sizeof pat, "%s/.pyenv/versions/*/bin/%s", home ? home : "/root", name);
    add_matches(pat, cands, &nc, max);
    return nc;
}

/* A usable CPython, as tools/find-pythons judges one: the canonical path of
   its config script (the one in its own exec-prefix), its version, ABI flags
   and identity (headers, ABI flags, shared libpython). */
typedef struct lc_python {
    char config[PATH_MAX], ver[64], abi[16], key[2 * PATH_MAX + 20];
} lc_python;

/* The next blank-separated word of *p (its length in *len), or NULL. */
static const char *next_word(const char **p, size_t *len)
{
    *p += strspn(*p, " \t\n");
    if (!**p) return NULL;
    const char *w = *p;
    *len = strcspn(w, " \t\n");
    *p += *len;
    return w;
}

/* Into out (PATH_MAX): the canonical path of lib<name>.so in a -L directory
   of ldflags, the multiarch library directory, /usr/lib or /usr/local/lib. */
static int find_libpython(const char *ldflags, const char *name, char *out)
{
    static char multiarch[128];
    static int asked;
    if (!asked) {
        char *argv[] = {"cc", "-print-multiarch", NULL}, *m = capture(argv, NULL);
        snprintf(multiarch, sizeof multiarch, "%s", m ? m : "");
        free(m);
        asked = 1;
    }
    char dirs[24][PATH_MAX];
    int nd = 0;
    size_t l;
    for (const char *p = ldflags, *w; (w = next_word(&p, &l)) && nd < 21;)
        if (l > 2 && l < PATH_MAX && !strncmp(w, "-L", 2)) snprintf(dirs[nd++], PATH_MAX, "%.*s", (int)(l - 2), w + 2);
    snprintf(dirs[nd++], PATH_MAX, "/usr/lib/%s", multiarch);
    snprintf(dirs[nd++], PATH_MAX, "/usr/lib");
    snprintf(dirs[nd++], PATH_MAX, "/usr/local/lib");
    for (int i = 0; i < nd; i++) {
        char lib[PATH_MAX + 80];
        snprintf(lib, sizeof lib, "%.4000s/lib%.60s.so", dirs[i], name);
        if (access(lib, F_OK) == 0) return realpath(lib, out) ? 0 : -1;
    }
    return -1;
}

/* cand, a python3.X-config: whether it is usable (see lc_python), into py. */
static int examine(const char *cand, lc_python *py)
{
    char *inc = config_query(cand, "--includes", NULL), *ep = config_query(cand, "--exec-prefix", NULL);
    char incdir[PATH_MAX] = "", conf[PATH_MAX + 80], real_inc[PATH_MAX], lib[64] = "", real_lib[PATH_MAX];
    size_t l;
    const char *p = inc ? inc : "", *w = next_word(&p, &l);
    if (w && l > 2 && l < PATH_MAX && !strncmp(w, "-I", 2)) snprintf(incdir, sizeof incdir, "%.*s", (int)(l - 2), w + 2);
    /* a Debian alias: the script in the Python's own exec-prefix */
    snprintf(conf, sizeof conf, "%s/bin/%s", ep ? ep : "", strrchr(cand, '/') ? strrchr(cand, '/') + 1 : cand);
    if (!ep || strlen(conf) >= PATH_MAX || access(conf, X_OK) != 0) snprintf(conf, sizeof conf, "%s", cand);
    free(inc);
    free(ep);
    char h[PATH_MAX + 16];
    snprintf(h, sizeof h, "%s/Python.h", incdir);
    int major = 0, minor = 0;
    if (!incdir[0] || access(h, F_OK) != 0 || header_version(incdir, py->ver) < 0 ||
        sscanf(py->ver, "%d.%d", &major, &minor) != 2 || too_old(major, minor))
        return -1;
    char *abi = config_query(conf, "--abiflags", NULL), *ld = config_query(conf, "--ldflags", "--embed");
    snprintf(py->abi, sizeof py->abi, "%s", abi ? abi : "");
    p = ld ? ld : "";
    while ((w = next_word(&p, &l)) && !lib[0])
        if (l > 9 && l < sizeof lib && !strncmp(w, "-lpython3", 9)) snprintf(lib, sizeof lib, "%.*s", (int)(l - 2), w + 2);
    int ok = ld && lib[0] && find_libpython(ld, lib, real_lib) == 0 && realpath(incdir, real_inc) &&
             realpath(conf, py->config);
    free(abi);
    free(ld);
    if (!ok) return -1;
    snprintf(py->key, sizeof py->key, "%s|%s|%s", real_inc, py->abi, real_lib);
    return 0;
}

/* Every usable CPython among the executables named by pattern (PATH, then
   pyenv), each once (by its identity), in the order found. */
static int scan(const char *pattern, lc_python *found, int max)
{
    static char cands[LC_MAX_CANDIDATES][PATH_MAX];
    int nc = candidates(pattern, cands, LC_MAX_CANDIDATES), nf = 0;
    for (int i = 0; i < nc && nf < max; i++) {
        int minor = 0, dup = 0;   /* older minors (by name) are not asked */
        if (sscanf(strrchr(cands[i], '/') + 1, "python3.%d", &minor) != 1 || too_old(3, minor)) continue;
        if (examine(cands[i], &found[nf]) < 0) continue;
        for (int j = 0; j < nf && !dup; j++) dup = strcmp(found[j].key, found[nf].key) == 0;
        if (!dup) nf++;
    }
    return nf;
}

/* tools/find-pythons' order: X, Y, Z, pre-release (a < b < rc < final), N */
static int version_cmp(const char *a, const char *b)
{
    int k[2][5];
    const char *v[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        char pre[4] = "";
        memset(k[i], 0, sizeof k[i]);
        sscanf(v[i], "%d.%d.%d%3[abrc]%d", &k[i][0], &k[i][1], &k[i][2], pre, &k[i][4]);
        k[i][3] = !pre[0] ? 3 : pre[0] == 'a' ? 0 : pre[0] == 'b' ? 1 : 2;
    }
    for (int j = 0; j < 5; j++)
        if (k[0][j] != k[1][j]) return k[0][j] < k[1][j] ? -1 : 1;
    return 0;
}

static int python_cmp(const lc_python *a, const lc_python *b)
{
    int c = version_cmp(a->ver, b->ver);
    return c ? c : strcmp(a->abi, b->abi);
}

/* Every CPython pyfini can run on (3.11+) found as python3.X-config (PATH,
   pyenv; tools/find-pythons' list), "3.11.2, 3.14.10d", in version order,
   once each; "none" when there is none. */
static void found_pythons(char *buf, size_t n)
{
    static lc_python found[LC_MAX_CANDIDATES];
    int nf = scan("python3.[0-9]*-config", found, LC_MAX_CANDIDATES);
    for (int i = 1; i < nf; i++)   /* insertion sort: a few entries */
        for (int j = i; j > 0 && python_cmp(&found[j - 1], &found[j]) > 0; j--) {
            lc_python t = found[j];
            found[j] = found[j - 1];
            found[j - 1] = t;
        }
    snprintf(buf, n, "%s", nf ? "" : "none");
    for (int j = 0; j < nf; j++) {
        if (j && !python_cmp(&found[j - 1], &found[j])) continue;   /* a second copy */
        size_t l = strlen(buf);
        snprintf(buf + l, n - l, "%s%s%s", l ? ", " : "", found[j].ver, found[j].abi);
    }
}

/* want: "3.12", "3.14d", "3.12.1", or a path to a python3.X-config; chosen
   as `tools/find-pythons --choose WANT` chooses: of the python3.X-config
   scripts of that name (with these ABI flags), the newest version (X.Y.Z:
   that one), of equal ones the first found. */
static int find_config(const char *want, char *out, size_t n, char *ver, char *abi, char *err, size_t errn)
{
    if (strchr(want, '/')) return config_from_path(want, out, n, ver, abi, err, errn);
    wanted w;
    int pw = parse_wanted(want, &w);
    if (pw == -2) {
        snprintf(err, errn, "--python %s: pyfini needs CPython 3.%d or newer", want, LC_PY_MIN_MINOR);
        return -1;
    }
    if (pw < 0) {
        snprintf(err, errn, "--python '%s': expected X.Y, X.Y.Z, X.Yd (debug build) or a path to python3.X-config",
                 want);
        return -1;
    }
    static lc_python found[LC_MAX_CANDIDATES];
    int nf = scan(w.name, found, LC_MAX_CANDIDATES), pick = -1;
    char seen_versions[1024] = "", exact[32];
    snprintf(exact, sizeof exact, "%d.%d.%d", w.major, w.minor, w.patch);
    for (int i = 0; i < nf; i++) {
        size_t l = strlen(seen_versions);
        snprintf(seen_versions + l, sizeof seen_versions - l, "%s%s%s", l ? ", " : "", found[i].ver, found[i].abi);
        if (strcmp(found[i].abi, w.abi) != 0 || (w.patch >= 0 && strcmp(found[i].ver, exact) != 0)) continue;
        if (pick < 0 || version_cmp(found[i].ver, found[pick].ver) > 0) pick = i;
    }
    if (pick >= 0 && strlen(found[pick].config) < n) {
        snprintf(out, n, "%s", found[pick].config);
        strcpy(ver, found[pick].ver);
        strcpy(abi, found[pick].abi);
        return 0;
    }
    char all[1024], why[1200];
    found_pythons(all, sizeof all);
    if (seen_versions[0])
        snprintf(why, sizeof why, "%s gives %s", w.name, seen_versions);
    else
        snprintf(why, sizeof why, "no %s on PATH or in pyenv%s", w.name,
                 w.major == 3 ? "; install its -dev package, or pass the path of a python3.X-config" : "");
    snprintf(err, errn, "--python %s: no such CPython found (%s); CPythons found: %s", want, why, all);
    return -1;
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

/* The compiler's command line; its strings live in cc (and in inc, ld). */
typedef struct compile_strings {
    char exe_def[PATH_MAX + 64], out_tmp[PATH_MAX + 16];
    char incdirs[3][PATH_MAX + 4], srcs[LC_NWORKER_FILES][PATH_MAX], rpaths[16][PATH_MAX + 16];
    char libs[sizeof LC_WORKER_LIBS];
    char dynlist[PATH_MAX + 32];
} compile_strings;

static void compiler_argv(char **argv, compile_strings *cc, char *inc, char *ld)
{
    int argc = 0;
    argv[argc++] = (char *)c_compiler();
    argv[argc++] = "-std=c11";
    argv[argc++] = "-O2";
    argv[argc++] = "-g";
    argv[argc++] = cc->exe_def;
    for (int i = 0; i < 3; i++) {
        snprintf(cc->incdirs[i], sizeof cc->incdirs[i], "-I%s/%s", layout()->source, worker_include_dirs[i]);
        argv[argc++] = cc->incdirs[i];
    }
    split_into(argv, &argc, LC_COMPILER_ARGS - 56, inc);
    for (size_t i = 0; i < LC_NWORKER_FILES; i++) {
        size_t l = strlen(worker_files[i]);
        if (l < 2 || strcmp(worker_files[i] + l - 2, ".c")) continue;
        snprintf(cc->srcs[i], PATH_MAX, "%s/%s", layout()->source, worker_files[i]);
        argv[argc++] = cc->srcs[i];
    }
    snprintf(cc->dynlist, sizeof cc->dynlist, "-Wl,--dynamic-list=%s/worker/lc_heap.dynlist", layout()->source);
    argv[argc++] = cc->dynlist;
    argv[argc++] = "-o";
    argv[argc++] = cc->out_tmp;
    int ld_start = argc;
    split_into(argv, &argc, LC_COMPILER_ARGS - 36, ld);
    int nr = 0;
    for (int i = ld_start, end = argc; i < end && nr < 16; i++)
        if (!strncmp(argv[i], "-L", 2)) {
            snprintf(cc->rpaths[nr], sizeof cc->rpaths[nr], "-Wl,-rpath,%s", argv[i] + 2);
            argv[argc++] = cc->rpaths[nr++];
        }
    memcpy(cc->libs, LC_WORKER_LIBS, sizeof cc->libs);
    split_into(argv, &argc, LC_COMPILER_ARGS - 6, cc->libs);
    argv[argc] = NULL;
}

/* Run argv with its output into log; 0 when it exited 0, else the spawn error or -1. */
static int run_logged(char **argv, const char *log)
{
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
    if (rc != 0) return rc;
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
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
    static compile_strings cc;
    snprintf(cc.exe_def, sizeof cc.exe_def, "-DLC_PYTHON_EXECUTABLE=\"%s/bin/python%d.%d%s\"", eprefix, major, minor,
             abi);
    snprintf(cc.out_tmp, sizeof cc.out_tmp, "%s.tmp%d", exe_path, (int)getpid());
    char *argv[LC_COMPILER_ARGS];
    compiler_argv(argv, &cc, inc, ld);
    char log[PATH_MAX + 8];
    snprintf(log, sizeof log, "%s.log", exe_path);
    fprintf(stderr, "pyfini-leakcheck: building the worker for CPython %s%s (once) in %s\n", ver, abi, dir);
    int rc = run_logged(argv, log);
    free(inc), free(ld), free(eprefix);
    if (rc != 0) {
        snprintf(err, errn, "building the worker for CPython %s%s failed (%s); see %s", ver, abi,
                 rc > 0 ? strerror(rc) : "compiler error", log);
        unlink(cc.out_tmp);
        return -1;
    }
    if (rename(cc.out_tmp, exe_path) < 0) {
        snprintf(err, errn, "rename %s: %s", cc.out_tmp, strerror(errno));
        return -1;
    }
    return 0;
}

int lc_default_worker(char *out, size_t n, char *err, size_t errn)
{
    const lc_layout *L = layout();
    if (access(L->worker, X_OK) == 0) {
        snprintf(out, n, "%s", L->worker);
        return 0;
    }
    snprintf(err, errn, "the worker %s is missing: %s", L->worker,
             L->installed ? "reinstall pyfini (cmake --install)" : "rebuild pyfini (cmake --build build)");
    return -1;
}

/* The cache key of a worker: the config, the tool's version, its files. */
static int worker_key(const char *want, const char *config, const char *ver, const char *abi, uint64_t *key,
                      char *err, size_t errn)
{
    uint64_t h = lc_fnv(LC_FNV_OFFSET, config, strlen(config));
    h = lc_fnv(h, LC_VERSION, strlen(LC_VERSION));
    for (size_t i = 0; i < LC_NWORKER_FILES; i++) {
        char p[PATH_MAX];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", layout()->source, worker_files[i]);
        if (stat(p, &st) < 0) {
            snprintf(err, errn, "--python %s: the worker's source %s is gone, so no worker can be built for "
                     "CPython %s%s (build pyfini with -DPYFINI_PYTHON_CONFIG=%s instead)", want, p, ver, abi, config);
            return -1;
        }
        h = lc_fnv(h, &st.st_mtim, sizeof st.st_mtim);
        h = lc_fnv(h, &st.st_size, sizeof st.st_size);
    }
    *key = h;
    return 0;
}

/* The worker for want (see lc_worker_for_python) and what it runs: the
 * python3.X-config, version and ABI flags (config, ver, abi: PATH_MAX, 64,
 * 16 bytes); built when missing only if build is set. */
static int worker_for(const char *want, int build, char *out, size_t n, char *config, char *ver, char *abi,
                      char *err, size_t errn)
{
    if (find_config(want, config, PATH_MAX, ver, abi, err, errn) < 0) return -1;
    char *a = realpath(config, NULL), *b = realpath(LC_BUILD_PYTHON_CONFIG, NULL);
    int same = a && b && strcmp(a, b) == 0;
    free(a);
    free(b);
    if (same) return lc_default_worker(out, n, err, errn);
    uint64_t h;
    if (worker_key(want, config, ver, abi, &h, err, errn) < 0) return -1;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char base[PATH_MAX];
    if (xdg && *xdg) snprintf(base, sizeof base, "%s/pyfini-leakcheck", xdg);
    else snprintf(base, sizeof base, "%s/.cache/pyfini-leakcheck", home && *home ? home : "/tmp");
    int k = snprintf(out, n, "%s/%s%s-%016llx/pyfini-leakcheck-worker", base, ver, abi, (unsigned long long)h);
    if (k < 0 || (size_t)k >= n) {
        snprintf(err, errn, "cache path too long");
        return -1;
    }
    if (!build || access(out, X_OK) == 0) return 0;
    return build_worker(config, ver, abi, out, err, errn);
}

int lc_worker_for_python(const char *want, char *out, size_t n, char *err, size_t errn)
{
    char config[PATH_MAX], ver[64] = "", abi[16] = "";
    return worker_for(want, 1, out, n, config, ver, abi, err, errn);
}

int lc_print_version(FILE *f, const char *python, char *err, size_t errn)
{
    fprintf(f, "pyfini-leakcheck %s\n", LC_VERSION);
    char worker[PATH_MAX], config[PATH_MAX], ver[64] = "", abi[16] = "";
    if (!python) {
        if (lc_default_worker(worker, sizeof worker, err, errn) < 0) return -1;
        fprintf(f, "CPython %s (the build's: %s; --python X.Y picks another)\nworker %s\n", LC_BUILD_PY_TAG,
                LC_BUILD_PYTHON_CONFIG, worker);
    } else {
        if (worker_for(python, 0, worker, sizeof worker, config, ver, abi, err, errn) < 0) return -1;
        fprintf(f, "CPython %s%s (--python %s: %s)\nworker %s%s\n", ver, abi, python, config, worker,
                access(worker, X_OK) == 0 ? "" : " (built on first use)");
    }
    fprintf(f, "sources %s (of workers for --python)\n", layout()->source);
    return 0;
}
