# `make demo` and `make test` run `make setup` first; setup is idempotent and fast once built.
PY := .venv/bin/python

.PHONY: setup test demo clean

setup:
	@bash tools/setup_env.sh

test: setup
	$(PY) -m pytest tests

demo: setup  # `make demo DEMO_ARGS="--arch v2"`: the same demo with SwinV2 backbones
	$(PY) tools/demo.py $(DEMO_ARGS)

clean:
	rm -rf .venv build *.egg-info
