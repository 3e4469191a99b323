/* stats.c - see stats.h */
#include <math.h>
#include <string.h>

#include "lc_schedule.h"
#include "stats.h"

double lc_t995(int df)
{
    static const double t[] = {0,     63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.250,
                               3.169, 3.106,  3.055, 3.012, 2.977, 2.947, 2.921, 2.898, 2.878, 2.861,
                               2.845, 2.831,  2.819, 2.807, 2.797, 2.787, 2.779, 2.771, 2.763, 2.756,
                               2.750};
    if (df <= 0) return INFINITY;
    if (df <= 30) return t[df];
    if (df <= 60) return 2.660 + (2.750 - 2.660) * (60 - df) / 30.0;
    if (df <= 120) return 2.617 + (2.660 - 2.617) * (120 - df) / 60.0;
    return 2.576;
}

const char *lc_verdict_name(enum lc_verdict v)
{
    switch (v) {
    case LC_NO_LEAK: return "no leak";
    case LC_LEAK: return "LEAK";
    case LC_INCONCLUSIVE: return "inconclusive";
    case LC_TOO_FEW: return "too few cycles";
    }
    return "?";
}

/* Least-squares slope of the cumulative sum of x[0..n-1] and the standard
 * error of that slope. */
static void ols_cumulative(const double *x, size_t n, double *slope, double *se)
{
    double sy = 0, ymean = 0, kmean = (double)(n + 1) / 2.0;
    for (size_t i = 0; i < n; i++) {
        sy += x[i];
        ymean += sy;
    }
    ymean /= (double)n;
    double sxx = 0, sxy = 0;
    sy = 0;
    for (size_t i = 0; i < n; i++) {
        sy += x[i];
        double dk = (double)(i + 1) - kmean;
        sxx += dk * dk;
        sxy += dk * (sy - ymean);
    }
    *slope = sxx > 0 ? sxy / sxx : 0;
    double rss = 0;
    sy = 0;
    for (size_t i = 0; i < n; i++) {
        sy += x[i];
        double fit = ymean + *slope * ((double)(i + 1) - kmean);
        rss += (sy - fit) * (sy - fit);
    }
    *se = (n > 2 && sxx > 0) ? sqrt(rss / (double)(n - 2) / sxx) : INFINITY;
}

/* slope and bound over x[0..n-1], chunk growths into growth[] */
static void slope_and_bound(const double *x, size_t n, int nchunks, int independent, double *slope, double *bound,
                            double *growth)
{
    double se;
    ols_cumulative(x, n, slope, &se);
    double half = lc_t995((int)n - 2) * se;
    if (independent && n >= 2) {
        double m = 0, var = 0;
        for (size_t i = 0; i < n; i++) m += x[i];
        m /= (double)n;
        for (size_t i = 0; i < n; i++) var += (x[i] - m) * (x[i] - m);
        var /= (double)(n - 1);
        double h = lc_t995((int)n - 1) * sqrt(var / (double)n);
        if (h > half) half = h;
    }
    double rates[LC_CHUNKS_MAX], rmean = 0;
    for (int c = 0; c < nchunks; c++) {
        size_t a = n * (size_t)c / (size_t)nchunks, b = n * (size_t)(c + 1) / (size_t)nchunks;
        double g = 0;
        for (size_t i = a; i < b; i++) g += x[i];
        if (growth) growth[c] = g;
        rates[c] = g / (double)(b - a);
        rmean += rates[c];
    }
    rmean /= nchunks;
    if (nchunks >= 2) {
        double var = 0;
        for (int c = 0; c < nchunks; c++) var += (rates[c] - rmean) * (rates[c] - rmean);
        var /= (nchunks - 1);
        double h2 = lc_t995(nchunks - 1) * sqrt(var / nchunks);
        if (h2 > half) half = h2;
    }
    *bound = half;
}

static int chunks_for(size_t n)
{
    if (n >= 20) return 5;
    if (n >= 12) return 4;
    if (n >= 6) return 3;
    return 2;
}

void lc_judge(const double *x, size_t n, double cycles_per_sample, double resolution, double threshold,
              int independent, int exact, lc_judgement *j)
{
    memset(j, 0, sizeof *j);
    j->n = n;
    if (n < LC_MIN_SAMPLES) {
        j->verdict = LC_TOO_FEW;
        for (size_t i = 0; i < n; i++) j->mean += x[i];
        if (n) j->mean /= (double)n;
        j->slope = j->mean;
        j->bound = INFINITY;
        return;
    }
    j->sample_min = INFINITY;
    for (size_t i = 0; i < n; i++) {
        j->mean += x[i];
        if (x[i] < j->sample_min) j->sample_min = x[i];
    }
    j->mean /= (double)n;
    j->nchunks = chunks_for(n);
    slope_and_bound(x, n, j->nchunks, independent, &j->slope, &j->bound, j->chunk_growth);
    for (int c = 0; c < j->nchunks; c++) j->chunk_growth[c] *= cycles_per_sample;
    j->floor = resolution / ((double)n / j->nchunks * cycles_per_sample);
    size_t half = n / 2;
    slope_and_bound(x + half, n - half, chunks_for(n - half), independent, &j->late_slope, &j->late_bound, NULL);

    int all_grow = 1;
    j->chunk_rate_min = INFINITY;
    for (int c = 0; c < j->nchunks; c++) {
        if (j->chunk_growth[c] < resolution) all_grow = 0;
        size_t a = n * (size_t)c / (size_t)j->nchunks, b = n * (size_t)(c + 1) / (size_t)j->nchunks;
        double rate = j->chunk_growth[c] / ((double)(b - a) * cycles_per_sample);
        if (rate < j->chunk_rate_min) j->chunk_rate_min = rate;
    }
    /* the exact rule: every chunk above the allowed loss per cycle */
    if (exact) all_grow = j->chunk_rate_min > threshold;
    if (j->slope - j->bound > threshold && all_grow)
        j->verdict = LC_LEAK;
    else if (j->slope + j->bound <= threshold + j->floor || j->late_slope + j->late_bound <= threshold + j->floor)
        j->verdict = LC_NO_LEAK;
    else
        j->verdict = LC_INCONCLUSIVE;
}
