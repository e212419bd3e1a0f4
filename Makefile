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
# pytest-xdist 3.6.1 (the last for Python 3.8) has no --no-loadscope-reorder
PYTEST_COMPAT := -m pytest -n $(TEST_WORKERS) --dist loadfile

test: setup
	$(PY) $(PYTEST) tests $(PYTEST_ARGS)

# Every user path in the oldest environment: the whole suite but the benchmark harness (which
# serves the pinned environment) and the tests of features torch 2.1 lacks (deselected and
# counted by tests/conftest.py).
test-compat: setup-compat
	.venv-compat/bin/python $(PYTEST_COMPAT) tests --ignore=tests/benchmarks -m 'not harness' $(PYTEST_ARGS)

# The core on the newest torch: the files that need neither mmdet nor mmseg (mmcv-lite has no
# ops), less the three tests there that build a detector or segmentor.
NEWEST_TESTS := tests/test_compat.py tests/ops tests/models/test_compile.py \
	tests/models/test_swin_v2.py tests/models/test_valid_sizes.py tests/checkpoint/test_resize.py \
	tests/deploy/test_onnx_export.py tests/reliability/test_bad_input.py \
	tests/reliability/test_untrusted_checkpoints.py tests/reliability/test_fuzz.py
test-newest: setup-newest
	.venv-newest/bin/python $(PYTEST) $(NEWEST_TESTS) -m 'not harness' \
	  --deselect tests/ops/test_compiled_fast_paths.py::test_mmengine_compile_trains_a_synthetic_segmentor \
	  --deselect tests/deploy/test_onnx_export.py::test_whole_mask_rcnn_exports_up_to_the_rpn \
	  --deselect tests/deploy/test_onnx_export.py::test_upernet_whole_model_needs_a_fixed_size_and_says_why \
	  $(PYTEST_ARGS)

# e.g. make demo ARGS=--no-benchmark, make demo ARGS="--arch v2" (the demo with SwinV2)
demo: setup
	$(PY) tools/demo.py $(ARGS) $(DEMO_ARGS)

clean:
	rm -rf .venv .venv-compat .venv-newest build *.egg-info
