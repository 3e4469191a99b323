/* report_plot.c - --plot FILE.svg, drawn with cairo's SVG surface.
 *
 * A check: one panel per judged meter.  x: the round (one subject and one
 * bare cycle each, or one cycle without a baseline); y: what the meter grew
 * over the subject's cycles, and over the bare cycles, since the first
 * cycle (each kind's increases summed: the reading is one process's, the
 * two kinds take turns).  Warm-up rounds are shaded.  Over the judged
 * rounds: the least-squares line of each series (dashed, through the
 * centroid of its points, with the slope stats.c found), and around the
 * judged series' line a wedge of slope +- the 99% bound.  A meter judged
 * LEAK has a red badge.
 *
 * A scan: a bar chart of the modules that lost the most bytes per cycle
 * (the figure of the scan table's LEAK cells), one bar per config.
 *
 * The colours are fixed (leakcheck/README.md names them; the tests find
 * the series by them): subject #1f77b4, bare #ff7f0e, LEAK badge #d62728;
 * scan bars: legacy #1f77b4, isolated #ff7f0e.  The series are stroked, the
 * badges, bars and legend swatches filled.
 *
 * Written to FILE.tmpPID and renamed into place (a symbolic link, a device or
 * a FIFO is written in place: lc_output_in_place): a failed write leaves no
 * half file.  Built without cairo (no libcairo2-dev at configure time),
 * --plot is refused with a message that says so.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"

#ifndef LC_HAVE_CAIRO

int lc_plot_available(char *why, size_t n)
{
    snprintf(why, n, "this pyfini-leakcheck was built without cairo (Debian package libcairo2-dev, "
                     "found by pkg-config when pyfini is configured): no --plot");
    return 0;
}

int lc_plot_check(const char *path, const lc_request *q, const lc_run *r, const analysis *a, char *err, size_t errn)
{
    (void)path, (void)q, (void)r, (void)a;
    return lc_plot_available(err, errn), -1;
}

int lc_plot_scan(const char *path, const lc_plot_scan_data *d, char *err, size_t errn)
{
    (void)path, (void)d;
    return lc_plot_available(err, errn), -1;
}

#else
#include <cairo-svg.h>
#include <cairo.h>
#include <fontconfig/fontconfig.h>

int lc_plot_available(char *why, size_t n)
{
    snprintf(why, n, "cairo %s", cairo_version_string());
    return 1;
}

typedef struct rgb {
    double r, g, b;
} rgb;
#define LC_RGB(hex) {((hex) >> 16 & 255) / 255.0, ((hex) >> 8 & 255) / 255.0, ((hex) & 255) / 255.0}
static const rgb C_SUBJECT = LC_RGB(0x1f77b4), C_BARE = LC_RGB(0xff7f0e), C_LEAK = LC_RGB(0xd62728);
static const rgb C_TEXT = LC_RGB(0x222222), C_GREY = LC_RGB(0x777777), C_FRAME = LC_RGB(0xbbbbbb);
static const rgb C_WARM = LC_RGB(0xeeeeee), C_FIT = LC_RGB(0x444444), C_LEAK_TEXT = LC_RGB(0xa00000);
static const rgb C_OK_TEXT = LC_RGB(0x207020), C_WHITE = LC_RGB(0xffffff);

static void color(cairo_t *cr, rgb c) { cairo_set_source_rgb(cr, c.r, c.g, c.b); }

static void fill_rect(cairo_t *cr, double x, double y, double w, double h, rgb c)
{
    color(cr, c);
    cairo_rectangle(cr, x, y, w, h);
    cairo_fill(cr);
}

/* text at (x, y) (baseline); align 0 left, 0.5 centre, 1 right; returns its width */
static double text(cairo_t *cr, double x, double y, double size, int bold, double align, rgb c, const char *s)
{
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                           bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, size);
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    color(cr, c);
    cairo_move_to(cr, x - align * e.x_advance, y);
    cairo_show_text(cr, s);
    return e.x_advance;
}

/* a legend entry: a filled swatch, then its words; returns the x after it */
static double legend(cairo_t *cr, double x, double y, rgb c, double alpha, const char *s)
{
    cairo_set_source_rgba(cr, c.r, c.g, c.b, alpha);
    cairo_rectangle(cr, x, y - 9, 18, 10);
    cairo_fill(cr);
    return x + 24 + text(cr, x + 24, y, 11, 0, 0, C_TEXT, s) + 18;
}

/* A step of 1, 2 or 5 times a power of ten that cuts [lo, hi] into about n. */
static double nice_step(double lo, double hi, int n)
{
    double span = hi - lo;
    if (!(span > 0)) return 1;
    double raw = span / n, p = pow(10, floor(log10(raw))), f = raw / p;
    return p * (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10);
}

/* The surface, written to path.tmpPID; lc_plot_end renames it into place. */
typedef struct plot {
    cairo_surface_t *s;
    cairo_t *cr;
    char tmp[LC_PATH_MAX + 32];
} plot;

static int plot_begin(plot *p, const char *path, double w, double h, char *err, size_t errn)
{
    if (lc_output_in_place(path)) lc_scopy(p->tmp, sizeof p->tmp, path);
    else snprintf(p->tmp, sizeof p->tmp, "%s.tmp%d", path, (int)getpid());
    p->s = cairo_svg_surface_create(p->tmp, w, h);
    p->cr = NULL;
    if (cairo_surface_status(p->s) != CAIRO_STATUS_SUCCESS) {
        int e = errno;
        snprintf(err, errn, "--plot %s: %s (cairo: %s)", path, strerror(e ? e : EIO),
                 cairo_status_to_string(cairo_surface_status(p->s)));
        cairo_surface_destroy(p->s);
        if (strcmp(p->tmp, path) != 0) unlink(p->tmp);
        return -1;
    }
    p->cr = cairo_create(p->s);
    fill_rect(p->cr, 0, 0, w, h, C_WHITE);
    return 0;
}

static int plot_end(plot *p, const char *path, char *err, size_t errn)
{
    cairo_status_t st = cairo_status(p->cr);
    cairo_destroy(p->cr);
    cairo_surface_finish(p->s);
    if (st == CAIRO_STATUS_SUCCESS) st = cairo_surface_status(p->s);
    cairo_surface_destroy(p->s);
    /* cairo's font caches and fontconfig's configuration, loaded for the text,
       are given back: the process ends without blocks a leak checker (ASan's,
       valgrind) would report; both load again if another plot needs them */
    cairo_debug_reset_static_data();
    FcFini();
    int in_place = strcmp(p->tmp, path) == 0;
    if (st == CAIRO_STATUS_SUCCESS && (in_place || rename(p->tmp, path) == 0)) return 0;
    int e = errno;
    if (!in_place) unlink(p->tmp);
    if (st != CAIRO_STATUS_SUCCESS) snprintf(err, errn, "--plot %s: cairo: %s", path, cairo_status_to_string(st));
    else snprintf(err, errn, "--plot %s: %s", path, strerror(e));
    return -1;
}

/* --- a check: one panel per judged meter --------------------------------- */
#define P_COLS 2
#define P_W 520.0            /* a panel's box */
#define P_H 250.0
#define P_LEFT 74.0          /* inside the box: the axes' margins */
#define P_RIGHT 16.0
#define P_TOP 34.0
#define P_BOTTOM 38.0
#define P_HEAD 92.0          /* the figure's header */

/* One meter's two series, as points (round, growth) from (0, 0). */
typedef struct series {
    double *x, *y;
    size_t n;
} series;

typedef struct panel_data {
    series s[2];             /* [0] subject cycles, [1] bare cycles */
    long rounds, warmup;
    double lo, hi;           /* y range of the points and lines */
} panel_data;

static void gather_series(const lc_run *r, int v, panel_data *d)
{
    for (int k = 0; k < 2; k++) {
        d->s[k].x = calloc(r->ncyc + 1, sizeof(double));
        d->s[k].y = calloc(r->ncyc + 1, sizeof(double));
        d->s[k].n = 0;
    }
    double cum[2] = {0, 0};
    d->rounds = r->sched.warmup + r->sched.cycles;
    d->warmup = r->sched.warmup;
    d->lo = d->hi = 0;
    if (!d->s[0].x || !d->s[0].y || !d->s[1].x || !d->s[1].y) return;
    for (size_t i = 0; i < r->ncyc; i++) {
        const lc_cycle *c = &r->cyc[i];
        int64_t prev = i ? r->cyc[i - 1].v[v] : r->initial[v];
        if (c->v[v] < 0 || prev < 0) continue;
        int k = c->id.kind == 'S' ? 0 : 1;
        series *s = &d->s[k];
        if (!s->n) s->x[0] = 0, s->y[0] = 0, s->n = 1;
        cum[k] += (double)(c->v[v] - prev);
        s->x[s->n] = (double)c->id.round + 1;
        s->y[s->n++] = cum[k];
        if (cum[k] < d->lo) d->lo = cum[k];
        if (cum[k] > d->hi) d->hi = cum[k];
    }
}

static void free_series(panel_data *d)
{
    for (int k = 0; k < 2; k++) free(d->s[k].x), free(d->s[k].y);
}

/* The centroid of a series' judged points (x > warm-up). */
static int centroid(const series *s, long warmup, double *cx, double *cy)
{
    double sx = 0, sy = 0;
    long n = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->x[i] > (double)warmup) sx += s->x[i], sy += s->y[i], n++;
    if (!n) return 0;
    *cx = sx / (double)n, *cy = sy / (double)n;
    return 1;
}

typedef struct frame {
    double x0, y0, w, h;     /* the plot area */
    double xmax, lo, hi;
} frame;

static double fx(const frame *f, double x) { return f->x0 + f->w * x / f->xmax; }
static double fy(const frame *f, double y) { return f->y0 + f->h - f->h * (y - f->lo) / (f->hi - f->lo); }

static void axes(cairo_t *cr, const frame *f, const lc_meter_def *m)
{
    cairo_set_line_width(cr, 0.6);
    double step = nice_step(f->lo, f->hi, 4);
    for (double t = ceil(f->lo / step) * step; t <= f->hi + step * 1e-9; t += step) {
        double y = fy(f, t);
        color(cr, C_FRAME);
        cairo_move_to(cr, f->x0, y);
        cairo_line_to(cr, f->x0 + f->w, y);
        cairo_stroke(cr);
        char b[32];
        lc_fmt_value(b, sizeof b, m, fabs(t) < step * 1e-9 ? 0 : t, 0);
        text(cr, f->x0 - 5, y + 3.5, 9.5, 0, 1, C_GREY, b);
    }
    double xs = nice_step(0, f->xmax, 6);
    if (xs < 1) xs = 1;
    for (double t = 0; t <= f->xmax + 1e-9; t += xs) {
        char b[32];
        snprintf(b, sizeof b, "%.0f", t);
        text(cr, fx(f, t), f->y0 + f->h + 13, 9.5, 0, 0.5, C_GREY, b);
    }
    text(cr, f->x0 + f->w, f->y0 + f->h + 27, 9.5, 0, 1, C_GREY, "round");
    color(cr, C_FRAME);
    cairo_rectangle(cr, f->x0, f->y0, f->w, f->h);
    cairo_stroke(cr);
}

static void stroke_series(cairo_t *cr, const frame *f, const series *s, rgb c, double width)
{
    if (s->n < 2) return;
    cairo_set_line_width(cr, width);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    color(cr, c);
    cairo_move_to(cr, fx(f, s->x[0]), fy(f, s->y[0]));
    for (size_t i = 1; i < s->n; i++) cairo_line_to(cr, fx(f, s->x[i]), fy(f, s->y[i]));
    cairo_stroke(cr);
}

/* The judged rounds' line of slope through (cx, cy), dashed; with a finite
 * bound, the wedge of slope +- bound about it, in the series' colour. */
static void fit_line(cairo_t *cr, const frame *f, double warmup, double cx, double cy, double slope, double bound,
                     rgb c)
{
    double x0 = warmup, x1 = f->xmax;
    if (isfinite(bound) && bound > 0) {
        cairo_set_source_rgba(cr, c.r, c.g, c.b, 0.18);
        cairo_move_to(cr, fx(f, x0), fy(f, cy + (slope + bound) * (x0 - cx)));
        cairo_line_to(cr, fx(f, x1), fy(f, cy + (slope + bound) * (x1 - cx)));
        cairo_line_to(cr, fx(f, x1), fy(f, cy + (slope - bound) * (x1 - cx)));
        cairo_line_to(cr, fx(f, x0), fy(f, cy + (slope - bound) * (x0 - cx)));
        cairo_close_path(cr);
        cairo_fill(cr);
    }
    static const double dash[] = {5, 3};
    cairo_set_dash(cr, dash, 2, 0);
    cairo_set_line_width(cr, 1.1);
    color(cr, C_FIT);
    cairo_move_to(cr, fx(f, x0), fy(f, cy + slope * (x0 - cx)));
    cairo_line_to(cr, fx(f, x1), fy(f, cy + slope * (x1 - cx)));
    cairo_stroke(cr);
    cairo_set_dash(cr, NULL, 0, 0);
}

/* The y range widened to the fitted lines' ends, clipped to twice the
 * points' span (a wide bound must not flatten the series). */
static void widen(panel_data *d, double warmup, double cx, double cy, double slope)
{
    double span = d->hi - d->lo;
    for (int e = 0; e < 2; e++) {
        double x = e ? (double)d->rounds : warmup, y = cy + slope * (x - cx);
        if (span > 0 && (y < d->lo - span || y > d->hi + span)) continue;
        if (y < d->lo) d->lo = y;
        if (y > d->hi) d->hi = y;
    }
}

static void panel_title(cairo_t *cr, double x, double y, double w, const meter_result *m, int paired)
{
    double tw = text(cr, x, y, 12.5, 1, 0, C_TEXT, m->def->name);
    char s[32], b[32], line[160];
    lc_fmt_value(s, sizeof s, m->def, m->judged->slope, 1);
    lc_fmt_value(b, sizeof b, m->def, m->judged->bound, 0);
    snprintf(line, sizeof line, "%s %s/cycle \xc2\xb1 %s", paired ? "excess" : "judged", s, b);
    text(cr, x + tw + 10, y, 10.5, 0, 0, C_TEXT, line);
    int leak = m->verdict == LC_LEAK;
    const char *v = lc_verdict_name(m->verdict);
    if (leak) {   /* the LEAK badge */
        fill_rect(cr, x + w - 52, y - 12, 52, 17, C_LEAK);
        text(cr, x + w - 26, y + 1, 11, 1, 0.5, C_WHITE, "LEAK");
    } else {
        text(cr, x + w, y, 10.5, 1, 1, m->verdict == LC_NO_LEAK ? C_OK_TEXT : C_GREY, v);
    }
}

static void draw_panel(cairo_t *cr, double bx, double by, const lc_run *r, const meter_result *m, int paired)
{
    panel_data d;
    gather_series(r, m->def->value, &d);
    const lc_judgement *fits[2] = {m->have_subject ? &m->subject : NULL, m->have_bare ? &m->bare : NULL};
    double cx[2], cy[2];
    int have[2];
    for (int k = 0; k < 2; k++) {
        have[k] = fits[k] && centroid(&d.s[k], d.warmup, &cx[k], &cy[k]);
        if (have[k]) widen(&d, (double)d.warmup, cx[k], cy[k], fits[k]->slope);
    }
    if (!(d.hi > d.lo)) d.hi = d.lo + 5 * m->def->resolution;   /* a flat meter: whole units on the axis */
    double pad = (d.hi - d.lo) * 0.06;
    frame f = {bx + P_LEFT, by + P_TOP, P_W - P_LEFT - P_RIGHT, P_H - P_TOP - P_BOTTOM,
               d.rounds > 0 ? (double)d.rounds : 1, d.lo - pad, d.hi + pad};
    if (d.warmup > 0) fill_rect(cr, f.x0, f.y0, fx(&f, (double)d.warmup) - f.x0, f.h, C_WARM);
    if (d.warmup > 0) text(cr, f.x0 + 3, f.y0 + 11, 8.5, 0, 0, C_GREY, "warm-up");
    axes(cr, &f, m->def);
    panel_title(cr, bx + 8, by + 20, P_W - 16 - P_RIGHT, m, paired);
    cairo_save(cr);
    cairo_rectangle(cr, f.x0, f.y0, f.w, f.h);
    cairo_clip(cr);
    /* the wedge of the judged bound about the judged kind's line: the subject's
       when paired (subject slope - bare slope = the excess slope) */
    int jk = paired ? 0 : (m->judged == &m->bare ? 1 : 0);
    for (int k = 0; k < 2; k++)
        if (have[k]) fit_line(cr, &f, (double)d.warmup, cx[k], cy[k], fits[k]->slope, k == jk ? m->judged->bound : 0,
                              k ? C_BARE : C_SUBJECT);
    /* the bare series wider, beneath: seen where the two coincide */
    stroke_series(cr, &f, &d.s[1], C_BARE, 3.2);
    stroke_series(cr, &f, &d.s[0], C_SUBJECT, 1.4);
    cairo_restore(cr);
    free_series(&d);
}

static void check_header(cairo_t *cr, double w, const lc_request *q, const lc_run *r, const analysis *a, int paired)
{
    char *subj = NULL, line[1024];
    size_t n = 0;
    FILE *m = open_memstream(&subj, &n);
    if (m) lc_print_subject(m, q), fclose(m);
    snprintf(line, sizeof line, "pyfini-leakcheck %s", subj ? subj : "");
    free(subj);
    text(cr, 16, 24, 15, 1, 0, C_TEXT, line);
    const char *verdict = lc_run_verdict(r, a);
    int leak = !strcmp(verdict, "LEAK");
    snprintf(line, sizeof line, "verdict: %s", verdict);
    text(cr, w - 16, 24, 15, 1, 1, leak ? C_LEAK_TEXT : C_TEXT, line);
    snprintf(line, sizeof line, "CPython %s%s, %s interpreters, %ld warm-up + %ld judged rounds%s", r->version,
             r->abiflags, q->config->name, q->warmup, r->sched.cycles,
             paired ? " of 1 subject + 1 bare cycle; judged: the subject's excess" : "");
    text(cr, 16, 44, 11, 0, 0, C_GREY, line);
    text(cr, 16, 60, 11, 0, 0, C_GREY,
         "y: what the meter grew over the subject's cycles and over the bare cycles since the first cycle");
    double x = 16;
    if (lc_has_subject(q)) x = legend(cr, x, 80, C_SUBJECT, 1, "subject cycles");
    if (paired || !lc_has_subject(q)) x = legend(cr, x, 80, C_BARE, 1, "bare cycles");
    x = legend(cr, x, 80, C_FIT, 1, "least-squares line (dashed)");
    x = legend(cr, x, 80, C_SUBJECT, 0.18, "slope \xc2\xb1 99% bound");
    legend(cr, x, 80, C_WARM, 1, "warm-up (not judged)");
}

int lc_plot_check(const char *path, const lc_request *q, const lc_run *r, const analysis *a, char *err, size_t errn)
{
    const meter_result *shown[LC_NMETERS];
    size_t n = 0;
    for (size_t i = 0; i < LC_NMETERS; i++)
        if (a->m[i].available && a->m[i].judged) shown[n++] = &a->m[i];
    int paired = a->n_subject && a->n_bare;
    size_t rows = (n + P_COLS - 1) / P_COLS;
    double w = P_COLS * P_W + 16, h = P_HEAD + (rows ? (double)rows * P_H : 40) + 10;
    plot p;
    if (plot_begin(&p, path, w, h, err, errn) < 0) return -1;
    check_header(p.cr, w, q, r, a, paired);
    if (!n)
        text(p.cr, 16, P_HEAD + 24, 13, 0, 0, C_TEXT, "no meter judged any cycle: nothing to draw");
    for (size_t i = 0; i < n; i++)
        draw_panel(p.cr, 8 + (double)(i % P_COLS) * P_W, P_HEAD + (double)(i / P_COLS) * P_H, r, shown[i], paired);
    return plot_end(&p, path, err, errn);
}

/* --- a scan: the worst modules' bytes per cycle --------------------------- */
#define S_LEFT 250.0
#define S_BAR 13.0
#define S_GAP 12.0
#define S_HEAD 78.0

int lc_plot_scan(const char *path, const lc_plot_scan_data *d, char *err, size_t errn)
{
    static const rgb bar_color[LC_PLOT_CONFIGS] = {LC_RGB(0x1f77b4), LC_RGB(0xff7f0e)};
    size_t n = d->nbars;
    double group = d->nconfigs * S_BAR + S_GAP, w = 900, h = S_HEAD + (n ? (double)n * group + 44 : 40) + 10;
    plot p;
    if (plot_begin(&p, path, w, h, err, errn) < 0) return -1;
    cairo_t *cr = p.cr;
    text(cr, 16, 24, 15, 1, 0, C_TEXT, d->title);
    text(cr, 16, 44, 11, 0, 0, C_GREY, d->subtitle);
    double x = 16;
    for (int k = 0; k < d->nconfigs; k++) x = legend(cr, x, 64, bar_color[k], 1, d->configs[k]);
    if (!n) {
        text(cr, 16, S_HEAD + 24, 13, 0, 0, C_TEXT, "no module lost bytes per cycle (no LEAK cell in the table)");
        return plot_end(&p, path, err, errn);
    }
    double max = 0;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < d->nconfigs; k++)
            if (d->bars[i].loss[k] > max) max = d->bars[i].loss[k];
    double step = nice_step(0, max, 5), top = ceil(max / step) * step, aw = w - S_LEFT - 110;
    double y0 = S_HEAD, y1 = S_HEAD + (double)n * group;
    cairo_set_line_width(cr, 0.6);
    for (double t = 0; t <= top + step * 1e-9; t += step) {
        double xx = S_LEFT + aw * t / top;
        color(cr, C_FRAME);
        cairo_move_to(cr, xx, y0);
        cairo_line_to(cr, xx, y1);
        cairo_stroke(cr);
        char b[32];
        lc_fmt_bytes(b, sizeof b, t, 0);
        text(cr, xx, y1 + 14, 9.5, 0, 0.5, C_GREY, b);
    }
    text(cr, S_LEFT + aw, y1 + 30, 10, 0, 1, C_GREY, "bytes lost per cycle");
    for (size_t i = 0; i < n; i++) {
        const lc_plot_bar *b = &d->bars[i];
        double gy = y0 + (double)i * group + S_GAP / 2;
        text(cr, S_LEFT - 8, gy + d->nconfigs * S_BAR / 2 + 4, 11, 0, 1, C_TEXT, b->module);
        for (int k = 0; k < d->nconfigs; k++) {
            double by = gy + k * S_BAR, bw = aw * b->loss[k] / top;
            if (b->loss[k] > 0) fill_rect(cr, S_LEFT, by + 1, bw, S_BAR - 2, bar_color[k]);
            text(cr, S_LEFT + (bw > 0 ? bw : 0) + 5, by + S_BAR - 3, 9.5, 0, 0, b->loss[k] > 0 ? C_TEXT : C_GREY,
                 b->status[k]);
        }
    }
    return plot_end(&p, path, err, errn);
}
#endif
