/* symbols.c - symbolise return addresses of this process with elfutils' libdw.
 * Used by the worker at the end of a --where run, when no Python allocation
 * is being recorded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elfutils/libdwfl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "symbols.h"

static Dwfl *lc_dwfl;

static const Dwfl_Callbacks lc_dwfl_callbacks = {
    .find_elf = dwfl_linux_proc_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
};

int lc_symbols_open(void)
{
    lc_dwfl = dwfl_begin(&lc_dwfl_callbacks);
    if (!lc_dwfl) return -1;
    if (dwfl_linux_proc_report(lc_dwfl, getpid()) != 0 || dwfl_report_end(lc_dwfl, NULL, NULL) != 0) {
        dwfl_end(lc_dwfl);
        lc_dwfl = NULL;
        return -1;
    }
    return 0;
}

void lc_symbols_close(void)
{
    if (lc_dwfl) dwfl_end(lc_dwfl);
    lc_dwfl = NULL;
}

const char *lc_symbols_error(void)
{
    return dwfl_errmsg(-1);
}

/* C++ names demangled by libstdc++'s __cxa_demangle (looked up at run time:
 * loaded whenever a C++ extension module is; else libstdc++.so.6 is opened,
 * and without it names stay mangled).  The whole name is demangled before it
 * is cut to lc_frame's size: a mangled name cut short does not demangle
 * (templates of pybind11's internals run to 600 characters and more). */
typedef char *(*lc_demangle_fn)(const char *, char *, size_t *, int *);

static char *demangled(const char *name)
{
    static lc_demangle_fn fn;
    static int tried;
    if (strncmp(name, "_Z", 2) != 0) return NULL;
    if (!tried) {
        tried = 1;
        *(void **)&fn = dlsym(RTLD_DEFAULT, "__cxa_demangle");
        if (!fn) {
            void *h = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL);
            if (h) *(void **)&fn = dlsym(h, "__cxa_demangle");
        }
    }
    if (!fn) return NULL;
    int status = -1;
    char *d = fn(name, NULL, NULL, &status);
    if (d && status == 0) return d;
    free(d);
    return NULL;
}

/* name into out->function; a name too long ends in "..." */
static void set_function(lc_frame *out, const char *name)
{
    size_t n = sizeof out->function, len = strlen(name);
    if (len < n) {
        memcpy(out->function, name, len + 1);
        return;
    }
    memcpy(out->function, name, n - 4);
    memcpy(out->function + n - 4, "...", 4);
}

int lc_symbolise(void *ip, lc_frame *out)
{
    memset(out, 0, sizeof *out);
    /* a return address: look up the call instruction before it */
    Dwarf_Addr addr = (Dwarf_Addr)(uintptr_t)ip - 1;
    snprintf(out->function, sizeof out->function, "0x%" PRIx64, (uint64_t)addr);
    if (!lc_dwfl) return -1;
    Dwfl_Module *mod = dwfl_addrmodule(lc_dwfl, addr);
    if (!mod) return -1;
    const char *name = dwfl_module_addrname(mod, addr);
    const char *modname = NULL;
    Dwarf_Addr start = 0;
    modname = dwfl_module_info(mod, NULL, &start, NULL, NULL, NULL, NULL, NULL);
    if (modname) {
        const char *slash = strrchr(modname, '/');
        snprintf(out->object, sizeof out->object, "%s", slash ? slash + 1 : modname);
    }
    if (name) {
        char *d = demangled(name);
        set_function(out, d ? d : name);
        free(d);
    } else snprintf(out->function, sizeof out->function, "%s+0x%" PRIx64,
                  out->object[0] ? out->object : "?", (uint64_t)(addr - start));
    Dwfl_Line *line = dwfl_module_getsrc(mod, addr);
    if (line) {
        int lineno = 0;
        const char *file = dwfl_lineinfo(line, NULL, &lineno, NULL, NULL, NULL);
        if (file) {
            snprintf(out->file, sizeof out->file, "%s", file);
            out->line = lineno;
        }
    }
    return 0;
}
