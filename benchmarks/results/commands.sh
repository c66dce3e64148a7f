#!/bin/bash
# The commands behind the Procgen per-ISA files in this folder, run from the repository root with
# PYTHONPATH=. on a 2-core Xeon (Xeon-BF16) while it was shared (load 13-20): hence one thread, CPU clock.
# AVX2-emulated: the same Xeon with torch's, oneDNN's and MKL's kernels limited to AVX2.
AVX2="env ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"
A="--chunks 128 --inference-chunks 32,64,128 --repeats 2 --layouts channels_last,nchw --threads 1 --clock cpu"
python benchmarks/impala_step.py $A > benchmarks/results/impala_step_xeon_bf16.txt
$AVX2 python benchmarks/impala_step.py $A --precisions fp32 > benchmarks/results/impala_step_xeon_avx2_emulated.txt
python benchmarks/roofline.py --clock cpu --threads 1 --repeats 5 > benchmarks/results/roofline_xeon_bf16.txt
$AVX2 python benchmarks/roofline.py --clock cpu --threads 1 --repeats 5 > benchmarks/results/roofline_xeon_avx2_emulated.txt
# without MKL_ENABLE_INSTRUCTIONS (MKL's matmul and linear layers keep AVX-512):
env ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/roofline.py --clock cpu --threads 1 --repeats 5 \
    > benchmarks/results/roofline_xeon_avx2_emulated_mkl_avx512.txt
# Xeon-AMX (bf16 on AMX tiles):
python benchmarks/roofline.py --clock cpu --threads 1 --dtypes fp32,bf16 --no-profile --repeats 3 > benchmarks/results/roofline_xeon_amx_bf16.txt
