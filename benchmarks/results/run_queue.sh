#!/bin/bash
# The measurement queue of issue 14, one run after the other (outputs next to this file):
# roofline (native), impala_step (AVX2-emulated), roofline (AVX2-emulated).
cd "$(dirname "$0")/../.."
PY=${PY:-/work/main/.venv/bin/python}
AVX2="env ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"
while pgrep -f "benchmarks/impala_step.py" > /dev/null; do sleep 10; done
nice -n 10 $PY benchmarks/roofline.py --repeats 5 > benchmarks/results/roofline_native.txt 2>&1
$AVX2 nice -n 10 $PY benchmarks/impala_step.py --chunks 128 --inference-chunks 32,64,128 --precisions fp32 --repeats 2 \
    --layouts channels_last,nchw > benchmarks/results/impala_step_avx2.txt 2>&1
$AVX2 nice -n 10 $PY benchmarks/roofline.py --repeats 5 > benchmarks/results/roofline_avx2.txt 2>&1
