#!/bin/bash
# Native and AVX2-emulated runs of roofline.py (outputs next to this file); waits for a running impala_step.py.
cd "$(dirname "$0")/../.."
PY=${PY:-/work/main/.venv/bin/python}
while pgrep -f "benchmarks/impala_step.py" > /dev/null; do sleep 10; done
nice -n 10 $PY benchmarks/roofline.py --repeats 5 > benchmarks/results/roofline_native.txt 2>&1
ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 nice -n 10 $PY benchmarks/roofline.py --repeats 5 > benchmarks/results/roofline_avx2.txt 2>&1
