# pyfini - the two commands of the README, and a few more.
#   make demo         build with the newest CPython found and run the main job, pyfini-leakcheck,
#                     on its built-in default (bare legacy vs isolated interpreters, then json)
#   make demo-phases  the four phases in the main and an isolated sub-interpreter
#   make test         the whole suite on every CPython found (plain and ASan+UBSan builds)
#   make test-matrix  the suite on every host CPython and on the Debian sid CPythons (root; see README)
#   make stress       tools/stress, each part where it can judge (needs root for the sid tree):
#                     on one host CPython (STRESS_HOST) valgrind memcheck on the state, error
#                     and phase tests, the 60-second thread test (tests/test_threads), its
#                     TSan build and pyfini-leakcheck's fuzz targets (15 s each; clang is on
#                     the host only); on one sid CPython (STRESS_SID) valgrind again and the
#                     soak (pyfini-leakcheck on _pyfini_soak, PYFINI_SOAK_CYCLES, legacy and
#                     isolated: bare cycles of 3.12/3.13 lose memory themselves). One table of
#                     every row at the end; fails when any row FAILs. docs/reliability.md
#   make bench        benchmarks (figures, not pass/fail)
#   make deb          the Debian package $(BUILD)/pyfini_<version>_<arch>.deb for this Debian
#                     release (tools/make-deb; needs dpkg-dev and python3-dev)
BUILD ?= build
STRESS_HOST ?= 3.12
STRESS_SID  ?= 3.14
JOBS  ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all demo demo-phases test test-matrix stress bench deb deps clean

all: deps
	cmake -S . -B $(BUILD) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

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

# the heavy checks of issue 16 on one representative CPython per tree (CI time)
stress: deps
	@mkdir -p build; rows=build/stress-rows; rm -f $$rows; t0=$$(date +%s); rc=0; \
	STRESS_ROWS=$$rows PYTHON=$(STRESS_HOST) tools/stress valgrind soak-threads tsan fuzz || rc=1; \
	tools/sid-tree run STRESS_ROWS=$$rows PYTHON=$(STRESS_SID) BUILD_ROOT=build/sid tools/stress valgrind soak || rc=1; \
	echo; echo "make stress: every row (host $(STRESS_HOST), sid $(STRESS_SID)), $$(( $$(date +%s) - t0 )) s in all:"; \
	cat $$rows 2>/dev/null || echo "(no rows: see above)"; \
	nf=$$(grep -c ' FAIL' $$rows 2>/dev/null); echo "make stress: $${nf:-?} rows failed"; exit $$rc

bench: all
	$(BUILD)/bench/bench_state

deb:
	tools/make-deb $(BUILD)

clean:
	rm -rf $(BUILD)
