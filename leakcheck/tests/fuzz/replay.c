/* replay.c - a fuzz target's corpus, replayed once: every file of each
 * directory (or each file) given, in name order, through
 * LLVMFuzzerTestOneInput (fuzz.h).  Built with the build's compiler and
 * flags (ASan in ASan builds), so the normal suite checks every kept input
 * on every CPython.  Prints the count; a target that finds a broken promise
 * aborts.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    for (size_t k; buf && (k = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += k;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "replay: %s: out of memory\n", path);
        return -1;
    }
    /* a copy of exactly n bytes: ASan sees a read past the input */
    uint8_t *in = malloc(n ? n : 1);
    if (in) memcpy(in, buf, n);
    free(buf);
    if (!in) return -1;
    LLVMFuzzerTestOneInput(in, n);
    free(in);
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

int main(int argc, char **argv)
{
    LLVMFuzzerInitialize(&argc, &argv);
    long files = 0;
    int failed = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) == 0 && !S_ISDIR(st.st_mode)) {
            failed |= replay_file(argv[i]) < 0, files++;
            continue;
        }
        struct dirent **names;
        int n = scandir(argv[i], &names, NULL, by_name);
        if (n < 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        for (int k = 0; k < n; k++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], names[k]->d_name);
            if (names[k]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode))
                failed |= replay_file(path) < 0, files++;
            free(names[k]);
        }
        free(names);
    }
    fprintf(stderr, "replay: %ld inputs, %s\n", files, failed ? "some unreadable" : "none failed");
    if (files == 0) fprintf(stderr, "replay: no input: an empty corpus proves nothing\n");
    return failed || files == 0;
}
