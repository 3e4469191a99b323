/* lc_util.h - small helpers shared by the driver and the worker. */
#ifndef LC_UTIL_H
#define LC_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Copy the C string src into dst[n], cut to fit, always terminated. */
static inline void lc_scopy(char *dst, size_t n, const char *src)
{
    size_t l = strlen(src);
    if (l >= n) l = n - 1;
    memcpy(dst, src, l);
    dst[l] = 0;
}

/* "s" unless n is 1: "%ld cycle%s", n, lc_plural(n) */
static inline const char *lc_plural(long long n) { return n == 1 ? "" : "s"; }

/* FNV-1a, 64 bits: h = lc_fnv(LC_FNV_OFFSET, p, n), then chain more bytes. */
#define LC_FNV_OFFSET 1469598103934665603ull
#define LC_FNV_PRIME 1099511628211ull
static inline uint64_t lc_fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * LC_FNV_PRIME;
    return h;
}

#endif
