/* bench_overhead.c - pyfini-leakcheck's overhead over a bare create/end loop.
 * Runs the same number of interpreter cycles with pyfini-leakcheck-bare-loop
 * (no meters) and with pyfini-leakcheck, and prints the wall times, the CPU
 * times (user + system of the process and its children: what a loaded
 * machine does not blur) and their ratios side by side.  Figures, not a test.
 * usage: pyfini-leakcheck-bench [CYCLES]   (default 200) */
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>

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

/* the best wall time and the best CPU time of n runs */
static times best_of(int n, char *const argv[])
{
    times best = {-1, -1};
    for (int i = 0; i < n; i++) {
        times t = run(argv);
        if (t.wall < 0) return t;
        if (best.wall < 0 || t.wall < best.wall) best.wall = t.wall;
        if (best.cpu < 0 || t.cpu < best.cpu) best.cpu = t.cpu;
    }
    return best;
}

int main(int argc, char **argv)
{
    const char *cycles = argc > 1 ? argv[1] : "200";
    long n = atol(cycles);
    struct { const char *label, *config, *module; int baseline, where; } cases[] = {
        {"bare legacy", "legacy", NULL, 0, 0},
        {"bare isolated", "isolated", NULL, 0, 0},
        {"legacy --import json --no-baseline", "legacy", "json", 0, 0},
        {"legacy --import json (baseline: 2 cycles/round)", "legacy", "json", 1, 0},
        {"bare legacy --where", "legacy", NULL, 0, 1},
        {"bare isolated --where", "isolated", NULL, 0, 1},
    };
    printf("pyfini-leakcheck overhead: %ld interpreter cycles (rounds), best of 3 runs (--where: 2), incl. start-up\n\n", n);
    printf("%-44s %10s %10s %7s   %10s %10s %7s\n", "", "wall time", "", "", "CPU time", "", "");
    printf("%-44s %10s %10s %7s   %10s %10s %7s\n", "case", "bare loop", "leakcheck", "ratio", "bare loop", "leakcheck",
           "ratio");
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
        times tl = best_of(3, loop), tt = best_of(cases[i].where ? 2 : 3, tool);
        if (tl.wall < 0 || tt.wall < 0) {
            printf("%-44s %s\n", cases[i].label, "not run (this CPython cannot, or it failed)");
            continue;
        }
        double f = cases[i].baseline ? 2 : 1;   /* the baseline doubles the cycles */
        printf("%-44s %8.3f s %8.3f s %6.2fx   %8.3f s %8.3f s %6.2fx%s\n", cases[i].label, f * tl.wall, tt.wall,
               tt.wall / (f * tl.wall), f * tl.cpu, tt.cpu, tt.cpu / (f * tl.cpu),
               cases[i].baseline ? "  (vs 2x the loop)" : "");
    }
    printf("\nratio = leakcheck / bare loop; the goals: <= 1.10x without --where, <= 3x with it.\n");
    return 0;
}
