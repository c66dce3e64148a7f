"""Hardware-dependent choices: "auto" precisions pick bf16 only where it is known faster, and say why."""

from __future__ import annotations

import json

import pytest
import torch

from ppo_lightning.core import hardware

AVX2_EPYC = frozenset({"fpu", "sse4_2", "avx", "avx2", "fma"})  # an AMD EPYC of the issue: no AVX-512
SPR = AVX2_EPYC | {"avx512f", "avx512_vnni", "avx512_bf16"}  # this project's Intel Xeon: no AMX
AMX = SPR | {"amx_bf16", "amx_tile"}  # a Sapphire Rapids that exposes AMX


@pytest.fixture
def cpu(monkeypatch):
    """Pretend to be a CPU with the given flags (and torch capability), without hiding env vars."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)

    def set_cpu(flags, capability="AVX512"):
        monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))
        monkeypatch.setattr(hardware, "cpu_capability", lambda: capability)

    return set_cpu


def test_auto_is_bf16_only_with_amx(cpu):
    cpu(AVX2_EPYC, "AVX2")  # bf16 emulated: 8-12x slower
    choice, reason = hardware.resolve_precision("auto", "cpu")
    assert choice == "fp32" and "emulated" in reason and not hardware.bf16_native_cpu()[0]
    cpu(SPR)  # native bf16 instructions, but measured slower than fp32 for this network
    choice, reason = hardware.resolve_precision("auto", torch.device("cpu"))
    assert choice == "fp32" and "no AMX" in reason and hardware.bf16_native_cpu()[0]
    cpu(AMX)
    choice, reason = hardware.resolve_precision("auto", torch.device("cpu"))
    assert choice == "bf16" and "amx_bf16" in reason


def test_emulated_avx2_counts_as_not_native(cpu, monkeypatch):
    cpu(AMX, "AVX2")  # ATEN_CPU_CAPABILITY=avx2 on an AMX CPU
    assert hardware.resolve_precision("auto", "cpu")[0] == "fp32"
    cpu(AMX, "AVX512")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    choice, reason = hardware.resolve_precision("auto", "cpu")
    assert choice == "fp32" and "ONEDNN_MAX_CPU_ISA=AVX2" in reason
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")  # keeps avx512_bf16, hides AMX
    choice, reason = hardware.resolve_precision("auto", "cpu")
    assert choice == "fp32" and "amx_bf16" in reason and hardware.bf16_native_cpu()[0]
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")  # a limit that keeps AMX
    assert hardware.resolve_precision("auto", "cpu")[0] == "bf16"


def test_explicit_precisions_are_kept_and_bad_ones_refused(cpu):
    cpu(AVX2_EPYC, "AVX2")
    assert hardware.resolve_precision("bf16", "cpu") == ("bf16", "set in the config")  # the user's call
    assert hardware.resolve_precision("fp32", "cpu")[0] == "fp32"
    assert hardware.resolve_precision(None, "cpu")[0] is None
    with pytest.raises(ValueError, match="precision"):
        hardware.resolve_precision("fp16", "cpu")


@pytest.mark.parametrize("capability,expected", [((8, 0), "bf16"), ((9, 0), "bf16"), ((7, 0), "fp32")])
def test_auto_on_cuda_follows_the_compute_capability(monkeypatch, capability, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "a GPU")
    choice, reason = hardware.resolve_precision("auto", "cuda:0")
    assert choice == expected and f"sm_{capability[0]}{capability[1]}" in reason


def test_machine_info_is_plain_and_names_the_isa():
    info = hardware.machine_info()
    assert json.loads(json.dumps(info)) == info  # goes into the benchmarks' JSON line as is
    assert set(info["isa"]) == set(hardware.ISA_FLAGS) and info["cores"] >= 1
    assert info["torch_threads"] == torch.get_num_threads() and info["cpu_model"]
    assert "cores" in hardware.machine_line(info)


def test_choice_is_logged_once(monkeypatch):
    from ppo_lightning.training import precision

    lines = []
    monkeypatch.setattr(precision, "_logged", set())
    monkeypatch.setattr(precision, "_emit", lines.append)
    for _ in range(3):
        precision.log_choice("model.proximal_precision auto on cpu", "fp32", "CPU without avx512_bf16")
    assert lines == ["model.proximal_precision auto on cpu: fp32 (CPU without avx512_bf16)"]


def test_a_benchmark_says_where_it_ran():
    """benchmarks/impala_step.py (tiny sizes): the machine line first, ``"machine"`` in the JSON line."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, str(root / "benchmarks/impala_step.py"), "--threads", "1", "--batch", "4", "--chunks", "4",
         "--inference-chunks", "4", "--precisions", "fp32", "--repeats", "1"],
        capture_output=True, text=True, check=True, env={**__import__("os").environ, "PYTHONPATH": str(root)})
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("machine: ") and "cores" in lines[0]
    machine = json.loads(lines[-1])["machine"]
    assert machine["cores"] >= 1 and machine["torch_threads"] == 1 and set(machine["isa"]) == set(hardware.ISA_FLAGS)


# The four CPU labels the committed study records carry, with the CPU type each report names.
RECORDED_LABELS = {
    "CPU: AMD EPYC, 2 cores, avx2": "EPYC-AVX2",
    "CPU: AMD EPYC, 2 cores, avx2/avx512f/avx512_bf16": "EPYC-AVX512",
    "CPU: Intel(R) Xeon(R) Processor, 2 cores, avx2/avx512f": "Xeon-AVX512",
    "CPU: Intel(R) Xeon(R) Processor, 2 cores, avx2/avx512f/avx512_bf16/amx_bf16": "Xeon-AMX",
}


@pytest.mark.parametrize("label,short", RECORDED_LABELS.items())
def test_a_recorded_cpu_label_reads_back_into_the_identity_it_was_written_from(label, short):
    identity = hardware.CpuIdentity.from_label(label)
    assert identity.label == label and identity.cores == 2 and identity.short == short
    assert hardware.cpu_short(label) == short


@pytest.mark.parametrize("label", ["", None, "not recorded", "CPU: unknown", "CPU: x, many cores, avx2"])
def test_a_label_that_names_no_cpu_is_not_recorded(label):
    assert hardware.CpuIdentity.from_label(label) is None and hardware.cpu_short(label) == "CPU not recorded"


def test_this_machines_identity_is_procs_model_flags_and_usable_cores(monkeypatch):
    import os

    monkeypatch.setattr(hardware, "cpu_flags", lambda: AMX)
    monkeypatch.setattr(hardware, "cpu_model", lambda: "Intel(R) Xeon(R) Platinum 8480+")
    cores = len(os.sched_getaffinity(0))
    assert hardware.cpu_label() == f"CPU: Intel(R) Xeon(R) Platinum 8480+, {cores} cores, avx2/avx512f/avx512_bf16/amx_bf16"
    assert hardware.cpu_type() == "Xeon-AMX" and hardware.core_count() == cores
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"sse4_2"}))
    monkeypatch.setattr(hardware, "cpu_model", lambda: "AMD EPYC 7B13")
    assert hardware.cpu_label().endswith("cores, no avx2") and hardware.cpu_type() == "EPYC"
