/* tests/memmeter.h - exact live bytes of CPython's three allocator domains
 * (RAW, MEM, OBJ: PyMem_SetAllocator wrappers with a size header, installed
 * before Py_Initialize) plus malloc's bytes in use (mallinfo2) and RSS.
 * Used by the zero-loss test and the benchmarks. Include after Python.h.
 */
#ifndef PYFINI_TEST_MEMMETER_H
#define PYFINI_TEST_MEMMETER_H

#include <malloc.h>
#include <stdio.h>
#include <string.h>

#define MM_HDR 16   /* keeps 16-byte alignment */

static PyMemAllocatorEx mm_orig[3];
static long long mm_live[3];

static void *mm_malloc(void *ctx, size_t n)
{
    int d = (int)(intptr_t)ctx;
    char *p = (char *)mm_orig[d].malloc(mm_orig[d].ctx, n + MM_HDR);
    if (p == NULL) {
        return NULL;
    }
    memcpy(p, &n, sizeof n);
    __atomic_add_fetch(&mm_live[d], (long long)n, __ATOMIC_RELAXED);
    return p + MM_HDR;
}

static void *mm_calloc(void *ctx, size_t nelem, size_t elsize)
{
    int d = (int)(intptr_t)ctx;
    size_t n = nelem * elsize;
    char *p = (char *)mm_orig[d].calloc(mm_orig[d].ctx, 1, n + MM_HDR);
    if (p == NULL) {
        return NULL;
    }
    memcpy(p, &n, sizeof n);
    __atomic_add_fetch(&mm_live[d], (long long)n, __ATOMIC_RELAXED);
    return p + MM_HDR;
}

static void *mm_realloc(void *ctx, void *ptr, size_t n)
{
    int d = (int)(intptr_t)ctx;
    if (ptr == NULL) {
        return mm_malloc(ctx, n);
    }
    char *base = (char *)ptr - MM_HDR;
    size_t old;
    memcpy(&old, base, sizeof old);
    char *p = (char *)mm_orig[d].realloc(mm_orig[d].ctx, base, n + MM_HDR);
    if (p == NULL) {
        return NULL;
    }
    memcpy(p, &n, sizeof n);
    __atomic_add_fetch(&mm_live[d], (long long)n - (long long)old, __ATOMIC_RELAXED);
    return p + MM_HDR;
}

static void mm_free(void *ctx, void *ptr)
{
    int d = (int)(intptr_t)ctx;
    if (ptr == NULL) {
        return;
    }
    char *base = (char *)ptr - MM_HDR;
    size_t n;
    memcpy(&n, base, sizeof n);
    __atomic_sub_fetch(&mm_live[d], (long long)n, __ATOMIC_RELAXED);
    mm_orig[d].free(mm_orig[d].ctx, base);
}

/* Before Py_Initialize(). */
static inline void mm_install(void)
{
    PyMemAllocatorDomain doms[3] = {PYMEM_DOMAIN_RAW, PYMEM_DOMAIN_MEM, PYMEM_DOMAIN_OBJ};
    for (int d = 0; d < 3; d++) {
        PyMem_GetAllocator(doms[d], &mm_orig[d]);
        PyMemAllocatorEx w = {(void *)(intptr_t)d, mm_malloc, mm_calloc, mm_realloc, mm_free};
        PyMem_SetAllocator(doms[d], &w);
    }
}

/* Bytes held through CPython's allocators now. */
static inline long long mm_python_bytes(void)
{
    return __atomic_load_n(&mm_live[0], __ATOMIC_RELAXED) +
           __atomic_load_n(&mm_live[1], __ATOMIC_RELAXED) +
           __atomic_load_n(&mm_live[2], __ATOMIC_RELAXED);
}

static inline long long mm_malloc_bytes(void) { return (long long)mallinfo2().uordblks; }

static inline long long mm_rss_bytes(void)
{
    long long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f != NULL) {
        if (fscanf(f, "%lld %lld", &pages, &rss) != 2) {
            rss = 0;
        }
        fclose(f);
    }
    return rss * 4096;
}

/* Least-squares slope of y over 0..n-1. */
static inline double mm_slope(const long long *y, int n)
{
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) {
        sx += i;
        sy += (double)y[i];
        sxx += (double)i * i;
        sxy += (double)i * (double)y[i];
    }
    double den = n * sxx - sx * sx;
    return den == 0 ? 0 : (n * sxy - sx * sy) / den;
}

#endif /* PYFINI_TEST_MEMMETER_H */
