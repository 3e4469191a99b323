/* verdictmod.c - subjects for the run's verdict rule (leakcheck/README.md,
 * "The verdict", the table; test leakcheck.verdict_rule).  Built once per
 * kind, VM_KIND =
 *   1 _pyfini_vm_lists20   20 empty lists per import, never freed (about
 *                          1.1 kB of objects: py and blocks grow steadily)
 *   2 _pyfini_vm_sizes     one object per import of another size each time
 *                          (bytes of 40 to 3,000 B, some served by malloc),
 *                          never freed: py grows unevenly, blocks by one
 *   3 _pyfini_vm_zero      PyMem_Malloc(0) per import, never freed: no
 *                          byte, one block (a count meter alone)
 *   4 _pyfini_vm_fd        one file descriptor per import, never closed
 *   5 _pyfini_vm_churn     clean: allocates and frees a lot per import
 *                          (10,000 objects of many sizes, a 1 MB malloc)
 *   6 _pyfini_vm_toggle    a malloc'ed table that grows by 2,000 bytes when
 *                          the module is imported and shrinks back when the
 *                          next interpreter is created (an audit hook on
 *                          cpython.PyInterpreterState_New): it grows in
 *                          subject cycles and shrinks in bare ones, as a
 *                          table CPython shares between interpreters can -
 *                          no block, no leak, but a positive "excess"
 *   7 _pyfini_vm_swap      keeps one PyMem_Malloc buffer of another size at
 *                          each import, freeing the previous one: py.mem
 *                          (and py) move either way, the other py rows and
 *                          heap.plain stay 0
 * Multi-phase initialisation; legacy interpreters are what the tests use.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#ifndef VM_KIND
#error define VM_KIND (1-7)
#endif

#if VM_KIND == 1
#define VM_NAME "_pyfini_vm_lists20"
#define VM_INIT PyInit__pyfini_vm_lists20
#elif VM_KIND == 2
#define VM_NAME "_pyfini_vm_sizes"
#define VM_INIT PyInit__pyfini_vm_sizes
#elif VM_KIND == 3
#define VM_NAME "_pyfini_vm_zero"
#define VM_INIT PyInit__pyfini_vm_zero
#elif VM_KIND == 4
#define VM_NAME "_pyfini_vm_fd"
#define VM_INIT PyInit__pyfini_vm_fd
#elif VM_KIND == 5
#define VM_NAME "_pyfini_vm_churn"
#define VM_INIT PyInit__pyfini_vm_churn
#elif VM_KIND == 6
#define VM_NAME "_pyfini_vm_toggle"
#define VM_INIT PyInit__pyfini_vm_toggle
#else
#define VM_NAME "_pyfini_vm_swap"
#define VM_INIT PyInit__pyfini_vm_swap
#endif

static unsigned long imports;   /* imports in this process */

#if VM_KIND == 6
static char *table;
static size_t table_size = 1000;
static int grown;

static int resize(size_t n)
{
    char *t = realloc(table, n);
    if (!t) return -1;
    memset(t, 0x66, n);
    table = t;
    table_size = n;
    return 0;
}

/* every interpreter's creation, in the creating thread (a C audit hook is
   the process's, not one interpreter's) */
static int on_audit(const char *event, PyObject *args, void *data)
{
    (void)args, (void)data;
    if (grown && !strcmp(event, "cpython.PyInterpreterState_New") && resize(1000) == 0) grown = 0;
    return 0;
}
#endif

static int vm_exec(PyObject *m)
{
    (void)m;
    imports++;
#if VM_KIND == 1
    for (int i = 0; i < 20; i++)
        if (!PyList_New(0)) return -1;   /* the reference is dropped on the floor */
#elif VM_KIND == 2
    static unsigned long x = 2463534242ul;   /* xorshift64 */
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    Py_ssize_t n = 40 + (Py_ssize_t)(x % 2961);
    if (!PyBytes_FromStringAndSize(NULL, n)) return -1;   /* never freed */
#elif VM_KIND == 3
    if (!PyMem_Malloc(0)) return PyErr_NoMemory(), -1;
#elif VM_KIND == 4
    if (open("/dev/null", O_RDONLY | O_CLOEXEC) < 0) return PyErr_SetFromErrno(PyExc_OSError), -1;
#elif VM_KIND == 5
    PyObject *keep = PyList_New(0);
    if (!keep) return -1;
    for (int i = 0; i < 10000; i++) {
        PyObject *o = i % 3 == 0 ? PyBytes_FromStringAndSize(NULL, (i * 37) % 1500)
                    : i % 3 == 1 ? Py_BuildValue("(iis)", i, -i, "churn")
                                 : PyDict_New();
        if (!o || PyList_Append(keep, o) < 0) {
            Py_XDECREF(o);
            Py_DECREF(keep);
            return -1;
        }
        Py_DECREF(o);
    }
    Py_DECREF(keep);
    char *big = malloc(1 << 20);
    if (!big) return PyErr_NoMemory(), -1;
    memset(big, 1, 1 << 20);
    free(big);
#elif VM_KIND == 6
    static int hooked;
    if (!hooked) {
        if (PySys_AddAuditHook(on_audit, NULL) < 0) return -1;
        hooked = 1;
    }
    if (!grown) {
        if (resize(3000) < 0) return PyErr_NoMemory(), -1;
        grown = 1;
    }
#else
    static void *kept;
    static unsigned long x = 88172645463325252ul;   /* xorshift64: sizes without a trend */
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    void *p = PyMem_Malloc(64 + x % 4000);
    if (!p) return PyErr_NoMemory(), -1;
    PyMem_Free(kept);
    kept = p;
#endif
    return 0;
}

static PyModuleDef_Slot vm_slots[] = {
    {Py_mod_exec, (void *)vm_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef vm_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = VM_NAME,
    .m_doc = "pyfini-leakcheck test module for the verdict rule (tests/verdictmod.c)",
    .m_size = 0,
    .m_slots = vm_slots,
};

PyMODINIT_FUNC VM_INIT(void);
PyMODINIT_FUNC VM_INIT(void)
{
    return PyModuleDef_Init(&vm_def);
}
