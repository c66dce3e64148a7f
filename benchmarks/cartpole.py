"""CartPole-v1 learning speed: frames and wall seconds until the mean return of the last 20
episodes reaches 475, checked after each iteration; 3 seeds each of PPO, PPO-EWMA, PPG and PPG-EWMA
with the project's configs (ppo_lightning/configs/cartpole/*.yaml).

Wall time runs from the start of training (Lightning's on_train_start, after the env and collector
are built) to the end of the iteration where the criterion first holds. The per-run split of that
time into rollout / GAE / update (forward, backward, Adam, callbacks incl. the EWMA) comes from the
per-iteration timings the data module reports.

    python benchmarks/cartpole.py [--seeds 1 2 3] [--algos ppo ppo_ewma ppg ppg_ewma]

The machine (CPU model, cores, ISA flags, torch threads) is printed first; the last line printed is
one JSON object with the medians and ``"machine"`` (`ppo_lightning.core.hardware.machine_info`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import lightning.pytorch as pl

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"ppo": "ppo_lightning/configs/cartpole/ppo.yaml", "ppo_ewma": "ppo_lightning/configs/cartpole/ppo_ewma.yaml",
           "ppg": "ppo_lightning/configs/cartpole/ppg.yaml", "ppg_ewma": "ppo_lightning/configs/cartpole/ppg_ewma.yaml"}
THRESHOLD = 475.0


class Crossing(pl.Callback):
    """Records frames and wall time when the criterion first holds, and the time split until then."""

    def __init__(self) -> None:
        self.t0 = None
        self.result = None
        self.split = {"rollout": 0.0, "gae": 0.0, "update": 0.0}
        self.steps = 0

    def on_train_start(self, trainer, pl_module) -> None:
        self.t0 = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self.result is not None:
            return
        dm = trainer.datamodule
        m = dm.iteration_metrics()
        self.split["rollout"] += m.get("time/rollout_s", 0.0)
        self.split["gae"] += m.get("time/gae_s", 0.0)
        self.split["update"] += m.get("time/update_s", 0.0)
        self.steps = trainer.global_step
        if dm.states[0].episodes.mean_return(20) >= THRESHOLD:
            self.result = {"frames_to_475": dm.frames, "wall_s_to_475": time.perf_counter() - self.t0}


def run(algo: str, seed: int, tmp: Path, extra: list[str] = ()) -> dict:
    """One training run of the algorithm's config (plus CLI overrides ``extra``) until 475."""
    from ppo_lightning.run.builder import fit_main

    crossing = Crossing()
    args = [
        "fit", "--config", str(ROOT / CONFIGS[algo]), "--seed_everything", str(seed), "--data.seed", str(seed),
        "--mlflow.enabled", "false", "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_checkpointing", "false", "--run_dir", str(tmp / f"{algo}-{seed}"), *extra,
    ]
    fit_main(args, extra_callbacks=[crossing])  # the crossing recorder rides along
    out = crossing.result or {"frames_to_475": None, "wall_s_to_475": None}
    out["split_s"] = {k: round(v, 2) for k, v in crossing.split.items()}
    out["grad_steps"] = crossing.steps
    return out


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--algos", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    args = parser.parse_args(argv)
    import logging
    import tempfile

    from ppo_lightning.core.hardware import machine_info, machine_line

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    print(machine_line(machine_info()), flush=True)
    summary = {}
    with tempfile.TemporaryDirectory() as tmp:
        for algo in args.algos:
            rows = []
            for seed in args.seeds:
                r = run(algo, seed, Path(tmp))
                rows.append(r)
                per_step = 1000 * r["split_s"]["update"] / max(r["grad_steps"], 1)
                print(f"{algo:9s} seed {seed}: frames to 475 = {r['frames_to_475']}, wall s to 475 = "
                      f"{r['wall_s_to_475'] and round(r['wall_s_to_475'], 2)}; split s {r['split_s']}, "
                      f"{r['grad_steps']} gradient steps ({per_step:.2f} ms each)", flush=True)
            summary[algo] = {
                "frames_to_475": median([r["frames_to_475"] for r in rows]),
                "wall_s_to_475": median([r["wall_s_to_475"] for r in rows]),
            }
            if summary[algo]["wall_s_to_475"] is not None:
                summary[algo]["wall_s_to_475"] = round(summary[algo]["wall_s_to_475"], 2)
    summary["machine"] = machine_info()  # after the runs: torch threads as the configs set them
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
