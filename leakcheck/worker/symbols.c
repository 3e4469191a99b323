/* symbols.c - symbolise return addresses of this process with elfutils' libdw.
 * Used by the worker at the end of a --where run, when no Python allocation
 * is being recorded. */
#define _GNU_SOURCE
#include <elfutils/libdwfl.h>
#include <inttypes.h>
#include <stdio.h>
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
    if (name) snprintf(out->function, sizeof out->function, "%s", name);
    else snprintf(out->function, sizeof out->function, "%s+0x%" PRIx64,
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
