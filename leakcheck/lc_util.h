/* lc_util.h - small helpers shared by the driver and the worker. */
#ifndef LC_UTIL_H
#define LC_UTIL_H

#include <string.h>

/* Copy the C string src into dst[n], cut to fit, always terminated. */
static inline void lc_scopy(char *dst, size_t n, const char *src)
{
    size_t l = strlen(src);
    if (l >= n) l = n - 1;
    memcpy(dst, src, l);
    dst[l] = 0;
}

#endif
