/* report_junit.c - --junit FILE: the verdicts as a JUnit XML report, the
 * form CI systems (Jenkins, GitLab, GitHub's test-report actions) list as
 * test results.  One <testcase> per config and subject (--scan: per module
 * and config; --demo: per line of its table):
 *   passed    no leak
 *   <failure> LEAK (a bytes meter, or pyfini's report on the subject's stderr)
 *   <error>   the subject crashed, hung, failed, a child of it failed, or the
 *             run was interrupted
 *   <skipped> not judged (never a pass), or not run
 * the text report as the <failure>/<error> text, else as <system-out>.
 * Written with libxml2's xmlwriter (escaping, encoding); text that is not
 * UTF-8 or holds characters XML 1.0 forbids (a subject's control bytes)
 * has them as '?'. */
#define _GNU_SOURCE
#include <errno.h>
#include <libxml/chvalid.h>
#include <libxml/xmlwriter.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "driver.h"

int lc_output_in_place(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 && !S_ISREG(st.st_mode);
}

typedef struct junit_case {
    char *classname, *name, *type, *message, *text;
    double seconds;
    enum lc_case_result result;
} junit_case;

static junit_case *cases;
static size_t ncases, capcases;
static int lost;                      /* a case could not be kept (out of memory) */
static char py_version[96], py_executable[1024];

static char *dup_or_null(const char *s)
{
    if (!s) return NULL;
    char *d = strdup(s);
    if (!d) lost = 1;
    return d;
}

void lc_junit_add(const char *classname, const char *name, double seconds, enum lc_case_result result,
                  const char *type, const char *message, const char *text)
{
    if (ncases == capcases) {
        size_t c = capcases ? 2 * capcases : 16;
        junit_case *n = realloc(cases, c * sizeof *n);
        if (!n) {
            lost = 1;
            return;
        }
        cases = n;
        capcases = c;
    }
    junit_case *k = &cases[ncases++];
    k->classname = dup_or_null(classname);
    k->name = dup_or_null(name);
    k->type = dup_or_null(type);
    k->message = dup_or_null(message);
    k->text = dup_or_null(text);
    k->seconds = seconds;
    k->result = result;
}

void lc_junit_python(const lc_run *r)
{
    if (py_version[0] || !r->version[0]) return;
    snprintf(py_version, sizeof py_version, "%s%s", r->version, r->abiflags);
    lc_scopy(py_executable, sizeof py_executable, r->executable);
}

/* The report's line "verdict: ..." without its head, or NULL. */
static char *verdict_line(const char *text)
{
    const char *v = strstr(text, "\nverdict: ");
    if (!v) return NULL;
    v += strlen("\nverdict: ");
    return strndup(v, strcspn(v, "\n"));
}

void lc_junit_check(const lc_request *q, const lc_run *r, const analysis *a, int exit_status, double seconds)
{
    lc_junit_python(r);
    char classname[128], *name = NULL, *text = NULL;
    size_t nlen = 0, tlen = 0;
    snprintf(classname, sizeof classname, "pyfini-leakcheck.%s", q->config->name);
    FILE *f = open_memstream(&name, &nlen);
    if (f) lc_print_subject(f, q), fclose(f);
    if (r->outcome == LC_OUT_ERROR || r->outcome == LC_OUT_SPAWN) {
        lc_junit_add(classname, name, seconds, LC_CASE_ERROR, "error", r->error, r->error);
        free(name);
        return;
    }
    f = open_memstream(&text, &tlen);
    if (f) lc_print_report(f, q, r, a, exit_status), fclose(f);
    char *line = text ? verdict_line(text) : NULL;
    const char *verdict = lc_run_verdict(r, a);
    const char *message = line ? line : verdict;
    switch (exit_status) {
    case LC_EXIT_NO_LEAK: lc_junit_add(classname, name, seconds, LC_CASE_PASS, NULL, NULL, text); break;
    case LC_EXIT_LEAK: lc_junit_add(classname, name, seconds, LC_CASE_FAILURE, verdict, message, text); break;
    case LC_EXIT_NOT_JUDGED: lc_junit_add(classname, name, seconds, LC_CASE_SKIPPED, verdict, message, text); break;
    default: lc_junit_add(classname, name, seconds, LC_CASE_ERROR, verdict, message, text); break;
    }
    free(line);
    free(name);
    free(text);
}

/* s as XML 1.0 character data: what is not UTF-8 or not an XML Char -> '?' */
static char *xml_text(const char *s)
{
    size_t n = strlen(s);
    char *out = malloc(n + 1), *o = out;
    if (!out) return NULL;
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    while (p < end) {
        int len = (int)(end - p);
        int c = xmlGetUTF8Char(p, &len);
        if (c < 0 || len <= 0 || !xmlIsCharQ(c)) {
            *o++ = '?';
            p++;
            continue;
        }
        memcpy(o, p, (size_t)len);
        o += len;
        p += len;
    }
    *o = 0;
    return out;
}

/* The writer's calls return < 0 on failure: one bad one fails the report. */
typedef struct xw {
    xmlTextWriterPtr w;
    int failed;
} xw;

static void ck(xw *x, int rc)
{
    if (rc < 0) x->failed = 1;
}

static void attr(xw *x, const char *name, const char *value)
{
    char *v = xml_text(value ? value : "");
    if (!v) {
        x->failed = 1;
        return;
    }
    ck(x, xmlTextWriterWriteAttribute(x->w, BAD_CAST name, BAD_CAST v));
    free(v);
}

static void attr_num(xw *x, const char *name, const char *fmt, double v)
{
    char b[64];
    snprintf(b, sizeof b, fmt, v);
    attr(x, name, b);
}

static void text(xw *x, const char *s)
{
    char *v = xml_text(s);
    if (!v) {
        x->failed = 1;
        return;
    }
    ck(x, xmlTextWriterWriteString(x->w, BAD_CAST v));
    free(v);
}

static void property(xw *x, const char *name, const char *value)
{
    ck(x, xmlTextWriterStartElement(x->w, BAD_CAST "property"));
    attr(x, "name", name);
    attr(x, "value", value);
    ck(x, xmlTextWriterEndElement(x->w));
}

static void write_case(xw *x, const junit_case *k)
{
    static const char *const elem[] = {NULL, "failure", "error", "skipped"};
    ck(x, xmlTextWriterStartElement(x->w, BAD_CAST "testcase"));
    attr(x, "classname", k->classname);
    attr(x, "name", k->name);
    attr_num(x, "time", "%.3f", k->seconds);
    if (k->result != LC_CASE_PASS) {
        ck(x, xmlTextWriterStartElement(x->w, BAD_CAST elem[k->result]));
        attr(x, "message", k->message);
        if (k->result != LC_CASE_SKIPPED) {
            attr(x, "type", k->type);
            if (k->text) text(x, k->text);
        }
        ck(x, xmlTextWriterEndElement(x->w));
    }
    if (k->text && (k->result == LC_CASE_PASS || k->result == LC_CASE_SKIPPED)) {
        ck(x, xmlTextWriterStartElement(x->w, BAD_CAST "system-out"));
        text(x, k->text);
        ck(x, xmlTextWriterEndElement(x->w));
    }
    ck(x, xmlTextWriterEndElement(x->w));
}

/* The counts of a <testsuites>/<testsuite> element. */
static void counts(xw *x, double total_s)
{
    size_t n[4] = {0};
    for (size_t i = 0; i < ncases; i++) n[cases[i].result]++;
    attr(x, "name", "pyfini-leakcheck");
    attr_num(x, "tests", "%.0f", (double)ncases);
    attr_num(x, "failures", "%.0f", (double)n[LC_CASE_FAILURE]);
    attr_num(x, "errors", "%.0f", (double)n[LC_CASE_ERROR]);
    attr_num(x, "skipped", "%.0f", (double)n[LC_CASE_SKIPPED]);
    attr_num(x, "time", "%.3f", total_s);
}

static void write_document(xw *x, const char *mode)
{
    double total = 0;
    for (size_t i = 0; i < ncases; i++) total += cases[i].seconds;
    char stamp[32] = "", host[256] = "";
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm)) strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
    if (gethostname(host, sizeof host - 1) != 0) host[0] = 0;
    ck(x, xmlTextWriterSetIndent(x->w, 1));
    ck(x, xmlTextWriterSetIndentString(x->w, BAD_CAST "  "));
    ck(x, xmlTextWriterStartDocument(x->w, NULL, "UTF-8", NULL));
    ck(x, xmlTextWriterStartElement(x->w, BAD_CAST "testsuites"));
    counts(x, total);
    ck(x, xmlTextWriterStartElement(x->w, BAD_CAST "testsuite"));
    counts(x, total);
    attr(x, "timestamp", stamp);
    attr(x, "hostname", host);
    ck(x, xmlTextWriterStartElement(x->w, BAD_CAST "properties"));
    property(x, "tool_version", LC_VERSION);
    property(x, "mode", mode);
    property(x, "python", py_version);
    property(x, "python_executable", py_executable);
    ck(x, xmlTextWriterEndElement(x->w));
    for (size_t i = 0; i < ncases; i++) write_case(x, &cases[i]);
    ck(x, xmlTextWriterEndDocument(x->w));   /* closes the open elements */
}

int lc_junit_write(const char *path, const char *mode, char *err, size_t errn)
{
    if (lost) {
        snprintf(err, errn, "--junit %s: out of memory gathering the test cases", path);
        return -1;
    }
    xmlBufferPtr buf = xmlBufferCreate();
    xw x = {buf ? xmlNewTextWriterMemory(buf, 0) : NULL, 0};
    if (!x.w) {
        if (buf) xmlBufferFree(buf);
        snprintf(err, errn, "--junit %s: libxml2 could not make a writer", path);
        return -1;
    }
    write_document(&x, mode);
    xmlFreeTextWriter(x.w);   /* flushes into buf */
    if (x.failed) {
        xmlBufferFree(buf);
        snprintf(err, errn, "--junit %s: libxml2's writer failed", path);
        return -1;
    }
    char tmp[LC_PATH_MAX + 32];
    int in_place = lc_output_in_place(path);
    if (in_place) lc_scopy(tmp, sizeof tmp, path);
    else snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    int ok = f && fwrite(xmlBufferContent(buf), 1, (size_t)xmlBufferLength(buf), f) == (size_t)xmlBufferLength(buf);
    int saved = errno;
    if (f && fclose(f) != 0 && ok) ok = 0, saved = errno;
    xmlBufferFree(buf);
    if (ok && !in_place && rename(tmp, path) != 0) ok = 0, saved = errno;
    if (!ok) {
        if (f && !in_place) unlink(tmp);
        snprintf(err, errn, "--junit %s: %s", path, strerror(saved));
        return -1;
    }
    return 0;
}
