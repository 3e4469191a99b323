#!/bin/sh
# docs/reproducers/cython31_cdef_class_own_gil.sh [X.Y] - build
# cython31_cdef_class_own_gil.pyx for CPython X.Y (default 3.14, 3.14+ for
# concurrent.interpreters) into build/reproducers/cython-X.Y/ and import it
# in isolated interpreters one after the other.
# Inside the project's sid tree:
#   tools/sid-tree run sh docs/reproducers/cython31_cdef_class_own_gil.sh 3.14
# Measured there (Cython 3.1.6, CPython 3.14.10): the first interpreter
# imports it, the second aborts the process ("double free or corruption
# (out)" or "free(): invalid size", SIGABRT).  The same module without
# "cdef class" (a def function, a module global) runs every cycle.
set -eu
v=${1:-3.14}
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-build/reproducers/cython-$v}
mkdir -p "$out"
m=cython31_cdef_class_own_gil
cython3 -3 "$here/$m.pyx" -o "$out/$m.c"
gcc -shared -fPIC -O1 -DCYTHON_USE_MODULE_STATE=1 $(python$v-config --includes) "$out/$m.c" \
    -o "$out/$m$(python$v-config --extension-suffix)"
cd "$out"
PYTHONPATH=. python$v - <<PY
from concurrent import interpreters
for i in range(4):
    it = interpreters.create()   # isolated: own GIL, own obmalloc, multi-phase modules only
    it.exec("import $m")
    it.close()
    print("cycle", i + 1, "ok", flush=True)
PY
