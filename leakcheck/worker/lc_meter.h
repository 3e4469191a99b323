/* lc_meter.h - the process meters beside the allocator wrapper (lc_alloc.h):
 * what the system and the C library see.  No CPython.  Used by the worker
 * and by pyfini's tests.  Each returns -1 when it cannot read. */
#ifndef LC_METER_H
#define LC_METER_H

#include <stdint.h>

int64_t lc_meter_rss(void);      /* resident set size, bytes (/proc/self/statm) */
int64_t lc_meter_malloc(void);   /* bytes in use in malloc: mallinfo2 uordblks + hblkhd, or ASan's count */
const char *lc_meter_malloc_how(void);   /* how lc_meter_malloc() reads */
int64_t lc_meter_fds(void);      /* open file descriptors (/proc/self/fd) */

#endif
