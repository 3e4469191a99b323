#!/bin/sh
# docs/reproducers/build.sh [X.Y] - build the three reproducers against the
# pybind11 found by the compiler (3.1: Debian's pybind11-dev) and CPython X.Y
# (default 3.14), into build/reproducers/; ASAN=1 adds AddressSanitizer.
# Inside the project's sid tree: tools/sid-tree run sh docs/reproducers/build.sh 3.14
set -eu
v=${1:-3.14}
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-build/reproducers/$v}
mkdir -p "$out"
san=""
[ "${ASAN:-0}" = 1 ] && san="-fsanitize=address -fno-omit-frame-pointer"
for r in metaclass_refcount tss_exhaustion second_thread; do
  g++ -std=c++17 -O1 -g $san $(python$v-config --includes) "$here/$r.cpp" -o "$out/$r" \
      $(python$v-config --ldflags --embed) -pthread
  echo "built $out/$r"
done
