/* tools/repro/own-gil-concurrent-create.c - CPython, not pyfini: creating
 * isolated interpreters (own GIL) on several threads at once fails now and
 * then on CPython 3.12.1 and 3.13.0, with or without a C audit hook.
 *
 * No pyfini here: THREADS threads, released together by a barrier each round,
 * each create an isolated interpreter (Py_NewInterpreterFromConfig, own GIL,
 * own obmalloc), run `import threading, atexit` and a class statement in it,
 * and end it. HOOK=1 in the environment first adds a C audit hook that returns
 * 0 for every event (pyfini adds one on 3.11-3.13.1): it made no difference.
 * Exit 0 after ROUNDS rounds; exit 3 and CPython's message when a creation
 * fails. Seen 2026-12-06 on this 2-core machine (other work running):
 *   3.13.0 "Failed to import encodings module": 2 of 10 runs of 2,400
 *     creations without a hook, 1 of 12 with one;
 *   3.12.1 "failed to get the Python codec of the filesystem encoding" after
 *     "TypeError: descriptor 'close' for '_io.BufferedReader' objects doesn't
 *     apply to a '_io.FileIO' object" (a method looked up for the wrong type):
 *     1 of 8 runs of 1,600 with a hook;
 * and none in 14,400 + 40,000 + 16,000 creations of the same kind on 3.13.0
 * and 30,400 + 9,600 on 3.12.1 before: rare, and more frequent under load.
 *
 * Build and run (any CPython 3.12+ with python3.X-config):
 *   P=python3.13-config
 *   cc -O2 $($P --includes) tools/repro/own-gil-concurrent-create.c \
 *      -o build/own-gil-concurrent-create $($P --ldflags --embed) -pthread \
 *      -Wl,-rpath,$($P --prefix)/lib
 *   build/own-gil-concurrent-create 300        # rounds; 8 threads each
 */
#include <Python.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#if PY_VERSION_HEX < 0x030C0000
#  error "own-GIL interpreters need CPython 3.12 or later"
#endif

#define THREADS 8

static pthread_barrier_t round_start;
static int rounds;

static int quiet_hook(const char *event, PyObject *args, void *data)
{
    (void)event;
    (void)args;
    (void)data;
    return 0;
}

static void *creator(void *unused)
{
    (void)unused;
    for (int r = 0; r < rounds; r++) {
        pthread_barrier_wait(&round_start);
        PyInterpreterConfig config = {
            .use_main_obmalloc = 0,
            .allow_fork = 0,
            .allow_exec = 0,
            .allow_threads = 1,
            .allow_daemon_threads = 0,
            .check_multi_interp_extensions = 1,
            .gil = PyInterpreterConfig_OWN_GIL,
        };
        PyThreadState *ts = NULL;
        PyStatus status = Py_NewInterpreterFromConfig(&ts, &config);
        if (PyStatus_Exception(status)) {
            fprintf(stderr, "round %d: creating an isolated interpreter failed: %s\n", r,
                    status.err_msg ? status.err_msg : "(no message)");
            exit(3);
        }
        if (PyRun_SimpleString("import threading, atexit\nclass Tracked: pass\nobj = Tracked()\n") != 0) {
            fprintf(stderr, "round %d: the code failed in the interpreter\n", r);
            exit(4);
        }
        Py_EndInterpreter(ts);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    rounds = argc > 1 ? atoi(argv[1]) : 100;
    if (rounds < 1) {
        fprintf(stderr, "usage: %s [rounds >= 1]\n", argv[0]);
        return 2;
    }
    const char *h = getenv("HOOK");
    int hooked = h != NULL && h[0] == '1';
    if (hooked && PySys_AddAuditHook(quiet_hook, NULL) != 0) {
        fprintf(stderr, "PySys_AddAuditHook failed\n");
        return 2;
    }
    Py_Initialize();
    PyThreadState *main_ts = PyEval_SaveThread();
    pthread_barrier_init(&round_start, NULL, THREADS);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        if (pthread_create(&th[i], NULL, creator, NULL) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 2;
        }
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
    }
    PyEval_RestoreThread(main_ts);
    if (Py_FinalizeEx() != 0) {
        return 5;
    }
    printf("CPython %s, %s: %d rounds x %d threads, every creation succeeded\n", PY_VERSION,
           hooked ? "with a C audit hook" : "no audit hook", rounds, THREADS);
    return 0;
}
