/* symbols.h - symbolise return addresses of this process (elfutils libdw). */
#ifndef LC_SYMBOLS_H
#define LC_SYMBOLS_H

typedef struct lc_frame {
    char function[256];   /* symbol name (C++: demangled; cut to "...": ends so), or object+offset, or the address */
    char object[128];     /* file name of the ELF object */
    char file[512];       /* source file, "" if no line information */
    int line;
} lc_frame;

int lc_symbols_open(void);               /* 0 ok, -1 (see lc_symbols_error) */
void lc_symbols_close(void);
const char *lc_symbols_error(void);
int lc_symbolise(void *ip, lc_frame *out);

#endif
