#!/usr/bin/env bash
# Distributed training, as mmdet's/mmseg's tools/dist_train.sh, with torchrun:
#   tools/dist_train.sh CONFIG NPROC [train.py options...]
# On a machine without CUDA the processes use gloo (tools/train.py sets it); with CUDA, NCCL.
# NNODES, NODE_RANK, PORT and MASTER_ADDR are read from the environment; PYTHON picks the
# interpreter (default: the repo's .venv when present).
set -euo pipefail
CONFIG=$1
NPROC=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
HERE="$(cd "$(dirname "$0")" && pwd)"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$HERE/../.venv/bin/python" ]; then PYTHON="$HERE/../.venv/bin/python"; else PYTHON=python; fi
fi
PYTHONPATH="$HERE/..":${PYTHONPATH:-} \
"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$NPROC" --master_port="$PORT" \
    "$HERE/train.py" "$CONFIG" --launcher pytorch "${@:3}"
