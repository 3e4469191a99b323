/* whose.h - whose is a --where site's loss (whose.c). */
#ifndef LC_WK_WHOSE_H
#define LC_WK_WHOSE_H

enum wk_whose { WK_WHOSE_SUBJECT, WK_WHOSE_CPYTHON, WK_WHOSE_UNATTRIBUTED, WK_NWHOSE };

/* CPython's directories from sys (the main interpreter's thread state
 * attached), told in I records "whose_dir"; 0 when unknown (then every site
 * is the subject's or unattributed). */
int wk_whose_open(void);
/* The site of the call stack frames[0..nframes-1] (return addresses,
 * innermost first; max_frames: the unwinder's limit; object: blocks of
 * PYMEM_DOMAIN_OBJ, Python objects), whose innermost
 * Python frame is in pyfile (NULL: no Python line; no_python_frame: a sample
 * block was allocated while no Python frame ran): an enum wk_whose. */
int wk_whose_site(int object, void *const *frames, int nframes, int max_frames, const char *pyfile,
                  int no_python_frame);
const char *wk_whose_name(int w);   /* "subject", "cpython", "unattributed" */

#endif
