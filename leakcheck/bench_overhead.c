/* bench_overhead.c - pyfini-leakcheck's overhead over a bare create/end loop.
 * Runs the same number of interpreter cycles with pyfini-leakcheck-bare-loop
 * (no meters) and with pyfini-leakcheck, and prints the wall times, the CPU
 * times (user + system of the process and its children: what a loaded
 * machine does not blur) and their ratios side by side.  Figures, not a test.
 * Each case runs ROUNDS times, the loop and the tool in turn (so that a
 * change of the machine's load falls on both), and prints the medians and
 * the median of the per-round ratios with their range: one run of either
 * varies by +-10 % on this machine, more than the overhead it measures.
 * usage: pyfini-leakcheck-bench [CYCLES [ROUNDS]]   (defaults 200, 5) */
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
    const char *cycles = argc > 1 ? argv[1] : "200";
    long n = atol(cycles);
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    if (n < 1 || rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "usage: pyfini-leakcheck-bench [CYCLES [ROUNDS]]   (CYCLES >= 1, 1 <= ROUNDS <= %d)\n",
                MAX_ROUNDS);
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
    printf("pyfini-leakcheck overhead: %ld interpreter cycles, %d rounds (the loop, then the tool), medians, "
           "incl. start-up\n\n", n, rounds);
    printf("%-44s %10s %10s %7s   %10s %10s %7s %13s\n", "", "wall time", "", "", "CPU time", "", "", "");
    printf("%-44s %10s %10s %7s   %10s %10s %7s %13s\n", "case", "bare loop", "leakcheck", "ratio", "bare loop",
           "leakcheck", "ratio", "ratio range");
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
    printf("\nratio = leakcheck / bare loop, the median of the rounds' ratios; the goals: <= 1.10x without --where, "
           "<= 3x with it.\n");
    return 0;
}
