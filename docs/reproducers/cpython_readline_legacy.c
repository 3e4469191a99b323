/* cpython_readline_legacy.c - CPython's readline module loses one strdup()
 * block (40 bytes with glibc) per legacy sub-interpreter that imports it.
 *
 * readline is a single-phase module: every interpreter that imports it runs
 * PyInit_readline -> setup_readline() (Modules/readline.c), which stores a
 * new strdup() of the word-break characters in the C global
 * completer_word_break_characters without freeing the one before.
 *
 *   cc cpython_readline_legacy.c $(python3.X-config --cflags --ldflags --embed) -o repro && ./repro
 *
 * Prints the heap bytes in use (glibc's mallinfo2) gained over N cycles of
 * Py_NewInterpreter + Py_EndInterpreter, with and without `import readline`. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <malloc.h>
#include <stdio.h>

static size_t in_use(void) { return mallinfo2().uordblks; }

static long cycles(int n, const char *code)
{
    PyThreadState *main_ts = PyThreadState_Get();
    size_t before = 0;
    for (int i = -20; i < n; i++) {   /* 20 warm-up cycles */
        if (i == 0) before = in_use();
        PyThreadState *ts = Py_NewInterpreter();
        if (!ts || PyRun_SimpleString(code) != 0) return -1;
        Py_EndInterpreter(ts);
        PyThreadState_Swap(main_ts);
    }
    return (long)(in_use() - before);
}

int main(void)
{
    Py_Initialize();
    const int n = 2000;
    long bare = cycles(n, "pass");
    long rl = cycles(n, "import readline");
    printf("CPython %s, %d legacy cycles: bare %+ld B, import readline %+ld B: %+.1f B per cycle more\n",
           Py_GetVersion(), n, bare, rl, (double)(rl - bare) / n);
    return Py_FinalizeEx() < 0;
}
