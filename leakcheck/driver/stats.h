/* stats.h - how pyfini-leakcheck judges one meter's series.
 *
 * Input: x[0..n-1], the increase of a meter over each judged cycle, or, with
 * a baseline, per block pair: (growth over k subject cycles - growth over the
 * k bare cycles after them) / k, the excess per cycle.  Blocks, not single
 * alternating cycles: a noisy meter (malloc's free lists, RSS pages) has a
 * bounded state that cancels out of a block's growth but would add up in a
 * sum of single-cycle differences.  cycles_per_sample = k (1 without pairs).
 *
 *  slope   least-squares slope of the cumulative series Y_k = x_0+..+x_k
 *          against k: bytes (units) per cycle.  A jump early in the run
 *          raises the level of Y, not its slope.
 *  bound   99% confidence bound of the slope: the widest of the least-squares
 *          standard error, the spread of the per-chunk rates (the judged
 *          cycles are cut into up to LC_CHUNKS_MAX chunks) and, for block
 *          pairs (independent samples), the standard error of their mean;
 *          each times Student's t.
 *  chunks  growth of the meter over each chunk.  In the spirit of
 *          regrtest -R: a leak grows in every chunk.
 *
 * Verdict, with thr = the allowed loss per cycle (--max-bytes-per-cycle for
 * bytes meters, 0 otherwise) and floor = resolution / chunk length (what the
 * meter can resolve: one page for RSS, one unit for exact meters):
 *  LEAK          slope - bound > thr and every chunk grew by >= resolution;
 *  no leak       slope + bound <= thr + floor, or the second half of the run
 *                alone gives slope + bound <= thr + floor (growth stopped);
 *  inconclusive  otherwise, e.g. a noisy meter with a wide bound.
 *
 * Exact meters (exact != 0: heap*, py*, blocks, refs, fds - they count every
 * byte or unit, no sampling, no free lists) follow the exact rule: "every
 * chunk grew" means every chunk's growth PER CYCLE is above thr (not one
 * resolution step).  A steady loss repeats exactly, its bound is 0 (or the
 * few bytes of malloc_usable_size()'s rounding): LEAK when it is above thr,
 * else no leak - nothing is left inconclusive by the meter.  Only a program
 * that is itself noisy (CPython 3.11: objects of one cycle freed in a later
 * one, so py* and heap move by kilobytes either way) can leave an exact
 * meter inconclusive; never "no leak" on a chunk that happened to dip.
 */
#ifndef LC_STATS_H
#define LC_STATS_H

#include <stddef.h>

#define LC_CHUNKS_MAX 5

enum lc_verdict { LC_NO_LEAK, LC_LEAK, LC_INCONCLUSIVE, LC_TOO_FEW };

typedef struct lc_judgement {
    size_t n;                 /* judged cycles */
    double slope, bound;      /* per cycle; bound = half-width */
    double mean;              /* plain mean of x */
    double floor;             /* resolution / chunk length */
    int nchunks;
    double chunk_growth[LC_CHUNKS_MAX];
    double chunk_rate_min;    /* smallest growth per cycle of a chunk */
    double sample_min;        /* smallest sample (block pair or cycle), per cycle */
    double late_slope, late_bound;   /* second half of the judged cycles */
    enum lc_verdict verdict;
} lc_judgement;

void lc_judge(const double *x, size_t n, double cycles_per_sample, double resolution, double threshold,
              int independent, int exact, lc_judgement *out);
const char *lc_verdict_name(enum lc_verdict v);
double lc_t995(int df);   /* Student's t, 99.5% quantile */

#endif
