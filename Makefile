# `make demo` and `make test` run `make setup` first; setup is idempotent and fast once built.
PY := .venv/bin/python

.PHONY: setup test demo clean

setup:
	@bash tools/setup_env.sh

# Extra pytest options, e.g. make test PYTEST_ARGS="--durations=30 -x" (.ci/run prints the slowest).
PYTEST_ARGS ?=
# Test processes (pytest-xdist); each file runs whole in one of them, so a module's fixtures are
# built once, and files marked heavy go first (tests/conftest.py). TEST_WORKERS=0 runs the suite
# in this process (what a debugger wants).
TEST_WORKERS ?= 2

test: setup
	$(PY) -m pytest tests -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# e.g. make demo ARGS=--no-benchmark, make demo ARGS="--arch v2" (the demo with SwinV2)
demo: setup
	$(PY) tools/demo.py $(ARGS) $(DEMO_ARGS)

clean:
	rm -rf .venv build *.egg-info
