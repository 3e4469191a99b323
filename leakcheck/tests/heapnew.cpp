// heapnew.cpp - a C++ test extension module for pyfini-leakcheck's C-heap
// meter: every import allocates a 64-byte object with operator new in
// pyfini_test::Registry::remember() and never deletes it (libstdc++'s
// operator new calls malloc: the worker's interposed malloc counts it, and
// --where names the demangled C++ function).  _pyfini_heap_new.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstring>

namespace pyfini_test {

struct Node {
    unsigned char payload[64];
};
static_assert(sizeof(Node) == 64, "a 64-byte object");

struct Registry {
    static Node *volatile last;   // overwritten by the next import: lost
    __attribute__((noinline)) static void remember(int tag);
};
Node *volatile Registry::last;

void Registry::remember(int tag)
{
    Node *n = new Node;
    std::memset(n->payload, tag, sizeof n->payload);
    last = n;
}

}  // namespace pyfini_test

static int heapnew_exec(PyObject *)
{
    try {
        pyfini_test::Registry::remember(0x64);
    } catch (...) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot heapnew_slots[] = {
    {Py_mod_exec, reinterpret_cast<void *>(heapnew_exec)},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, nullptr},
};

static PyModuleDef heapnew_def = {
    PyModuleDef_HEAD_INIT, "_pyfini_heap_new", "pyfini-leakcheck test module: operator new of 64 bytes per import, lost",
    0, nullptr, heapnew_slots, nullptr, nullptr, nullptr,
};

extern "C" PyMODINIT_FUNC PyInit__pyfini_heap_new(void);
extern "C" PyMODINIT_FUNC PyInit__pyfini_heap_new(void)
{
    return PyModuleDef_Init(&heapnew_def);
}
