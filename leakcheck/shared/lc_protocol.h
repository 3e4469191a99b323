/* lc_protocol.h - what the pyfini-leakcheck worker tells the driver.
 *
 * The driver (pyfini-leakcheck, not linked to any CPython) starts one worker
 * process (pyfini-leakcheck-worker, linked to one CPython) and reads text
 * lines from a pipe the worker gets as file descriptor LC_RECORD_FD.  One
 * record per line, fields separated by one space; a last field written
 * <...> is text and may contain spaces (never a line break: the encoder
 * turns those into spaces).  The records (lc_record_specs[] in lc_protocol.c
 * holds the same lines; the protocol test checks the two agree and that
 * every record survives encoding and decoding):
 *
 *   I <key> <value...>                 information about the Python (version, build, --where notes)
 *   A <meter> <0|1> <how...>           meter availability (how it is read, or why it is not)
 *   R <values>                         reading before the first cycle
 *   B <seq> <S|B> <round> <0|1>        cycle seq begins: subject or bare, its round, judged or warm-up
 *   C <seq> <S|B> <round> <0|1> <values>  reading after cycle seq
 *   O <seq> <n>                        obmalloc blocks still in use when cycle seq's interpreter ended
 *   W <site> <domain> <sub_bytes> <sub_blocks> <bare_bytes> <bare_blocks>  a --where site
 *   F <site> <n> <frame...>            symbolised C frame n of site
 *   P <site> <n> <python line...>      Python line n of site (tracemalloc, innermost first)
 *   K <seq> <pid> <exit> <signal>      a child of the subject ended, collected after cycle seq (exit -1: signalled)
 *   X <module> <path...>               an extension module (--list-extensions)
 *   E <kind> <0|1> <message...>        the run failed (kind: lc_error_kind; 1 = the config refused the subject); exit 2
 *   D                                  done
 *
 * <values> are LC_NVALUES integers in the order of enum lc_value; -1 means
 * the meter is unavailable on this build.  Encoders (lc_enc_*) write one
 * line, newline included, into an lc_line; lc_decode() reads one line.
 */
#ifndef LC_PROTOCOL_H
#define LC_PROTOCOL_H

#include <stddef.h>
#include <stdint.h>

#define LC_RECORD_FD 3
/* --early-stop: the driver's answers at each checkpoint (lc_schedule.h), one
 * byte each, on a socket the worker gets as this descriptor (close-on-exec):
 * LC_CONTROL_GO_ON or LC_CONTROL_STOP.  A worker that cannot read it (the
 * subject closed or replaced it) runs every planned round. */
#define LC_CONTROL_FD 4
#define LC_CONTROL_GO_ON 'c'
#define LC_CONTROL_STOP 's'
/* At the start of every cycle the worker writes "\n" LC_STDERR_MARK "<seq>\n"
 * on its own stderr (fd 2, in the cycle loop's thread), so that the driver
 * knows which cycle wrote each line of the subject's stderr. */
#define LC_STDERR_MARK "\037pyfini-leakcheck cycle "
/* Before it exits with LC_WK_EXIT_RECORD_*, the worker says so on stderr:
 * "\n" LC_STDERR_BROKEN "<exit status>\n" (and with LC_WK_EXIT_STDERR_* in
 * an I record "broken <exit status>"): the driver maps an exit status to
 * its meaning only when the worker confirmed it, so that a subject calling
 * os._exit(10) is not read as a closed record pipe. */
#define LC_STDERR_BROKEN "\037pyfini-leakcheck broken "
#define LC_LINE_MAX 8192      /* longest record, newline included */
#define LC_INFO_KEY_MAX 64
#define LC_METER_NAME_MAX 32
#define LC_DOMAIN_NAME_MAX 16
#define LC_MODULE_NAME_MAX 1024
#define LC_MAX_IMPORTS 64     /* --import options per run (driver and worker refuse more) */
#define LC_MESSAGE_MAX 4096   /* an error message (E records) */
#define LC_SITES_PER_DOMAIN 10  /* W records per allocator domain, at most (the largest excess first) */
#define LC_SITE_FRAMES 12     /* F records per site, at most */
#define LC_SITE_PYLINES 10    /* P records per site, at most */

enum lc_value {
    LC_V_TIME_NS,   /* wall time of the cycle, ns */
    LC_V_RSS,       /* resident set size, bytes */
    LC_V_MALLOC,    /* malloc bytes in use */
    LC_V_PY,        /* bytes held through Python's allocators, all domains */
    LC_V_PY_RAW,    /* ... PYMEM_DOMAIN_RAW */
    LC_V_PY_MEM,    /* ... PYMEM_DOMAIN_MEM */
    LC_V_PY_OBJ,    /* ... PYMEM_DOMAIN_OBJ */
    LC_V_PY_OBMALLOC, /* ... RAW blocks pymalloc allocates for its own bookkeeping */
    LC_V_BLOCKS,    /* blocks allocated through Python's allocators, in use */
    LC_V_REFS,      /* total reference count (debug builds) */
    LC_V_FDS,       /* open file descriptors */
    LC_V_HEAP,      /* bytes of live C-heap blocks (malloc & co, interposed; malloc_usable_size) */
    LC_V_HEAP_PLAIN,  /* ... of those not obtained through Python's allocators */
    LC_V_HEAP_BLOCKS, /* live C-heap blocks */
    LC_NVALUES
};

/* The worker's exit statuses: how the driver tells what happened when the
 * records stop (the driver names each in its report). */
enum lc_worker_exit {
    LC_WK_EXIT_DONE = 0,             /* D record written */
    LC_WK_EXIT_FAILED = 2,           /* E record written */
    LC_WK_EXIT_DRIVER_GONE = 4,      /* writing a record failed otherwise (the driver is gone) */
    LC_WK_EXIT_RECORD_CLOSED = 10,   /* the subject closed the record pipe (LC_RECORD_FD) */
    LC_WK_EXIT_RECORD_REPLACED = 11, /* ... or put another file on it (dup2, or a new open after a close) */
    LC_WK_EXIT_STDERR_CLOSED = 12,   /* the subject closed the worker's stderr (fd 2) */
    LC_WK_EXIT_STDERR_REPLACED = 13, /* ... or put another file on it */
    LC_WK_EXIT_FORKED_CHILD = 14,    /* a child the subject forked came back into the tool's code: ended there */
};

/* Why a run failed (E records). */
enum lc_error_kind {
    LC_ERR_USAGE,      /* bad input: options, a missing module, a syntax error */
    LC_ERR_SUBJECT,    /* the subject raised in a cycle */
    LC_ERR_CONFIG,     /* the interpreter could not be created */
    LC_ERR_INTERNAL,   /* the worker itself failed */
    LC_NERROR_KINDS
};
const char *lc_error_kind_name(enum lc_error_kind k);   /* "usage", ... */

/* One record in its wire form: the bytes, newline included. */
typedef struct lc_line {
    char s[LC_LINE_MAX];
    size_t n;
} lc_line;

/* Which cycle, as B and C records name it. */
typedef struct lc_cycle_id {
    long seq;       /* 1-based */
    char kind;      /* 'S' subject, 'B' bare */
    long round;     /* 0-based round of the run */
    int judged;     /* 0 warm-up */
} lc_cycle_id;

void lc_enc_info(lc_line *l, const char *key, const char *value);
void lc_enc_avail(lc_line *l, const char *meter, int available, const char *how);
void lc_enc_reading(lc_line *l, const int64_t v[LC_NVALUES]);
void lc_enc_begin(lc_line *l, const lc_cycle_id *c);
void lc_enc_cycle(lc_line *l, const lc_cycle_id *c, const int64_t v[LC_NVALUES]);
void lc_enc_obm(lc_line *l, long seq, int64_t blocks);
void lc_enc_site(lc_line *l, unsigned site, const char *domain, const int64_t bytes[2], const int64_t blocks[2]);
void lc_enc_frame(lc_line *l, unsigned site, int n, const char *text);     /* F */
void lc_enc_pyline(lc_line *l, unsigned site, int n, const char *text);    /* P */
void lc_enc_extension(lc_line *l, const char *module, const char *path);
void lc_enc_child(lc_line *l, long seq, long pid, int exit_code, int signal);   /* K */
void lc_enc_error(lc_line *l, enum lc_error_kind kind, int refused, const char *message);
void lc_enc_done(lc_line *l);

/* A decoded record.  Text fields point into the decoded line. */
typedef struct lc_record {
    char type;   /* the record's letter */
    union {
        struct { char key[LC_INFO_KEY_MAX]; const char *value; } info;
        struct { char meter[LC_METER_NAME_MAX]; int available; const char *how; } avail;
        struct { int64_t v[LC_NVALUES]; } reading;
        struct { lc_cycle_id id; int64_t v[LC_NVALUES]; } cycle;   /* B (no v), C */
        struct { long seq; int64_t blocks; } obm;
        struct { long seq, pid; int exit_code, signal; } child;   /* K */
        struct { unsigned site; char domain[LC_DOMAIN_NAME_MAX]; int64_t bytes[2], blocks[2]; } site;
        struct { unsigned site; int n; const char *text; } frame;    /* F, P */
        struct { char module[LC_MODULE_NAME_MAX]; const char *path; } ext;
        struct { enum lc_error_kind kind; int refused; const char *message; } error;
    } u;
} lc_record;

/* Decode one line (without its newline).  0, or -1 for a line that is no
 * well-formed record (out is then unspecified). */
int lc_decode(const char *line, lc_record *out);

/* The documentation of each record type, as in the comment above. */
typedef struct lc_record_spec {
    char type;
    const char *syntax;    /* "B <seq> <S|B> <round> <0|1>" */
} lc_record_spec;
extern const lc_record_spec lc_record_specs[];
extern const size_t lc_nrecord_specs;

#endif
