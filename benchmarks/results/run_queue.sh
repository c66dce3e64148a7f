#!/bin/bash
# The measurement queue of issue 14 (outputs next to this file): after the native impala_step.py run,
# roofline.py (native), then impala_step.py (AVX2-emulated). roofline.py AVX2-emulated ran alongside:
#   ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/roofline.py --repeats 5
cd "$(dirname "$0")/../.."
PY=${PY:-/work/main/.venv/bin/python}
AVX2="env ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"
while pgrep -f "benchmarks/impala_step.py" > /dev/null; do sleep 10; done
nice -n 10 $PY benchmarks/roofline.py --repeats 5 > benchmarks/results/roofline_native.txt 2>&1
$AVX2 nice -n 10 $PY benchmarks/impala_step.py --chunks 128 --inference-chunks 32,64,128 --precisions fp32 --repeats 2 \
    --layouts channels_last,nchw > benchmarks/results/impala_step_avx2.txt 2>&1
