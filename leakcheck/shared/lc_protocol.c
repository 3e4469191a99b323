/* lc_protocol.c - the one encoder and the one decoder of each record type
 * (see lc_protocol.h).  No CPython, no jansson: the driver and the worker
 * both link it. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lc_protocol.h"
#include "lc_util.h"

const lc_record_spec lc_record_specs[] = {
    {'I', "I <key> <value...>"},
    {'A', "A <meter> <0|1> <how...>"},
    {'R', "R <values>"},
    {'B', "B <seq> <S|B> <round> <0|1>"},
    {'C', "C <seq> <S|B> <round> <0|1> <values>"},
    {'O', "O <seq> <n>"},
    {'W', "W <site> <domain> <sub_bytes> <sub_blocks> <bare_bytes> <bare_blocks>"},
    {'F', "F <site> <n> <frame...>"},
    {'P', "P <site> <n> <python line...>"},
    {'K', "K <seq> <pid> <exit> <signal>"},
    {'X', "X <module> <path...>"},
    {'E', "E <kind> <0|1> <message...>"},
    {'D', "D"},
};
const size_t lc_nrecord_specs = sizeof lc_record_specs / sizeof *lc_record_specs;

static const char *const error_kind_names[LC_NERROR_KINDS] = {"usage", "subject", "config", "internal"};

const char *lc_error_kind_name(enum lc_error_kind k)
{
    return (unsigned)k < LC_NERROR_KINDS ? error_kind_names[k] : "internal";
}

/* --- encoding ------------------------------------------------------------- */
/* Append to l, cut to fit (room is kept for the newline). */
static void put(lc_line *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(lc_line *l, const char *fmt, ...)
{
    size_t room = sizeof l->s - 1 - l->n;   /* one byte for the newline */
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(l->s + l->n, room, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    l->n += (size_t)k < room ? (size_t)k : room - 1;
}

/* A text field: line breaks become spaces. */
static void put_text(lc_line *l, const char *text)
{
    size_t start = l->n;
    put(l, "%s", text ? text : "");
    for (size_t i = start; i < l->n; i++)
        if (l->s[i] == '\n' || l->s[i] == '\r') l->s[i] = ' ';
}

static void put_values(lc_line *l, const int64_t v[LC_NVALUES])
{
    for (int i = 0; i < LC_NVALUES; i++) put(l, "%s%" PRId64, i ? " " : "", v[i]);
}

static void begin(lc_line *l, char type)
{
    l->n = 0;
    l->s[0] = 0;
    put(l, "%c", type);
}

static void end(lc_line *l)
{
    l->s[l->n++] = '\n';
    l->s[l->n] = 0;
}

void lc_enc_info(lc_line *l, const char *key, const char *value)
{
    begin(l, 'I');
    put(l, " %s ", key);
    put_text(l, value);
    end(l);
}

void lc_enc_avail(lc_line *l, const char *meter, int available, const char *how)
{
    begin(l, 'A');
    put(l, " %s %d ", meter, available ? 1 : 0);
    put_text(l, how);
    end(l);
}

void lc_enc_reading(lc_line *l, const int64_t v[LC_NVALUES])
{
    begin(l, 'R');
    put(l, " ");
    put_values(l, v);
    end(l);
}

static void put_cycle_id(lc_line *l, const lc_cycle_id *c)
{
    put(l, " %ld %c %ld %d", c->seq, c->kind, c->round, c->judged ? 1 : 0);
}

void lc_enc_begin(lc_line *l, const lc_cycle_id *c)
{
    begin(l, 'B');
    put_cycle_id(l, c);
    end(l);
}

void lc_enc_cycle(lc_line *l, const lc_cycle_id *c, const int64_t v[LC_NVALUES])
{
    begin(l, 'C');
    put_cycle_id(l, c);
    put(l, " ");
    put_values(l, v);
    end(l);
}

void lc_enc_obm(lc_line *l, long seq, int64_t blocks)
{
    begin(l, 'O');
    put(l, " %ld %" PRId64, seq, blocks);
    end(l);
}

void lc_enc_child(lc_line *l, long seq, long pid, int exit_code, int signal)
{
    begin(l, 'K');
    put(l, " %ld %ld %d %d", seq, pid, exit_code, signal);
    end(l);
}

void lc_enc_site(lc_line *l, unsigned site, const char *domain, const int64_t bytes[2], const int64_t blocks[2])
{
    begin(l, 'W');
    put(l, " %u %s %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64, site, domain, bytes[0], blocks[0], bytes[1],
        blocks[1]);
    end(l);
}

static void enc_site_text(lc_line *l, char type, unsigned site, int n, const char *text)
{
    begin(l, type);
    put(l, " %u %d ", site, n);
    put_text(l, text);
    end(l);
}

void lc_enc_frame(lc_line *l, unsigned site, int n, const char *text) { enc_site_text(l, 'F', site, n, text); }
void lc_enc_pyline(lc_line *l, unsigned site, int n, const char *text) { enc_site_text(l, 'P', site, n, text); }

void lc_enc_extension(lc_line *l, const char *module, const char *path)
{
    begin(l, 'X');
    put(l, " %s ", module);
    put_text(l, path);
    end(l);
}

void lc_enc_error(lc_line *l, enum lc_error_kind kind, int refused, const char *message)
{
    begin(l, 'E');
    put(l, " %s %d ", lc_error_kind_name(kind), refused ? 1 : 0);
    put_text(l, message);
    end(l);
}

void lc_enc_done(lc_line *l)
{
    begin(l, 'D');
    end(l);
}

/* --- decoding ------------------------------------------------------------- */
/* A word of at most n - 1 bytes into out; *s moves past it and one space. */
static int get_word(const char **s, char *out, size_t n)
{
    const char *e = strchr(*s, ' ');
    size_t len = e ? (size_t)(e - *s) : strlen(*s);
    if (len == 0 || len >= n) return -1;
    memcpy(out, *s, len);
    out[len] = 0;
    *s += len + (e != NULL);
    return 0;
}

static int get_i64(const char **s, int64_t *v)
{
    char *end;
    errno = 0;
    long long x = strtoll(*s, &end, 10);
    if (end == *s || errno || (*end != ' ' && *end != 0)) return -1;
    *v = x;
    *s = end + (*end == ' ');
    return 0;
}

static int get_long(const char **s, long *v)
{
    int64_t x;
    if (get_i64(s, &x) < 0) return -1;
    *v = (long)x;
    return 0;
}

static int get_int(const char **s, int *v)
{
    long x;
    if (get_long(s, &x) < 0) return -1;
    *v = (int)x;
    return 0;
}

static int get_flag(const char **s, int *v)
{
    return get_int(s, v) < 0 || (*v != 0 && *v != 1) ? -1 : 0;
}

static int get_values(const char **s, int64_t v[LC_NVALUES])
{
    for (int i = 0; i < LC_NVALUES; i++)
        if (get_i64(s, &v[i]) < 0) return -1;
    return **s ? -1 : 0;
}

static int get_cycle_id(const char **s, lc_cycle_id *c)
{
    char kind[2];
    if (get_long(s, &c->seq) < 0 || get_word(s, kind, sizeof kind) < 0 || get_long(s, &c->round) < 0
        || get_flag(s, &c->judged) < 0)
        return -1;
    c->kind = kind[0];
    return c->kind == 'S' || c->kind == 'B' ? 0 : -1;
}

static int dec_info(const char *s, lc_record *r)
{
    if (get_word(&s, r->u.info.key, sizeof r->u.info.key) < 0) return -1;
    r->u.info.value = s;
    return 0;
}

static int dec_avail(const char *s, lc_record *r)
{
    if (get_word(&s, r->u.avail.meter, sizeof r->u.avail.meter) < 0 || get_flag(&s, &r->u.avail.available) < 0)
        return -1;
    r->u.avail.how = s;
    return 0;
}

static int dec_reading(const char *s, lc_record *r) { return get_values(&s, r->u.reading.v); }

static int dec_begin(const char *s, lc_record *r) { return get_cycle_id(&s, &r->u.cycle.id) < 0 || *s ? -1 : 0; }

static int dec_cycle(const char *s, lc_record *r)
{
    return get_cycle_id(&s, &r->u.cycle.id) < 0 ? -1 : get_values(&s, r->u.cycle.v);
}

static int dec_obm(const char *s, lc_record *r)
{
    return get_long(&s, &r->u.obm.seq) < 0 || get_i64(&s, &r->u.obm.blocks) < 0 || *s ? -1 : 0;
}

static int dec_child(const char *s, lc_record *r)
{
    return get_long(&s, &r->u.child.seq) < 0 || get_long(&s, &r->u.child.pid) < 0
                   || get_int(&s, &r->u.child.exit_code) < 0 || get_int(&s, &r->u.child.signal) < 0 || *s
               ? -1
               : 0;
}

static int dec_site(const char *s, lc_record *r)
{
    int64_t id;
    if (get_i64(&s, &id) < 0 || get_word(&s, r->u.site.domain, sizeof r->u.site.domain) < 0) return -1;
    r->u.site.site = (unsigned)id;
    for (int k = 0; k < 2; k++)
        if (get_i64(&s, &r->u.site.bytes[k]) < 0 || get_i64(&s, &r->u.site.blocks[k]) < 0) return -1;
    return *s ? -1 : 0;
}

static int dec_frame(const char *s, lc_record *r)
{
    int64_t id;
    if (get_i64(&s, &id) < 0 || get_int(&s, &r->u.frame.n) < 0) return -1;
    r->u.frame.site = (unsigned)id;
    r->u.frame.text = s;
    return 0;
}

static int dec_extension(const char *s, lc_record *r)
{
    if (get_word(&s, r->u.ext.module, sizeof r->u.ext.module) < 0) return -1;
    r->u.ext.path = s;
    return 0;
}

static int dec_error(const char *s, lc_record *r)
{
    char kind[16];
    if (get_word(&s, kind, sizeof kind) < 0 || get_flag(&s, &r->u.error.refused) < 0) return -1;
    r->u.error.kind = LC_ERR_INTERNAL;
    for (int k = 0; k < LC_NERROR_KINDS; k++)
        if (!strcmp(kind, error_kind_names[k])) r->u.error.kind = (enum lc_error_kind)k;
    r->u.error.message = s;
    return 0;
}

static int dec_done(const char *s, lc_record *r)
{
    (void)r;
    return *s ? -1 : 0;
}

int lc_decode(const char *line, lc_record *out)
{
    static const struct { char type; int (*dec)(const char *, lc_record *); } decoders[] = {
        {'I', dec_info}, {'A', dec_avail}, {'R', dec_reading}, {'B', dec_begin}, {'C', dec_cycle},
        {'O', dec_obm}, {'W', dec_site}, {'F', dec_frame}, {'P', dec_frame}, {'K', dec_child}, {'X', dec_extension},
        {'E', dec_error}, {'D', dec_done}};
    memset(out, 0, sizeof *out);
    if (!line[0] || (line[1] != ' ' && line[1] != 0)) return -1;
    out->type = line[0];
    const char *rest = line[1] ? line + 2 : line + 1;
    for (size_t i = 0; i < sizeof decoders / sizeof *decoders; i++)
        if (decoders[i].type == line[0]) return decoders[i].dec(rest, out);
    return -1;
}
