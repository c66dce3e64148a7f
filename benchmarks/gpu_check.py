"""GPU check: the paper's Procgen configs on NVIDIA GPUs, a few iterations each (run by gpu_check.sh).

Phases, each in its own process (``--phase``), each a warm-up iteration plus ``--iterations`` timed ones:
  ppo        ppo_lightning/configs/procgen/ppo_hard.yaml on one GPU
  ppo_ewma   ppo_lightning/configs/procgen/ppo_ewma_hard.yaml on one GPU (trainer.precision auto: bf16-mixed on sm_80+)
  ddp        ppo_ewma_hard.yaml on all visible GPUs, strategy ddp
  fsdp2      ppo_ewma_hard.yaml on all visible GPUs, ModelParallelStrategy (FSDP2, tensor_parallel_size 1)
Each phase reports frames/s of all ranks together (after the warm-up iteration), the peak GPU memory
(max over ranks, ``torch.cuda.max_memory_allocated``), the rollout / update split, and whether the
ranks' parameters agree (sum and sum of squares of the full parameters, gathered from every rank,
equal bit for bit). The driver prints one line per phase and ends with one JSON line.

    bash benchmarks/gpu_check.sh                 # all phases (under 5 minutes on recent GPUs)
    python benchmarks/gpu_check.py --phases ppo  # one phase
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = {
    "ppo": ("ppo_lightning/configs/procgen/ppo_hard.yaml", "single"),
    "ppo_ewma": ("ppo_lightning/configs/procgen/ppo_ewma_hard.yaml", "single"),
    "ddp": ("ppo_lightning/configs/procgen/ppo_ewma_hard.yaml", "ddp"),
    "fsdp2": ("ppo_lightning/configs/procgen/ppo_ewma_hard.yaml", "fsdp2"),
}
MARK = "GPU_CHECK_PHASE "


def no_gpu_reason() -> str | None:
    """None when torch sees a CUDA GPU; else one line saying why not."""
    import torch

    if torch.version.cuda is None:
        return f"gpu_check: this torch ({torch.__version__}) is a CPU build; install a CUDA build of torch==2.13.0"
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return "gpu_check: torch sees no CUDA GPU (torch.cuda.is_available() is False)"
    return None


def run_phase(name: str, iterations: int, num_envs: int, rollout_steps: int) -> None:
    """One phase in this process (its DDP/FSDP ranks re-run this same command line)."""
    import lightning.pytorch as pl
    import torch

    import ppo_lightning.run.builder as cli_mod

    config, kind = PHASES[name]
    world = torch.cuda.device_count() if kind != "single" else 1
    fpi = num_envs * rollout_steps * world  # frames per iteration, all ranks
    from ppo_lightning.core.hardware import core_count

    cores = core_count()

    class Probe(pl.Callback):
        def __init__(self) -> None:
            self.rows: list[dict] = []

        def on_train_epoch_start(self, trainer, pl_module) -> None:
            torch.cuda.synchronize()
            self.t0 = time.perf_counter()

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            torch.cuda.synchronize()  # once per iteration, for the timing
            timing = trainer.datamodule.source.last_timing
            self.rows.append({"wall_s": time.perf_counter() - self.t0, "rollout_s": timing["time/rollout_s"],
                              "gae_s": timing["time/gae_s"]})

        def on_train_end(self, trainer, pl_module) -> None:
            stats = []
            for p in pl_module.network.parameters():
                full = p.full_tensor() if hasattr(p, "full_tensor") else p  # FSDP2: gather (every rank)
                stats.append(torch.stack([full.double().sum(), full.double().square().sum()]))
            mine = torch.stack(stats)
            peak = torch.tensor([float(torch.cuda.max_memory_allocated())], device=mine.device)
            rollout_device = str(trainer.datamodule.source.device)
            if trainer.world_size > 1:
                everyone, peaks = trainer.strategy.all_gather(mine), trainer.strategy.all_gather(peak)
            else:
                everyone, peaks = mine.unsqueeze(0), peak.unsqueeze(0)
            agree = bool((everyone == everyone[0:1]).all())
            if trainer.is_global_zero:
                timed = self.rows[1:]
                wall = sum(r["wall_s"] for r in timed)
                out = {
                    "phase": name, "config": config, "gpus": trainer.world_size,
                    "strategy": type(trainer.strategy).__name__, "iterations": len(timed),
                    "fps": round(fpi * len(timed) / wall, 1),
                    "iteration_s": round(wall / len(timed), 3),
                    "rollout_s": round(sum(r["rollout_s"] for r in timed) / len(timed), 3),
                    "warmup_iteration_s": round(self.rows[0]["wall_s"], 2),
                    "peak_gpu_memory_gib": round(float(peaks.max()) / 2**30, 3),
                    "params_agree": agree, "rollout_device": rollout_device,
                    "precision": trainer.precision,
                    "gpu": torch.cuda.get_device_name(0),
                }
                print(MARK + json.dumps(out), flush=True)

    probe = Probe()
    strategy = {
        "single": ["--trainer.devices", "1"],
        "ddp": ["--trainer.devices", str(world), "--trainer.strategy", "ddp"],
        "fsdp2": ["--trainer.devices", str(world), "--trainer.strategy",
                  "lightning.pytorch.strategies.ModelParallelStrategy",
                  "--trainer.strategy.data_parallel_size", str(world), "--trainer.strategy.tensor_parallel_size", "1"],
    }[kind]
    run_dir = Path(os.environ.get("GPU_CHECK_RUN_DIR", tempfile.gettempdir())) / f"gpu_check_{name}"
    cli_mod.fit_main([
        "fit", "--config", str(ROOT / config), "--trainer.accelerator", "gpu", *strategy,
        "--mlflow.enabled", "false", "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_checkpointing", "false", "--run_dir", str(run_dir),
        "--data.num_envs", str(num_envs), "--data.rollout_steps", str(rollout_steps),
        "--data.total_frames", str(fpi * (iterations + 1)),
        "--data.num_threads", str(max(1, cores // max(world, 1) // 2)),
    ], extra_callbacks=[probe])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phases", default=",".join(PHASES), help=f"comma list of {', '.join(PHASES)}")
    p.add_argument("--phase", default=None, help=argparse.SUPPRESS)  # internal: run one phase here
    p.add_argument("--iterations", type=int, default=2, help="timed iterations per phase (after 1 warm-up)")
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--rollout-steps", type=int, default=256)
    p.add_argument("--phase-timeout", type=float, default=150.0, help="seconds before a phase is stopped")
    args = p.parse_args(argv)
    reason = no_gpu_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 3
    if args.phase:
        run_phase(args.phase, args.iterations, args.num_envs, args.rollout_steps)
        return 0

    import torch

    from ppo_lightning.core.hardware import machine_info, machine_line

    names = [x.strip() for x in args.phases.split(",") if x.strip()]
    unknown = [x for x in names if x not in PHASES]
    if unknown:
        p.error(f"unknown phases {unknown}; known: {list(PHASES)}")
    print(machine_line(), f"| {torch.cuda.device_count()} GPU(s)", flush=True)
    results, ok, t_start = {}, True, time.perf_counter()
    for name in names:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--phase", name, "--iterations", str(args.iterations),
               "--num-envs", str(args.num_envs), "--rollout-steps", str(args.rollout_steps)]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.phase_timeout)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
            if proc.returncode or not lines:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
                results[name] = {"error": f"exit {proc.returncode}: {tail[0][:300]}"}
            else:
                results[name] = json.loads(lines[-1][len(MARK):])
        except subprocess.TimeoutExpired:
            results[name] = {"error": f"timed out after {args.phase_timeout:.0f} s"}
        results[name]["phase_s"] = round(time.perf_counter() - t0, 1)
        r = results[name]
        if "error" in r:
            ok = False
            print(f"{name:9s} FAILED ({r['error']})", flush=True)
        else:
            ok &= r["params_agree"]
            print(f"{name:9s} {r['gpus']} GPU(s) {r['strategy']:22s} {r['fps']:9.1f} frames/s  iteration "
                  f"{r['iteration_s']:.2f} s (rollout {r['rollout_s']:.2f})  peak GPU memory "
                  f"{r['peak_gpu_memory_gib']:.2f} GiB  ranks' parameters agree: {r['params_agree']}  "
                  f"[{r['phase_s']:.0f} s]", flush=True)
    summary = {"ok": ok, "total_s": round(time.perf_counter() - t_start, 1), "phases": results,
               "machine": machine_info()}
    print(json.dumps(summary))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
