# cpython312_decimal_isolated.py - CPython 3.12: `import decimal` in isolated
# sub-interpreters corrupts memory within two cycles (no pyfini involved).
#
#   python3.12 docs/reproducers/cpython312_decimal_isolated.py
#
# 3.12.1 here: "cycle 1 ok", then libmpdec's "mpd_setminalloc: ignoring request
# to set MPD_MINALLOC a second time", then glibc's "munmap_chunk(): invalid
# pointer" or "double free or corruption" (SIGABRT) or a SIGSEGV.
# Why: _decimal is a single-phase module; an isolated interpreter refuses it
# (ImportError, and decimal falls back to _pydecimal) only AFTER its PyInit
# ran inside that interpreter, leaving C globals that point to objects of the
# interpreter's own obmalloc; once it ended, the next PyInit__decimal uses them.
# Upstream: python/cpython gh-117953 "Single-Phase Init Extension Module Init
# Functions Still Run in Isolated Interpreters", fixed for 3.13 by gh-118157
# (the init function runs in the main interpreter first); 3.12 keeps it.
# CPython 3.13.0 runs this loop (with _interpreters) without a crash.
import _xxsubinterpreters as interpreters

for i in range(10):
    interp = interpreters.create()   # 3.12: isolated (own GIL, multi-phase modules only)
    interpreters.run_string(interp, "import decimal")
    interpreters.destroy(interp)
    print("cycle", i + 1, "ok", flush=True)
