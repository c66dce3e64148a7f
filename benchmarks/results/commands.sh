#!/bin/bash
# The commands behind the files in this folder (issue 14), run from the repository root with
# PYTHONPATH=. on the 2-core Xeon while it was shared (load 13-20): hence one thread, CPU clock.
AVX2="env ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"
A="--chunks 128 --inference-chunks 32,64,128 --repeats 2 --layouts channels_last,nchw --threads 1 --clock cpu"
python benchmarks/impala_step.py $A > benchmarks/results/impala_step_native.txt
$AVX2 python benchmarks/impala_step.py $A --precisions fp32 > benchmarks/results/impala_step_avx2.txt
python benchmarks/roofline.py --clock cpu --threads 1 --repeats 5 > benchmarks/results/roofline_cpuclock_native.txt
$AVX2 python benchmarks/roofline.py --clock cpu --threads 1 --repeats 5 > benchmarks/results/roofline_cpuclock_avx2.txt
# without MKL_ENABLE_INSTRUCTIONS (MKL's matmul and linear layers keep AVX-512):
env ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/roofline.py --clock cpu --threads 1 --repeats 5 \
    > benchmarks/results/roofline_cpuclock_avx2_mkl_avx512.txt
# stopped, see the file's last lines:
bash benchmarks/results/run_throughput_avx2.sh
# probes of ideas not shipped (each prints its own figures; run natively and with $AVX2):
python benchmarks/results/probes/conv_postop_fusion.py
python benchmarks/results/probes/first_conv_layouts.py
python benchmarks/results/probes/first_conv_im2col.py
python benchmarks/results/probes/mkl_avx2_matmul.py
python benchmarks/results/probes/onednn_fusion_bf16.py 512 11   # issue 21, bf16 on AMX only
