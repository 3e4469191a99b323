/* heapmod.c - test extension modules for pyfini-leakcheck's C-heap meter
 * (heap, heap.plain): plain malloc & co, never Python's allocators.  Built
 * once per LC_HEAP_KIND, each module's exec slot doing on every import:
 *   1 _pyfini_heap_malloc200  malloc(200), lost (in heapmod_exec)
 *   2 _pyfini_heap_realloc    realloc grows one global buffer by 100 bytes
 *   3 _pyfini_heap_cache5     a cache: malloc(1000) kept for the first 5
 *                             imports of the process, nothing after
 *   4 _pyfini_heap_mallocfree malloc(200) and free in the same import
 *   5 _pyfini_heap_nextcycle  malloc(200) kept until the next import frees it
 *   6 _pyfini_heap_doublefree frees one malloc(200) block twice (corruption:
 *                             glibc aborts, the run is a crash)
 *   7 _pyfini_heap_badfree    frees a pointer malloc never returned (16 bytes
 *                             into a zeroed block: corruption)
 *   8 _pyfini_heap_overrun    writes past the end of one block over the
 *                             header of the block right after it, then frees
 *                             that one (corruption)
 * Multi-phase initialisation, declared safe for a per-interpreter GIL.
 * Cycles run one after another: the globals see no concurrent access.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#ifndef LC_HEAP_KIND
#error define LC_HEAP_KIND to 1..8
#endif

#if LC_HEAP_KIND == 1
#define LC_NAME _pyfini_heap_malloc200
#elif LC_HEAP_KIND == 2
#define LC_NAME _pyfini_heap_realloc
#elif LC_HEAP_KIND == 3
#define LC_NAME _pyfini_heap_cache5
#elif LC_HEAP_KIND == 4
#define LC_NAME _pyfini_heap_mallocfree
#elif LC_HEAP_KIND == 5
#define LC_NAME _pyfini_heap_nextcycle
#elif LC_HEAP_KIND == 6
#define LC_NAME _pyfini_heap_doublefree
#elif LC_HEAP_KIND == 7
#define LC_NAME _pyfini_heap_badfree
#else
#define LC_NAME _pyfini_heap_overrun
#endif
#define LC_STR2(x) #x
#define LC_STR(x) LC_STR2(x)
#define LC_CAT2(a, b) a##b
#define LC_CAT(a, b) LC_CAT2(a, b)

/* where the leaked pointer goes, so that the compiler keeps the calls */
void *volatile heapmod_sink;

/* not static and not inlined: --where must find this name */
__attribute__((noinline)) int heapmod_exec(PyObject *m);

int heapmod_exec(PyObject *m)
{
    (void)m;
    char *p = NULL, *q;
    static char *buffer, *previous, *cache[5];
    static size_t buffer_size;
    static int imports;
    switch (LC_HEAP_KIND) {
    case 1:
        p = malloc(200);
        if (p) memset(p, 0x20, 200);
        heapmod_sink = p;   /* overwritten by the next import: lost */
        break;
    case 2:
        q = realloc(buffer, buffer_size + 100);
        if (!q) break;
        buffer = p = q;
        memset(buffer + buffer_size, 0x10, 100);
        buffer_size += 100;
        break;
    case 3:
        if (imports < 5) {
            p = cache[imports] = malloc(1000);
            if (p) memset(p, 0x30, 1000);
        } else {
            p = cache[0];
        }
        break;
    case 4:
        p = malloc(200);
        if (p) memset(p, 0x40, 200);
        heapmod_sink = p;
        free(p);
        break;
    case 5:
        free(previous);
        p = previous = malloc(200);
        if (p) memset(p, 0x50, 200);
        break;
    case 6:
        p = malloc(200);
        heapmod_sink = p;
        free(p);
        free(heapmod_sink);
        break;
    case 7:
        p = calloc(1, 200);
        heapmod_sink = p ? p + 16 : NULL;
        free(heapmod_sink);
        break;
    default:
        /* two blocks next to each other (glibc: b's 8-byte size field right
           after a's usable bytes); blocks that are not are kept (leaked) */
        for (int i = 0; i < 64; i++) {
            char *a = malloc(1000), *b = malloc(1000);
            if (!a || !b) break;
            if (b == a + malloc_usable_size(a) + 8) {
                memset(a, 0xff, malloc_usable_size(a) + 8);   /* 8 bytes too many: b's size */
                heapmod_sink = b;
                free(heapmod_sink);
                break;
            }
        }
        break;
    }
    imports++;
    if (!p && LC_HEAP_KIND < 6) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot heapmod_slots[] = {
    {Py_mod_exec, (void *)heapmod_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef heapmod_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = LC_STR(LC_NAME),
    .m_doc = "pyfini-leakcheck test module for the C-heap meter (leakcheck/tests/heapmod.c)",
    .m_size = 0,
    .m_slots = heapmod_slots,
};

PyMODINIT_FUNC LC_CAT(PyInit_, LC_NAME)(void);
PyMODINIT_FUNC LC_CAT(PyInit_, LC_NAME)(void)
{
    return PyModuleDef_Init(&heapmod_def);
}
