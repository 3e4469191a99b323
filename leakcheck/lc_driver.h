/* lc_driver.h - pyfini-leakcheck's driver: runs a worker, keeps what it reports. */
#ifndef LC_DRIVER_H
#define LC_DRIVER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "lc_protocol.h"
#include "lc_stats.h"
#include "lc_util.h"

typedef struct lc_cycle {
    long seq;
    char kind;          /* 'S' subject, 'B' bare */
    long round;         /* 0-based round of the run */
    int judged;
    int64_t v[LC_NVALUES];
    int64_t obm;        /* obmalloc blocks still in use at interpreter end, -1 unknown */
} lc_cycle;

typedef struct lc_site {
    unsigned id;
    char domain[8];
    int64_t bytes[2], blocks[2];   /* [0] subject, [1] bare cycles */
    int nframes;
    char frames[12][400];
    int npyframes;            /* Python traceback of a sample block (tracemalloc) */
    char pyframes[10][400];
} lc_site;

typedef struct lc_meter_avail {
    int known, available;
    char how[300];
} lc_meter_avail;

enum lc_outcome {
    LC_OUT_DONE,        /* D record */
    LC_OUT_ERROR,       /* E record (bad input, subject raised, config refused) */
    LC_OUT_CRASH,       /* killed by a signal or exited without D/E */
    LC_OUT_HANG,        /* no record within the timeout: killed */
    LC_OUT_SPAWN,       /* could not start the worker */
};

typedef struct lc_run {
    /* what was asked */
    long warmup, cycles;
    int baseline, subject;
    double timeout_s;
    int progress;       /* print a progress line on stderr */
    /* what the worker said */
    char version[64], abiflags[16], executable[1024], compiler[256], configs[256];
    int debug;
    char ignored_env[256];
    lc_meter_avail avail[LC_NVALUES];
    int64_t initial[LC_NVALUES];
    int have_initial;
    lc_cycle *cyc;
    size_t ncyc, capcyc;
    lc_site *sites;
    size_t nsites, capsites;
    char (*extensions)[2][1024];
    size_t nextensions, capextensions;
    long begun_seq;     /* last B record */
    char begun_kind;
    long begun_round;
    int begun_judged;
    char where_note[512];
    char where_python[512];  /* "tracemalloc, N frames" or "unavailable...: why" */
    /* how it ended */
    enum lc_outcome outcome;
    char error_kind[32];
    char error[4096];
    int exit_status;    /* worker exit status, -1 if signalled */
    int signal;         /* terminating signal or 0 */
    char output_tail[4096];   /* last bytes of the worker's stdout+stderr */
} lc_run;

/* Start worker with argv (argv[0] = path), gather records until it ends. */
void lc_run_worker(lc_run *r, char *const argv[]);
void lc_run_free(lc_run *r);

/* meters */
typedef struct lc_meter_def {
    const char *name;
    int value;           /* enum lc_value */
    int bytes;           /* a bytes meter (drives exit status 1) */
    double resolution;
    const char *help;
} lc_meter_def;
extern const lc_meter_def lc_meters[];
extern const size_t lc_nmeters;

/* --python: path of a worker for that CPython (built into a cache once). */
int lc_worker_for_python(const char *want, char *out, size_t n, char *err, size_t errn);
int lc_default_worker(char *out, size_t n, char *err, size_t errn);

/* human-readable bytes */
void lc_fmt_bytes(char *out, size_t n, double b, int sign);

#endif
