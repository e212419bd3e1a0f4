# `make demo` and `make test` run `make setup` first; setup is idempotent and fast once built.
PY := .venv/bin/python

.PHONY: setup test demo clean

setup:
	@bash tools/setup_env.sh

# Extra pytest options, e.g. make test PYTEST_ARGS="--durations=30 -x" (.ci/run prints the slowest).
PYTEST_ARGS ?=

test: setup
	$(PY) -m pytest tests $(PYTEST_ARGS)

# e.g. make demo ARGS=--no-benchmark, make demo ARGS="--arch v2" (the demo with SwinV2)
demo: setup
	$(PY) tools/demo.py $(ARGS) $(DEMO_ARGS)

clean:
	rm -rf .venv build *.egg-info
