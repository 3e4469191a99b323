/* test_leakcheck.c - pyfini-leakcheck against real interpreters (Check).
 *
 * Every test runs the built tool as a user would and reads its exit status,
 * its messages and its --json document.  Expectations that depend on the
 * CPython version check LC_TEST_PY_VERSION and say what they expect.
 * One CTest test per Check test case (CK_RUN_CASE), see CMakeLists.txt.
 */
#define _GNU_SOURCE
#undef NDEBUG
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <jansson.h>
#include <libxml/parser.h>
#include <libxml/xpath.h>
#include <limits.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <sys/stat.h>

#ifndef LC_TOOL
#error LC_TOOL must name the tool
#endif

extern char **environ;

static int py_major, py_minor, py_patch;

typedef struct result {
    int status;     /* exit status, 128 + signal if signalled */
    char *out, *err;
    json_t *json;   /* parsed stdout when it is JSON */
} result;

static char *slurp(int fd)
{
    size_t n = 0, cap = 65536;
    char *b = malloc(cap);
    lseek(fd, 0, SEEK_SET);
    ssize_t k;
    while ((k = read(fd, b + n, cap - n - 1)) > 0) {
        n += (size_t)k;
        if (n + 1 == cap) b = realloc(b, cap *= 2);
    }
    b[n] = 0;
    return b;
}

/* Every JSON document a test case gets is kept as LC_TEST_REPORTS/CASE-N.json
 * (the directory is set by CMake): the schema test (leakcheck.json_schema)
 * validates them all against docs/leakcheck.schema.json.  A case's files of
 * an earlier run go first. */
static void keep_document(const char *out)
{
    static int n;
    const char *dir = getenv("LC_TEST_REPORTS"), *name = getenv("CK_RUN_CASE");
    if (!dir || !*dir || !name || !*name) return;
    char path[PATH_MAX];
    if (n++ == 0) {
        snprintf(path, sizeof path, "%s/%s-*.json", dir, name);
        glob_t g;
        if (glob(path, 0, NULL, &g) == 0) {
            for (size_t i = 0; i < g.gl_pathc; i++) unlink(g.gl_pathv[i]);
            globfree(&g);
        }
    }
    snprintf(path, sizeof path, "%s/%s-%d.json", dir, name, n);
    FILE *f = fopen(path, "w");
    ck_assert_msg(f && fputs(out, f) >= 0 && fclose(f) == 0, "cannot keep %s", path);
}

/* The tool started with args (NULL-terminated, without argv[0]), its
 * stdout and stderr into unlinked temporary files. */
typedef struct running {
    pid_t pid;
    int of, ef;
} running;

static running start_tool(const char *const *args)
{
    char outp[] = "/tmp/lc-test-out-XXXXXX", errp[] = "/tmp/lc-test-err-XXXXXX";
    running t = {0, mkstemp(outp), mkstemp(errp)};
    ck_assert(t.of >= 0 && t.ef >= 0);
    unlink(outp);
    unlink(errp);
    const char *argv[64];
    int n = 0;
    argv[n++] = LC_TOOL;
    for (int i = 0; args[i]; i++) argv[n++] = args[i];
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, t.of, 1);
    posix_spawn_file_actions_adddup2(&fa, t.ef, 2);
    ck_assert_int_eq(posix_spawn(&t.pid, LC_TOOL, &fa, NULL, (char *const *)argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    return t;
}

/* its end: exit status, output, the JSON document (kept, see keep_document) */
static result finish_tool(running *t)
{
    int st;
    ck_assert_int_eq(waitpid(t->pid, &st, 0), t->pid);
    result r = {0};
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.out = slurp(t->of);
    r.err = slurp(t->ef);
    close(t->of);
    close(t->ef);
    r.json = json_loads(r.out, 0, NULL);
    if (r.json) keep_document(r.out);
    return r;
}

/* run the tool with args (NULL-terminated, without argv[0]) */
static result run_tool(const char *const *args)
{
    running t = start_tool(args);
    return finish_tool(&t);
}

/* the end of a long output, for assertion messages (Check limits their size) */
static const char *tail(const char *s)
{
    size_t n = strlen(s);
    return n > 1500 ? s + n - 1500 : s;
}

static void free_result(result *r)
{
    free(r->out);
    free(r->err);
    json_decref(r->json);
}

static const char *verdict_of(const result *r, const char *meter)
{
    json_t *m = json_object_get(json_object_get(r->json, "meters"), meter);
    return json_string_value(json_object_get(m, "verdict"));
}

/* per-cycle figure of the judged series (excess with a baseline) */
static double judged_per_cycle(const result *r, const char *meter)
{
    json_t *m = json_object_get(json_object_get(r->json, "meters"), meter);
    const char *which = json_string_value(json_object_get(m, "judged"));
    ck_assert_msg(which != NULL, "meter %s has no judged series:\n%s", meter, r->out);
    return json_number_value(json_object_get(json_object_get(m, which), "per_cycle"));
}

static int at_least(int major, int minor) { return py_major > major || (py_major == major && py_minor >= minor); }

/* a run that finished and judged: no leak (0), LEAK (1) or inconclusive (4,
 * a short run on a loaded machine: e.g. 4 bare cycles under ASan in CI);
 * for tests of the mechanics, not of a verdict */
static int finished_run(int status) { return status == 0 || status == 1 || status == 4; }

static void no_bytes_meter_leaks(const result *r)
{
    static const char *const bytes[] = {"rss", "malloc", "heap", "heap.plain", "py", "py.raw", "py.mem", "py.obj",
                                        "py.obm"};
    for (size_t i = 0; i < sizeof bytes / sizeof *bytes; i++) {
        const char *v = verdict_of(r, bytes[i]);
        ck_assert_msg(v && strcmp(v, "LEAK") != 0, "meter %s judged %s:\n%s", bytes[i], v ? v : "(none)", r->out);
    }
}

/* --- bad input: exit 2 and a clear message, never a crash ------------------ */
static void expect_usage(const char *const *args, const char *needle)
{
    result r = run_tool(args);
    ck_assert_msg(r.status == 2, "exit %d, expected 2; stderr:\n%s", r.status, r.err);
    ck_assert_msg(strstr(r.err, needle) != NULL, "stderr lacks '%s':\n%s", needle, tail(r.err));
    free_result(&r);
}

START_TEST(test_bad_input)
{
    expect_usage((const char *[]){"--bogus", NULL}, "unknown option '--bogus'");
    expect_usage((const char *[]){"--cycles", "abc", NULL}, "--cycles needs an integer");
    expect_usage((const char *[]){"--cycles", NULL}, "needs a value");
    expect_usage((const char *[]){"--json=out.json", NULL}, "option '--json' takes no value (given 'out.json')");
    expect_usage((const char *[]){"--where=1", NULL}, "option '--where' takes no value");
    expect_usage((const char *[]){"--config", "weird", NULL}, "unknown --config 'weird'");
    expect_usage((const char *[]){"stray", NULL}, "unexpected argument 'stray'");
    expect_usage((const char *[]){"--import", "no_such_module_pyfini", "--cycles", "4", NULL},
                 "no module named 'no_such_module_pyfini'");
    expect_usage((const char *[]){"--code", "x = (", "--cycles", "4", NULL}, "SyntaxError");
    expect_usage((const char *[]){"--file", "/nonexistent/pyfini.py", NULL}, "No such file or directory");
    expect_usage((const char *[]){"--code", "raise ValueError('boom')", "--cycles", "4", NULL}, "ValueError: boom");
    expect_usage((const char *[]){"--python", "3.99", NULL}, "--python 3.99");
    expect_usage((const char *[]){"--python", "banana", NULL}, "expected X.Y");
    /* of the form X.Y but found nowhere: said so, with the CPythons that were
       found (the build's among them) */
    result r = run_tool((const char *[]){"--python", "9.9", NULL});
    const char *list = strstr(r.err, "; CPythons found: ");
    ck_assert_msg(r.status == 2 && strstr(r.err, "--python 9.9: no such CPython found (no python9.9-config on PATH "
                                                 "or in pyenv)") && list && strstr(list, LC_TEST_PY_VERSION),
                  "exit %d; stderr:\n%s", r.status, tail(r.err));
    free_result(&r);
    /* every numeric option: zero, negative, not a number */
    expect_usage((const char *[]){"--cycles", "0", NULL}, "--cycles needs an integer >= 1, not '0'");
    expect_usage((const char *[]){"--cycles", "-5", NULL}, "--cycles needs an integer >= 1, not '-5'");
    expect_usage((const char *[]){"--warmup", "-1", NULL}, "--warmup needs an integer >= 0, not '-1'");
    expect_usage((const char *[]){"--warmup", "x", NULL}, "--warmup needs an integer");
    expect_usage((const char *[]){"--timeout", "0", NULL}, "--timeout needs a number >= 0.1, not '0'");
    expect_usage((const char *[]){"--timeout", "nan", NULL}, "--timeout needs a number");
    expect_usage((const char *[]){"--max-bytes-per-cycle", "-1", NULL}, "--max-bytes-per-cycle needs a number >= 0");
    expect_usage((const char *[]){"--max-bytes-per-cycle", "lots", NULL}, "--max-bytes-per-cycle needs a number");
    /* --max-rss: bytes or K/M/G; negative, garbage, overflow and an empty value refused */
    static const char *const bad_rss[] = {"-1", "-5M", "lots", "300MB", "3.5G", "", " 300M", "+300M", "0x10",
                                          "99999999999999999999", "9223372036854775807K", "9000000000G"};
    for (size_t i = 0; i < sizeof bad_rss / sizeof *bad_rss; i++) {
        char want[128];
        snprintf(want, sizeof want, "--max-rss needs a size in bytes (a whole number >= 0, optionally with K, M or G), "
                 "not '%s'", bad_rss[i]);
        expect_usage((const char *[]){"--max-rss", bad_rss[i], NULL}, want);
    }
}
END_TEST

/* does this python3.X-config answer (a pyenv shim of a version not selected does not)? */
static int config_answers(const char *cfg)
{
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "'%s' --prefix >/dev/null 2>&1", cfg);
    return !strchr(cfg, '\'') && access(cfg, X_OK) == 0 && system(cmd) == 0;
}

/* A python3.X-config of a CPython older than 3.11 (X = minor), found on
 * PATH or through pyenv (`pyenv root`), never a hard-coded path; 0 if none. */
static int find_old_config(int minor, char *out, size_t n)
{
    char name[64], pat[PATH_MAX + 96];
    snprintf(name, sizeof name, "python3.%d-config", minor);
    const char *path = getenv("PATH");
    char *copy = strdup(path ? path : "");
    for (char *save = NULL, *d = strtok_r(copy, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(out, n, "%s/%s", d, name);
        if (config_answers(out)) {
            free(copy);
            return 1;
        }
    }
    free(copy);
    FILE *p = popen("pyenv root 2>/dev/null", "r");
    char root[PATH_MAX] = "";
    if (p) {
        if (!fgets(root, sizeof root, p)) root[0] = 0;
        pclose(p);
    }
    root[strcspn(root, "\n")] = 0;
    if (!root[0]) return 0;
    snprintf(pat, sizeof pat, "%s/versions/*/bin/%s", root, name);
    glob_t g;
    int found = 0;
    if (glob(pat, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc && !found; i++)
            if (config_answers(g.gl_pathv[i])) found = 1, snprintf(out, n, "%s", g.gl_pathv[i]);
        globfree(&g);
    }
    return found;
}

/* --python of a CPython older than 3.11 (issue 10): refused with what pyfini
 * needs, by version and by the path of its python3.X-config */
START_TEST(test_python_too_old)
{
    expect_usage((const char *[]){"--python", "3.10", NULL}, "--python 3.10: pyfini needs CPython 3.11 or newer");
    expect_usage((const char *[]){"--python", "3.9", NULL}, "--python 3.9: pyfini needs CPython 3.11 or newer");
    expect_usage((const char *[]){"--python", "3.10.13", NULL}, "pyfini needs CPython 3.11 or newer");
    int found = 0;
    for (int minor = 9; minor <= 10; minor++) {
        char cfg[PATH_MAX];
        if (!find_old_config(minor, cfg, sizeof cfg)) continue;
        found++;
        char want[PATH_MAX + 64];
        snprintf(want, sizeof want, "--python %s: CPython 3.%d.", cfg, minor);
        expect_usage((const char *[]){"--python", cfg, "--cycles", "4", NULL}, want);
        expect_usage((const char *[]){"--python", cfg, NULL}, "pyfini needs CPython 3.11 or newer");
    }
    if (!found) printf("NOTE python_too_old: no python3.9-config or python3.10-config here (PATH, pyenv)\n");
}
END_TEST

/* Too few cycles is never "no leak" (issue 10): refused up front with the
 * minimum (lc_schedule_min_cycles), and a run that finished but that no
 * bytes meter could judge is "not judged", exit 4. */
START_TEST(test_too_few_cycles)
{
    expect_usage((const char *[]){"--cycles", "3", NULL}, "--cycles 3 is too few to judge: a verdict needs at least 4");
    expect_usage((const char *[]){"--import", "json", "--cycles", "2", "--warmup", "1", "--json", NULL},
                 "at least 4 judged cycles");
    expect_usage((const char *[]){"--scan", "--import", "json", "--cycles", "1", NULL}, "at least 4 judged cycles");
    /* --no-allocator-wrapper: only rss, malloc and the C-heap meters (not
       Python's allocator wrapper: heap.plain is then all of heap) can judge;
       whatever they say, the run's verdict follows the rule of --help: with
       py off only rss sees Python's objects, so "no leak" needs rss,
       heap.plain, heap.blocks and fds to say so */
    result r = run_tool((const char *[]){"--no-allocator-wrapper", "--cycles", "4", "--warmup", "1", "--json", NULL});
    ck_assert_msg(json_is_object(r.json), "no JSON: exit %d\n%s", r.status, tail(r.err));
    const char *rss = verdict_of(&r, "rss"), *mal = verdict_of(&r, "malloc"), *heap = verdict_of(&r, "heap");
    const char *hb = verdict_of(&r, "heap.blocks"), *fds = verdict_of(&r, "fds");
    const char *verdict = json_string_value(json_object_get(r.json, "verdict"));
    ck_assert_str_eq(verdict_of(&r, "py"), "unavailable");
    ck_assert_str_eq(verdict_of(&r, "heap.plain"), heap);
    int leak = !strcmp(rss, "LEAK") || !strcmp(mal, "LEAK") || !strcmp(heap, "LEAK") || !strcmp(hb, "LEAK") ||
               !strcmp(fds, "LEAK");
    /* under AddressSanitizer the heap meters are off: malloc (its allocator's figures) stands for them */
    int heap_ok = !strcmp(heap, "unavailable") ? !strcmp(mal, "no leak") : !strcmp(heap, "no leak") && !strcmp(hb, "no leak");
    int ok = !strcmp(rss, "no leak") && heap_ok && !strcmp(fds, "no leak");
    const char *want = leak ? "LEAK" : (ok ? "no leak" : "not judged");
    int want_status = leak ? 1 : (ok ? 0 : 4);
    ck_assert_msg(!strcmp(verdict, want) && r.status == want_status,
                  "rss %s, malloc %s, heap %s, heap.blocks %s, fds %s: verdict %s exit %d, expected %s exit %d", rss,
                  mal, heap, hb, fds, verdict, r.status, want, want_status);
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "exit_status")), want_status);
    free_result(&r);
}
END_TEST

START_TEST(test_help)
{
    result r = run_tool((const char *[]){"--help", NULL});
    ck_assert_int_eq(r.status, 0);
    static const char *const words[] = {"rss", "malloc", "py.raw", "py.obj", "blocks", "refs", "fds", "time",
                                        "--where", "--scan", "--no-baseline", "--junit", "--version",
                                        "--no-allocator-wrapper", "Exit status", "not judged", "  4  "};
    for (size_t i = 0; i < sizeof words / sizeof *words; i++)
        ck_assert_msg(strstr(r.out, words[i]) != NULL, "--help does not explain %s", words[i]);
    free_result(&r);
}
END_TEST

/* --version: the project's version (CMake's project(VERSION), the one
 * source), then the CPython a run would use and its worker; with --python,
 * that CPython's, without building its worker. */
START_TEST(test_version)
{
    char want[128];
    snprintf(want, sizeof want, "pyfini-leakcheck %s\nCPython %s", LC_TEST_TOOL_VERSION, LC_TEST_PY_VERSION);
    result r = run_tool((const char *[]){"--version", NULL});
    ck_assert_msg(r.status == 0 && !strncmp(r.out, want, strlen(want)), "exit %d:\n%s%s", r.status, r.out, r.err);
    ck_assert_msg(strstr(r.out, "\nworker /") && strstr(r.out, "the build's"), "%s", r.out);
    free_result(&r);
    /* --version runs nothing, so the options of a run are not judged */
    r = run_tool((const char *[]){"--cycles", "1", "--version", NULL});
    ck_assert_msg(r.status == 0, "exit %d:\n%s", r.status, r.err);
    free_result(&r);
    expect_usage((const char *[]){"--version", "--python", "3.99", NULL}, "--python 3.99: no such CPython found (no python3.99-config");
    const char *other = getenv("LC_TEST_OTHER_PYTHON");
    if (!other || !*other) {
        printf("NOTE version: no other host CPython for --version --python\n");
        return;
    }
    char cache[PATH_MAX];
    snprintf(cache, sizeof cache, "/tmp/lc-test-version-XXXXXX");
    ck_assert(mkdtemp(cache) != NULL);
    setenv("XDG_CACHE_HOME", cache, 1);   /* an empty cache: the worker is not built */
    r = run_tool((const char *[]){"--version", "--python", other, NULL});
    snprintf(want, sizeof want, "\nCPython %s (--python %s: /", other, other);
    ck_assert_msg(r.status == 0 && strstr(r.out, want) && strstr(r.out, "(built on first use)"), "exit %d:\n%s%s",
                  r.status, r.out, r.err);
    ck_assert_msg(rmdir(cache) == 0, "--version wrote into the cache %s", cache);
    free_result(&r);
}
END_TEST

/* --- the subject's stderr is in the report (issue 10) --------------------- */
static json_t *stderr_of(const result *r)
{
    json_t *e = json_object_get(r->json, "subject_stderr");
    ck_assert_msg(json_is_object(e), "no subject_stderr: exit %d\n%s%s", r->status, tail(r->out), tail(r->err));
    return e;
}

static int has_string(json_t *array, const char *s)
{
    size_t i;
    json_t *v;
    json_array_foreach(array, i, v) if (!strcmp(json_string_value(v), s)) return 1;
    return 0;
}

/* A module that leaks objects tracked in a pyfini state: pyfini's report
 * (pyfini__state_report, at POST_SHUTDOWN) is parsed into a finding that
 * fails the run (exit 1), with the state, the count and the types. */
START_TEST(test_pyfini_leak_report)
{
    result r = run_tool((const char *[]){"--import", "_pyfini_trackleak", "--cycles", "4", "--warmup", "1", "--json",
                                         NULL});
    ck_assert_msg(r.status == 1, "exit %d, expected 1\n%s%s", r.status, tail(r.out), tail(r.err));
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "verdict")), "LEAK");
    json_t *e = stderr_of(&r), *L = json_array_get(json_object_get(e, "pyfini_leaks"), 0);
    ck_assert_msg(json_is_object(L), "no pyfini leak parsed:\n%s", tail(r.out));
    ck_assert_str_eq(json_string_value(json_object_get(L, "state")), "pyfini.test.trackleak");
    ck_assert_int_eq(json_integer_value(json_object_get(L, "objects")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(L, "first_cycle")), 1);
    /* every subject cycle reports it: 1 warm-up + 4 judged */
    ck_assert_int_eq(json_integer_value(json_object_get(L, "reports")), 5);
    ck_assert_int_eq(json_integer_value(json_object_get(e, "pyfini_leak_reports")), 5);
    json_t *types = json_object_get(L, "types");
    ck_assert_msg(has_string(types, "type TrackLeaked") && has_string(types, "TrackLeaked object"),
                  "types: %s", tail(r.out));
    /* the report lines are the finding, not "other" lines */
    ck_assert_int_eq(json_array_size(json_object_get(e, "distinct_lines")), 0);
    free_result(&r);
    r = run_tool((const char *[]){"--import", "_pyfini_trackleak", "--cycles", "4", "--warmup", "0", NULL});
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(strstr(r.out, "PYFINI LEAK: state \"pyfini.test.trackleak\": 2 tracked objects")
                  && strstr(r.out, "verdict: LEAK: pyfini reported 4 leaks"), "report:\n%s", tail(r.out));
    free_result(&r);
}
END_TEST

/* Warnings, "Exception ignored", many distinct lines and a huge line: each
 * kept line with its count and first cycle, the rest counted, memory bounded. */
START_TEST(test_subject_stderr_summary)
{
    const char *code = "import sys, os, warnings\n"
                       "warnings.warn('pyfini-test warning')\n"
                       "class A:\n"
                       "    def __del__(self): raise ValueError('pyfini-test del')\n"
                       "a = A(); del a\n"
                       "sys.stderr.write('h' * 300000 + '\\n')\n"
                       "for i in range(50): print('distinct', os.urandom(6).hex(), file=sys.stderr)\n"
                       "print('to stdout, not read')\n";
    result r = run_tool((const char *[]){"--code", code, "--no-baseline", "--cycles", "4", "--warmup", "0", "--json",
                                         NULL});
    ck_assert_msg(finished_run(r.status), "exit %d\n%s%s", r.status, tail(r.out), tail(r.err));
    json_t *e = stderr_of(&r), *lines = json_object_get(e, "distinct_lines"), *d;
    int warning = 0, ignored = 0, huge = 0;
    size_t i;
    json_array_foreach(lines, i, d) {
        const char *text = json_string_value(json_object_get(d, "text")), *kind = json_string_value(json_object_get(d, "kind"));
        long count = (long)json_integer_value(json_object_get(d, "count"));
        long first = (long)json_integer_value(json_object_get(d, "first_cycle"));
        ck_assert_msg(strlen(text) < 600, "a line of %zu bytes kept", strlen(text));
        ck_assert_msg(!strstr(text, "to stdout"), "stdout read: %s", text);
        if (strstr(text, "UserWarning: pyfini-test warning")) {
            warning = 1;
            ck_assert_str_eq(kind, "warning");
            ck_assert_int_eq(count, 4);
            ck_assert_int_eq(first, 1);
        }
        if (!strncmp(text, "Exception ignored", 17) && strstr(text, "A.__del__")) {
            ignored = 1;
            ck_assert_str_eq(kind, "exception ignored");
            ck_assert_int_eq(count, 4);
            ck_assert_int_eq(first, 1);
        }
        if (!strncmp(text, "hhhh", 4)) {
            huge = 1;
            ck_assert_int_eq(count, 4);
        }
    }
    ck_assert_msg(warning && ignored && huge, "warning %d, exception ignored %d, huge line %d:\n%s", warning, ignored,
                  huge, tail(r.out));
    ck_assert_int_le(json_array_size(lines), 20);
    /* 200 distinct lines in all: those not kept are counted */
    ck_assert_int_ge(json_integer_value(json_object_get(e, "more_distinct_lines")) + (json_int_t)json_array_size(lines),
                     200);
    free_result(&r);
}
END_TEST

/* --- a subject that breaks the tool's descriptors (issue 10) -------------- */
/* Python code that runs action in the cycle-th cycle of the process only
 * (a counter in the process environment: os.putenv, shared by all
 * interpreters). */
static char *in_cycle(int cycle, const char *action)
{
    char *code;
    ck_assert(asprintf(&code, "import os\nn = int(os.environ.get('LC_TEST_N', '0')) + 1\nos.putenv('LC_TEST_N', str(n))\n"
                       "if n == %d: %s\n", cycle, action) > 0);
    return code;
}

static void expect_broken(const char *action, const char *reason)
{
    char *code = in_cycle(3, action);
    result r = run_tool((const char *[]){"--code", code, "--no-baseline", "--cycles", "4", "--warmup", "0", "--json", NULL});
    ck_assert_msg(r.status == 3, "%s: exit %d, expected 3\n%s%s", action, r.status, tail(r.out), tail(r.err));
    json_t *c = json_object_get(r.json, "crash");
    ck_assert_msg(json_is_object(c), "%s: no crash object\n%s", action, tail(r.out));
    const char *why = json_string_value(json_object_get(c, "reason"));
    ck_assert_msg(why && strstr(why, reason), "%s: reason %s, expected %s", action, why ? why : "(none)", reason);
    ck_assert_int_eq(json_integer_value(json_object_get(c, "cycle")), 3);
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "cycles_finished")), 2);
    free_result(&r);
    r = run_tool((const char *[]){"--code", code, "--no-baseline", "--cycles", "4", "--warmup", "0", NULL});
    ck_assert_int_eq(r.status, 3);
    ck_assert_msg(strstr(r.out, "BROKEN: ") && strstr(r.out, reason) && strstr(r.out, "in cycle 3")
                  && !strstr(r.out, "exited with status"), "%s: report:\n%s", action, tail(r.out));
    free_result(&r);
    free(code);
}

START_TEST(test_subject_closes_fds)
{
    expect_broken("os.closerange(3, 256)", "closed the tool's record pipe (file descriptor 3)");
    expect_broken("os.dup2(os.open('/dev/null', os.O_WRONLY), 3)", "replaced the tool's record pipe (file descriptor 3");
    expect_broken("os.close(2)", "closed the worker's stderr (file descriptor 2)");
    expect_broken("os.dup2(os.open('/dev/null', os.O_WRONLY), 2)", "replaced the worker's stderr (file descriptor 2");
}
END_TEST

/* A subject that forks (issue 10): in a sub-interpreter every child dies in
 * PyOS_AfterFork_Child (_PyInterpreterState_DeleteExceptMain: "not main
 * interpreter").  The worker reaps them (PR_SET_CHILD_SUBREAPER), the report
 * says how each ended, a child that did not exit 0 fails the run (exit 3);
 * no child writes a record (the cycles finished are the worker's). */
START_TEST(test_forking_subject)
{
    result r = run_tool((const char *[]){"--code", "import os; os.fork()", "--no-baseline", "--cycles", "4", "--warmup",
                                         "0", "--json", NULL});
    ck_assert_msg(json_is_object(r.json), "exit %d\n%s", r.status, tail(r.err));
    json_t *c = json_object_get(r.json, "children");
    ck_assert_int_eq(json_integer_value(json_object_get(c, "total")), 4);
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "cycles_finished")), 4);
    json_int_t failed = json_integer_value(json_object_get(c, "failed"));
    json_t *e0 = json_array_get(json_object_get(c, "ends"), 0);
    /* collected after the cycle that forked it or a later one (a child that
       is slow to die, e.g. under ASan, is collected later) */
    json_int_t first = json_integer_value(json_object_get(e0, "first_cycle"));
    ck_assert_msg(first >= 1 && first <= 4, "first_cycle %lld", (long long)first);
    if (failed) {
        ck_assert_msg(r.status == 3, "children failed: exit %d, expected 3", r.status);
        ck_assert_str_eq(json_string_value(json_object_get(r.json, "verdict")), "child failed");
    }
    /* what CPython says of it is in the summary of the subject's stderr: the
       fatal error (release builds), or on debug builds (3.15d) the assertion
       in _PyEval_ReInitThreads that aborts the child before it */
    int said = json_integer_value(json_object_get(stderr_of(&r), "fatal_errors")) > 0;
    size_t k;
    json_t *d;
    json_array_foreach(json_object_get(stderr_of(&r), "distinct_lines"), k, d)
        if (strstr(json_string_value(json_object_get(d, "text")), "Assertion")) said = 1;
    ck_assert_msg(said || !failed, "no Fatal Python error or assertion seen:\n%s", tail(r.out));
    free_result(&r);
    r = run_tool((const char *[]){"--code", "import os; os.fork()", "--no-baseline", "--cycles", "4", "--warmup", "0",
                                  NULL});
    ck_assert_msg(strstr(r.out, "children of the subject (forked; the worker is their reaper): 4 ended"), "report:\n%s",
                  tail(r.out));
    free_result(&r);
}
END_TEST

/* A subject that ends the process itself: os._exit(0) or os._exit(3) in
 * cycle 3 is said as such, exit 3, never read as a finished run. */
START_TEST(test_subject_exits)
{
    static const char *const codes[] = {"0", "3", "10"};
    for (size_t i = 0; i < 3; i++) {
        char action[32];
        snprintf(action, sizeof action, "os._exit(%s)", codes[i]);
        char *code = in_cycle(3, action);
        result r = run_tool((const char *[]){"--code", code, "--no-baseline", "--cycles", "4", "--warmup", "0", NULL});
        char want[160];
        snprintf(want, sizeof want, "EXIT: the worker process ended with exit status %s in cycle 3", codes[i]);
        ck_assert_msg(r.status == 3, "%s: exit %d, expected 3", action, r.status);
        ck_assert_msg(strstr(r.out, want) && !strstr(r.out, "BROKEN"), "%s: report:\n%s", action, tail(r.out));
        free_result(&r);
        free(code);
    }
}
END_TEST

/* SIGINT/SIGTERM/SIGHUP to the driver (issue 10): the partial report of
 * the finished cycles, marked interrupted, exit 5, and the worker ends
 * (SIGHUP: a closed terminal; at its default it left the subject's
 * children running). */
static void expect_interrupted(int sig, int json)
{
    ck_assert_int_eq(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);
    char outp[] = "/tmp/lc-test-out-XXXXXX";
    int of = mkstemp(outp);
    ck_assert(of >= 0);
    unlink(outp);
    const char *argv[] = {LC_TOOL, "--cycles", "1000000", "--no-baseline", "--warmup", "0", json ? "--json" : NULL, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, of, 1);
    pid_t pid;
    ck_assert_int_eq(posix_spawn(&pid, LC_TOOL, &fa, NULL, (char *const *)argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    usleep(1500 * 1000);
    kill(pid, sig);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    char *out = slurp(of);
    close(of);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 5, "signal %d: status 0x%x, expected exit 5\n%s", sig, st, tail(out));
    if (json) {
        json_t *j = json_loads(out, 0, NULL);
        ck_assert_msg(j != NULL, "not JSON:\n%s", tail(out));
        ck_assert_str_eq(json_string_value(json_object_get(j, "verdict")), "interrupted");
        ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(j, "interrupted"), "signal")), sig);
        ck_assert_int_eq(json_integer_value(json_object_get(j, "exit_status")), 5);
        json_decref(j);
    } else {
        ck_assert_msg(strstr(out, "INTERRUPTED by signal") && strstr(out, "exit status 5"), "report:\n%s", tail(out));
    }
    free(out);
    /* the worker ended: this test is a subreaper, so a worker that outlived
       the driver would be our child now (waitpid 0: alive, or its pid) */
    ck_assert_msg(waitpid(-1, &st, WNOHANG) == -1, "a process of the run outlived the driver");
}

START_TEST(test_interrupted)
{
    expect_interrupted(SIGTERM, 1);
    expect_interrupted(SIGINT, 0);
    expect_interrupted(SIGHUP, 1);
}
END_TEST

/* 3.11 has only legacy interpreters: asking for another config is a usage error */
START_TEST(test_config_needs_312)
{
    result r = run_tool((const char *[]){"--config", "isolated", "--cycles", "4", "--json", NULL});
    if (at_least(3, 12)) {
        ck_assert_msg(finished_run(r.status), "3.12+: isolated runs; exit %d\n%s%s", r.status, tail(r.out), tail(r.err));
    } else {
        ck_assert_msg(r.status == 2, "3.11: expected exit 2, got %d", r.status);
        ck_assert_msg(strstr(r.err, "needs CPython 3.12 or newer") != NULL, "stderr: %s", tail(r.err));
    }
    free_result(&r);
}
END_TEST

/* --- crashes and hangs are findings: exit 3 ------------------------------- */
/* a --json run whose worker aborted (SIGABRT) in cycle 1, a subject cycle */
static json_t *expect_abort_in_cycle1(const result *r)
{
    ck_assert_msg(r->status == 3, "exit %d, expected 3\n%s%s", r->status, tail(r->out), tail(r->err));
    json_t *c = json_object_get(r->json, "crash");
    ck_assert_msg(json_is_object(c), "no crash object:\n%s", tail(r->out));
    ck_assert_int_eq(json_integer_value(json_object_get(c, "signal")), 6);
    ck_assert_int_eq(json_integer_value(json_object_get(c, "cycle")), 1);
    ck_assert_str_eq(json_string_value(json_object_get(c, "cycle_kind")), "subject");
    return c;
}

START_TEST(test_crash_reported)
{
    result r = run_tool((const char *[]){"--code", "import os\nos.abort()", "--cycles", "4", "--json", NULL});
    expect_abort_in_cycle1(&r);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "verdict")), "crash");
    free_result(&r);
    /* the text report names signal, cycle and subject */
    r = run_tool((const char *[]){"--code", "import os\nos.abort()", "--cycles", "4", NULL});
    ck_assert_int_eq(r.status, 3);
    ck_assert_msg(strstr(r.out, "CRASH: the worker was killed by signal 6") && strstr(r.out, "in cycle 1")
                  && strstr(r.out, "subject: --code"), "report:\n%s", tail(r.out));
    free_result(&r);
}
END_TEST

START_TEST(test_hang_reported)
{
    result r = run_tool((const char *[]){"--code", "import time\ntime.sleep(60)", "--cycles", "4", "--timeout", "1",
                                         NULL});
    ck_assert_msg(r.status == 3, "exit %d, expected 3\n%s", r.status, tail(r.out));
    ck_assert_msg(strstr(r.out, "HANG: cycle 1") != NULL, "report:\n%s", tail(r.out));
    free_result(&r);
}
END_TEST

/* --- hostile subjects (issue 16): each reported, nothing left running ------ */
static int sanitized(void)
{
    const char *s = getenv("LC_TEST_SANITIZED");
    return s && *s;
}

/* The signals a subject raises in cycle 2 (os.kill(os.getpid(), N)): the
 * worker dies of each (CPython installs no handler in the worker:
 * PyConfig.install_signal_handlers = 0; the driver starts it with every
 * signal at its default, none blocked).  Exit 3, the signal's number,
 * abbreviation and the cycle in the report and in --json.  Under ASan its
 * runtime catches SIGSEGV, SIGBUS and SIGFPE itself (handle_segv,
 * handle_sigbus, handle_sigfpe default on): it prints its report ("SUMMARY:
 * AddressSanitizer: SEGV ...") and exits 1 - the driver says so ("SANITIZER:
 * AddressSanitizer: SEGV in cycle 2", crash.reason), asserted instead;
 * SIGILL and SIGABRT (handle_sigill, handle_abort default off) kill it. */
START_TEST(test_crash_each_signal)
{
    static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGKILL, SIGTERM, SIGQUIT, SIGTRAP, SIGSYS,
                               SIGXCPU, SIGUSR1, SIGALRM};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
        int sig = sigs[i];
        int asan_catches = sanitized() && (sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE);
        char action[64], abbrev[32], asan_kind[64];
        snprintf(asan_kind, sizeof asan_kind, "AddressSanitizer: %s", sigabbrev_np(sig));   /* SEGV, BUS, FPE */
        snprintf(action, sizeof action, "os.kill(os.getpid(), %d)", sig);
        snprintf(abbrev, sizeof abbrev, "SIG%s", sigabbrev_np(sig));
        char *code = in_cycle(2, action);
        result r = run_tool((const char *[]){"--code", code, "--no-baseline", "--cycles", "4", "--warmup", "0", "--json",
                                             NULL});
        ck_assert_msg(r.status == 3, "%s: exit %d, expected 3\n%s%s", abbrev, r.status, tail(r.out), tail(r.err));
        json_t *c = json_object_get(r.json, "crash");
        ck_assert_msg(json_is_object(c), "%s: no crash object\n%s", abbrev, tail(r.out));
        ck_assert_str_eq(json_string_value(json_object_get(r.json, "verdict")), "crash");
        ck_assert_str_eq(json_string_value(json_object_get(c, "kind")), "crash");
        ck_assert_int_eq(json_integer_value(json_object_get(c, "cycle")), 2);
        ck_assert_int_eq(json_integer_value(json_object_get(r.json, "cycles_finished")), 1);
        if (asan_catches) {
            const char *out = json_string_value(json_object_get(c, "output_tail"));
            ck_assert_msg(json_is_null(json_object_get(c, "signal")), "%s under ASan: a signal in the report", abbrev);
            ck_assert_int_eq(json_integer_value(json_object_get(c, "exit_status")), 1);
            ck_assert_msg(out && strstr(out, "AddressSanitizer"), "%s under ASan: no ASan report in\n%s", abbrev,
                          out ? out : "(none)");
            const char *why = json_string_value(json_object_get(c, "reason"));
            ck_assert_msg(why && strstr(why, asan_kind), "%s under ASan: reason %s", abbrev, why ? why : "(none)");
        } else {
            ck_assert_msg(json_integer_value(json_object_get(c, "signal")) == sig, "%s: signal %lld", abbrev,
                          (long long)json_integer_value(json_object_get(c, "signal")));
            ck_assert_str_eq(json_string_value(json_object_get(c, "signal_abbrev")), abbrev);
            ck_assert_str_eq(json_string_value(json_object_get(c, "signal_name")), sigdescr_np(sig));
        }
        free_result(&r);
        r = run_tool((const char *[]){"--code", code, "--no-baseline", "--cycles", "4", "--warmup", "0", NULL});
        ck_assert_int_eq(r.status, 3);
        char want[160];
        if (asan_catches) snprintf(want, sizeof want, "SANITIZER: %s in cycle 2", asan_kind);
        else snprintf(want, sizeof want, "CRASH: the worker was killed by signal %d (%s, %s) in cycle 2", sig, abbrev,
                      sigdescr_np(sig));
        ck_assert_msg(strstr(r.out, want) && strstr(r.out, "exit status 3"), "%s: '%s' not in the report:\n%s", abbrev,
                      want, tail(r.out));
        free_result(&r);
        free(code);
    }
}
END_TEST

/* Is any process of group pgid left (zombies included)?  kill(-pgid, 0). */
static int group_gone(pid_t pgid) { return kill(-pgid, 0) == -1 && errno == ESRCH; }

/* A file the subject writes its process group (the worker's pid: it leads
 * its group) and more pids into; the path into path. */
static void temp_path(char *path, size_t n, const char *what)
{
    snprintf(path, n, "/tmp/lc-test-%s-%ld", what, (long)getpid());
    unlink(path);
}

static int read_pids(const char *path, long *pids, int max)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int n = 0;
    while (n < max && fscanf(f, "%ld", &pids[n]) == 1) n++;
    fclose(f);
    return n;
}

/* A subject that starts processes (subprocess.Popen, os.system's "sleep &":
 * an orphan the worker, a subreaper, inherits), writes their pids and its
 * process group, then runs action: the run ends (exit want) and, when the
 * driver returns, no process of the worker's group is left, not even a
 * zombie; `kind` is the verdict. */
static void expect_nothing_left(const char *action, const char *const *extra, int want, const char *kind)
{
    char path[128], *code;
    temp_path(path, sizeof path, "pids");
    ck_assert(asprintf(&code, "import os, subprocess, time, threading\n"
                              "p = subprocess.Popen(['sleep', '60'])\n"
                              "os.system('sleep 60 &')\n"
                              "with open('%s', 'w') as f: f.write('%%d %%d' %% (os.getpgrp(), p.pid))\n%s\n",
                       path, action) > 0);
    const char *args[32] = {"--code", code, "--no-baseline", "--cycles", "4", "--warmup", "0", "--json"};
    int n = 8;
    for (int i = 0; extra[i]; i++) args[n++] = extra[i];
    args[n] = NULL;
    result r = run_tool(args);
    long pids[2] = {0, 0};
    ck_assert_msg(read_pids(path, pids, 2) == 2, "%s: the subject wrote no pids\n%s%s", action, tail(r.out), tail(r.err));
    ck_assert_msg(r.status == want, "%s: exit %d, expected %d\n%s%s", action, r.status, want, tail(r.out), tail(r.err));
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "verdict")), kind);
    ck_assert_msg(group_gone((pid_t)pids[0]), "%s: a process of the worker's group %ld is left", action, pids[0]);
    ck_assert_msg(kill((pid_t)pids[1], 0) == -1 && errno == ESRCH, "%s: the subject's child %ld is left", action, pids[1]);
    /* both sleeps outlived the worker, in its group: the driver killed them */
    json_int_t killed = json_integer_value(json_object_get(json_object_get(r.json, "children"), "killed_with_group"));
    ck_assert_msg(killed >= 2, "%s: killed_with_group %lld, expected the two sleeps", action, (long long)killed);
    free_result(&r);
    unlink(path);
    free(code);
}

/* The driver killed by SIGKILL mid-run (nothing of it runs to clean up):
 * the worker dies too, by PR_SET_PDEATHSIG.  This test is a subreaper, so
 * the orphaned worker becomes its child: reaped here, killed by SIGKILL. */
static void expect_worker_dies_with_driver(void)
{
    char path[128], *code;
    temp_path(path, sizeof path, "worker");
    ck_assert(asprintf(&code, "import os, time\nwith open('%s', 'w') as f: f.write(str(os.getpgrp()))\ntime.sleep(60)",
                       path) > 0);
    running t = start_tool((const char *[]){"--code", code, "--no-baseline", "--cycles", "4", "--warmup", "0", NULL});
    long worker = 0;
    for (int i = 0; i < 3000 && !read_pids(path, &worker, 1); i++) usleep(10 * 1000);
    ck_assert_msg(worker > 0, "the subject did not start within 30 s");
    ck_assert_int_eq(kill(t.pid, SIGKILL), 0);
    result r = finish_tool(&t);
    ck_assert_int_eq(r.status, 128 + SIGKILL);
    int st = 0;
    pid_t got = 0;
    for (int i = 0; i < 500 && got == 0; i++) {
        got = waitpid((pid_t)worker, &st, WNOHANG);
        if (!got) usleep(10 * 1000);
    }
    ck_assert_msg(got == (pid_t)worker, "the worker %ld outlived the driver by 5 s (waitpid %ld)", worker, (long)got);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the worker ended with status 0x%x, not SIGKILL", st);
    ck_assert(group_gone((pid_t)worker));
    free_result(&r);
    unlink(path);
    free(code);
}

/* A child the driver had before its first worker is not the run's: a
 * shell's "cmd & exec pyfini-leakcheck" hands cmd to it, and the orphan
 * sweep (the driver is a subreaper) had killed it and counted it as the
 * subject's ("1 that had left it (setsid)"). */
static void expect_inherited_child_spared(void)
{
    char path[128], *cmd;
    temp_path(path, sizeof path, "inherited");
    ck_assert(asprintf(&cmd, "sleep 60 </dev/null >/dev/null 2>&1 & echo $! > '%s'; exec '%s' --code pass "
                             "--no-baseline --cycles 4 --warmup 0 --json >/dev/null 2>&1", path, LC_TOOL) > 0);
    const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    pid_t sh;
    ck_assert_int_eq(posix_spawn(&sh, "/bin/sh", NULL, NULL, (char *const *)argv, environ), 0);
    int st;
    ck_assert_int_eq(waitpid(sh, &st, 0), sh);
    long pid = 0;
    ck_assert_msg(read_pids(path, &pid, 1) == 1, "the shell wrote no pid");
    int alive = kill((pid_t)pid, 0) == 0;
    kill((pid_t)pid, SIGKILL);   /* ours now (this test is a subreaper): reaped */
    waitpid((pid_t)pid, &st, 0);
    ck_assert_msg(alive, "the driver killed %ld, a child it had before its first worker", pid);
    free(cmd);
}

/* A process that leaves the group (setsid(): subprocess's start_new_session)
 * is out of the group kill's reach, but comes to the driver (a subreaper)
 * when the worker dies, and is killed there: gone when the driver returns. */
static void expect_setsid_caught(void)
{
    char path[128], *code;
    temp_path(path, sizeof path, "setsid");
    ck_assert(asprintf(&code, "import os, subprocess, time\n"
                              "p = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
                              "with open('%s', 'w') as f: f.write(str(p.pid))\ntime.sleep(60)", path) > 0);
    result r = run_tool((const char *[]){"--code", code, "--no-baseline", "--cycles", "4", "--warmup", "0", "--timeout",
                                         "1", "--json", NULL});
    long pid = 0;
    ck_assert_msg(read_pids(path, &pid, 1) == 1, "the subject wrote no pid\n%s%s", tail(r.out), tail(r.err));
    ck_assert_int_eq(r.status, 3);
    ck_assert_msg(kill((pid_t)pid, 0) == -1 && errno == ESRCH, "the setsid() child %ld outlived the driver", pid);
    json_t *c = json_object_get(r.json, "children");
    ck_assert_int_eq(json_integer_value(json_object_get(c, "killed_left_group")), 1);
    free_result(&r);
    unlink(path);
    free(code);
}

START_TEST(test_nothing_left_running)
{
    ck_assert_int_eq(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);
    /* a hang: the worker killed at the timeout, its group with it */
    expect_nothing_left("time.sleep(60)", (const char *[]){"--timeout", "1", NULL}, 3, "hang");
    /* a thread that sleeps: Py_EndInterpreter waits for it (threading._shutdown) */
    expect_nothing_left("threading.Thread(target=time.sleep, args=(60,)).start()",
                        (const char *[]){"--timeout", "1", NULL}, 3, "hang");
    /* a crash of the worker itself */
    expect_nothing_left("os.abort()", (const char *[]){NULL}, 3, "crash");
    /* os._exit: the worker ends by itself, before waiting for its children */
    expect_nothing_left("os._exit(0)", (const char *[]){NULL}, 3, "crash");
    /* a subject that kills its own process group: the driver is not in it */
    expect_nothing_left("os.killpg(0, 9)", (const char *[]){NULL}, 3, "crash");
    expect_worker_dies_with_driver();
    expect_setsid_caught();
    expect_inherited_child_spared();
    /* nothing of any run is left to this subreaper (the driver reaped it all) */
    int st;
    ck_assert_msg(waitpid(-1, &st, WNOHANG) == -1 && errno == ECHILD, "a process of a run came back to the test");
}
END_TEST

/* The driver's own high-water mark of resident memory (VmHWM), bytes; -1 gone. */
static long long vm_hwm(pid_t pid)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%ld/status", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *v = strstr(buf, "VmHWM:");
    long long kb;
    return v && sscanf(v + 6, "%lld", &kb) == 1 ? kb * 1024 : -1;
}

/* 100 MB on stdout and 100 MB on stderr in cycle 1, and one 100 kB line: the
 * driver reads it all (the worker never blocks on a full pipe), keeps a
 * bounded summary, its own memory stays bounded (VmHWM read every 20 ms
 * while it runs), and the report says the output was cut.  Under ASan too
 * (14 s there, 4 s plain, CPython 3.12.1; the driver's VmHWM 11 MB, 6 MB). */
START_TEST(test_output_flood)
{
    char *code = in_cycle(1, "import sys; sys.stdout.write(('o' * 99 + '\\n') * 1000000); "
                             "sys.stderr.write(('e' * 99 + '\\n') * 1000000); sys.stderr.write('L' * 100000 + '\\n')");
    for (int json = 1; json >= 0; json--) {
        const char *args[] = {"--code", code, "--no-baseline", "--cycles", "4", "--warmup", "0", json ? "--json" : NULL,
                              NULL};
        running t = start_tool(args);
        long long hwm = 0;
        for (;;) {   /* until it ended (WNOWAIT: reaped by finish_tool) */
            long long h = vm_hwm(t.pid);
            if (h > hwm) hwm = h;
            siginfo_t si;
            memset(&si, 0, sizeof si);
            if (waitid(P_PID, (id_t)t.pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == t.pid) break;
            usleep(20 * 1000);
        }
        result r = finish_tool(&t);
        ck_assert_msg(finished_run(r.status), "exit %d: the flood was not a finished run\n%s%s",
                      r.status, tail(r.out), tail(r.err));
        ck_assert_msg(hwm > 0 && hwm < 64LL << 20, "the driver's VmHWM %lld bytes: not bounded (64 MB)", hwm);
        if (json) {
            json_t *o = json_object_get(r.json, "subject_output");
            ck_assert_msg(json_is_object(o), "no subject_output:\n%s", tail(r.out));
            ck_assert(json_integer_value(json_object_get(o, "stdout_bytes")) >= 100000000);
            ck_assert(json_integer_value(json_object_get(o, "stderr_bytes")) >= 100100000);
            ck_assert(json_is_true(json_object_get(o, "cut")));
            ck_assert_int_eq(json_integer_value(json_object_get(o, "stderr_lines_cut")), 1);
            ck_assert_int_eq(json_integer_value(json_object_get(stderr_of(&r), "lines")), 1000001);
            ck_assert_int_eq(json_integer_value(json_object_get(r.json, "cycles_finished")), 4);
        } else {
            ck_assert_msg(strstr(r.out, "subject's output: CUT: 100.00 MB on stdout, 100.10 MB on stderr")
                          && strstr(r.out, "1 longer line cut"), "report:\n%s", tail(r.out));
        }
        printf("output_flood: the driver's VmHWM %.1f MB (%s)\n", (double)hwm / 1048576, json ? "--json" : "text");
        free_result(&r);
    }
    free(code);
}
END_TEST

/* A subject that allocates without end (1 MB at a time, appended to a list,
 * in cycle 2) under --max-rss 300M: the driver reads the worker's VmRSS
 * every 20 ms and kills it above the limit: verdict "memory limit", exit 3,
 * the RSS at the kill and the limit in --json.  Under ASan too: its shadow
 * memory is in the resident set but far below 300 MiB before cycle 2 (the
 * worker sets no RLIMIT_DATA there). */
START_TEST(test_memory_limit)
{
    const char *code = "import os, time\n"
                       "n = int(os.environ.get('LC_TEST_N', '0')) + 1\n"
                       "os.putenv('LC_TEST_N', str(n))\n"
                       "l = []\n"
                       "while n == 2:\n"
                       "    l.append(b'x' * (1 << 20))\n"
                       "    time.sleep(0.001)\n";
    result r = run_tool((const char *[]){"--code", code, "--no-baseline", "--cycles", "4", "--warmup", "0",
                                         "--max-rss", "300M", "--json", NULL});
    ck_assert_msg(r.status == 3, "exit %d, expected 3\n%s%s", r.status, tail(r.out), tail(r.err));
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "verdict")), "memory limit");
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "max_rss")), 300LL << 20);
    json_t *c = json_object_get(r.json, "crash");
    ck_assert_str_eq(json_string_value(json_object_get(c, "kind")), "memory");
    ck_assert_int_eq(json_integer_value(json_object_get(c, "cycle")), 2);
    json_int_t rss = json_integer_value(json_object_get(c, "rss_at_kill"));
    ck_assert_msg(rss > 300LL << 20 && rss < 600LL << 20, "rss_at_kill %lld: not just above 300 MiB", (long long)rss);
    printf("memory_limit: killed at %.1f MiB\n", (double)rss / 1048576);
    free_result(&r);
    r = run_tool((const char *[]){"--code", code, "--no-baseline", "--cycles", "4", "--warmup", "0", "--max-rss",
                                  "300M", NULL});
    ck_assert_int_eq(r.status, 3);
    ck_assert_msg(strstr(r.out, "MEMORY LIMIT: the worker's resident set was") && strstr(r.out, "in cycle 2 (a subject cycle")
                  && strstr(r.out, "above --max-rss 314.57 MB (314572800 bytes)"), "report:\n%s", tail(r.out));
    free_result(&r);
    /* 0: no limit (a run that allocates a little finishes) */
    r = run_tool((const char *[]){"--max-rss", "0", "--cycles", "4", "--json", NULL});
    /* finished and judged, or (4 cycles, a meter undecided: the issue-25
       rule) finished and "not judged" - never the memory limit (3) */
    ck_assert_msg(finished_run(r.status), "--max-rss 0: exit %d\n%s", r.status, tail(r.err));
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "max_rss")), 0);
    free_result(&r);
    /* one allocation above the backstop (RLIMIT_DATA, twice the limit; not
       under ASan) never reaches the resident set: the subject's MemoryError,
       which must say that the limit is the tool's */
    if (sanitized()) return;
    r = run_tool((const char *[]){"--code", "b = bytearray(1 << 30)", "--no-baseline", "--cycles", "4", "--warmup",
                                  "0", "--max-rss", "300M", NULL});
    ck_assert_msg(r.status == 2, "exit %d, expected 2\n%s", r.status, tail(r.err));
    ck_assert_msg(strstr(r.err, "MemoryError") && strstr(r.err, "limited to 629145600 bytes, RLIMIT_DATA at twice --max-rss"),
                  "stderr:\n%s", tail(r.err));
    free_result(&r);
}
END_TEST

/* Real case: an isolated interpreter importing decimal aborts on 3.12.1
 * ("double free or corruption").  Other versions: no crash expected. */
START_TEST(test_decimal_isolated)
{
    if (!at_least(3, 12)) return;   /* 3.11: no isolated interpreters (test_config_needs_312) */
    result r = run_tool((const char *[]){"--config", "isolated", "--import", "decimal", "--cycles", "10", "--json", NULL});
    if (py_major == 3 && py_minor == 12 && py_patch == 1) {
        ck_assert_msg(r.status == 3, "3.12.1: expected the crash (exit 3), got %d\n%s", r.status, tail(r.out));
        json_t *c = json_object_get(r.json, "crash");
        ck_assert_msg(json_is_object(c), "no crash object:\n%s", tail(r.out));
        ck_assert_str_eq(json_string_value(json_object_get(c, "cycle_kind")), "subject");
        /* the memory corruption shows as glibc's "double free or corruption"
         * abort (SIGABRT) or as a SIGSEGV, depending on the address layout */
        ck_assert_msg(json_integer_value(json_object_get(c, "signal")) == 6
                      || json_integer_value(json_object_get(c, "signal")) == 11, "3.12.1: SIGABRT or SIGSEGV expected");
    } else {
        ck_assert_msg(finished_run(r.status), "%d.%d.%d: expected no crash, exit %d\n%s", py_major, py_minor,
                      py_patch, r.status, tail(r.out));
    }
    free_result(&r);
}
END_TEST

/* --- CPython's own loss per bare cycle ------------------------------------ */
/* 3.12/3.13: about 1.7 MB RSS (2.0 MB with the tool's 16-byte headers in
 * every block) and 394 kB malloc per isolated cycle: LEAK.  3.14+: no leak. */
START_TEST(test_bare_isolated)
{
    if (!at_least(3, 12)) return;
    result r = run_tool((const char *[]){"--config", "isolated", "--cycles", "60", "--json", NULL});
    if (!at_least(3, 14)) {
        ck_assert_msg(r.status == 1, "%d.%d: expected LEAK (exit 1), got %d\n%s", py_major, py_minor, r.status, tail(r.out));
        ck_assert_str_eq(verdict_of(&r, "rss"), "LEAK");
        ck_assert_str_eq(verdict_of(&r, "malloc"), "LEAK");
        double rss = judged_per_cycle(&r, "rss"), mal = judged_per_cycle(&r, "malloc");
        ck_assert_msg(rss > 1.4e6 && rss < 2.4e6, "rss %.0f B/cycle, expected about 1.7-2.0 MB", rss);
        ck_assert_msg(mal > 380e3 && mal < 420e3, "malloc %.0f B/cycle, expected about 394 kB", mal);
        ck_assert_msg(judged_per_cycle(&r, "py.obm") > 390000,
                      "py.obm: the abandoned obmalloc's arena map (393,984 B on 3.12.1) is lost");
    } else {
        ck_assert_msg(r.status == 0, "%d.%d: expected no leak (exit 0), got %d\n%s", py_major, py_minor, r.status, tail(r.out));
        no_bytes_meter_leaks(&r);
    }
    free_result(&r);
}
END_TEST

/* 3.12/3.13: a bare legacy cycle loses Python objects (77 kB on 3.12.1, 147 kB
 * on 3.13.0): LEAK in py.obj.  3.14+: no leak.  3.11: reported, not judged here. */
START_TEST(test_bare_legacy)
{
    result r = run_tool((const char *[]){"--cycles", "60", "--json", NULL});
    ck_assert_msg(finished_run(r.status), "exit %d\n%s%s", r.status, tail(r.out), tail(r.err));
    if (at_least(3, 14)) {
        ck_assert_msg(r.status == 0, "%d.%d: expected no leak, exit %d\n%s", py_major, py_minor, r.status, tail(r.out));
        no_bytes_meter_leaks(&r);
    } else if ((py_minor == 12 && py_patch == 1) || (py_minor == 13 && py_patch == 0)) {
        /* measured here: 77 kB (3.12.1), 147 kB (3.13.0) of objects per cycle */
        ck_assert_str_eq(verdict_of(&r, "py.obj"), "LEAK");
        ck_assert_msg(judged_per_cycle(&r, "py.obj") > 50e3, "py.obj %.0f B/cycle", judged_per_cycle(&r, "py.obj"));
        ck_assert_int_eq(r.status, 1);
    } else if (at_least(3, 12)) {
        /* other 3.12/3.13 releases: later fixes changed this (3.13.18: no
           loss); judged, not asserted */
        printf("NOTE bare legacy cycle on CPython %d.%d.%d: py.obj %s, %.0f B/cycle\n", py_major,
               py_minor, py_patch, verdict_of(&r, "py.obj"), judged_per_cycle(&r, "py.obj"));
    }
    free_result(&r);
}
END_TEST

/* --- the C-heap meter: heap, heap.plain (tests/heapmod.c, heapnew.cpp) ----- */
/* Exact meters judge by the exact rule, so few cycles do: 8 judged rounds
 * (8 block pairs of 1 subject + 1 bare cycle, 3 chunks), legacy
 * interpreters (every CPython). */
static result heap_run(const char *module, const char *max_bytes, const char *warmup, int where)
{
    const char *args[16] = {"--config", "legacy", "--import", module, "--cycles", "8", "--warmup", warmup,
                            "--max-bytes-per-cycle", max_bytes, "--json"};
    if (where) args[11] = "--where";
    return run_tool(args);
}

/* heap.plain on every CPython; heap (which also holds Python's RAW blocks)
 * on 3.12+ only: on 3.11 CPython's own objects of one cycle are freed in a
 * later one, so heap moves by kilobytes per cycle there (as py does) */
static void expect_heap(const result *r, const char *module, const char *verdict, double lo, double hi)
{
    static const char *const meters[] = {"heap.plain", "heap"};
    for (int i = 0; i < (at_least(3, 12) ? 2 : 1); i++) {
        const char *v = verdict_of(r, meters[i]);
        ck_assert_msg(v && !strcmp(v, verdict), "%s: %s judged %s, expected %s\n%s%s", module, meters[i],
                      v ? v : "(none)", verdict, tail(r->out), tail(r->err));
        double x = judged_per_cycle(r, meters[i]);
        ck_assert_msg(x >= lo && x <= hi, "%s: %s excess %.1f B/cycle, expected %.0f..%.0f", module, meters[i], x, lo,
                      hi);
    }
}

START_TEST(test_heap_malloc200)
{
    /* malloc(200) lost per import: 200 B usable (glibc: request + 8, rounded
       to 16, minus the 8-byte header) */
    result r = heap_run("_pyfini_heap_malloc200", "100", "1", 0);
    ck_assert_msg(r.status == 1, "B=100: exit %d, expected 1 (LEAK)\n%s%s", r.status, tail(r.out), tail(r.err));
    expect_heap(&r, "malloc200, B=100", "LEAK", 184, 216);
    ck_assert_str_eq(verdict_of(&r, "py.raw"), "no leak");   /* not Python's allocators */
    free_result(&r);
    r = heap_run("_pyfini_heap_malloc200", "1000", "1", 0);
    expect_heap(&r, "malloc200, B=1000", "no leak", 184, 216);
    ck_assert_msg(r.status == 0, "B=1000: exit %d, expected 0 (no leak)\n%s%s", r.status, tail(r.out), tail(r.err));
    free_result(&r);
    /* the text report says which bytes are in two meters (py.* and heap) */
    const char *text[] = {"--import", "_pyfini_heap_malloc200", "--cycles", "4", "--warmup", "1", NULL};
    r = run_tool(text);
    ck_assert_msg(strstr(r.out, "(bytes in two meters: ") && strstr(r.out, "heap.plain is heap without them)"),
                  "no two-meter line in the report\n%s", tail(r.out));
    free_result(&r);
}
END_TEST

START_TEST(test_heap_cxx_new)
{
    /* operator new of a 64-byte object per import: libstdc++'s new calls
       malloc, the worker's; --where names the C++ function, demangled */
    /* imported on line 2 of --code: the Python line of the C-heap site (the
       pass's C profile function, where.c), on every CPython */
    const char *args[16] = {"--config", "legacy", "--code", "x = 1\nimport _pyfini_heap_new\n", "--cycles", "8",
                            "--warmup", "1", "--max-bytes-per-cycle", "0", "--json", "--where"};
    result r = run_tool(args);
    ck_assert_msg(r.status == 1, "exit %d, expected 1 (LEAK)\n%s%s", r.status, tail(r.out), tail(r.err));
    expect_heap(&r, "new", "LEAK", 64, 80);
    json_t *where = json_object_get(r.json, "where"), *site;
    size_t i;
    int found = 0;
    json_array_foreach(where, i, site) {
        if (strcmp(json_string_value(json_object_get(site, "domain")), "heap") != 0) continue;
        ck_assert_msg(strstr(json_string_value(json_array_get(json_object_get(site, "frames"), 0)),
                             "pyfini_test::Registry::remember(int)"),
                      "first heap site is not the demangled pyfini_test::Registry::remember(int):\n%s", tail(r.out));
        double b = json_number_value(json_object_get(site, "bytes_per_cycle"));
        ck_assert_msg(b >= 64 && b <= 80, "heap site: %.1f B/cycle", b);
        const char *line = json_string_value(json_array_get(json_object_get(site, "python_frames"), 0));
        ck_assert_msg(line && strcmp(line, "<--code>:2") == 0, "heap site's Python line: %s, expected <--code>:2\n%s",
                      line ? line : "(none)", tail(r.out));
        found = 1;
        break;
    }
    ck_assert_msg(found, "no heap site in --where:\n%s", tail(r.out));
    free_result(&r);
    /* a call that makes no call event (a ctypes function): the line event
       of the pass's trace function gives its line, not the line before */
    const char *ct[16] = {"--config", "legacy", "--code",
                          "import ctypes\nlibc = ctypes.CDLL(None)\nlibc.malloc.restype = ctypes.c_void_p\n"
                          "x = len('abc')\np = libc.malloc(200)\n",
                          "--cycles", "8", "--warmup", "1", "--max-bytes-per-cycle", "0", "--json", "--where"};
    r = run_tool(ct);
    if (r.status == 2 && strstr(r.out, "ctypes")) {
        printf("NOTE heap_cxx_new on CPython %s: no ctypes, the line of a ctypes call not checked\n", LC_TEST_PY_VERSION);
        free_result(&r);
        return;
    }
    ck_assert_msg(r.status == 1, "ctypes malloc: exit %d, expected 1 (LEAK)\n%s%s", r.status, tail(r.out), tail(r.err));
    found = 0;
    json_array_foreach(json_object_get(r.json, "where"), i, site) {
        const char *line = json_string_value(json_array_get(json_object_get(site, "python_frames"), 0));
        if (strcmp(json_string_value(json_object_get(site, "domain")), "heap") == 0 && line &&
            strcmp(line, "<--code>:5") == 0)
            found = 1;
    }
    ck_assert_msg(found, "no heap site with the Python line <--code>:5 (the ctypes malloc):\n%s", tail(r.out));
    free_result(&r);
}
END_TEST

START_TEST(test_heap_realloc)
{
    /* a global buffer grown by 100 bytes per import with realloc */
    result r = heap_run("_pyfini_heap_realloc", "0", "1", 0);
    ck_assert_msg(r.status == 1, "exit %d, expected 1 (LEAK)\n%s%s", r.status, tail(r.out), tail(r.err));
    expect_heap(&r, "realloc", "LEAK", 84, 116);
    free_result(&r);
}
END_TEST

START_TEST(test_heap_no_leak)
{
    /* a cache that grows for the first 5 imports of the process, then stops:
       1 import in the warm-up, 4 in the first half of the judged block pairs,
       none in the second half (the growth stopped: no leak) */
    result r = heap_run("_pyfini_heap_cache5", "0", "1", 0);
    expect_heap(&r, "cache5", "no leak", 0, 1000);
    free_result(&r);
    /* malloc + free in the same import */
    r = heap_run("_pyfini_heap_mallocfree", "0", "1", 0);
    expect_heap(&r, "mallocfree", "no leak", 0, 0);
    free_result(&r);
    /* a block allocated in one cycle and freed by the next import */
    r = heap_run("_pyfini_heap_nextcycle", "0", "1", 0);
    expect_heap(&r, "nextcycle", "no leak", -1, 1);
    free_result(&r);
}
END_TEST

START_TEST(test_heap_corruption)
{
    /* a double free, a free of a pointer malloc never returned, and a block
       overrun over the next one's header are the subject's corruption:
       glibc's checks abort the worker in the subject's cycle, the run is a
       crash (exit 3) with glibc's message (the overrun: "munmap_chunk():
       invalid pointer" with Debian 12's glibc 2.36, "free(): invalid size"
       with sid's); the meter does not go on */
    static const char *const cases[][2] = {{"_pyfini_heap_doublefree", "double free"},
                                           {"_pyfini_heap_badfree", "free(): invalid"},
                                           {"_pyfini_heap_overrun", "(): invalid"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        result r = heap_run(cases[i][0], "0", "0", 0);
        json_t *c = expect_abort_in_cycle1(&r);
        const char *out = json_string_value(json_object_get(c, "output_tail"));
        ck_assert_msg(out && strstr(out, cases[i][1]), "%s: glibc's message '%s' not in the worker's output:\n%s",
                      cases[i][0], cases[i][1], tail(r.out));
        free_result(&r);
    }
}
END_TEST

/* --- the 64-byte test module ---------------------------------------------- */
static void leak64(const char *config)
{
    result r = run_tool((const char *[]){"--config", config, "--import", "_pyfini_leak64", "--cycles", "100", "--json",
                                         NULL});
    ck_assert_msg(r.status == 1, "%s: expected LEAK (exit 1), got %d\n%s%s", config, r.status, tail(r.out), tail(r.err));
    ck_assert_str_eq(verdict_of(&r, "py.raw"), "LEAK");
    double raw = judged_per_cycle(&r, "py.raw");
    ck_assert_msg(raw > 63.5 && raw < 64.5, "%s: py.raw excess %.2f B/cycle, expected 64", config, raw);
    /* 3.12+: the module's objects are all freed, py.obj's excess is exactly 0.
     * 3.11: objects left by one legacy cycle are freed in a later one (py.obj
     * moves by +-18 kB per cycle, bounded): only "not LEAK" is expected. */
    if (at_least(3, 12))
        ck_assert_msg(fabs(judged_per_cycle(&r, "py.obj")) < 1, "%s: py.obj excess should be 0", config);
    else
        ck_assert_msg(strcmp(verdict_of(&r, "py.obj"), "LEAK") != 0, "3.11: py.obj judged LEAK");
    free_result(&r);
}

START_TEST(test_leak64_legacy) { leak64("legacy"); }
END_TEST

START_TEST(test_leak64_isolated)
{
    if (!at_least(3, 12)) return;
    leak64("isolated");
}
END_TEST

/* the same module without the loss: no false LEAK in 20 runs */
START_TEST(test_noleak64_repeated)
{
    const char *config = at_least(3, 12) ? "isolated" : "legacy";
    for (int i = 0; i < 20; i++) {
        result r = run_tool((const char *[]){"--config", i % 2 ? config : "legacy", "--import", "_pyfini_noleak64",
                                             "--cycles", "20", "--warmup", "3", "--json", NULL});
        ck_assert_msg(r.status == 0, "run %d: exit %d (a false LEAK?)\n%s%s", i, r.status, tail(r.out), tail(r.err));
        no_bytes_meter_leaks(&r);
        ck_assert_msg(judged_per_cycle(&r, "py.raw") == 0 && (!at_least(3, 12) || judged_per_cycle(&r, "py.obj") == 0),
                      "run %d: py.raw excess %.2f, py.obj excess %.2f", i, judged_per_cycle(&r, "py.raw"),
                      judged_per_cycle(&r, "py.obj"));
        free_result(&r);
    }
}
END_TEST

/* --- the run's verdict rule (README "The verdict", its table; analyse.c
 * run_rule), a subject built for each row (tests/verdictmod.c) ---------- */
/* The verdict of a meter that the run's exit status judges: with the
 * default --judge subject and a split made (JSON "whose"), the subject's
 * share's for the meters the sites split; else the meter's own. */
static const char *judged_verdict_of(const result *r, const char *meter)
{
    json_t *w = json_object_get(r->json, "whose");
    if (json_is_object(w) && json_is_true(json_object_get(w, "done"))
        && !strcmp(json_string_value(json_object_get(w, "judge")), "subject")) {
        json_t *m = json_object_get(json_object_get(w, "meters"), meter);
        if (m) return json_string_value(json_object_get(m, "subject_verdict"));
    }
    return verdict_of(r, meter);
}

/* What the rule promises of any finished run with --max-bytes-per-cycle 0:
 * a count meter that is LEAK makes the run LEAK; "no leak" only where every
 * meter that sees the subject's allocations said "no leak". */
static void rule_holds(const result *r, const char *what)
{
    static const char *const counts[] = {"blocks", "heap.blocks", "refs", "fds"};
    static const char *const needed[] = {"py", "heap.plain", "blocks", "heap.blocks", "refs", "fds"};
    const char *verdict = json_string_value(json_object_get(r->json, "verdict"));
    ck_assert_msg(verdict != NULL, "%s: no verdict\n%s", what, tail(r->out));
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
        const char *v = judged_verdict_of(r, counts[i]);
        if (v && !strcmp(v, "LEAK"))
            ck_assert_msg(!strcmp(verdict, "LEAK") && r->status == 1, "%s: %s LEAK but the run says %s (exit %d)\n%s",
                          what, counts[i], verdict, r->status, tail(r->out));
    }
    if (strcmp(verdict, "no leak") != 0) return;
    ck_assert_int_eq(r->status, 0);
    for (size_t i = 0; i < sizeof needed / sizeof *needed; i++) {
        const char *v = judged_verdict_of(r, needed[i]);
        ck_assert_msg(!v || !strcmp(v, "no leak") || !strcmp(v, "unavailable"),
                      "%s: the run says no leak while %s is %s\n%s", what, needed[i], v ? v : "?", tail(r->out));
    }
}

static result vm_run(const char *module, const char *cycles)
{
    result r = run_tool((const char *[]){"--config", "legacy", "--import", module, "--cycles", cycles, "--warmup", "3",
                                         "--json", NULL});
    ck_assert_msg(json_is_object(r.json), "%s: no JSON, exit %d\n%s", module, r.status, tail(r.err));
    rule_holds(&r, module);
    return r;
}

static void expect_run(const result *r, const char *module, const char *verdict, int status)
{
    const char *v = json_string_value(json_object_get(r->json, "verdict"));
    ck_assert_msg(v && !strcmp(v, verdict) && r->status == status, "%s: verdict %s exit %d, expected %s exit %d\n%s",
                  module, v ? v : "?", r->status, verdict, status, tail(r->out));
}

static void expect_meter(const result *r, const char *module, const char *meter, const char *verdict)
{
    const char *v = verdict_of(r, meter);
    ck_assert_msg(v && !strcmp(v, verdict), "%s: %s judged %s, expected %s\n%s", module, meter, v ? v : "(none)",
                  verdict, tail(r->out));
}

/* 20 judged rounds each (3 + 20 x 2 legacy cycles, 2-4 s). */
START_TEST(test_verdict_rule)
{
    /* a steady loss of objects: py +1,120 B exactly, blocks +20 */
    result r = vm_run("_pyfini_vm_lists20", "20");
    expect_run(&r, "lists20", "LEAK", 1);
    expect_meter(&r, "lists20", "py", "LEAK");
    expect_meter(&r, "lists20", "blocks", "LEAK");
    double py = judged_per_cycle(&r, "py");
    ck_assert_msg(py > 1000 && py < 1300, "lists20: py %.1f B/cycle, expected 20 empty lists (about 1.1 kB)", py);
    free_result(&r);
    /* objects of another size each time: bytes unevenly, blocks by one */
    r = vm_run("_pyfini_vm_sizes", "20");
    expect_run(&r, "sizes", "LEAK", 1);
    expect_meter(&r, "sizes", "blocks", "LEAK");
    free_result(&r);
    /* a count meter alone: PyMem_Malloc(0), no byte, one block */
    r = vm_run("_pyfini_vm_zero", "20");
    expect_run(&r, "zero", "LEAK", 1);
    expect_meter(&r, "zero", "blocks", "LEAK");
    expect_meter(&r, "zero", "py", "no leak");
    free_result(&r);
    /* a file descriptor */
    r = vm_run("_pyfini_vm_fd", "20");
    expect_run(&r, "fd", "LEAK", 1);
    expect_meter(&r, "fd", "fds", "LEAK");
    free_result(&r);
    /* clean, allocating and freeing a lot: every meter that sees its
       allocations says no leak.  rss may grow in its cycles with no block
       count behind it (3.13.0, where CPython's own per-cycle loss pins the
       pages the subject's freed blocks leave: +455 kB against +2.5 kB; seen
       on 3.14.10 too) - not LEAK, not "no leak" either: only rss (or malloc)
       may be undecided */
    r = vm_run("_pyfini_vm_churn", "20");
    json_t *und = json_object_get(r.json, "undecided_meters");
    size_t ui;
    json_t *uv;
    json_array_foreach(und, ui, uv) {
        const char *name = json_string_value(uv);
        ck_assert_msg(!strcmp(name, "rss") || !strcmp(name, "malloc"), "churn: %s undecided\n%s", name, tail(r.out));
    }
    if (json_array_size(und)) expect_run(&r, "churn", "not judged", 4);
    else expect_run(&r, "churn", "no leak", 0);
    free_result(&r);
    /* a zero sub-meter never outvotes its inconclusive whole: py.mem (and
       py) move either way, py.raw, py.obj, heap.plain stay 0 - not judged */
    r = vm_run("_pyfini_vm_swap", "20");
    expect_meter(&r, "swap", "py.raw", "no leak");
    expect_meter(&r, "swap", "py.obj", "no leak");
    ck_assert_msg(strcmp(verdict_of(&r, "py"), "no leak") != 0, "swap: py judged no leak\n%s", tail(r.out));
    expect_run(&r, "swap", "not judged", 4);
    free_result(&r);
}
END_TEST

/* No LEAK from noise (issue 25, point 3): a table that grows in subject
 * cycles and shrinks in bare ones has a positive "excess" in every block
 * pair while the meter's own level does not grow, and no block count grows
 * with it: inconclusive, the run not judged (exit 4) - never LEAK, never
 * "no leak".  Before the rule: heap.plain +2.0 kB/cycle LEAK. */
START_TEST(test_no_leak_from_noise)
{
    result r = vm_run("_pyfini_vm_toggle", "20");
    expect_meter(&r, "toggle", "heap.plain", "inconclusive");
    json_t *hp = json_object_get(json_object_get(r.json, "meters"), "heap.plain");
    ck_assert_str_eq(json_string_value(json_object_get(hp, "overruled")), "noise");
    expect_meter(&r, "toggle", "heap.blocks", "no leak");
    expect_run(&r, "toggle", "not judged", 4);
    free_result(&r);
    /* the text report says why */
    r = run_tool((const char *[]){"--import", "_pyfini_vm_toggle", "--cycles", "8", "--warmup", "3", NULL});
    const char *why = strstr(r.out, "(judged inconclusive, not LEAK: ");
    ck_assert_msg(why && strstr(why, "heap.plain") && r.status == 4, "exit %d\n%s", r.status, tail(r.out));
    free_result(&r);
}
END_TEST

/* --- whose loss (README "Whose loss"; driver/whose.c, worker/whose.c) ---- */
static double whose_of(const result *r, const char *meter, const char *share)
{
    json_t *m = json_object_get(json_object_get(json_object_get(r->json, "whose"), "meters"), meter);
    json_t *v = json_object_get(m, share);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* 3.12 and 3.13 lose memory in every bare `import json` (marshal's interned
 * strings are immortal and outlive the interpreter: CPython gh-113993,
 * gh-116510): the split puts at least 90% of py's excess on CPython;
 * --judge whole judges it all (exit 1).  Elsewhere json loses nothing: its
 * run has nothing to split (said, not failed). */
START_TEST(test_whose_cpython)
{
    result r = run_tool((const char *[]){"--import", "json", "--cycles", "20", "--warmup", "10", "--judge", "whole",
                                         "--json", NULL});
    ck_assert_msg(json_is_object(r.json), "no JSON, exit %d\n%s", r.status, tail(r.err));
    const char *py = verdict_of(&r, "py");
    if (!(at_least(3, 12) && !at_least(3, 14)) || !py || strcmp(py, "LEAK") != 0) {
        printf("NOTE whose_cpython on CPython %s: bare `import json` judged %s: nothing to split\n",
               LC_TEST_PY_VERSION, py ? py : "?");
        ck_assert_msg(!json_is_object(json_object_get(r.json, "whose")) || r.status == 1, "a split without a LEAK");
        free_result(&r);
        return;
    }
    json_t *w = json_object_get(r.json, "whose");
    ck_assert_msg(json_is_true(json_object_get(w, "done")), "no split: %s\n%s",
                  json_string_value(json_object_get(w, "why_not")), tail(r.out));
    double e = whose_of(&r, "py", "excess"), c = whose_of(&r, "py", "cpython");
    printf("NOTE whose_cpython on CPython %s: py +%.0f B/cycle, CPython's +%.0f B, subject's +%.0f B, unattributed "
           "+%.0f B\n", LC_TEST_PY_VERSION, e, c, whose_of(&r, "py", "subject"), whose_of(&r, "py", "unattributed"));
    ck_assert_msg(c >= 0.9 * e, "CPython's share %.0f B of py's +%.0f B/cycle: below 90%%", c, e);
    ck_assert_msg(whose_of(&r, "py", "subject") <= 0.01 * e, "json's sites called the subject's");
    ck_assert_msg(r.status == 1, "--judge whole: exit %d, expected 1 (the whole excess is LEAK)", r.status);
    free_result(&r);
}
END_TEST

/* A module of ours that loses 20 empty lists (about 1.1 kB) per import: its
 * own share is LEAK, exit 1, on every CPython, and none of it is CPython's.
 * Its lists come off CPython's list free list (allocated by CPython's code
 * earlier in the cycle: 3.11.7 all 20, 3.13.0 6 of them): a free-list
 * type's allocation is never excused (worker/whose.c, free_list_frame). */
START_TEST(test_whose_subject)
{
    result r = run_tool((const char *[]){"--import", "_pyfini_vm_lists20", "--cycles", "20", "--warmup", "3", "--json",
                                         NULL});
    ck_assert_msg(json_is_object(r.json), "no JSON, exit %d\n%s", r.status, tail(r.err));
    expect_run(&r, "_pyfini_vm_lists20", "LEAK", 1);
    json_t *w = json_object_get(r.json, "whose");
    ck_assert_msg(json_is_true(json_object_get(w, "done")), "no split: %s\n%s",
                  json_string_value(json_object_get(w, "why_not")), tail(r.out));
    double e = whose_of(&r, "py", "excess"), s = whose_of(&r, "py", "subject") + whose_of(&r, "py", "unattributed");
    printf("NOTE whose_subject on CPython %s: py +%.0f B/cycle, the subject's +%.0f B (own sites +%.0f B), CPython's "
           "+%.0f B\n", LC_TEST_PY_VERSION, e, s, whose_of(&r, "py", "subject"), whose_of(&r, "py", "cpython"));
    ck_assert_msg(s >= 0.9 * e && s >= 1000, "the subject's share +%.0f B of +%.0f B/cycle", s, e);
    free_result(&r);
    /* the default judges the whole excess: a string the standard library
       made (posixpath.join) and the subject keeps reads as CPython's share
       (3.12.1, 3.13.0: "no leak", exit 0 under --judge subject, found by a
       review) - the default must still say LEAK */
    r = run_tool((const char *[]){"--import", "_pyfini_keep", "--code",
                                  "import _pyfini_keep as k, os; k.keep(os.path.join('a', 'b' * 300))", "--cycles",
                                  "20", "--warmup", "3", "--json", NULL});
    ck_assert_msg(r.status == 1, "a kept string by default: exit %d, expected 1 (LEAK)\n%s", r.status, tail(r.out));
    free_result(&r);
}
END_TEST

/* At the default cycles (10 + 100): 20 empty lists per import is LEAK on
 * every CPython, 3.11 included (issue 25: "no leak" there before the
 * worker sized 3.11's shared tables, worker/settle.c); and CPython's _ssl
 * on 3.11 (blocks +20 per import: PyErr_NewException in PyInit__socket) is
 * never "no leak" while a count meter says LEAK. */
START_TEST(test_verdict_default_cycles)
{
    result r = run_tool((const char *[]){"--import", "_pyfini_vm_lists20", "--json", NULL});
    rule_holds(&r, "lists20, default cycles");
    expect_run(&r, "lists20, default cycles", "LEAK", 1);
    expect_meter(&r, "lists20, default cycles", "py", "LEAK");
    double py = judged_per_cycle(&r, "py");
    ck_assert_msg(py > 1000 && py < 1300, "lists20: py %.1f B/cycle", py);
    free_result(&r);
    r = run_tool((const char *[]){"--import", "_ssl", "--cycles", "20", "--json", NULL});
    if (r.status == 2) {
        printf("NOTE verdict_default_cycles on CPython %s: no _ssl\n", LC_TEST_PY_VERSION);
    } else {
        rule_holds(&r, "_ssl");
        if (!at_least(3, 12)) expect_run(&r, "_ssl (3.11)", "LEAK", 1);
    }
    free_result(&r);
}
END_TEST

/* --early-stop (issue 27, point 3): --cycles is a cap; the run is judged
 * every LC_EARLY_STOP_ROUNDS (5) judged rounds and ends when its verdict
 * and every exact meter's are the same at two checkpoints in a row. */
static void expect_early(const result *r, const char *what, long cap, long stopped_at, long cycles)
{
    json_t *e = json_object_get(r->json, "early_stop");
    ck_assert_msg(json_is_object(e), "%s: no early_stop object\n%s", what, tail(r->out));
    ck_assert_int_eq(json_integer_value(json_object_get(e, "cap")), cap);
    json_t *at = json_object_get(e, "stopped_at");
    if (stopped_at) ck_assert_msg(json_integer_value(at) == stopped_at, "%s: stopped at %lld, expected %ld\n%s", what,
                                  (long long)json_integer_value(at), stopped_at, tail(r->out));
    else ck_assert_msg(json_is_null(at), "%s: stopped at %lld, expected no stop\n%s", what,
                       (long long)json_integer_value(at), tail(r->out));
    ck_assert_int_eq(json_integer_value(json_object_get(r->json, "cycles")), cycles);
}

/* a decided run stopped at a checkpoint (every 5 rounds, two in a row
 * agreeing: 10 at the earliest) before the cap, its cycles the rounds run;
 * an undecided one ran to the cap */
static void expect_early_decided(const result *r, const char *what, long cap)
{
    json_t *e = json_object_get(r->json, "early_stop");
    ck_assert_msg(json_is_object(e), "%s: no early_stop object\n%s", what, tail(r->out));
    ck_assert_int_eq(json_integer_value(json_object_get(e, "cap")), cap);
    json_t *at = json_object_get(e, "stopped_at");
    long cycles = (long)json_integer_value(json_object_get(r->json, "cycles"));
    if (r->status == 4) {
        ck_assert_msg(json_is_null(at) && cycles == cap, "%s: not judged, yet stopped at %lld (%ld rounds)\n%s", what,
                      (long long)json_integer_value(at), cycles, tail(r->out));
        return;
    }
    long n = (long)json_integer_value(at);
    ck_assert_msg(json_is_integer(at) && n >= 10 && n % 5 == 0 && n < cap && cycles == n,
                  "%s: stopped at %ld with %ld rounds judged (cap %ld)\n%s", what, n, cycles, cap, tail(r->out));
}

START_TEST(test_early_stop)
{
    /* a steady loss: LEAK at 5 and at 10 rounds - stopped after 10 of 100 */
    result r = run_tool((const char *[]){"--import", "_pyfini_vm_lists20", "--early-stop", "--json", NULL});
    rule_holds(&r, "lists20, early stop");
    expect_run(&r, "lists20, early stop", "LEAK", 1);
    expect_meter(&r, "lists20, early stop", "py", "LEAK");
    double py = judged_per_cycle(&r, "py");
    ck_assert_msg(py > 1000 && py < 1300, "lists20, early stop: py %.1f B/cycle", py);
    expect_early_decided(&r, "lists20", 100);   /* 10 rounds here (3.11.2 to 3.15.2d), 15 seen on 3.11.7 */
    free_result(&r);
    /* clean code that allocates and frees: no leak, stopped at a checkpoint
       (10 rounds on 3.11.2 to 3.15.2d as a rule) - or, where a meter stays
       undecided (rss growing in every chunk with no block count behind it:
       pages the freed objects leave, pinned by the bare cycle's own loss on
       3.12 and 3.13; py one late step, seen on 3.13.0), not judged at any
       checkpoint: every round up to the cap.  Never LEAK. */
    r = run_tool((const char *[]){"--code", "x = [i for i in range(1000)]\ndel x\n", "--early-stop", "--cycles",
                                  "30", "--json", NULL});
    rule_holds(&r, "clean code, early stop");
    ck_assert_msg(r.status == 0 || r.status == 4, "clean code, early stop: exit %d\n%s", r.status, tail(r.out));
    expect_early_decided(&r, "clean code", 30);
    if (r.status == 4) {
        printf("NOTE early_stop on CPython %s: clean code not judged in 30 rounds (undecided:", LC_TEST_PY_VERSION);
        size_t ui;
        json_t *uv;
        json_array_foreach(json_object_get(r.json, "undecided_meters"), ui, uv) printf(" %s", json_string_value(uv));
        printf(")\n");
    }
    free_result(&r);
    /* never decided (py moves either way): every round up to the cap */
    r = run_tool((const char *[]){"--import", "_pyfini_vm_swap", "--early-stop", "--cycles", "15", "--warmup", "3",
                                  "--json", NULL});
    expect_run(&r, "swap, early stop", "not judged", 4);
    expect_early(&r, "swap", 15, 0, 15);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(r.json, "early_stop"), "checkpoints")), 2);
    free_result(&r);
    /* a subject that closes or replaces the worker's control socket: no
       stop, no hang - every planned round, the verdict as usual */
    const char *closing[] = {"import os\ntry:\n    os.close(4)\nexcept OSError:\n    pass\n",
                             "import os\nos.dup2(2, 4)\n"};
    for (int i = 0; i < 2; i++) {
        r = run_tool((const char *[]){"--code", closing[i], "--early-stop", "--cycles", "12", "--warmup", "2", "--json",
                                      NULL});
        ck_assert_msg(finished_run(r.status), "control socket %s: exit %d\n%s%s", i ? "replaced" : "closed", r.status,
                      tail(r.out), tail(r.err));
        expect_early(&r, i ? "control socket replaced" : "control socket closed", 12, 0, 12);
        free_result(&r);
    }
    expect_usage((const char *[]){"--demo", "--early-stop", NULL}, "--demo runs its own schedule: no --early-stop");
}
END_TEST

static int has_frame_in(json_t *site, const char *name)
{
    size_t k;
    json_t *fr;
    json_array_foreach(json_object_get(site, "frames"), k, fr) {
        if (strstr(json_string_value(fr), name)) return 1;
    }
    return 0;
}

static int has_frame(json_t *where, const char *name)
{
    size_t i, k;
    json_t *site, *fr;
    json_array_foreach(where, i, site) {
        json_array_foreach(json_object_get(site, "frames"), k, fr) {
            if (strstr(json_string_value(fr), name)) return 1;
        }
    }
    return 0;
}

START_TEST(test_where_names_function)
{
    const char *config = at_least(3, 12) ? "isolated" : "legacy";
    result r = run_tool((const char *[]){"--config", config, "--import", "_pyfini_leak64", "--cycles", "20", "--where",
                                         "--json", NULL});
    ck_assert_msg(r.status == 1, "exit %d\n%s%s", r.status, tail(r.out), tail(r.err));
    json_t *where = json_object_get(r.json, "where");
    ck_assert_msg(json_is_array(where) && json_array_size(where) >= 1, "no where sites:\n%s", tail(r.out));
    json_t *top = json_array_get(where, 0);
    ck_assert_msg(has_frame(where, "leak64_exec"), "leak64_exec not named:\n%s", tail(r.out));
    /* the top raw-domain site is the module's 64 bytes */
    size_t i;
    json_t *site;
    int found = 0;
    json_array_foreach(where, i, site) {
        if (strcmp(json_string_value(json_object_get(site, "domain")), "raw") != 0) continue;
        ck_assert_msg(strstr(json_string_value(json_array_get(json_object_get(site, "frames"), 0)), "leak64_exec"),
                      "first raw site is not leak64_exec:\n%s", tail(r.out));
        ck_assert_msg(fabs(json_number_value(json_object_get(site, "bytes_per_cycle")) - 64) < 0.5, "bytes/cycle");
        found = 1;
        break;
    }
    ck_assert(found);
    (void)top;
    /* Python lines: tracemalloc would read freed file-name strings of ended
       own-obmalloc interpreters on 3.14+ (they free their interned strings):
       unavailable there */
    const char *how = json_string_value(json_object_get(r.json, "where_python"));
    ck_assert_msg(how != NULL, "no where_python");
    if (at_least(3, 14))
        ck_assert_msg(strstr(how, "unavailable on CPython 3.1") != NULL, "%s", how);
    else if (at_least(3, 12))
        ck_assert_msg(strncmp(how, "tracemalloc", 11) == 0, "%s", how);
    if (at_least(3, 12)) {
        json_t *ob = json_object_get(r.json, "obmalloc_blocks_at_end");
        ck_assert_msg(json_is_object(ob), "isolated: obmalloc blocks at interpreter end not reported:\n%s", tail(r.out));
        if (!at_least(3, 14))
            ck_assert_msg(json_integer_value(json_object_get(ob, "min")) > 0,
                          "3.12/3.13: blocks still in use when the interpreter ends (its arenas are abandoned)");
        else
            ck_assert_msg(json_integer_value(json_object_get(ob, "max")) == 0, "3.14+: no block left in use");
    }
    free_result(&r);
}
END_TEST

/* --where's Python lines come from tracemalloc (CPython 3.12+; 3.11's
 * tracemalloc deadlocks in Py_NewInterpreter: PyGILState_Ensure in its
 * PyMem_RawMalloc hook), through _PyTraceMalloc_GetTraceback(). Its own
 * tables must not be counted: the py meters read the same with --where.
 * 3.14+: unavailable (an own-obmalloc interpreter frees the file names
 * tracemalloc keeps: see test_where_subject_creates_interpreter). */
static const char python_leak_src[] = "import _pyfini_leak64, _pyfini_keep\n"
                                      "def make():\n"
                                      "    return bytearray(3000)\n"
                                      "_pyfini_keep.keep(make())\n";

START_TEST(test_where_python_lines)
{
    const char *config = at_least(3, 12) ? "isolated" : "legacy";
    result r = run_tool((const char *[]){"--config", config, "--code", python_leak_src, "--cycles", "10", "--warmup",
                                         "3", "--where", "--json", NULL});
    result plain = run_tool((const char *[]){"--config", config, "--code", python_leak_src, "--cycles", "10",
                                             "--warmup", "3", "--json", NULL});
    ck_assert_msg(r.status == 1 && plain.status == 1, "exit %d / %d\n%s%s", r.status, plain.status, tail(r.out),
                  tail(r.err));
    static const char *const exact[] = {"py.raw", "py.mem", "py.obj", "py.obm", "blocks"};
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++)
        ck_assert_msg(judged_per_cycle(&r, exact[i]) == judged_per_cycle(&plain, exact[i]),
                      "%s: %.2f/cycle with --where, %.2f without (tracemalloc's tables counted?)", exact[i],
                      judged_per_cycle(&r, exact[i]), judged_per_cycle(&plain, exact[i]));
    const char *how = json_string_value(json_object_get(r.json, "where_python"));
    ck_assert_msg(how != NULL, "no where_python in the JSON document");
    json_t *where = json_object_get(r.json, "where"), *site, *buf = NULL, *raw = NULL;
    size_t i;
    json_array_foreach(where, i, site) {
        double b = json_number_value(json_object_get(site, "bytes_per_cycle"));
        double n = json_number_value(json_object_get(site, "blocks_per_cycle"));
        if (!buf && b >= 3000 && b < 3200 && n == 1) buf = site;   /* one buffer per cycle */
        if (!raw && has_frame_in(site, "leak64_exec")) raw = site;
    }
    ck_assert_msg(buf && raw, "the bytearray's buffer or leak64_exec's block not found:\n%s", tail(r.out));
    json_t *pf = json_object_get(buf, "python_frames");
    if (!at_least(3, 12) || at_least(3, 14)) {
        ck_assert_msg(strncmp(how, "unavailable on CPython 3.1", 26) == 0, "%s", how);
        ck_assert_int_eq(json_array_size(pf), 0);
    } else {
        ck_assert_msg(strncmp(how, "tracemalloc", 11) == 0, "where_python: %s", how);
        ck_assert_msg(json_array_size(pf) >= 2, "no Python lines for the bytearray:\n%s", tail(r.out));
        ck_assert_str_eq(json_string_value(json_array_get(pf, 0)), "<--code>:3");
        ck_assert_str_eq(json_string_value(json_array_get(pf, 1)), "<--code>:4");
        /* an import's frames are folded; the line that imported follows */
        json_t *rf = json_object_get(raw, "python_frames");
        ck_assert_msg(json_array_size(rf) >= 2 &&
                          strstr(json_string_value(json_array_get(rf, 0)), "import machinery") &&
                          !strcmp(json_string_value(json_array_get(rf, 1)), "<--code>:1"),
                      "leak64_exec's Python lines:\n%s", tail(r.out));
    }
    free_result(&r);
    free_result(&plain);
}
END_TEST

/* 3.14+: an interpreter with its own obmalloc (concurrent.interpreters'
 * default) frees its interned strings when it ends, among them file names
 * tracemalloc keeps; a later lookup crashed the worker. A subject may create
 * one even in a legacy cycle, and an audit hook saw no event for it, so
 * --where runs without tracemalloc on 3.14+. */
START_TEST(test_where_subject_creates_interpreter)
{
    if (!at_least(3, 14)) return;
    result r = run_tool((const char *[]){"--config", "legacy", "--cycles", "5", "--warmup", "2", "--where", "--json",
                                         "--code",
                                         "import concurrent.interpreters as ci\n"
                                         "i = ci.create()\n"
                                         "i.exec('import json')\n"
                                         "i.close()\n",
                                         NULL});
    ck_assert_msg(finished_run(r.status), "exit %d (3 = the worker crashed)\n%s%s", r.status, tail(r.out),
                  tail(r.err));
    const char *how = json_string_value(json_object_get(r.json, "where_python"));
    ck_assert_msg(how && strncmp(how, "unavailable on CPython 3.1", 26) == 0, "where_python: %s", how ? how : "(none)");
    free_result(&r);
}
END_TEST

/* --- output formats ------------------------------------------------------- */
START_TEST(test_json_and_csv)
{
    char csv[] = "/tmp/lc-test-csv-XXXXXX";
    int fd = mkstemp(csv);
    ck_assert(fd >= 0);
    close(fd);
    result r = run_tool((const char *[]){"--import", "json", "--cycles", "10", "--warmup", "2", "--json", "--csv", csv,
                                         NULL});
    /* any verdict of the rule: 10 judged rounds after 2 warm-up ones may
       leave py inconclusive (3.15.2: "not judged", exit 4) */
    ck_assert_msg(finished_run(r.status), "exit %d\n%s", r.status, tail(r.err));
    ck_assert_msg(r.json != NULL, "stdout is not JSON:\n%s", tail(r.out));
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(r.json, "python"), "version")), LC_TEST_PY_VERSION);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "config")), "legacy");
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "judged")), "excess");
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "cycles_finished")), 24);   /* (2 + 10) x 2 */
    json_t *refs = json_object_get(json_object_get(r.json, "meters"), "refs");
    ck_assert(json_is_boolean(json_object_get(refs, "available")));
    if (!json_is_true(json_object_get(refs, "available")))   /* release build: says why, not 0 */
        ck_assert_str_eq(json_string_value(json_object_get(refs, "verdict")), "unavailable");
    free_result(&r);
    FILE *f = fopen(csv, "r");
    ck_assert(f != NULL);
    char line[4096];
    int rows = 0;
    ck_assert(fgets(line, sizeof line, f) != NULL);
    ck_assert_msg(strncmp(line, "cycle,round,kind,phase,time_ms,rss,rss_increase", 47) == 0, "header: %s", line);
    while (fgets(line, sizeof line, f)) rows++;
    fclose(f);
    unlink(csv);
    ck_assert_int_eq(rows, 24);

    /* a file name that is not UTF-8 still gives a valid document naming it */
    char bad[] = "/tmp/lc-test-\xff\xfe-XXXXXX";
    int bfd = mkstemp(bad);
    ck_assert(bfd >= 0);
    ck_assert(write(bfd, "x = 1\n", 6) == 6);
    close(bfd);
    result b = run_tool((const char *[]){"--file", bad, "--cycles", "4", "--warmup", "3", "--json", NULL});
    unlink(bad);
    ck_assert_msg(b.status == 0 && b.json, "exit %d, JSON %s\n%s", b.status, b.json ? "ok" : "invalid", tail(b.err));
    const char *named = json_string_value(json_object_get(json_object_get(b.json, "subject"), "file"));
    ck_assert_msg(named && strstr(named, "/tmp/lc-test-?" "?-"), "subject.file: %s", named ? named : "(missing)");
    free_result(&b);
}
END_TEST

/* --- --junit: the JUnit XML report, parsed back with libxml2 --------------- */
/* The value of an XPath expression (string(...), count(...)) in doc. */
static char *xpath(xmlDocPtr doc, const char *expr)
{
    xmlXPathContextPtr c = xmlXPathNewContext(doc);
    xmlXPathObjectPtr o = c ? xmlXPathEvalExpression(BAD_CAST expr, c) : NULL;
    xmlChar *v = o ? xmlXPathCastToString(o) : NULL;
    char *s = strdup(v ? (const char *)v : "");
    xmlFree(v);
    xmlXPathFreeObject(o);
    xmlXPathFreeContext(c);
    return s;
}

static void expect_xpath(xmlDocPtr doc, const char *expr, const char *want, const char *path)
{
    char *got = xpath(doc, expr);
    ck_assert_msg(!strcmp(got, want), "%s: %s is '%s', expected '%s'", path, expr, got, want);
    free(got);
}

typedef struct xp {
    const char *expr, *want;
} xp;

static void expect_xpaths(xmlDocPtr doc, const xp *x, const char *path)
{
    for (; x->expr; x++) expect_xpath(doc, x->expr, x->want, path);
}

/* Run the tool with --junit DIR/name.xml (path: PATH_MAX bytes) and parse
 * the report; with --json, its one test case must say what the document's
 * verdict says. */
static xmlDocPtr junit_run(const char *dir, const char *name, const char *const *args, result *r, char *path)
{
    snprintf(path, PATH_MAX, "%s/%s.xml", dir, name);
    const char *argv[48];
    int n = 0;
    for (; args[n]; n++) argv[n] = args[n];
    argv[n++] = "--junit", argv[n++] = path, argv[n] = NULL;
    *r = run_tool(argv);
    xmlDocPtr doc = xmlReadFile(path, NULL, XML_PARSE_NONET);
    ck_assert_msg(doc != NULL, "%s: no JUnit report, or it does not parse (exit %d)\n%s", path, r->status, tail(r->err));
    expect_xpath(doc, "name(/*)", "testsuites", path);
    expect_xpath(doc, "string(/testsuites/testsuite/properties/property[@name='tool_version']/@value)",
                 LC_TEST_TOOL_VERSION, path);
    const char *v = json_string_value(json_object_get(r->json, "verdict"));
    if (!v) return doc;   /* no document (--scan checks its own) */
    const char *elem = !strcmp(v, "no leak") ? "" : !strcmp(v, "LEAK") ? "failure"
                     : !strcmp(v, "not judged") ? "skipped" : "error";
    expect_xpath(doc, "count(//testcase)", "1", path);
    expect_xpath(doc, "name(//testcase/*[not(self::system-out)])", elem, path);
    return doc;
}

/* One run with --junit: its exit status and what its report holds (exact:
 * also the expectations that need undistorted memory meters, not under ASan). */
static void junit_case(const char *dir, const char *name, const char *const *args, int status, const xp *always,
                       const xp *exact)
{
    const char *sanitized = getenv("LC_TEST_SANITIZED");
    char path[PATH_MAX];
    result r;
    xmlDocPtr d = junit_run(dir, name, args, &r, path);
    expect_xpaths(d, always, path);
    if (!sanitized || !*sanitized) {
        ck_assert_msg(r.status == status, "%s: exit %d, expected %d\n%s", name, r.status, status, tail(r.out));
        expect_xpaths(d, exact, path);
    }
    xmlFreeDoc(d);
    free_result(&r);
}

START_TEST(test_junit)
{
    char dir[] = "/tmp/lc-test-junit-XXXXXX", path[PATH_MAX];
    ck_assert(mkdtemp(dir) != NULL);
    /* a leaking subject: a failure of type LEAK, the report its text */
    junit_case(dir, "leak", (const char *[]){"--import", "_pyfini_leak64", "--cycles", "4", "--warmup", "3", "--json",
                                             NULL}, 1,
               (const xp[]){{"string(//testcase/@classname)", "pyfini-leakcheck.legacy"},
                            {"string(//testcase/@name)", "--import _pyfini_leak64"}, {0, 0}},
               (const xp[]){{"string(//testcase/failure/@type)", "LEAK"},
                            {"string(/testsuites/@failures)", "1"},
                            /* the module's 64 bytes: py.raw, and py when the obj domain is quiet */
                            {"contains(//testcase/failure, 'verdict: LEAK: ')", "true"},
                            {"starts-with(//testcase/failure/@message, 'LEAK: ')", "true"},
                            {"contains(//testcase/failure/@message, 'py.raw +64 B/cycle')", "true"}, {0, 0}});
    /* a clean one: passed, the report kept as its output */
    junit_case(dir, "noleak", (const char *[]){"--import", "_pyfini_noleak64", "--cycles", "4", "--warmup", "3",
                                               "--json", NULL}, 0, (const xp[]){{0, 0}},
               (const xp[]){{"count(//testcase/*)", "1"},
                            {"contains(//testcase/system-out, 'verdict: no leak')", "true"},
                            {"string(/testsuites/@tests)", "1"}, {"string(/testsuites/@failures)", "0"}, {0, 0}});
    /* a subject that fails, with bytes XML forbids: an error, still valid XML */
    junit_case(dir, "error", (const char *[]){"--code", "raise ValueError('boom\\x01\\x1b')", "--cycles", "4", "--json",
                                              NULL}, 2,
               (const xp[]){{"string(//testcase/error/@type)", "error"},
                            {"contains(//testcase/error/@message, 'ValueError: boom?" "?')", "true"}, {0, 0}},
               (const xp[]){{0, 0}});
    /* --scan: one test case per module and config; 3.11 has no isolated
       interpreter: skipped there, never passed */
    junit_case(dir, "scan", (const char *[]){"--scan", "--import", "_pyfini_leak64", "--cycles", "4", "--warmup", "3",
                                             "--json", NULL}, 1,
               (const xp[]){{"count(//testcase)", "2"},
                            {"string(//testcase[1]/@classname)", "pyfini-leakcheck.scan.legacy"},
                            {"string(//testcase[1]/@name)", "_pyfini_leak64"},
                            {"count(//testcase[2]/skipped)", at_least(3, 12) ? "0" : "1"}, {0, 0}},
               (const xp[]){{"string(//testcase[1]/failure/@type)", "LEAK"}, {0, 0}});
    /* a place that cannot be written: refused before any cycle, nothing lost */
    expect_usage((const char *[]){"--junit", "/nonexistent-pyfini/r.xml", NULL},
                 "--junit /nonexistent-pyfini/r.xml: cannot write");
    expect_usage((const char *[]){"--junit", dir, NULL}, "is a directory");
    glob_t g;
    snprintf(path, sizeof path, "%s/*", dir);
    ck_assert_int_eq(glob(path, 0, NULL, &g), 0);
    ck_assert_int_eq(g.gl_pathc, 4);   /* the four reports, no temporary file left */
    for (size_t i = 0; i < g.gl_pathc; i++) unlink(g.gl_pathv[i]);
    globfree(&g);
    /* a symbolic link (or a device, a FIFO) is written in place, not replaced
       by the temporary file's rename (lc_output_in_place) */
    char target[PATH_MAX], link[PATH_MAX];
    snprintf(target, sizeof target, "%s/target.xml", dir);
    snprintf(link, sizeof link, "%s/link.xml", dir);
    FILE *t = fopen(target, "w");
    ck_assert(t && fputs("keep", t) >= 0 && fclose(t) == 0);
    ck_assert(symlink("target.xml", link) == 0);
    result r = run_tool((const char *[]){"--import", "_pyfini_noleak64", "--cycles", "4", "--warmup", "3", "--junit",
                                         link, NULL});
    ck_assert_msg(r.status == 0, "exit %d\n%s%s", r.status, tail(r.out), tail(r.err));
    struct stat st;
    ck_assert_msg(lstat(link, &st) == 0 && S_ISLNK(st.st_mode), "--junit replaced the symbolic link");
    char head[8] = "";
    t = fopen(target, "r");
    ck_assert(t && fread(head, 1, 5, t) == 5 && fclose(t) == 0);
    ck_assert_msg(strncmp(head, "<?xml", 5) == 0, "the link's target was not written: '%s'", head);
    free_result(&r);
    unlink(link);
    unlink(target);
    /* an output that cannot be written: exit 2 (not 0), and the report says so */
    r = run_tool((const char *[]){"--import", "_pyfini_noleak64", "--cycles", "4", "--warmup", "3", "--csv",
                                  "/dev/full", NULL});
    ck_assert_msg(r.status == 2 && strstr(r.out, "exit status 2") && strstr(r.err, "--csv /dev/full"),
                  "--csv /dev/full: exit %d\n%s%s", r.status, tail(r.out), tail(r.err));
    free_result(&r);
    rmdir(dir);
}
END_TEST

/* --- --plot: the SVG parsed back with libxml2 ------------------------------
 * The series are told apart by their colours (report_plot.c, leakcheck/
 * README.md): stroked paths #1f77b4 (subject) and #ff7f0e (bare), filled
 * #d62728 (a LEAK badge); scan bars filled #1f77b4 (legacy) and #ff7f0e
 * (isolated), each config's legend swatch one more.  cairo 1.16 writes the
 * paint in style="...", 1.18 in attributes: both are read. */
#define SVG_SUBJECT 0x1f77b4
#define SVG_BARE 0xff7f0e
#define SVG_LEAK 0xd62728

/* prop of an element: its attribute, else its style="..." property (a copy, or NULL) */
static char *svg_prop(xmlNodePtr n, const char *prop)
{
    xmlChar *a = xmlGetProp(n, BAD_CAST prop);
    if (a) {
        char *v = strdup((const char *)a);
        xmlFree(a);
        return v;
    }
    xmlChar *st = xmlGetProp(n, BAD_CAST "style");
    char *v = NULL;
    size_t len = strlen(prop);
    for (const char *p = st ? (const char *)st : ""; *p; p++) {
        if ((p == (const char *)st || p[-1] == ';' || p[-1] == ' ') && !strncmp(p, prop, len) && p[len] == ':') {
            const char *e = strchr(p + len + 1, ';');
            v = strndup(p + len + 1, e ? (size_t)(e - p - len - 1) : strlen(p + len + 1));
            break;
        }
    }
    xmlFree(st);
    return v;
}

/* "rgb(12.156863%,46.666667%,70.588235%)", "rgb(31, 119, 180)" or "#1f77b4" -> 0x1f77b4; -1 none */
static long svg_rgb(const char *v)
{
    if (!v) return -1;
    while (*v == ' ') v++;
    if (*v == '#') return strtol(v + 1, NULL, 16);
    if (strncmp(v, "rgb(", 4)) return -1;
    long c = 0;
    const char *p = v + 4;
    for (int i = 0; i < 3; i++) {
        char *end;
        double x = strtod(p, &end);
        if (*end == '%') x = x * 255.0 / 100.0, end++;
        c = c << 8 | (lround(x) & 255);
        p = end + strspn(end, ", ");
    }
    return c;
}

/* Paths (outside the glyph symbols) painted with colour on prop ("stroke"
 * or "fill"), fully opaque. */
static int svg_count_node(xmlNodePtr n, const char *prop, long colour)
{
    int count = 0;
    for (; n; n = n->next) {
        if (n->type != XML_ELEMENT_NODE || !strcmp((const char *)n->name, "symbol")) continue;
        if (!strcmp((const char *)n->name, "path")) {
            char *v = svg_prop(n, prop), *op = NULL;
            if (svg_rgb(v) == colour) {
                char name[32];
                snprintf(name, sizeof name, "%s-opacity", prop);
                op = svg_prop(n, name);
                if (!op || strtod(op, NULL) >= 0.999) count++;
            }
            free(v);
            free(op);
        }
        count += svg_count_node(n->children, prop, colour);
    }
    return count;
}

static int svg_count(xmlDocPtr doc, const char *prop, long colour)
{
    return svg_count_node(xmlDocGetRootElement(doc), prop, colour);
}

static xmlDocPtr read_svg(const char *path, const result *r)
{
    xmlDocPtr doc = xmlReadFile(path, NULL, XML_PARSE_NONET | XML_PARSE_HUGE);
    ck_assert_msg(doc != NULL, "%s: no SVG, or it does not parse (exit %d)\n%s", path, r->status, tail(r->err));
    ck_assert_str_eq((const char *)xmlDocGetRootElement(doc)->name, "svg");
    return doc;
}

/* One check with --plot and --json: one subject and one bare path per
 * judged meter of the document, a LEAK badge per meter it judged LEAK. */
static void plot_check(const char *dir, const char *module, int leaks)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s.svg", dir, module);
    result r = run_tool((const char *[]){"--import", module, "--cycles", "4", "--warmup", "3", "--json", "--plot", path,
                                         NULL});
    const char *sanitized = getenv("LC_TEST_SANITIZED");
    if (!sanitized || !*sanitized)
        ck_assert_msg(r.status == (leaks ? 1 : 0), "%s: exit %d\n%s", module, r.status, tail(r.err));
    ck_assert_msg(r.json, "%s: no JSON document\n%s", module, tail(r.err));
    int judged = 0, leak = 0;
    const char *name;
    json_t *m;
    json_object_foreach(json_object_get(r.json, "meters"), name, m) {
        if (!json_object_get(m, "judged")) continue;
        judged++;
        leak += !strcmp(json_string_value(json_object_get(m, "verdict")), "LEAK");
    }
    xmlDocPtr doc = read_svg(path, &r);
    ck_assert_msg(judged >= 8, "%s: %d judged meters", module, judged);
    ck_assert_int_eq(svg_count(doc, "stroke", SVG_SUBJECT), judged);
    ck_assert_int_eq(svg_count(doc, "stroke", SVG_BARE), judged);
    ck_assert_int_eq(svg_count(doc, "fill", SVG_LEAK), leak);
    if (!sanitized || !*sanitized) ck_assert_msg(leaks ? leak >= 2 : leak == 0, "%s: %d LEAK badges", module, leak);
    xmlFreeDoc(doc);
    free_result(&r);
    unlink(path);
}

START_TEST(test_plot)
{
    char dir[] = "/tmp/lc-test-plot-XXXXXX", path[PATH_MAX];
    ck_assert(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/p.svg", dir);
#if !LC_TEST_HAVE_PLOT
    expect_usage((const char *[]){"--plot", path, NULL}, "built without cairo (Debian package libcairo2-dev");
    rmdir(dir);
    return;
#endif
    plot_check(dir, "_pyfini_leak64", 1);
    plot_check(dir, "_pyfini_noleak64", 0);
    /* a place that cannot be written: refused before any cycle */
    expect_usage((const char *[]){"--plot", "/nonexistent-pyfini/p.svg", NULL},
                 "--plot /nonexistent-pyfini/p.svg: cannot write in /nonexistent-pyfini: ");
    expect_usage((const char *[]){"--plot", dir, NULL}, "is a directory");
    expect_usage((const char *[]){"--demo", "--plot", path, NULL}, "--demo draws no --plot");
    expect_usage((const char *[]){"--plot", "", NULL}, "--plot needs a file name");
    ck_assert_int_eq(rmdir(dir), 0);   /* nothing left behind: no temporary file */
}
END_TEST

/* --- scan ----------------------------------------------------------------- */
/* one module: "1 extension module", not "1 extension modules" (issue 10) */
START_TEST(test_scan_one_module)
{
    result r = run_tool((const char *[]){"--scan", "--import", "_pyfini_noleak64", "--cycles", "4", "--warmup", "3", NULL});
    ck_assert_msg(r.status == 0, "exit %d\n%s%s", r.status, tail(r.out), tail(r.err));
    ck_assert_msg(strstr(r.out, "(release build), 1 extension module, ") || strstr(r.out, "(debug build), 1 extension module, "),
                  "header:\n%s", tail(r.out));
    free_result(&r);
}
END_TEST

START_TEST(test_scan_modules)
{
    result r = run_tool((const char *[]){"--scan", "--import", "_pyfini_leak64", "--import", "_pyfini_noleak64",
                                         "--import", "_json", "--json", NULL});
    ck_assert_msg(r.status == 1, "scan with a leaking module: exit %d\n%s%s", r.status, tail(r.out), tail(r.err));
    json_t *mods = json_object_get(r.json, "modules");
    ck_assert_int_eq(json_array_size(mods), 3);
    /* worst first: the leaking module's row before the clean module's row
       (_json's place depends on the version) */
    size_t i0;
    json_t *m0;
    int leak_row = 0, clean_seen = 0;
    json_array_foreach(mods, i0, m0) {
        const char *st = json_string_value(json_object_get(json_object_get(m0, "legacy"), "status"));
        const char *name = json_string_value(json_object_get(m0, "module"));
        if (!strcmp(name, "_pyfini_leak64")) {
            ck_assert_msg(strncmp(st, "LEAK +64 B", 10) == 0, "leak64 legacy: %s", st);
            ck_assert_msg(!clean_seen, "rows not sorted worst first:\n%s", tail(r.out));
            leak_row = 1;
        }
        if (!strcmp(name, "_pyfini_noleak64")) clean_seen = 1;
    }
    ck_assert(leak_row);
    /* _json itself loses objects per import on 3.12/3.13 (16 objects, 849 B on
     * 3.12.1): only the 64-byte modules' rows are asserted */
    size_t i;
    json_t *m;
    int seen = 0;
    json_array_foreach(mods, i, m) {
        if (strcmp(json_string_value(json_object_get(m, "module")), "_pyfini_noleak64") != 0) continue;
        ck_assert_str_eq(json_string_value(json_object_get(json_object_get(m, "legacy"), "status")), "ok");
        if (at_least(3, 12))
            ck_assert_str_eq(json_string_value(json_object_get(json_object_get(m, "isolated"), "status")), "ok");
        seen = 1;
    }
    ck_assert(seen);
    free_result(&r);
}
END_TEST

/* the status of a scan row's column, or NULL */
static const char *scan_status_of(const result *r, const char *module, const char *config)
{
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(r->json, "modules"), i, m)
        if (!strcmp(json_string_value(json_object_get(m, "module")), module))
            return json_string_value(json_object_get(json_object_get(m, config), "status"));
    return NULL;
}

/* a module that does not exist is a failure of the scan (exit 2), not a pass;
 * --no-baseline reaches the rows; the header counts extension modules apart */
START_TEST(test_scan_missing_module)
{
    result r = run_tool((const char *[]){"--scan", "--import", "no_such_module_pyfini", "--import", "_pyfini_noleak64",
                                         "--import", "json", "--config", "legacy", "--no-baseline", "--cycles", "4",
                                         "--warmup", "0", NULL});
    ck_assert_msg(r.status == 2, "exit %d, expected 2\n%s%s", r.status, tail(r.out), tail(r.err));
    ck_assert_msg(strstr(r.out, "3 modules (extension modules on sys.path among them: 1), ") &&
                      strstr(r.out, "(raw, --no-baseline)"), "header:\n%s", tail(r.out));
    ck_assert_msg(strstr(r.out, "\nno_such_module_pyfini                not found"), "row:\n%s", tail(r.out));
    free_result(&r);
}
END_TEST

/* --config (one column) and --max-bytes-per-cycle reach every row; --where
 * and --csv are refused */
/* 3 warm-up rounds (here and in the other short runs of 4 judged cycles:
 * json_and_csv, junit, plot, scan_one_module, scan_jobs): on 3.11 the first
 * 5 cycles of any run still move py (3.11.7: +256 B three times, then +1,152
 * B; 3.11.2: +128, +384, +384, +896 B; bare cycles alike, no block more),
 * which 4 judged cycles cannot tell from a loss: "not judged" */
START_TEST(test_scan_options)
{
    result r = run_tool((const char *[]){"--scan", "--import", "_pyfini_leak64", "--config", "legacy",
                                         "--max-bytes-per-cycle", "100", "--cycles", "4", "--warmup", "3", "--json", NULL});
    ck_assert_msg(r.status == 0, "64 B/cycle under --max-bytes-per-cycle 100: exit %d\n%s%s", r.status, tail(r.out),
                  tail(r.err));
    ck_assert_str_eq(scan_status_of(&r, "_pyfini_leak64", "legacy"), "ok");
    json_t *row = json_array_get(json_object_get(r.json, "modules"), 0);
    ck_assert_msg(!json_object_get(row, "isolated"), "--config legacy still has an isolated column");
    ck_assert_int_eq(json_array_size(json_object_get(r.json, "configs")), 1);
    free_result(&r);
    /* --early-stop in a scan: a cap each module may stop below (its cell says
       where), and never with the scan's 8 cycles (the earliest stop is 10) */
    r = run_tool((const char *[]){"--scan", "--import", "_pyfini_leak64", "--config", "legacy", "--early-stop",
                                  "--cycles", "40", "--warmup", "3", "--json", NULL});
    ck_assert_msg(r.status == 1, "--early-stop scan of 64 B/cycle: exit %d\n%s%s", r.status, tail(r.out), tail(r.err));
    json_t *cell = json_object_get(json_array_get(json_object_get(r.json, "modules"), 0), "legacy");
    json_int_t rounds = json_integer_value(json_object_get(cell, "cycles"));
    ck_assert_msg(rounds >= 10 && rounds <= 40, "cell cycles %lld", (long long)rounds);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(r.json, "early_stop"), "cap")), 40);
    free_result(&r);
    expect_usage((const char *[]){"--scan", "--early-stop", NULL}, "never stop early");
    expect_usage((const char *[]){"--scan", "--where", NULL}, "--import MOD --where");
    expect_usage((const char *[]){"--scan", "--csv", "/dev/null", NULL}, "writes no --csv");
    if (!at_least(3, 12))
        expect_usage((const char *[]){"--scan", "--config", "isolated", "--import", "_json", NULL},
                     "has no such interpreters");
}
END_TEST

/* a row is as bad as its worst finding: pyfini's leak report on the
 * subject's stderr (the meters allowed 1 MB/cycle), a child that failed */
START_TEST(test_scan_reports_and_children)
{
    result r = run_tool((const char *[]){"--scan", "--import", "_pyfini_trackleak", "--config", "legacy",
                                         "--max-bytes-per-cycle", "1000000", "--cycles", "4", "--warmup", "0", "--json", NULL});
    ck_assert_msg(r.status == 1, "exit %d, expected 1\n%s%s", r.status, tail(r.out), tail(r.err));
    ck_assert_str_eq(scan_status_of(&r, "_pyfini_trackleak", "legacy"), "LEAK pyfini report");
    free_result(&r);
    char dir[] = "/tmp/lc-test-fork-XXXXXX";
    ck_assert(mkdtemp(dir));
    char mod[sizeof dir + 32], path[4096];
    snprintf(mod, sizeof mod, "%s/_lc_forker.py", dir);
    FILE *f = fopen(mod, "w");
    ck_assert(f);
    fputs("import os\nif os.fork() == 0:\n    os._exit(1)\n", f);
    fclose(f);
    const char *pp = getenv("PYTHONPATH");
    snprintf(path, sizeof path, "%s:%s", dir, pp ? pp : "");
    setenv("PYTHONPATH", path, 1);   /* this test's own process (fork mode) */
    r = run_tool((const char *[]){"--scan", "--import", "_lc_forker", "--config", "legacy", "--cycles", "4", "--warmup",
                                  "0", "--json", NULL});
    unlink(mod);
    rmdir(dir);
    ck_assert_msg(r.status == 3, "exit %d, expected 3\n%s%s", r.status, tail(r.out), tail(r.err));
    ck_assert_str_eq(scan_status_of(&r, "_lc_forker", "legacy"), "child failed");
    free_result(&r);
}
END_TEST

/* the table of --jobs 2 is that of --jobs 1 (rows, order, cells); --plot
 * draws a bar per LEAK cell with a figure; --jobs outside --scan is refused */
static char *scan_table(const result *r)
{
    char *t = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&t, &n);
    size_t i;
    json_t *m, *cfgs = json_object_get(r->json, "configs");
    json_array_foreach(json_object_get(r->json, "modules"), i, m) {
        fprintf(f, "%s", json_string_value(json_object_get(m, "module")));
        size_t k;
        json_t *c;
        json_array_foreach(cfgs, k, c) {
            json_t *cell = json_object_get(m, json_string_value(c));
            fprintf(f, " | %s: %s", json_string_value(json_object_get(cell, "status")),
                    json_string_value(json_object_get(cell, "message")));
        }
        fprintf(f, "\n");
    }
    fclose(f);
    return t;
}

START_TEST(test_scan_jobs)
{
    char dir[] = "/tmp/lc-test-jobs-XXXXXX", path[PATH_MAX];
    ck_assert(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/scan.svg", dir);
    /* three rows of three classes; the missing module's cells cost a worker start only (CI time) */
    const char *args[32] = {"--scan", "--import", "_pyfini_noleak64", "--import", "_pyfini_leak64", "--import",
                            "no_such_module_pyfini", "--cycles", "4", "--warmup", "3", "--json", "--jobs", "1", NULL};
    result serial = run_tool(args);
    args[13] = "2";
#if LC_TEST_HAVE_PLOT
    args[14] = "--plot", args[15] = path;
#endif
    result par = run_tool(args);
    ck_assert_msg(serial.json && par.json, "no JSON document\n%s%s", tail(serial.err), tail(par.err));
    ck_assert_int_eq(par.status, serial.status);
    char *ts = scan_table(&serial), *tp = scan_table(&par);
    ck_assert_msg(!strcmp(ts, tp), "--jobs 1:\n%s\n--jobs 2:\n%s", ts, tp);
    const char *sanitized = getenv("LC_TEST_SANITIZED");
    if (!sanitized || !*sanitized) {
        ck_assert_msg(serial.status == 2, "exit %d\n%s", serial.status, ts);
        ck_assert_msg(!strncmp(ts, "no_such_module_pyfini | not found", 33) &&
                          strstr(ts, "\n_pyfini_leak64 | LEAK +64 B/cycle") && strstr(ts, "\n_pyfini_noleak64 | ok: "),
                      "rows, worst first:\n%s", ts);
    }
#if LC_TEST_HAVE_PLOT
    /* a bar per LEAK cell with a figure ("LEAK +..."), a swatch per config */
    int bars[2] = {1, 1};
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(par.json, "modules"), i, m) {
        static const char *const cfg[2] = {"legacy", "isolated"};
        for (int k = 0; k < 2; k++) {
            const char *st = json_string_value(json_object_get(json_object_get(m, cfg[k]), "status"));
            bars[k] += st && !strncmp(st, "LEAK +", 6);
        }
    }
    xmlDocPtr doc = read_svg(path, &par);
    ck_assert_int_eq(svg_count(doc, "fill", SVG_SUBJECT), bars[0]);
    ck_assert_int_eq(svg_count(doc, "fill", SVG_BARE), bars[1]);
    if (!sanitized || !*sanitized) ck_assert_msg(bars[0] == 2, "legacy bars: %d", bars[0] - 1);
    xmlFreeDoc(doc);
    unlink(path);
#endif
    free(ts);
    free(tp);
    free_result(&serial);
    free_result(&par);
    rmdir(dir);
    expect_usage((const char *[]){"--import", "json", "--jobs", "2", NULL}, "--jobs 2: only --scan");
    expect_usage((const char *[]){"--scan", "--jobs", "0", NULL}, "--jobs needs an integer >= 1");
}
END_TEST

/* a whole scan of the Python's extension modules finishes, one row each */
START_TEST(test_scan_all)
{
    result r = run_tool((const char *[]){"--scan", "--cycles", "4", "--warmup", "1", "--json", NULL});
    /* any finding but "not judged" and usage errors: 2 is a module that raised */
    ck_assert_msg(r.status >= 0 && r.status <= 3 && r.json, "exit %d\n%s", r.status, tail(r.err));
    json_t *mods = json_object_get(r.json, "modules");
    ck_assert_msg(json_array_size(mods) > 10, "only %zu modules", json_array_size(mods));
    size_t i;
    json_t *m;
    json_array_foreach(mods, i, m) {   /* every row has a legacy status */
        const char *st = json_string_value(json_object_get(json_object_get(m, "legacy"), "status"));
        ck_assert_msg(st && *st, "row %zu has no legacy status", i);
    }
    free_result(&r);
}
END_TEST

/* --python: another installed CPython, worker compiled once into the cache */
START_TEST(test_other_python)
{
    const char *other = getenv("LC_TEST_OTHER_PYTHON");   /* X.Y.Z of another host CPython, set by CMake */
    if (!other || !*other) return;
    result r = run_tool((const char *[]){"--python", other, "--cycles", "8", "--json", NULL});
    ck_assert_msg(finished_run(r.status), "--python %s: exit %d\n%s", other, r.status, tail(r.err));
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(r.json, "python"), "version")), other);
    free_result(&r);
}
END_TEST

int main(void)
{
    sscanf(LC_TEST_PY_VERSION, "%d.%d.%d", &py_major, &py_minor, &py_patch);
    Suite *s = suite_create("leakcheck");
    struct { const char *name; const TTest *fn; int timeout; } cases[] = {
        {"bad_input", test_bad_input, 60},
        {"help", test_help, 10},
        {"version", test_version, 30},
        {"too_few_cycles", test_too_few_cycles, 60},
        {"python_too_old", test_python_too_old, 60},
        {"subject_closes_fds", test_subject_closes_fds, 120},
        {"forking_subject", test_forking_subject, 120},
        {"subject_exits", test_subject_exits, 120},
        {"interrupted", test_interrupted, 60},
        {"pyfini_leak_report", test_pyfini_leak_report, 120},
        {"subject_stderr_summary", test_subject_stderr_summary, 120},
        {"config_needs_312", test_config_needs_312, 60},
        {"crash_reported", test_crash_reported, 60},
        {"hang_reported", test_hang_reported, 60},
        {"crash_each_signal", test_crash_each_signal, 120},
        {"nothing_left_running", test_nothing_left_running, 60},
        {"output_flood", test_output_flood, 60},
        {"memory_limit", test_memory_limit, 60},
        {"decimal_isolated", test_decimal_isolated, 60},
        {"bare_isolated", test_bare_isolated, 120},
        {"bare_legacy", test_bare_legacy, 120},
        {"leak64_legacy", test_leak64_legacy, 120},
        {"leak64_isolated", test_leak64_isolated, 120},
        {"noleak64_repeated", test_noleak64_repeated, 300},
        {"verdict_rule", test_verdict_rule, 240},
        {"no_leak_from_noise", test_no_leak_from_noise, 120},
        {"early_stop", test_early_stop, 240},
        {"verdict_default_cycles", test_verdict_default_cycles, 240},
        {"whose_cpython", test_whose_cpython, 120},
        {"whose_subject", test_whose_subject, 120},
        {"where_names_function", test_where_names_function, 120},
        {"where_python_lines", test_where_python_lines, 180},
        {"where_subject_creates_interpreter", test_where_subject_creates_interpreter, 120},
        {"json_and_csv", test_json_and_csv, 60},
        {"junit", test_junit, 120},
        {"heap_malloc200", test_heap_malloc200, 120},
        {"heap_cxx_new", test_heap_cxx_new, 120},
        {"heap_realloc", test_heap_realloc, 120},
        {"heap_no_leak", test_heap_no_leak, 240},
        {"heap_corruption", test_heap_corruption, 60},
        {"scan_modules", test_scan_modules, 120},
        {"scan_one_module", test_scan_one_module, 60},
        {"scan_missing_module", test_scan_missing_module, 60},
        {"scan_options", test_scan_options, 60},
        {"scan_reports_and_children", test_scan_reports_and_children, 60},
        {"scan_all", test_scan_all, 600},
        {"scan_jobs", test_scan_jobs, 120},
        {"plot", test_plot, 120},
        {"other_python", test_other_python, 300},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_set_timeout(tc, cases[i].timeout);
        tcase_add_test(tc, cases[i].fn);
        suite_add_tcase(s, tc);
    }
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
