/* meters.c - one reading of every meter of the worker process. */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "lc_alloc.h"
#include "lc_heap.h"
#include "lc_meter.h"
#include "worker.h"

static PyObject *gettotalrefcount;   /* sys.gettotalrefcount on debug builds */

void wk_meters_open(void) { (void)lc_meter_rss(); }

static int64_t total_refcount(void)
{
    if (!gettotalrefcount) return -1;
    PyObject *r = PyObject_CallNoArgs(gettotalrefcount);
    if (!r) {
        PyErr_Clear();
        return -1;
    }
    int64_t v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return v;
}

void wk_reading(const wk_request *q, int64_t v[LC_NVALUES])
{
    int64_t bytes[LC_NDOMAINS], blocks[LC_NDOMAINS];
    v[LC_V_FDS] = lc_meter_fds();
    v[LC_V_REFS] = total_refcount();
    v[LC_V_RSS] = lc_meter_rss();
    v[LC_V_MALLOC] = lc_meter_malloc();
    lc_heap_totals heap;
    lc_heap_read(&heap);
    lc_alloc_totals(bytes, blocks);
    v[LC_V_HEAP] = heap.bytes;
    v[LC_V_HEAP_PLAIN] = heap.plain_bytes;
    v[LC_V_HEAP_BLOCKS] = heap.blocks;
    if (!lc_heap_available()) v[LC_V_HEAP] = v[LC_V_HEAP_PLAIN] = v[LC_V_HEAP_BLOCKS] = -1;
    v[LC_V_PY_RAW] = bytes[LC_DOMAIN_RAW];
    v[LC_V_PY_MEM] = bytes[LC_DOMAIN_MEM];
    v[LC_V_PY_OBJ] = bytes[LC_DOMAIN_OBJ];
    v[LC_V_PY_OBMALLOC] = bytes[LC_DOMAIN_OBMALLOC];
    v[LC_V_PY] = v[LC_V_BLOCKS] = 0;
    for (int d = 0; d < LC_NDOMAINS; d++) v[LC_V_PY] += bytes[d], v[LC_V_BLOCKS] += blocks[d];
    if (q->no_wrapper)
        v[LC_V_PY] = v[LC_V_PY_RAW] = v[LC_V_PY_MEM] = v[LC_V_PY_OBJ] = v[LC_V_PY_OBMALLOC] = v[LC_V_BLOCKS] = -1;
}

static void avail(const char *meter, int available, const char *how)
{
    lc_line l;
    lc_enc_avail(&l, meter, available, how);
    wk_emit(&l);
}

void wk_meters_report(const wk_request *q)
{
    static const char no_wrapper[] = "--no-allocator-wrapper: Python's allocators are not wrapped";
    avail("rss", 1, "/proc/self/statm");
    avail("malloc", 1, lc_meter_malloc_how());
    avail("heap", lc_heap_available(),
          lc_heap_available() ? "malloc & co interposed by the worker, malloc_usable_size bytes"
                              : "AddressSanitizer replaces malloc: the worker does not interpose it");
    avail("py", !q->no_wrapper, q->no_wrapper ? no_wrapper : "PyMem_SetAllocator wrapper");
    avail("blocks", !q->no_wrapper, q->no_wrapper ? no_wrapper : "PyMem_SetAllocator wrapper");
    PyObject *g = PySys_GetObject("gettotalrefcount");
    if (g) {
        Py_INCREF(g);
        gettotalrefcount = g;
        avail("refs", 1, "sys.gettotalrefcount");
    } else {
        avail("refs", 0, "not a debug build (Py_REF_DEBUG): sys.gettotalrefcount() does not exist");
    }
    avail("fds", lc_meter_fds() >= 0, "/proc/self/fd");
}
