/* report_csv.c - --csv FILE: one row per cycle, readings and increases. */
#include <stdio.h>

#include "driver.h"

int lc_write_csv(const char *path, const lc_run *r)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "cycle,round,kind,phase,time_ms");
    for (size_t k = 0; k < LC_NMETERS; k++) fprintf(f, ",%s,%s_increase", lc_meters[k].name, lc_meters[k].name);
    fprintf(f, ",obmalloc_blocks_at_end\n");
    for (size_t i = 0; i < r->ncyc; i++) {
        const lc_cycle *c = &r->cyc[i];
        fprintf(f, "%ld,%ld,%s,%s,%.3f", c->id.seq, c->id.round + 1, c->id.kind == 'S' ? "subject" : "bare",
                c->id.judged ? "judged" : "warmup", (double)c->v[LC_V_TIME_NS] / 1e6);
        for (size_t k = 0; k < LC_NMETERS; k++) {
            int v = lc_meters[k].value;
            int64_t prev = i ? r->cyc[i - 1].v[v] : r->initial[v];
            if (c->v[v] < 0 || prev < 0) fprintf(f, ",,");
            else fprintf(f, ",%lld,%lld", (long long)c->v[v], (long long)(c->v[v] - prev));
        }
        if (c->obm >= 0) fprintf(f, ",%lld\n", (long long)c->obm);
        else fprintf(f, ",\n");
    }
    return fclose(f);
}
