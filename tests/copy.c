/* tests/copy.c - a shared object that vendors its own copy of pyfini.h, as
 * an extension module would. Built twice (COPY = a, b) and loaded with
 * dlopen(RTLD_LOCAL) by test_copies: three copies of pyfini in one process.
 */
#include <Python.h>
#include "pyfini.h"

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define NAME(x) CAT(CAT(copy_, COPY), CAT(_, x))
#define STRINGIFY2(x) #x
#define STRINGIFY(x) STRINGIFY2(x)

static void (*recorder)(const char *, const char *);
static int seen_phase[8];

static int copy_cb(void *arg)
{
    recorder(STRINGIFY(COPY), (const char *)arg);
    return 0;
}

/* records the phase this copy's query sees */
static int copy_phase_cb(void *arg)
{
    int *slot = (int *)arg;
    *slot = pyfini_current_phase();
    return 0;
}



void NAME(set_recorder)(void (*rec)(const char *, const char *));
void NAME(set_recorder)(void (*rec)(const char *, const char *)) { recorder = rec; }

int NAME(register)(const char *tag, int phase);
int NAME(register)(const char *tag, int phase)
{
    return pyfini_atexit(copy_cb, (void *)tag, (pyfini_phase)phase);
}

int NAME(cancel)(pyfini_callback cb, const char *tag, int phase);
int NAME(cancel)(pyfini_callback cb, const char *tag, int phase)
{
    return pyfini_atexit_cancel(cb ? cb : copy_cb, (void *)tag, (pyfini_phase)phase);
}

pyfini_callback NAME(callback)(void);
pyfini_callback NAME(callback)(void) { return copy_cb; }

int NAME(watch_phase)(int phase);
int NAME(watch_phase)(int phase)
{
    return pyfini_atexit(copy_phase_cb, &seen_phase[phase], (pyfini_phase)phase);
}

int NAME(seen_phase)(int phase);
int NAME(seen_phase)(int phase) { return seen_phase[phase]; }

/* the state "pyfini.test.shared" (64 bytes) as this copy sees it */
static int copy_state_inits;
static int copy_state_init(void *p)
{
    (void)p;
    copy_state_inits++;
    return 0;
}
static const pyfini_state_def copy_state_def = {"pyfini.test.shared", 64, copy_state_init, NULL};

void *NAME(state)(void);
void *NAME(state)(void) { return pyfini_state(&copy_state_def); }

int NAME(state_inits)(void);
int NAME(state_inits)(void) { return copy_state_inits; }
