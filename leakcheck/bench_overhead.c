/* bench_overhead.c - pyfini-leakcheck's overhead over a bare create/end loop.
 * Runs the same number of interpreter cycles with pyfini-leakcheck-bare-loop
 * (no meters) and with pyfini-leakcheck, and prints the wall times and their
 * ratio side by side.  Figures, not a test.
 * usage: pyfini-leakcheck-bench [CYCLES]   (default 200) */
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

static double run(char *const argv[])
{
    struct timespec a, b;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", 01, 0);
    clock_gettime(CLOCK_MONOTONIC, &a);
    pid_t pid;
    if (posix_spawn(&pid, argv[0], &fa, NULL, argv, environ) != 0) return -1;
    int st;
    waitpid(pid, &st, 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    posix_spawn_file_actions_destroy(&fa);
    if (!WIFEXITED(st) || WEXITSTATUS(st) > 1) return -1;
    return (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
}

static double best_of(int n, char *const argv[])
{
    double best = -1;
    for (int i = 0; i < n; i++) {
        double t = run(argv);
        if (t < 0) return -1;
        if (best < 0 || t < best) best = t;
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
    };
    printf("pyfini-leakcheck overhead: %ld interpreter cycles (rounds), best of 3 runs, wall time incl. start-up\n\n", n);
    printf("%-50s %12s %14s %8s\n", "case", "bare loop", "leakcheck", "ratio");
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
        double tl = best_of(3, loop), tt = best_of(cases[i].where ? 1 : 3, tool);
        if (tl < 0 || tt < 0) {
            printf("%-50s %12s\n", cases[i].label, "not run (this CPython cannot, or it failed)");
            continue;
        }
        double ref = cases[i].baseline ? 2 * tl : tl;   /* the baseline doubles the cycles */
        printf("%-50s %10.3f s %12.3f s %7.1f%%%s\n", cases[i].label, ref, tt, (tt / ref - 1) * 100,
               cases[i].baseline ? "  (vs 2x the loop)" : "");
    }
    printf("\nratio = leakcheck / bare loop - 1; the goal is <= 10%% without --where.\n");
    return 0;
}
