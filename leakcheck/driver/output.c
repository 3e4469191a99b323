/* output.c - what the subject says on the worker's stderr, kept in bounded
 * memory: pyfini's leak reports parsed into findings (a finding fails the
 * run as a LEAK does), every other line summarised (distinct lines with
 * their counts and the first cycle that wrote them, LC_OUTPUT_DISTINCT_MAX
 * of them; beyond, distinct lines are only counted).  The worker writes a
 * cycle marker (LC_STDERR_MARK, shared/lc_protocol.h) on its stderr at the
 * start of every cycle, so every line belongs to the cycle that wrote it. */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

#define LC_HASH_SLOTS (2 * LC_OUTPUT_HASHES_MAX)

static const char *line_kind(const char *s)
{
    if (!strncmp(s, "Fatal Python error", 18)) return "fatal error";
    if (!strncmp(s, "Exception ignored", 17)) return "exception ignored";
    if (!strncmp(s, "Traceback (most recent call last)", 33) || !strncmp(s, "  File \"", 8)) return "traceback";
    if (strstr(s, "Warning: ")) return "warning";
    return "other";
}

/* Addresses differ between cycles: "0x7f12ab34cd56" -> "0x..." so that the
 * same line of every cycle counts as one. */
static void normalise(char *out, size_t n, const char *s)
{
    size_t k = 0;
    while (*s && k + 1 < n) {
        if (s[0] == '0' && s[1] == 'x' && isxdigit((unsigned char)s[2])) {
            const char *e = s + 2;
            while (isxdigit((unsigned char)*e)) e++;
            if (k + 6 >= n) break;
            memcpy(out + k, "0x...", 5);
            k += 5;
            s = e;
            continue;
        }
        out[k++] = *s++;
    }
    out[k] = 0;
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = lc_fnv(LC_FNV_OFFSET, s, strlen(s));
    return h ? h : 1;   /* 0 marks a free slot */
}

/* A distinct line beyond distinct[]: counted once (or "at least"). */
static void count_more(lc_output *o, const char *text)
{
    if (o->more_saturated) return;
    if (!o->hashes && !(o->hashes = calloc(LC_HASH_SLOTS, sizeof *o->hashes))) {
        o->more_saturated = 1;
        return;
    }
    uint64_t h = fnv1a(text);
    for (size_t i = h % LC_HASH_SLOTS;; i = (i + 1) % LC_HASH_SLOTS) {
        if (o->hashes[i] == h) return;
        if (o->hashes[i]) continue;
        o->hashes[i] = h;
        o->more_distinct++;
        if (++o->nhashes >= LC_OUTPUT_HASHES_MAX) o->more_saturated = 1;
        return;
    }
}

static void summarise(lc_output *o, const char *line)
{
    char text[LC_OUTPUT_LINE_MAX];
    normalise(text, sizeof text, line);
    const char *kind = line_kind(text);
    if (!strcmp(kind, "fatal error")) o->fatal_errors++;
    for (size_t i = 0; i < o->ndistinct; i++)
        if (!strcmp(o->distinct[i].text, text)) {
            o->distinct[i].count++;
            return;
        }
    if (o->ndistinct == LC_OUTPUT_DISTINCT_MAX) {
        count_more(o, text);
        return;
    }
    lc_output_line *d = &o->distinct[o->ndistinct++];
    lc_scopy(d->text, sizeof d->text, text);
    d->kind = kind;
    d->count = 1;
    d->first_cycle = o->cycle;
}

/* "pyfini:  - type mylib.Node at 0x55.., reference count 3" -> "type mylib.Node";
 * "pyfini:  - mylib.Node object at 0x7f.., ..." -> "mylib.Node object" */
static void take_type_line(lc_output *o, const char *rest)
{
    if (!o->in_report) return;
    lc_leak_report *L = &o->leaks[o->in_report - 1];
    char name[sizeof L->types[0]];
    const char *at = strstr(rest, " at 0x");
    size_t len = at ? (size_t)(at - rest) : strlen(rest);
    if (len >= sizeof name) len = sizeof name - 1;
    memcpy(name, rest, len);
    name[len] = 0;
    if (!strncmp(name, "... and ", 8)) return;
    for (int i = 0; i < L->ntypes; i++)
        if (!strcmp(L->types[i], name)) return;
    if (L->ntypes < LC_LEAK_TYPES_MAX) lc_scopy(L->types[L->ntypes++], sizeof L->types[0], name);
}

/* pyfini's leak report (include/pyfini.h, pyfini__state_report): returns 1
 * if line is one of its lines. */
static int take_pyfini(lc_output *o, const char *line)
{
    static const char head[] = "pyfini: leak in interpreter ";
    if (!strncmp(line, head, sizeof head - 1)) {
        long long interp;
        long objects;
        char state[sizeof o->leaks[0].state];
        if (sscanf(line + sizeof head - 1, "%lld, state \"%255[^\"]\": %ld tracked object", &interp, state, &objects)
            != 3)
            return 0;
        o->leak_reports++;
        o->in_report = 0;
        for (size_t i = 0; i < o->nleaks; i++)
            if (!strcmp(o->leaks[i].state, state) && o->leaks[i].objects == objects) {
                o->leaks[i].count++;
                o->in_report = (int)i + 1;
                return 1;
            }
        if (o->nleaks == LC_LEAK_REPORTS_MAX) {
            o->leak_reports_dropped++;
            return 1;
        }
        lc_leak_report *L = &o->leaks[o->nleaks++];
        memset(L, 0, sizeof *L);
        lc_scopy(L->state, sizeof L->state, state);
        L->interpreter = interp;
        L->objects = objects;
        L->first_cycle = o->cycle;
        L->count = 1;
        o->in_report = (int)o->nleaks;
        return 1;
    }
    if (!strncmp(line, "pyfini:  - ", 11)) {
        take_type_line(o, line + 11);
        return 1;
    }
    if (!strncmp(line, "pyfini: state \"", 15) && strstr(line, "\" is not freed")) {
        o->in_report = 0;
        return 1;
    }
    return 0;
}

/* One whole line (without its newline); each() gets the lines that are not
 * cycle markers (for the output tail). */
static void take_line(lc_output *o, const char *line, void (*each)(void *, const char *), void *arg)
{
    size_t ml = strlen(LC_STDERR_MARK), bl = strlen(LC_STDERR_BROKEN);
    if (!strncmp(line, LC_STDERR_BROKEN, bl)) {
        o->broken = atoi(line + bl);
        return;
    }
    if (!strncmp(line, LC_STDERR_MARK, ml)) {
        o->cycle = strtol(line + ml, NULL, 10);
        o->in_report = 0;
        return;
    }
    if (!*line) return;   /* empty lines (the markers' leading newline among them) are not kept */
    if (each) each(arg, line);
    o->lines++;
    if (!take_pyfini(o, line)) summarise(o, line);
}

/* The line in partial[] is whole. */
static void end_line(lc_output *o, void (*each)(void *, const char *), void *arg)
{
    o->partial[o->npartial] = 0;
    if (o->partial_cut) o->lines_cut++;
    take_line(o, o->partial, each, arg);
    o->npartial = 0;
    o->partial_cut = 0;
}

void lc_output_feed(lc_output *o, const char *buf, size_t n, void (*each)(void *, const char *), void *arg)
{
    for (size_t i = 0; i < n; i++) {
        if (buf[i] != '\n') {
            if (o->npartial + 1 < sizeof o->partial) o->partial[o->npartial++] = buf[i];
            else o->partial_cut = 1;   /* the rest of a line longer than LC_OUTPUT_LINE_MAX is dropped */
            continue;
        }
        end_line(o, each, arg);
    }
}

void lc_output_end(lc_output *o, void (*each)(void *, const char *), void *arg)
{
    if (o->npartial) end_line(o, each, arg);
}

void lc_output_free(lc_output *o)
{
    free(o->hashes);
    o->hashes = NULL;
}
