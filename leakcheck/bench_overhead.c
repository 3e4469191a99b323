/* bench_overhead.c - pyfini-leakcheck's overhead over a bare create/end loop.
 * Runs the same number of interpreter cycles with pyfini-leakcheck-bare-loop
 * (no meters) and with pyfini-leakcheck, and prints the wall times, the CPU
 * times (user + system of the process and its children: what a loaded
 * machine does not blur) and their ratios side by side.  Figures, not a test.
 * Each case runs ROUNDS times, the loop and the tool in turn (so that a
 * change of the machine's load falls on both), and prints the medians and
 * the median of the per-round ratios with their range: one run of either
 * varies by +-10 % on this machine, more than the overhead it measures.
 * usage: pyfini-leakcheck-bench [CYCLES [ROUNDS]]   (defaults 200, 5)
 *        pyfini-leakcheck-bench --instructions [CYCLES]   (default 30)
 * --instructions counts the instructions each side executes (itself and its
 * children) with valgrind's cachegrind (--cache-sim=no), one run each: a
 * figure the machine's load does not change, about 50 times slower. */
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

typedef struct times {
    double wall, cpu;   /* seconds */
} times;

static double tv(struct timeval t) { return (double)t.tv_sec + (double)t.tv_usec / 1e6; }

static times run(char *const argv[])
{
    times bad = {-1, -1};
    struct timespec a, b;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", 01, 0);
    clock_gettime(CLOCK_MONOTONIC, &a);
    pid_t pid;
    if (posix_spawn(&pid, argv[0], &fa, NULL, argv, environ) != 0) return bad;
    int st;
    struct rusage ru;   /* the child's and its waited-for children's (the worker) */
    wait4(pid, &st, 0, &ru);
    clock_gettime(CLOCK_MONOTONIC, &b);
    posix_spawn_file_actions_destroy(&fa);
    if (!WIFEXITED(st) || WEXITSTATUS(st) > 1) return bad;
    times t = {(double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9, tv(ru.ru_utime) + tv(ru.ru_stime)};
    return t;
}

/* Instructions executed by argv[0] and every process it starts (cachegrind's
 * "I refs" of each), -1 when valgrind cannot be run or the run failed. */
static double instructions(char *const argv[])
{
    char dir[] = "/tmp/pyfini-bench-XXXXXX", log[PATH_MAX + 32];
    if (!mkdtemp(dir)) return -1;
    snprintf(log, sizeof log, "--log-file=%s/log.%%p", dir);
    char *vg[32] = {"valgrind", "--tool=cachegrind", "--cache-sim=no", "--trace-children=yes",
                    "--cachegrind-out-file=/dev/null", log};
    int k = 6;
    for (int i = 0; argv[i] && k < 31; i++) vg[k++] = argv[i];
    vg[k] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", 01, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", 01, 0);
    pid_t pid;
    int st = -1;
    if (posix_spawnp(&pid, "valgrind", &fa, NULL, vg, environ) == 0) waitpid(pid, &st, 0);
    posix_spawn_file_actions_destroy(&fa);
    double total = 0;
    int logs = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strncmp(e->d_name, "log.", 4)) continue;
        char path[PATH_MAX + 300], line[256];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "r");
        while (f && fgets(line, sizeof line, f)) {
            char *r = strstr(line, "I   refs:");
            if (!r) continue;
            double v = 0;
            for (r += 9; *r; r++)
                if (*r >= '0' && *r <= '9') v = v * 10 + (*r - '0');
            total += v, logs++;
        }
        if (f) fclose(f);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(dir);
    return WIFEXITED(st) && WEXITSTATUS(st) <= 1 && logs > 0 ? total : -1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#define MAX_ROUNDS 64

int main(int argc, char **argv)
{
    int count_instructions = argc > 1 && strcmp(argv[1], "--instructions") == 0;
    if (count_instructions) argv++, argc--;
    const char *cycles = argc > 1 ? argv[1] : count_instructions ? "30" : "200";
    long n = atol(cycles);
    int rounds = argc > 2 && !count_instructions ? atoi(argv[2]) : 5;
    if (n < 1 || rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "usage: pyfini-leakcheck-bench [CYCLES [ROUNDS]]   (CYCLES >= 1, 1 <= ROUNDS <= %d)\n"
                        "       pyfini-leakcheck-bench --instructions [CYCLES]\n", MAX_ROUNDS);
        return 2;
    }
    struct { const char *label, *config, *module; int baseline, where; } cases[] = {
        {"bare legacy", "legacy", NULL, 0, 0},
        {"bare isolated", "isolated", NULL, 0, 0},
        {"legacy --import json --no-baseline", "legacy", "json", 0, 0},
        {"legacy --import json (baseline: 2 cycles/round)", "legacy", "json", 1, 0},
        {"bare legacy --where", "legacy", NULL, 0, 1},
        {"bare isolated --where", "isolated", NULL, 0, 1},
    };
    if (count_instructions) {
        printf("pyfini-leakcheck overhead: %ld interpreter cycles, instructions executed (valgrind's cachegrind, "
               "all processes), incl. start-up\n\n%-44s %15s %15s %7s\n", n, "case", "bare loop", "leakcheck",
               "ratio");
    } else {
        printf("pyfini-leakcheck overhead: %ld interpreter cycles, %d rounds (the loop, then the tool), medians, "
               "incl. start-up\n\n", n, rounds);
        printf("%-44s %10s %10s %7s   %10s %10s %7s %13s\n", "", "wall time", "", "", "CPU time", "", "", "");
        printf("%-44s %10s %10s %7s   %10s %10s %7s %13s\n", "case", "bare loop", "leakcheck", "ratio", "bare loop",
               "leakcheck", "ratio", "ratio range");
    }
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *loop[] = {(char *)LC_BARE_LOOP, (char *)cases[i].config, (char *)cycles, (char *)cases[i].module, NULL};
        char *tool[16];
        int k = 0;
        tool[k++] = (char *)LC_TOOL;
        tool[k++] = "--config";
        tool[k++] = (char *)cases[i].config;
        tool[k++] = "--cycles";
        tool[k++] = (char *)cycles;
        tool[k++] = "--warmup";
        tool[k++] = "0";
        if (cases[i].module) tool[k++] = "--import", tool[k++] = (char *)cases[i].module;
        if (!cases[i].baseline) tool[k++] = "--no-baseline";
        if (cases[i].where) tool[k++] = "--where";
        tool[k] = NULL;
        double f = cases[i].baseline ? 2 : 1;   /* the baseline doubles the cycles */
        if (count_instructions) {
            if (cases[i].where) continue;   /* its pass cycles and unwinding: see the timed rows */
            double il = instructions(loop), it = instructions(tool);
            if (il < 0 || it < 0)
                printf("%-44s %s\n", cases[i].label, "not run (valgrind missing, or the run failed)");
            else
                printf("%-44s %15.0f %15.0f %6.3fx%s\n", cases[i].label, f * il, it, it / (f * il),
                       cases[i].baseline ? "  (vs 2x the loop)" : "");
            fflush(stdout);
            continue;
        }
        double lw[MAX_ROUNDS], lc[MAX_ROUNDS], tw[MAX_ROUNDS], tc[MAX_ROUNDS], rw[MAX_ROUNDS], rc[MAX_ROUNDS];
        int ok = 1;
        for (int r = 0; r < rounds && ok; r++) {
            times tl = run(loop), tt = run(tool);
            if (tl.wall < 0 || tt.wall < 0) ok = 0;
            lw[r] = f * tl.wall, lc[r] = f * tl.cpu, tw[r] = tt.wall, tc[r] = tt.cpu;
            rw[r] = tw[r] / lw[r], rc[r] = tc[r] / lc[r];
        }
        if (!ok) {
            printf("%-44s %s\n", cases[i].label, "not run (this CPython cannot, or it failed)");
            continue;
        }
        double ratio_cpu = median(rc, rounds), ratio_wall = median(rw, rounds);   /* sorts rc: range below */
        printf("%-44s %8.3f s %8.3f s %6.2fx   %8.3f s %8.3f s %6.2fx  %5.2f-%4.2fx%s\n", cases[i].label,
               median(lw, rounds), median(tw, rounds), ratio_wall, median(lc, rounds), median(tc, rounds), ratio_cpu,
               rc[0], rc[rounds - 1], cases[i].baseline ? "  (vs 2x the loop)" : "");
        fflush(stdout);
    }
    if (count_instructions) {
        printf("\nratio = leakcheck / bare loop; the goal: <= 1.10x (counting, without --where).\n");
        return 0;
    }
    printf("\nratio = leakcheck / bare loop, the median of the rounds' ratios; the goals: <= 1.10x without --where, "
           "<= 3x with it.\n");
    return 0;
}
