/* lc_schedule.h - which cycle runs when: the one schedule the worker follows,
 * the driver describes and the analysis groups by.
 *
 * Warm-up: subject and bare cycles alternate (paired runs) or the one kind
 * runs.  Judged, paired: blocks of k subject cycles, then k bare cycles (the
 * last block may be shorter), k = cycles / 10 within [1, 10]: each block's
 * growth of a noisy meter then telescopes (see driver/stats.h).  A run
 * without a subject judges bare cycles; --no-baseline judges subject cycles.
 */
#ifndef LC_SCHEDULE_H
#define LC_SCHEDULE_H

#include <stdint.h>

#define LC_BLOCK_DIVISOR 10   /* k = judged cycles / LC_BLOCK_DIVISOR ... */
#define LC_BLOCK_MAX 10       /* ... at most LC_BLOCK_MAX, at least 1 */
#define LC_MIN_SAMPLES 4      /* judged samples (block pairs, or cycles) a meter needs for a verdict */
/* --cycles and --warmup are at most this (driver and worker refuse more):
   a schedule's length, 2 (warmup + cycles), then fits in a long */
#define LC_CYCLES_MAX 1000000000L

typedef struct lc_schedule {
    long warmup, cycles;   /* rounds: warm-up and judged */
    int subject;           /* the run has a subject */
    int paired;            /* subject and baseline: every round = 1 subject + 1 bare cycle */
    long block;            /* k */
    long n_side[2];        /* judged cycles per attribution side (lc_slot.side) */
} lc_schedule;

typedef struct lc_slot {
    int subject;      /* a subject cycle (else bare) */
    long round;       /* 0-based */
    int judged;       /* 0 warm-up */
    int side;         /* attribution: 0 subject cycles (bare ones without a subject), 1 bare cycles of a paired run */
    long block_len;   /* paired, judged: this block's k; else 1 */
    long block_pos;   /* position in the block's 2 k cycles (0 = its first subject cycle) */
} lc_slot;

lc_schedule lc_schedule_make(long warmup, long cycles, int subject, int baseline);
/* The same with block length k = block (0: the default above).  --early-stop
 * runs k = 1, so that a run stopped after any round is a whole schedule:
 * lc_schedule_make_block(warmup, rounds_done, ..., 1). */
lc_schedule lc_schedule_make_block(long warmup, long cycles, int subject, int baseline, long block);

/* --early-stop: the driver judges the run so far after every
 * LC_EARLY_STOP_ROUNDS judged rounds and tells the worker, through
 * LC_CONTROL_FD (lc_protocol.h), to go on or to stop there. */
#define LC_EARLY_STOP_ROUNDS 5
/* the earliest stop: two checkpoints that agree */
#define LC_EARLY_STOP_EARLIEST (2 * LC_EARLY_STOP_ROUNDS)
long lc_schedule_length(const lc_schedule *s);          /* cycles in all */
long lc_schedule_warmup_length(const lc_schedule *s);   /* index of the first judged cycle */
lc_slot lc_schedule_at(const lc_schedule *s, long i);   /* cycle i, 0-based (seq = i + 1) */

/* Samples the analysis judges per meter: block pairs (paired) or cycles. */
long lc_schedule_samples(const lc_schedule *s);
/* The smallest number of judged cycles (rounds) that gives LC_MIN_SAMPLES
 * samples: fewer cannot be judged (the driver refuses them). */
long lc_schedule_min_cycles(int subject, int baseline);

/* Per judged cycle: what the subject side holds beyond the bare side, given
 * the totals of each side (bytes or blocks of a --where site). */
double lc_schedule_excess(const lc_schedule *s, int64_t subject_total, int64_t bare_total);

#endif
