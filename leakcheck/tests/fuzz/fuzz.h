/* fuzz.h - what the fuzz targets of pyfini-leakcheck share (fuzz_*.c).
 *
 * Each target is one libFuzzer entry point, LLVMFuzzerTestOneInput, built
 * two ways: with clang's -fsanitize=fuzzer,address,undefined by tools/stress
 * (part fuzz: new inputs for a bounded time), and with the build's compiler
 * against replay.c (ctest leakcheck.fuzz_replay.*: every file of the corpus,
 * corpus/<target>/, once, on every CPython row and under ASan in ASan rows).
 * A target aborts (fuzz_fail) when the code it drives breaks a promise;
 * ASan and UBSan catch the rest.
 */
#ifndef LC_FUZZ_H
#define LC_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A broken promise: the message on stderr, then abort() (a crash to libFuzzer). */
#define fuzz_fail(...)                                                                   \
    do {                                                                                 \
        fprintf(stderr, "fuzz target %s:%d: ", __FILE__, __LINE__);                      \
        fprintf(stderr, __VA_ARGS__);                                                    \
        fputc('\n', stderr);                                                             \
        abort();                                                                         \
    } while (0)

/* stdout to /dev/null: the reports and --help the targets print are not read. */
static inline void fuzz_quiet_stdout(void)
{
    if (!freopen("/dev/null", "w", stdout)) fuzz_fail("cannot reopen stdout on /dev/null");
}

#endif
