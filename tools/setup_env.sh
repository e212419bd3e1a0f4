#!/usr/bin/env bash
# Create or update a venv with a pinned stack; idempotent, called by `make setup` (and by
# `make setup-compat` / `make setup-newest` for the two ends of the supported range).
#
#   tools/setup_env.sh [pinned]   .venv         Python 3.11, torch 2.13 (requirements/build.txt),
#                                               the whole stack: every test runs here
#   tools/setup_env.sh compat     .venv-compat  the oldest supported environment: Python 3.8,
#                                               torch 2.1.2, mmcv 2.1.0 (requirements/compat.txt)
#   tools/setup_env.sh newest     .venv-newest  the newest torch this machine installs, with
#                                               mmengine and mmcv-lite (no ops, so no mmdet/mmseg)
#
# mmcv 2.1.0 has no wheel on PyPI: it is compiled once per torch version (20 min on 2 cores
# with -O3 -g; about a third of that without debug info, estimated from one file, below)
# into a wheel cache outside the repo, keyed by the torch version, and reused by every later
# setup; the newest profile takes mmcv-lite from PyPI instead (mmcv's Python part, no ops).
#   SWIN_RPE_WHEEL_CACHE  where built wheels live (default ~/.cache/swin_rpe_plugin/wheels)
#   PYTHON                interpreter for the venv (default: the profile's)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
profile=${1:-pinned}

pyenv_python() {  # the newest pyenv interpreter of a minor version, else pythonX.Y on PATH
  local found
  found=$(ls -d "$HOME"/.pyenv/versions/"$1".*/bin/python 2>/dev/null | sort -V | tail -n 1)
  echo "${found:-python$1}"
}

case $profile in
  pinned)
    venv=$root/.venv
    python=${PYTHON:-python3.11}
    torch_version=$(sed -n 's/^torch==//p' requirements/build.txt)
    requirements=(-c requirements/constraints.txt -r requirements/runtime.txt
                  -r requirements/tests.txt -r requirements/deploy.txt)
    check='import mmcv.ops; mmcv.ops.nms; import mmdet, mmseg, swin_rpe_plugin, openvino, nncf'
    build_mmcv=1 ;;
  compat)
    venv=$root/.venv-compat
    python=${PYTHON:-$(pyenv_python 3.8)}
    torch_version=$(sed -n 's/^torch==//p' requirements/compat.txt)
    requirements=(-r requirements/compat.txt)
    check='import mmcv.ops; mmcv.ops.nms; import mmdet, mmseg, swin_rpe_plugin, onnxruntime, openvino, nncf'
    build_mmcv=1 ;;
  newest)
    venv=$root/.venv-newest
    python=${PYTHON:-python3.11}
    torch_version=$(sed -n 's/^torch==//p' requirements/newest.txt)
    requirements=(-r requirements/newest.txt)
    check='import mmcv.cnn, swin_rpe_plugin, onnxruntime'
    build_mmcv=0 ;;
  *)
    echo "setup: unknown profile '$profile': use pinned, compat or newest" >&2
    exit 2 ;;
esac

cache=${SWIN_RPE_WHEEL_CACHE:-$HOME/.cache/swin_rpe_plugin/wheels}/torch-$torch_version
stamp=$venv/.setup-stamp
want=$(cat requirements/*.txt setup.py tools/setup_env.sh | sha256sum | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
    && "$venv/bin/python" -c "$check" 2>/dev/null; then
  echo "setup: ${venv#"$root"/} is up to date"
  exit 0
fi

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
# pip compiles every installed file to .pyc (its default; ~20 s a venv): where
# PYTHONDONTWRITEBYTECODE is set, as in CI, imports never write one, so without them every test
# process and subprocess compiled torch's and mmdet's Python afresh (suites 1.5x slower).
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
if [ "$profile" = pinned ]; then
  "${pip[@]}" -r requirements/build.txt
else  # torch and numpy first: mmcv compiles against them (no build isolation)
  "${pip[@]}" $(grep -E '^(torch|numpy|ninja|wheel)==' "${requirements[1]}")
fi
# torch >= 2.13 declares setuptools>=77, which dropped pkg_resources that mmcv's setup.py needs:
# pip warns about the conflict; it is harmless at run time.
"${pip[@]}" 'setuptools==69.5.1' 2>&1 | grep -v -e 'dependency resolver' -e 'requires setuptools' || true

if [ "$build_mmcv" = 1 ] && ! ls "$cache"/mmcv-2.1.0-*.whl >/dev/null 2>&1; then
  echo "setup: building mmcv 2.1.0 with ops into $cache (minutes: see above)"
  mkdir -p "$cache"
  tmp=$(mktemp -d)
  # -g0: no debug info. Python's own CFLAGS carry -g, which nearly triples the compile time of
  # each op (nms.cpp against torch 2.1: 27.8 s with -O3 -g, 10.7 s with -O3 -g0) and changes
  # nothing the ops compute. tools/cxx_with_pch.sh parses torch's headers once for all the ops
  # (precompiled header; nms.cpp: 8.4 s -> 1.9 s) where the compiler is GCC.
  compiler=()
  if [ -z "${CXX:-}" ] && c++ -v 2>&1 | grep -q '^gcc version'; then
    compiler=(CXX="$root/tools/cxx_with_pch.sh" CXX_WITH_PCH_DIR="$tmp/pch")
  fi
  env ${compiler[@]+"${compiler[@]}"} CFLAGS="${CFLAGS:-} -g0" PATH="$venv/bin:$PATH" MAX_JOBS="${MAX_JOBS:-2}" MMCV_WITH_OPS=1 \
    "$venv/bin/python" -m pip wheel --disable-pip-version-check --no-cache-dir --no-build-isolation --no-deps \
    -w "$tmp" mmcv==2.1.0
  mv "$tmp"/mmcv-2.1.0-*.whl "$cache"/ && rm -rf "$tmp"
fi

"${pip[@]}" --find-links "$cache" --only-binary mmcv "${requirements[@]}"
"${pip[@]}" --no-deps --no-build-isolation -e .
"$venv/bin/python" -c "$check; print('setup: ${venv#"$root"/} imports cleanly')"

if [ "$profile" = pinned ]; then
  # transformers for the SwinV2 benchmark test (tests/benchmarks/test_benchmark_comparisons.py),
  # in a folder of its own that only that test puts on PYTHONPATH: its pins (regex, safetensors)
  # are newer than the stack's. The smallest set with which `from transformers import Swinv2Model`
  # imports (tokenizers: transformers 5.24 annotates with its classes at import time).
  reference=$venv/reference
  if ! PYTHONPATH=$reference "$venv/bin/python" -c 'from transformers import Swinv2Model' 2>/dev/null; then
    "${pip[@]}" --no-deps --upgrade --target "$reference" transformers==5.24.0 \
      huggingface_hub==1.33.0 tokenizers==0.23.3 regex==2026.11.19 safetensors==0.8.0 \
      httpx==0.28.1 httpcore==1.0.9 h11==0.16.0 idna==3.20 certifi==2026.10.19.post1
    PYTHONPATH=$reference "$venv/bin/python" -c 'from transformers import Swinv2Model'
  fi
fi
echo "$want" > "$stamp"
