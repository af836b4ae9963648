# torchneuron: `make demo` and `make test` work from a fresh clone.
#
# The virtualenv (.venv) is created when missing; the package is (re)installed editable with its
# test extras only when pyproject.toml changes (sentinel: .venv/.installed). torch==2.13.0 is
# installed first and explicitly, so pip never resolves a different (CUDA) torch build.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?= -q -p no:cacheprovider
# pytest-xdist worker processes for the test targets; TEST_WORKERS=0 runs the tests in the
# pytest process itself. Three on CI's 2 cores: a worker often waits (on child processes, 2-rank
# launches, a process-group timeout), and the third keeps the cores busy meanwhile (idle 2-core
# machine: 480 s of pytest with 3 workers against 631 s with 2; docs/DEVELOPMENT.md).
TEST_WORKERS ?= 3
# loadfile: each test file runs in one worker, so a module-scoped fixture (a 2-rank launch in
# tests/distributed, one child process) runs once and compiled ops are reused within a file.
# (loadgroup would be finer, but xdist 3.8 does not group tests under pytest 9.)
PYTEST := $(BIN)/python -m pytest $(PYTEST_ARGS) -n $(TEST_WORKERS) --dist loadfile

.PHONY: all demo test test-slow test-all zoo lint bench bench-write bench-compile clean distclean

all: test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install -e '.[test]'
	touch $@

demo: $(STAMP)
	$(BIN)/python examples/demo.py

# The test targets (docs/DEVELOPMENT.md): `make test` is lint and every test not marked
# `slow`; `make test-slow` runs the slow ones, `make test-all` both. pytest's exit status passes
# through unchanged (5 = no tests collected fails the target too).
define run_pytest
	@status=0; $(PYTEST) $(1) || status=$$?; \
	if [ $$status -eq 5 ]; then echo "make $@: FAILED: pytest collected no tests (exit 5)" >&2; \
	elif [ $$status -ne 0 ]; then echo "make $@: FAILED: pytest exited with status $$status" >&2; fi; \
	exit $$status
endef

test: $(STAMP)
	$(BIN)/ruff check src tests
	$(call run_pytest,-m "not slow and not zoo")

test-slow: $(STAMP)
	$(call run_pytest,-m "slow and not zoo")

test-all: $(STAMP)
	$(BIN)/ruff check src tests
	$(call run_pytest,-m "not zoo")

# The whole model zoo (tests/models/zoo.py): every tiny model trained on CPU and on neuron.
# Long (per-model times in docs/MODEL_ZOO.md); `make test` runs only the entries marked fast.
# Its torchvision/timm entries import those from build/vision-libs, kept out of the
# virtualenv (tests/models/vision_libs.py says why).
VISION_LIBS := build/vision-libs
zoo: $(STAMP) $(VISION_LIBS)/.installed
	$(BIN)/python -m pytest $(PYTEST_ARGS) -m 'zoo or not zoo' tests/models

$(VISION_LIBS)/.installed: tests/models/vision-requirements.txt | $(STAMP)
	rm -rf $(VISION_LIBS)
	$(BIN)/python -m pip install --no-deps --target $(VISION_LIBS) -r $<
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check src tests examples benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/eager_ops.py

bench-write: $(STAMP)
	$(BIN)/python benchmarks/eager_ops.py --write

bench-compile: $(STAMP)
	$(BIN)/python benchmarks/compile_bench.py

# Issue 13: every model of tests/compiler/test_compile_models.py trains compiled as on CPU
# (about 30 s a model on 2 idle cores; `make test` runs two of them, the rest are `slow`).
.PHONY: test-compile-models
test-compile-models: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/compiler/test_compile_models.py

# Build outputs and caches; the virtualenv stays (`make distclean` removes it too).
clean:
	rm -rf build dist src/*.egg-info .pytest_cache .ruff_cache $(STAMP)
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)

# Conformance sweep (issue 3): PyTorch's op_db/module_db samples on neuron vs CPU, in two
# worker processes. Long (wall time in docs/COVERAGE.md). Prints `N passed, N failed, N skipped`
# and writes docs/COVERAGE.md and tests/conformance/expected_failures.json. `make test` runs
# only the fast slice (tests/conformance/test_conformance_slice.py).
.PHONY: conformance
conformance: $(STAMP)
	$(BIN)/python tests/conformance/run.py sweep --jobs 2 --write-manifest $(CONFORMANCE_ARGS)

# PyTorch's own test files (issue 10): PYTORCH_TESTS is the test/ folder of a PyTorch source
# checkout (not shipped here). Device-generic classes on cpu and neuron, one pytest process
# per file and device; writes the upstream section of docs/COVERAGE.md. Hours on 2 cores:
# pass e.g. UPSTREAM_ARGS='--files test_indexing' or '--sample test_unary_ufuncs=50'.
.PHONY: upstream-tests upstream-selftest
upstream-tests: $(VENV)/.upstream-installed
	@test -n "$(PYTORCH_TESTS)" || { echo "usage: make upstream-tests PYTORCH_TESTS=/path/to/pytorch/test" >&2; exit 2; }
	$(BIN)/python tests/upstream/run.py run --pytorch-tests "$(PYTORCH_TESTS)" --jobs 2 --write $(UPSTREAM_ARGS)

$(VENV)/.upstream-installed: $(STAMP)
	$(BIN)/python -m pip install -e '.[test,upstream]'
	touch $@

# The runner itself, end to end on a small test file of its own (about a minute).
upstream-selftest: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS) tests/upstream/check_runner.py
