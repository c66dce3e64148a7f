"""PPO and PPO-EWMA throughput on MinAtar at the base configuration (ppo_lightning/configs/minatar/ppo.yaml).

    python benchmarks/minatar.py                  # Breakout, 3 interleaved rounds of 6 iterations each
    python benchmarks/minatar.py --game seaquest --rounds 2 --iterations 4 --threads 2

Prints the raw env rate (random actions through the TorchRL env), then PPO's and PPO-EWMA's
frames/s measured in alternating rounds (PPO, EWMA, PPO, EWMA, ...: on a shared machine a load
change hits both alike), each the median over rounds of the training rate after the first
iteration, and ends with one JSON line ``{"ppo_fps", "ppo_ewma_fps", ..., "machine": {...}}``.
Target (issue 11): >= 3,000 frames/s for PPO on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# This file is named like the ``minatar`` package: drop its folder from the import path (Python puts
# the script's folder first), or ``import minatar`` would import this script.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))


def machine() -> dict:
    """The CPU (`ppo_lightning.core.hardware.cpu_identity`), Python and the load at the start."""
    from ppo_lightning.core.hardware import cpu_identity

    cpu = cpu_identity()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpu": cpu.model, "cores": cpu.cores, "isa": list(cpu.isa),
            "python": platform.python_version(), "load_avg_1min_at_start": load}


def raw_env_fps(game: str, num_envs: int, steps: int = 200) -> float:

    from ppo_lightning.envs import make_env

    env = make_env(f"minatar:{game}", num_envs, seed=0)
    t0 = time.perf_counter()
    env.rollout(steps, break_when_any_done=False)
    return num_envs * steps / (time.perf_counter() - t0)


def train_fps(game: str, iterations: int, ewma: bool, threads: int, num_envs: int, rollout_steps: int) -> tuple[float, dict]:
    """Frames/s of the training loop after its first iteration, and the mean time split."""
    import lightning.pytorch as pl

    from ppo_lightning.run.builder import fit_main

    class Timer(pl.Callback):
        def __init__(self):
            self.t, self.splits = [], []

        def on_train_epoch_end(self, trainer, pl_module):
            self.t.append((time.perf_counter(), trainer.datamodule.frames))
            m = trainer.callback_metrics
            self.splits.append({k: float(m[k]) for k in ("time/rollout_s", "time/gae_s", "time/update_s") if k in m})

    timer = Timer()
    frames = num_envs * rollout_steps * (iterations + 1)
    args = ["fit", "--config", str(ROOT / "ppo_lightning" / "configs" / "minatar" / ("ppo_ewma.yaml" if ewma else "ppo.yaml")),
            "--data.env_id", f"minatar:{game}", "--data.total_frames", str(frames), "--data.num_threads", str(threads),
            "--data.num_envs", str(num_envs), "--data.rollout_steps", str(rollout_steps),
            "--mlflow.enabled", "false", "--trainer.logger", "false", "--trainer.enable_checkpointing", "false", "--run_dir", "/tmp/minatar_bench"]
    import ppo_lightning.run.builder as cli_mod

    orig = cli_mod.PPOCLI.before_fit

    def before_fit(self):
        orig(self)
        self.trainer.callbacks.append(timer)

    cli_mod.PPOCLI.before_fit = before_fit
    try:
        fit_main(args)
    finally:
        cli_mod.PPOCLI.before_fit = orig
    (t0, f0), (t1, f1) = timer.t[0], timer.t[-1]
    later = timer.splits[1:] or timer.splits
    split = {k.split("/")[1]: round(statistics.mean(s[k] for s in later), 4) for k in later[0]}
    return (f1 - f0) / (t1 - t0), split


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--game", default="breakout")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iterations", type=int, default=6, help="timed iterations per run (after one warm-up)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the config's default: 1)")
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--rollout-steps", type=int, default=64)
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    info = machine()
    print(f"{info['cpu']}, {info['cores']} cores, {'/'.join(info['isa'])}; load average {info['load_avg_1min_at_start']}")
    raw = raw_env_fps(a.game, a.num_envs)
    print(f"raw env ({a.num_envs} x minatar:{a.game}, random actions through TorchRL): {raw:,.0f} frames/s")
    res: dict[str, list[float]] = {"ppo": [], "ppo_ewma": []}
    splits: dict[str, dict] = {}
    for r in range(a.rounds):
        for name in ("ppo", "ppo_ewma"):
            fps, split = train_fps(a.game, a.iterations, name == "ppo_ewma", a.threads, a.num_envs, a.rollout_steps)
            res[name].append(fps)
            splits[name] = split
            print(f"round {r + 1} {name:8s} {fps:8,.0f} frames/s  (per iteration: {split})", flush=True)
    out = {"ppo_fps": round(statistics.median(res["ppo"]), 1), "ppo_ewma_fps": round(statistics.median(res["ppo_ewma"]), 1),
           "ewma_overhead": round(statistics.median(res["ppo"]) / statistics.median(res["ppo_ewma"]) - 1, 4),
           "raw_env_fps": round(raw, 1), "game": a.game, "threads": a.threads, "num_envs": a.num_envs,
           "rollout_steps": a.rollout_steps, "rounds": a.rounds, "iterations": a.iterations, "machine": info}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
