"""Cost of the fault guards (issue 13) on the hot path: CartPole PPO-EWMA (the project's config, fixed
number of iterations), with the numerical guard and env guard on vs off, round-robin in one process.

    python benchmarks/fault_guard_overhead.py [--iterations 30] [--rounds 3]

"off" replaces the NumericalGuard's per-step checks by no-ops and GuardedEnv by a pass-through
gymnasium Wrapper. Prints the median iteration time (8 envs x 32 steps, 40 optimizer steps) of each
variant over the rounds, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run(iterations: int, guarded: bool) -> dict[str, float]:
    from ppo_lightning import faults

    saved = (faults.NumericalGuard.check_batch, faults.NumericalGuard.after_backward,
             faults.NumericalGuard.check_parameters, faults.make_guarded_env_class)
    if not guarded:
        faults.NumericalGuard.check_batch = lambda self, batch, where="": None
        faults.NumericalGuard.after_backward = lambda self, module, optimizer, loss: True
        faults.NumericalGuard.check_parameters = lambda self, module, optimizer: None
        import gymnasium as gym

        faults.make_guarded_env_class = lambda: (lambda env, env_id, index, timeout_s: gym.Wrapper(env))
        import ppo_lightning.envs.gymnasium_env as ge

        ge.make_guarded_env_class = faults.make_guarded_env_class
    times: list[float] = []

    class Timer(pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            times.append(trainer.datamodule.iteration_metrics()["time/iteration_s"])

    try:
        from ppo_lightning.data import RolloutDataModule
        from ppo_lightning.module import PPOLightningModule

        pl.seed_everything(1)
        dm = RolloutDataModule(num_envs=8, rollout_steps=32, num_minibatches=8, update_epochs=5,
                               total_frames=iterations * 256)
        model = PPOLightningModule(dm.observation_space, dm.action_space,
                                   network={"name": "mlp", "hidden_sizes": [64, 64], "activation": "tanh"},
                                   decoupled=True, proximal_com=24.0, lr=0.002, value_coef=1.0, entropy_coef=0.0)
        trainer = pl.Trainer(max_epochs=-1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                             enable_checkpointing=False, gradient_clip_val=0.5, callbacks=[Timer()])
        trainer.fit(model, dm)
    finally:
        (faults.NumericalGuard.check_batch, faults.NumericalGuard.after_backward,
         faults.NumericalGuard.check_parameters, faults.make_guarded_env_class) = saved
        import ppo_lightning.envs.gymnasium_env as ge

        ge.make_guarded_env_class = saved[3]
    steady = times[2:]  # skip start-up iterations
    return {"iteration_s": statistics.median(steady), "step_ms": 1e3 * statistics.median(steady) / 40}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    res: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(args.rounds):
        for variant in ("on", "off"):
            res[variant].append(run(args.iterations, variant == "on")["iteration_s"])
    med = {k: statistics.median(v) for k, v in res.items()}
    for k in ("on", "off"):
        print(f"guards {k:3s}: median iteration {med[k] * 1e3:.1f} ms (rounds: {', '.join(f'{x * 1e3:.1f}' for x in res[k])})")
    print(json.dumps({"iteration_ms_on": med["on"] * 1e3, "iteration_ms_off": med["off"] * 1e3,
                      "overhead": med["on"] / med["off"] - 1}))


if __name__ == "__main__":
    main()
