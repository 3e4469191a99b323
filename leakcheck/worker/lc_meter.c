/* lc_meter.c - see lc_meter.h */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdio.h>
#include <unistd.h>

#include "lc_meter.h"

#if defined(__SANITIZE_ADDRESS__)
/* AddressSanitizer's allocator replaces malloc, and mallinfo2() does not see
 * it; it counts the bytes itself (declared in sanitizer/allocator_interface.h,
 * which gcc does not install everywhere) */
size_t __sanitizer_get_current_allocated_bytes(void);
#define LC_SANITIZER_MALLOC 1
#endif

int64_t lc_meter_rss(void)
{
    static int statm_fd = -1;
    static long page_size;
    if (statm_fd < 0) {
        page_size = sysconf(_SC_PAGESIZE);
        statm_fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
        if (statm_fd < 0) return -1;
    }
    char buf[128];
    ssize_t n = pread(statm_fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return -1;
    buf[n] = 0;
    long size, resident;
    if (sscanf(buf, "%ld %ld", &size, &resident) != 2) return -1;
    return (int64_t)resident * page_size;
}

int64_t lc_meter_malloc(void)
{
#ifdef LC_SANITIZER_MALLOC
    return (int64_t)__sanitizer_get_current_allocated_bytes();
#else
    struct mallinfo2 mi = mallinfo2();
    return (int64_t)(mi.uordblks + mi.hblkhd);
#endif
}

const char *lc_meter_malloc_how(void)
{
#ifdef LC_SANITIZER_MALLOC
    return "sanitizer allocator (requested bytes; mallinfo2 does not work under AddressSanitizer)";
#else
    return "mallinfo2";
#endif
}

int64_t lc_meter_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int64_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n - 1;   /* the directory's own descriptor */
}
