#!/usr/bin/env bash
# GPU check (benchmarks/gpu_check.py): the paper's Procgen configs for a few iterations on one GPU
# (PPO, PPO-EWMA), then DDP and FSDP2 on all visible GPUs; frames/s, peak GPU memory, whether the
# ranks' parameters agree; the last line is one JSON object. Under 5 minutes after `make install`.
# Without an NVIDIA GPU it stops at once with one line and a non-zero exit code.
#   bash benchmarks/gpu_check.sh [--iterations 2] [--phases ppo,ppo_ewma,ddp,fsdp2]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "gpu_check: no NVIDIA GPU on this machine (nvidia-smi finds none); nothing to check" >&2
    exit 3
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" benchmarks/gpu_check.py "$@"
