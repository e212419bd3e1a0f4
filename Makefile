# `make demo` and `make test` run `make setup` first; setup is idempotent and fast once built.
PY := .venv/bin/python

.PHONY: setup setup-compat setup-newest test test-compat test-newest demo clean

setup:
	@bash tools/setup_env.sh

# The two ends of the supported range (tools/setup_env.sh): .venv-compat is mmdet 3.3's own
# install-guide environment (Python 3.8, torch 2.1.2, mmcv 2.1.0 compiled against it),
# .venv-newest the newest torch this machine installs (mmcv-lite: no mmdet/mmseg there).
setup-compat:
	@bash tools/setup_env.sh compat

setup-newest:
	@bash tools/setup_env.sh newest

# Extra pytest options, e.g. make test PYTEST_ARGS="--durations=30 -x" (.ci/run prints the slowest).
PYTEST_ARGS ?=
# Test processes (pytest-xdist); each file runs whole in one of them, so a module's fixtures are
# built once, and files marked heavy go first (tests/conftest.py). TEST_WORKERS=0 runs the suite
# in this process (what a debugger wants).
TEST_WORKERS ?= 2

PYTEST := -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
# pytest-xdist 3.6.1 (the last for Python 3.8) has no --no-loadscope-reorder: tests/conftest.py's
# pytest_xdist_make_scheduler keeps the collection's order there
PYTEST_COMPAT := -m pytest -n $(TEST_WORKERS) --dist loadfile

test: setup
	$(PY) $(PYTEST) tests $(PYTEST_ARGS)

# The oldest environment and the newest torch run the tests of what differs between torch
# versions: the rule in tests/compat_suite.txt, applied by tests/conftest.py (--suite), leaves
# the rest out as deselected. Neither runs the benchmark harness (which serves the pinned
# environment); tests of features a torch lacks are deselected and counted (tests/conftest.py).
test-compat: setup-compat
	.venv-compat/bin/python $(PYTEST_COMPAT) tests --ignore=tests/benchmarks -m 'not harness' \
	  --suite compat $(PYTEST_ARGS)

# The same rule on the newest torch, less what needs mmdet, mmseg or mmcv's compiled ops
# (mmcv-lite there): the rule's toolkit lines.
test-newest: setup-newest
	.venv-newest/bin/python $(PYTEST) tests --ignore=tests/benchmarks -m 'not harness' \
	  --suite newest $(PYTEST_ARGS)

# e.g. make demo ARGS=--no-benchmark, make demo ARGS="--arch v2" (the demo with SwinV2)
demo: setup
	$(PY) tools/demo.py $(ARGS) $(DEMO_ARGS)

clean:
	rm -rf .venv .venv-compat .venv-newest build *.egg-info
