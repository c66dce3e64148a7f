#!/bin/bash
# throughput.py at the paper's configuration under AVX2 emulation: PPO and the shipped PPO-EWMA config
# (proximal_precision auto -> fp32 here), 1 timed iteration each after a warm-up.
cd "$(dirname "$0")/../.."
PY=${PY:-/work/main/.venv/bin/python}
ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 nice -n 10 $PY benchmarks/throughput.py --iterations 1 --proximal-precision auto > benchmarks/results/throughput_avx2.txt 2>&1
