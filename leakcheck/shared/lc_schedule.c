/* lc_schedule.c - see lc_schedule.h */
#include "lc_schedule.h"

lc_schedule lc_schedule_make(long warmup, long cycles, int subject, int baseline)
{
    return lc_schedule_make_block(warmup, cycles, subject, baseline, 0);
}

lc_schedule lc_schedule_make_block(long warmup, long cycles, int subject, int baseline, long block)
{
    lc_schedule s = {warmup, cycles, subject != 0, subject && baseline, 1, {0, 0}};
    long k = cycles / LC_BLOCK_DIVISOR;
    s.block = block > 0 ? block : k < 1 ? 1 : (k > LC_BLOCK_MAX ? LC_BLOCK_MAX : k);
    s.n_side[0] = cycles;
    s.n_side[1] = s.paired ? cycles : 0;
    return s;
}

long lc_schedule_warmup_length(const lc_schedule *s) { return s->warmup * (s->paired ? 2 : 1); }

long lc_schedule_length(const lc_schedule *s) { return (s->warmup + s->cycles) * (s->paired ? 2 : 1); }

lc_slot lc_schedule_at(const lc_schedule *s, long i)
{
    lc_slot sl = {s->subject, i, 0, 0, 1, 0};
    long warm = lc_schedule_warmup_length(s);
    if (i < warm) {
        if (s->paired) sl.subject = i % 2 == 0, sl.round = i / 2;
        sl.side = s->paired && !sl.subject;
        return sl;
    }
    sl.judged = 1;
    long j = i - warm;
    if (!s->paired) {
        sl.round = s->warmup + j;
        return sl;
    }
    /* every block before this one is full: 2 k cycles */
    long b = j / (2 * s->block), first = b * s->block;
    sl.block_len = s->cycles - first < s->block ? s->cycles - first : s->block;
    sl.block_pos = j - 2 * first;
    sl.subject = sl.block_pos < sl.block_len;
    sl.side = !sl.subject;
    sl.round = s->warmup + first + sl.block_pos % sl.block_len;
    return sl;
}

double lc_schedule_excess(const lc_schedule *s, int64_t subject_total, int64_t bare_total)
{
    double ex = s->n_side[0] ? (double)subject_total / (double)s->n_side[0] : 0;
    if (s->n_side[1]) ex -= (double)bare_total / (double)s->n_side[1];
    return ex;
}

long lc_schedule_samples(const lc_schedule *s)
{
    return s->paired ? (s->cycles + s->block - 1) / s->block : s->cycles;
}

long lc_schedule_min_cycles(int subject, int baseline)
{
    long c = 1;
    for (;; c++) {
        lc_schedule s = lc_schedule_make(0, c, subject, baseline);
        if (lc_schedule_samples(&s) >= LC_MIN_SAMPLES) return c;
    }
}
