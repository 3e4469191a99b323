/* fuzz_code.c - what the worker does with a --code source before any cycle
 * (worker/subject.c: wk_compile_subject, the check wk_precheck_subject
 * makes in the main interpreter), and the way its error comes back to the
 * driver: the E record the worker writes, decoded and taken by the driver.
 *
 * CPython is initialised once (LLVMFuzzerInitialize); each input is a
 * source text (up to its first NUL: a command-line argument has none),
 * compiled - never run - as the worker compiles "<--code>".  A source that
 * does not compile must give a message, and that message must reach the
 * driver whole (cut only to the record's size, line breaks as spaces).
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define FUZZ_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FUZZ_LSAN 1
#endif
#endif
#ifdef FUZZ_LSAN
#include <sanitizer/lsan_interface.h>
#endif

#include "driver.h"
#include "fuzz.h"
#include "worker.h"

/* subject.c's other functions write records and exit; the compile step
 * must reach neither. */
void wk_emit(const lc_line *l) { fuzz_fail("the compile step wrote a record: %.*s", (int)l->n, l->s); }
void wk_fail(enum lc_error_kind kind, int refused, const char *fmt, ...)
{
    (void)kind, (void)refused;
    fuzz_fail("the compile step failed the run (%s)", fmt);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    /* malloc for every Python block: ASan sees each one, and LeakSanitizer
       scans them (obmalloc's arenas are mmap()ed: pointers held there are
       not seen, and what they point to would look lost) */
    PyPreConfig pre;
    PyPreConfig_InitIsolatedConfig(&pre);
    pre.allocator = PYMEM_ALLOCATOR_MALLOC;
    PyStatus st = Py_PreInitialize(&pre);
    if (PyStatus_Exception(st)) fuzz_fail("Py_PreInitialize: %s", st.err_msg ? st.err_msg : "?");
    PyConfig config;
    PyConfig_InitIsolatedConfig(&config);
    config.install_signal_handlers = 0;
    /* What CPython allocates at start-up and holds until it ends (it is
       never finalised here) is not a leak of an input: LeakSanitizer, which
       libFuzzer runs after an input that allocated more than it freed,
       ignores it.  What the inputs allocate stays judged. */
#ifdef FUZZ_LSAN
    __lsan_disable();
#endif
    st = Py_InitializeFromConfig(&config);
#ifdef FUZZ_LSAN
    __lsan_enable();
#endif
    PyConfig_Clear(&config);
    if (PyStatus_Exception(st)) fuzz_fail("Py_InitializeFromConfig: %s", st.err_msg ? st.err_msg : "?");
    return 0;
}

/* The worker's E record for err, as the driver takes it. */
static void error_to_driver(const char *err)
{
    char msg[LC_MESSAGE_MAX];
    snprintf(msg, sizeof msg, "--code does not compile: %s", err);   /* wk_precheck_subject's words */
    lc_line l;
    lc_enc_error(&l, LC_ERR_USAGE, 0, msg);
    if (!l.n || l.s[l.n - 1] != '\n' || memchr(l.s, '\n', l.n - 1)) fuzz_fail("E record not one line: %s", l.s);
    l.s[l.n - 1] = 0;
    static lc_request q;
    static lc_run r;
    memset(&q, 0, sizeof q);
    q.config = &interp_configs[INTERP_LEGACY];
    lc_run_init(&r, &q, 1, 0);
    lc_run_take_record(&r, l.s);
    if (r.outcome != LC_OUT_ERROR || strcmp(r.error_kind, "usage"))
        fuzz_fail("the driver did not take the E record: %s", l.s);
    /* what arrives: the message, line breaks as spaces, cut to the record and to r.error */
    size_t k = strlen(r.error);
    if (k == 0 || strncmp(r.error, "--code does not compile: ", k < 25 ? k : 25))
        fuzz_fail("the driver got '%s' for '%s'", r.error, msg);
    for (size_t i = 0; i < k; i++)
        if (r.error[i] != msg[i] && !((msg[i] == '\n' || msg[i] == '\r') && r.error[i] == ' '))
            fuzz_fail("byte %zu of the message changed on its way: '%s' -> '%s'", i, msg, r.error);
    lc_run_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *src = malloc(size + 1);
    if (!src) return 0;
    memcpy(src, data, size);
    src[size] = 0;
    char err[LC_MESSAGE_MAX];
    err[0] = 0;
    if (wk_compile_subject(src, "<--code>", err, sizeof err) < 0) {
        if (!err[0]) fuzz_fail("a source that does not compile, without a message");
        error_to_driver(err);
    }
    if (PyErr_Occurred()) fuzz_fail("an exception left set");
    free(src);
    return 0;
}
