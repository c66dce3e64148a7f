#!/bin/bash
# Native and AVX2-emulated runs of impala_step.py, one after the other (outputs next to this file).
cd "$(dirname "$0")/../.."
PY=${PY:-/work/main/.venv/bin/python}
ARGS="--chunks 128 --inference-chunks 32,64,128 --repeats 2 --layouts channels_last,nchw"
nice -n 10 $PY benchmarks/impala_step.py $ARGS > benchmarks/results/impala_step_native.txt 2>&1
ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 nice -n 10 $PY benchmarks/impala_step.py $ARGS > benchmarks/results/impala_step_avx2.txt 2>&1
