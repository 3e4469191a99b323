# pyfini - the two commands of the README, and a few more.
#   make demo         build with the newest CPython found and run the main job, pyfini-leakcheck,
#                     on its built-in default (bare legacy vs isolated interpreters, then json)
#   make demo-phases  the four phases in the main and an isolated sub-interpreter
#   make test         the whole suite on every CPython found (plain and ASan+UBSan builds)
#   make test-matrix  the suite on every host CPython and on the Debian sid CPythons (root; see README)
#   make stress       tools/stress-all: tools/stress on one CPython per minor version, the newest release build
#                     of each (STRESS_PER_MINOR; needs root for the sid tree): on the host's
#                     (STRESS_HOST_ALL) valgrind memcheck on the state, error and phase tests
#                     (on the minors of STRESS_VALGRIND),
#                     the thread test (tests/test_threads: 20 s each, for CI time), its TSan
#                     build (on STRESS_HOST only of the host's: CI time), and
#                     on STRESS_HOST pyfini-leakcheck's fuzz targets too (15 s each; clang is
#                     on the host only); on the sid tree's (STRESS_SID_ALL) valgrind, the
#                     thread test, its TSan build and the soak (pyfini-leakcheck on _pyfini_soak, legacy and
#                     isolated: STRESS_SOAK_CYCLES (1,000) on STRESS_SID, 1,000 on the others; bare cycles
#                     of 3.12/3.13 lose memory themselves). The debug builds are not run (the
#                     release build of their minor stands for them). Two lanes at once (CI
#                     time: valgrind leaves a core idle while its longest test ends): on the
#                     host the first of STRESS_HOST_ALL beside the others, in the sid tree the
#                     first of STRESS_SID_ALL beside the others; each lane's log is printed
#                     after. One table of every row at the end; fails when any row FAILs.
#                     docs/reliability.md
#   make bench        benchmarks (figures, not pass/fail)
#   make deb          the Debian package $(BUILD)/pyfini_<version>_<arch>.deb for this Debian
#                     release (tools/make-deb; needs dpkg-dev and python3-dev)
BUILD ?= build
STRESS_HOST ?= 3.12
STRESS_HOST_ALL ?= 3.11 3.12 3.13
STRESS_SID  ?= 3.14
STRESS_SID_ALL  ?= 3.14 3.15
# valgrind on two minors (CI time: about 200 s of CPU each): 3.11 (with origins) and 3.14;
# ASan+UBSan rows (CI) cover 3.11 and 3.14
STRESS_VALGRIND ?= 3.11 3.14
# the soak on STRESS_SID: 1,000 cycles like the others (CI time: 3,000 cost
# about 100 s more; tools/stress's own default, 10,000, was the issue's
# figure: PASS, docs/reliability.md "Soak")
STRESS_SOAK_CYCLES ?= 1000
JOBS  ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all demo demo-phases test test-matrix stress bench deb deps clean

# configured once: later builds re-run CMake by themselves when a CMakeLists.txt
# or cmake/ file changed (so a second `make demo` does not configure again)
all: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) >/dev/null

deps:
	@tools/install-deps

# exit 1 means "a LEAK was judged" (CPython 3.12/3.13 lose memory per bare cycle): the demo worked
demo: all
	@$(BUILD)/pyfini-leakcheck --demo; rc=$$?; [ $$rc -le 1 ] || exit $$rc

demo-phases: all
	$(BUILD)/examples/phases_demo

test: deps
	tools/run-tests

test-matrix: deps
	tools/test-matrix

# the heavy checks of issue 16 on one CPython per minor version (CI time):
# tools/stress-all, with the variables above
stress: deps
	@STRESS_HOST='$(STRESS_HOST)' STRESS_HOST_ALL='$(STRESS_HOST_ALL)' STRESS_SID='$(STRESS_SID)' \
	  STRESS_SID_ALL='$(STRESS_SID_ALL)' STRESS_VALGRIND='$(STRESS_VALGRIND)' \
	  STRESS_SOAK_CYCLES='$(STRESS_SOAK_CYCLES)' tools/stress-all

bench: all
	$(BUILD)/bench/bench_state

deb:
	tools/make-deb $(BUILD)

clean:
	rm -rf $(BUILD)
