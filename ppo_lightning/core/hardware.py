"""What machine this runs on, and which precision tricks pay off on it.

A speed-up measured on one CPU can be a slow-down on another. For the IMPALA CNN's convolutions
(16-32 channels) bf16 is:
- emulated and 8-12x *slower* than fp32 on AVX2-only CPUs (AMD EPYC of issue 14; AVX2-emulated Xeon),
- 1.3x *slower* than fp32 on this project's Xeon with AVX512_BF16 but no AMX (oneDNN's
  avx512_core_bf16 kernels: 83 vs 121 GFLOP/s per core for a 16->16 conv), yet 1.55x *faster* for
  the whole PPO step on an AMD EPYC with the same flags (issue 50),
- much faster with AMX tiles (amx_bf16), which oneDNN uses for bf16 convolutions,
(docs/benchmarks/procgen.md, "Per CPU type"). Flags alone cannot choose, so ``--trainer.precision
auto`` on a CPU is measured per run (`ppo_lightning.training.precision_probe`); the rule here
(`resolve_trainer_precision`: bf16 only with AMX on the CPU or bf16 tensor cores on a GPU, sm_80+)
is what ``auto`` falls back to where no measurement runs (`ppo_lightning.training.precision`), and the
benchmarks record the machine (`machine_info`).

The effective instruction set is what the CPU reports *and* what torch is allowed to use. An
AVX2-only CPU is emulated for measurement with ``ATEN_CPU_CAPABILITY=avx2`` (torch's own kernels),
``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN: convolutions, bf16) and ``MKL_ENABLE_INSTRUCTIONS=AVX2`` (MKL:
matmul, linear layers; without it they keep AVX-512); the first two also hide AMX.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from functools import lru_cache

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PRECISION_CHOICES = ("fp32", "bf16", "auto")
# ISA flags (as /proc/cpuinfo spells them) that decide which CPU kernels run fast.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")
BF16_NATIVE_FLAGS = ("avx512_bf16", "amx_bf16")  # bf16 instructions (not emulated)
BF16_FAST_FLAGS = ("amx_bf16",)  # bf16 faster than fp32 for the IMPALA CNN on every CPU measured with them
# ONEDNN_MAX_CPU_ISA values (oneDNN's names, lower case) that keep bf16 instructions / AMX usable.
_ONEDNN_BF16_ISAS = ("avx512_core_bf16", "avx512_core_fp16", "avx512_core_amx", "avx512_core_amx_fp16",
                     "avx10_1_512", "avx10_1_512_amx", "avx10_1_512_amx_fp16", "all")
_ONEDNN_AMX_ISAS = ("avx512_core_amx", "avx512_core_amx_fp16", "avx10_1_512_amx", "avx10_1_512_amx_fp16", "all")


@lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    """(model name, flags) of the first CPU in /proc/cpuinfo."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
                if "model name" in fields and "flags" in fields:
                    break
    except OSError:  # not Linux: no flags, so nothing counts as bf16-native on the CPU
        pass
    model = fields.get("model name") or platform.processor() or platform.machine()
    return model, frozenset(fields.get("flags", "").split())


def cpu_model() -> str:
    return _cpuinfo()[0]


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (empty where there is none)."""
    return _cpuinfo()[1]


def cpu_capability() -> str:
    """The vector ISA torch's own CPU kernels use ("AVX512", "AVX2", ...; follows ATEN_CPU_CAPABILITY)."""
    import torch  # here, not at the top: the study and tune commands read the CPU identity without torch
    return torch.backends.cpu.get_cpu_capability()


def core_count() -> int:
    """Cores this process may run on (its affinity mask; the container's, not the host's). The one
    usable-core count: thread defaults, Procgen's workers, a study's default workers and the CPU
    label all read it."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# The ISA flags a CPU label names, in this order: the ones that decide torch's CPU kernels.
LABEL_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
_LABEL_PREFIX = "CPU: "
NOT_RECORDED = "CPU not recorded"


@dataclass(frozen=True)
class CpuIdentity:
    """A CPU as records, figures, benchmarks and studies name it: model, usable cores and the ISA
    flags of `LABEL_ISA_FLAGS` it has. `label` is the text written into records
    (``CPU: AMD EPYC, 2 cores, avx2/avx512f/avx512_bf16``), `from_label` reads one back, `short`
    is its CPU type in three words (``EPYC-AVX512``, ``Xeon-AMX``, ``EPYC-AVX2``)."""

    model: str
    cores: int
    isa: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{_LABEL_PREFIX}{self.model}, {self.cores} cores, {'/'.join(self.isa) or 'no avx2'}"

    @property
    def short(self) -> str:
        """The CPU type: the model's family (Xeon, EPYC, else the model) and its best vector ISA."""
        name = "Xeon" if "Xeon" in self.model else "EPYC" if "EPYC" in self.model else self.model
        isa = ("AMX" if "amx_bf16" in self.isa else "AVX512" if any(f.startswith("avx512") for f in self.isa)
               else "AVX2" if "avx2" in self.isa else "")
        return f"{name}-{isa}" if isa else name

    @classmethod
    def from_label(cls, label: str | None) -> "CpuIdentity | None":
        """The identity a `label` was written from; None for a label that names no CPU ("not
        recorded", empty, ``CPU: unknown``)."""
        if not label or not label.startswith(_LABEL_PREFIX):
            return None
        parts = label[len(_LABEL_PREFIX):].rsplit(", ", 2)
        if len(parts) != 3 or not parts[1].endswith(" cores") or not parts[1][:-len(" cores")].isdigit():
            return None
        model, cores, isa = parts
        flags = tuple(f for f in isa.split("/") if f in LABEL_ISA_FLAGS)
        return cls(model, int(cores[:-len(" cores")]), flags)


def cpu_identity() -> CpuIdentity:
    """This machine's `CpuIdentity` (/proc/cpuinfo's model and flags, `core_count`)."""
    flags = cpu_flags()
    return CpuIdentity(cpu_model(), core_count(), tuple(f for f in LABEL_ISA_FLAGS if f in flags))


def cpu_label() -> str:
    """This machine's CPU label, as records and figures carry it (`CpuIdentity.label`)."""
    return cpu_identity().label


def cpu_type() -> str:
    """This machine's CPU type in three words (`CpuIdentity.short`): EPYC-AVX512, Xeon-AMX, ..."""
    return cpu_identity().short


def cpu_short(label: str | None) -> str:
    """The CPU type of a recorded label (`CpuIdentity.short`), or "CPU not recorded"."""
    identity = CpuIdentity.from_label(label)
    return identity.short if identity else NOT_RECORDED


def _hidden(isas: tuple[str, ...], have: list[str]) -> str | None:
    """Why torch may not use the CPU's ``have`` instructions (the emulation variables), or None."""
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", ""))
    if limit and limit.lower() not in isas:
        return f"ONEDNN_MAX_CPU_ISA={limit} hides the CPU's {'/'.join(have)}"
    if not cpu_capability().startswith("AVX512"):
        return f"torch CPU capability {cpu_capability()} (ATEN_CPU_CAPABILITY) hides the CPU's {'/'.join(have)}"
    return None


def bf16_native_cpu() -> tuple[bool, str]:
    """Whether the CPU has bf16 instructions torch may use (not emulated), and why (one phrase)."""
    have = [f for f in BF16_NATIVE_FLAGS if f in cpu_flags()]
    if not have:
        return False, "CPU without avx512_bf16/amx_bf16 (bf16 is emulated there, 8-12x slower)"
    hidden = _hidden(_ONEDNN_BF16_ISAS, have)
    return (False, hidden) if hidden else (True, f"CPU has {'/'.join(have)}")


def bf16_faster_cpu() -> tuple[bool, str]:
    """Whether bf16 is faster than fp32 for the IMPALA CNN on this CPU by its flags alone (AMX), and why."""
    native, why = bf16_native_cpu()
    if not native:
        return False, why
    have = [f for f in BF16_FAST_FLAGS if f in cpu_flags()]
    if not have:
        return False, ("CPU has avx512_bf16 but no AMX: bf16 measured 1.3x slower (a Xeon) and 1.55x faster (an EPYC) "
                       "there, 32-true unless measured")
    hidden = _hidden(_ONEDNN_AMX_ISAS, have)
    return (False, hidden) if hidden else (True, f"CPU has {'/'.join(have)}")


def bf16_native(device: torch.device | str) -> tuple[bool, str]:
    """Whether bf16 compute is native and known faster than fp32 on ``device``, and why."""
    import torch  # here, not at the top: the study and tune commands read the CPU identity without torch
    device = torch.device(device)
    if device.type == "cpu":
        return bf16_faster_cpu()
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        name = torch.cuda.get_device_name(index)
        major, minor = torch.cuda.get_device_capability(index)
        if major >= 8:  # Ampere and later: bf16 tensor cores
            return True, f"CUDA {name} (sm_{major}{minor}) has bf16 tensor cores"
        return False, f"CUDA {name} (sm_{major}{minor}) has no native bf16"
    return False, f"no known native bf16 on device type {device.type!r}"


def resolve_precision(requested: str | None, device: torch.device | str = "cpu") -> tuple[str | None, str]:
    """``(choice, reason)`` for a requested precision: "fp32"/"bf16"/None stay as set, "auto"
    becomes "bf16" where bf16 is native and known faster on ``device`` (`bf16_native`: AMX CPUs,
    sm_80+ GPUs) and "fp32" everywhere else."""
    if requested is None or requested in ("fp32", "bf16"):
        return requested, "set in the config"
    if requested != "auto":
        raise ValueError(f"precision must be one of {PRECISION_CHOICES}, got {requested!r}")
    native, why = bf16_native(device)
    return ("bf16", why) if native else ("fp32", why)


# Lightning's precision values this project documents, plus our "auto" (resolved per machine).
TRAINER_PRECISIONS = ("32-true", "bf16-mixed", "auto")


def accelerator_device(accelerator: object = "auto") -> torch.device:
    """The device type a Trainer with ``accelerator`` will train on, known before it is built:
    "cpu" -> cpu; "gpu"/"cuda" -> cuda; "auto" (or None) -> cuda where available, else cpu. An
    accelerator object (or another name, e.g. "mps") stands for its own device type."""
    import torch  # here, not at the top: the study and tune commands read the CPU identity without torch
    if accelerator is None or accelerator == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(accelerator, str):  # an Accelerator instance: CPUAccelerator, CUDAAccelerator, ...
        accelerator = type(accelerator).__name__.lower().replace("accelerator", "")
    name = accelerator.lower()
    return torch.device("cuda" if name in ("gpu", "cuda") else name if name in ("cpu", "mps", "xla") else "cpu")


# Below this many samples per optimizer step a bf16-mixed step on a CPU is slower than a float32 one
# even with AMX: autocast casts every weight to bf16 on each step (forward, EWMA anchor, weight
# gradients back to float32) and at a few rows the matmuls it speeds up are a small part of the
# step. MinAtar CNN, Xeon-AMX, in one process (docs/benchmarks/small-batch.md): bf16 / fp32
# frames/s 0.87-0.98 at 8 samples (8 seeds), 0.89-0.91 at 32, ~1.0 at 128, 1.35-1.75 at 512.
BF16_CPU_MIN_MINIBATCH = 128


def resolve_trainer_precision(precision: object, accelerator: object = "auto",
                              minibatch_size: int | None = None) -> tuple[object, str]:
    """``(Lightning precision, reason)``: "auto" becomes "bf16-mixed" where bf16 is native and
    known faster on the training device (`bf16_native`: AMX CPUs, CUDA sm_80+) and "32-true"
    everywhere else (AVX2, AVX-512 without AMX, older GPUs); on a CPU also "32-true" when
    ``minibatch_size`` (samples per optimizer step) is below `BF16_CPU_MIN_MINIBATCH`. Any other
    value is Lightning's and is kept as set."""
    import torch  # here, not at the top: the study and tune commands read the CPU identity without torch
    if precision != "auto":
        return precision, "set in the config"
    device = accelerator_device(accelerator)
    if device.type == "cuda" and not torch.cuda.is_available():
        return "32-true", "no CUDA device visible"
    native, why = bf16_native(device)
    if native and device.type == "cpu" and minibatch_size is not None and minibatch_size < BF16_CPU_MIN_MINIBATCH:
        return "32-true", (f"{why}, but minibatches of {minibatch_size} < {BF16_CPU_MIN_MINIBATCH} samples: "
                           "bf16's per-step weight casts cost more than its faster matmuls there")
    return ("bf16-mixed" if native else "32-true"), why


def machine_info() -> dict:
    """Plain description of the machine for benchmark output: CPU model, cores, the ISA flags that
    matter, bf16-native or not, torch's threads and CPU capability, CUDA devices."""
    import torch  # here, not at the top: the study and tune commands read the CPU identity without torch
    flags = cpu_flags()
    native, _ = bf16_native_cpu()
    faster, why = bf16_faster_cpu()
    info = {
        "cpu_model": cpu_model(),
        "cpu_type": cpu_type(),
        "cores": core_count(),
        "isa": {f: f in flags for f in ISA_FLAGS},
        "torch_cpu_capability": cpu_capability(),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
        "mkl_enable_instructions": os.environ.get("MKL_ENABLE_INSTRUCTIONS"),
        "bf16_native_cpu": native,
        # --trainer.precision auto here where no measurement runs (the ISA-flag rule); a run measures
        "precision_auto_cpu": "bf16-mixed" if faster else "32-true",
        "bf16_reason": why,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available() else [],
    }
    return info


def machine_line(info: dict | None = None) -> str:
    """One human-readable line of `machine_info`."""
    info = info or machine_info()
    isa = " ".join(f for f, on in info["isa"].items() if on) or "none of " + "/".join(ISA_FLAGS)
    emu = ""
    limited = info["onednn_max_cpu_isa"] or info.get("mkl_enable_instructions")
    if limited or info["torch_cpu_capability"] != "AVX512" and info["isa"].get("avx512f"):
        emu = (f", EMULATED: torch capability {info['torch_cpu_capability']}, ONEDNN_MAX_CPU_ISA="
               f"{info['onednn_max_cpu_isa']}, MKL_ENABLE_INSTRUCTIONS={info.get('mkl_enable_instructions')}")
    gpus = f", GPUs: {', '.join(info['cuda_devices'])}" if info["cuda_devices"] else ""
    return (f"machine: {info['cpu_model']}, {info['cores']} cores, ISA {isa}, bf16 native: "
            f"{info['bf16_native_cpu']}, precision auto by ISA flags (unmeasured): {info['precision_auto_cpu']}{emu}, torch threads "
            f"{info['torch_threads']}{gpus}")
