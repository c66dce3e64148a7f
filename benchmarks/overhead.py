"""Where the CartPole wall time goes: framework overhead measured side by side in one process.

1. One gradient step through Lightning's Trainer versus the same loss, minibatches, fused Adam,
   gradient clipping and EWMA update in a plain PyTorch loop.
2. One batched env step through TorchRL's Collector (policy included) versus the policy alone and
   versus a raw gymnasium vector env.

    python benchmarks/overhead.py [--iterations 6] [--epochs 20]

The last line is one JSON object with the per-step milliseconds and the ratios.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import gymnasium as gym
import lightning.pytorch as pl
import numpy as np
import torch

from ppo_lightning.training.callbacks import quiet_library_notices
from ppo_lightning.data.datamodule import RolloutDataModule
from ppo_lightning.training.module import PPOLightningModule
from ppo_lightning.algos.proximal import ProximalPolicyEWMA


def lightning_step_ms(iterations: int, epochs: int) -> tuple[float, PPOLightningModule, RolloutDataModule]:
    dm = RolloutDataModule(total_frames=256 * iterations, seed=1, num_minibatches=8, update_epochs=epochs)
    model = PPOLightningModule(dm.observation_space, dm.action_space, lr=2e-3, decoupled=True, proximal_com=32.0)
    timer = _FitTimer()
    quiet_library_notices()  # Lightning's litlogger tip
    trainer = pl.Trainer(max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         gradient_clip_val=0.5, enable_model_summary=False, callbacks=[timer])
    trainer.fit(model, dm)
    return 1e3 * timer.seconds / trainer.global_step, model, dm


class _FitTimer(pl.Callback):
    """Training-loop time only: from on_train_start (envs built) to on_train_end."""

    def on_train_start(self, trainer, pl_module):
        self.t0 = time.perf_counter()

    def on_train_end(self, trainer, pl_module):
        self.seconds = time.perf_counter() - self.t0


def plain_step_ms(model: PPOLightningModule, dm: RolloutDataModule, iterations: int) -> float:
    dm.total_frames += dm.frames_per_iteration * iterations
    source = dm.make_source(model.network)
    opt = torch.optim.Adam(model.network.parameters(), lr=2e-3, eps=1e-5, fused=True)
    ewma = ProximalPolicyEWMA(32.0)
    ewma.reset(model.network)
    model.proximal_source = ewma
    steps, t0 = 0, time.perf_counter()
    for _ in range(iterations):
        for batch in source:  # collection + GAE included, as in the Lightning figure
            out = model.loss_module(model.add_proximal(batch))
            loss = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.network.parameters(), 0.5)
            opt.step()
            ewma.update()
            steps += 1
    total = time.perf_counter() - t0
    source.collector.shutdown()
    return 1e3 * total / steps


def env_step_ms(model: PPOLightningModule, dm: RolloutDataModule, rollouts: int = 20) -> dict[str, float]:
    source = dm.make_source(model.network)
    next(source._iterator)
    t0 = time.perf_counter()
    for _ in range(rollouts):
        next(source._iterator)
    collector = 1e3 * (time.perf_counter() - t0) / (rollouts * dm.rollout_steps)
    td = source.env.reset()
    with torch.no_grad():
        t0 = time.perf_counter()
        for _ in range(500):
            source.policy(td)
        policy = 1e3 * (time.perf_counter() - t0) / 500
    source.collector.shutdown()
    venv = gym.make_vec("CartPole-v1", num_envs=dm.num_envs, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    venv.reset(seed=0)
    actions = np.zeros(dm.num_envs, dtype=np.int64)
    t0 = time.perf_counter()
    for _ in range(2000):
        venv.step(actions)
    raw = 1e3 * (time.perf_counter() - t0) / 2000
    return {"collector_step_ms": collector, "policy_ms": policy, "raw_env_step_ms": raw}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args(argv)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    lit, model, dm = lightning_step_ms(args.iterations, args.epochs)
    plain = plain_step_ms(model, dm, args.iterations)
    env = env_step_ms(model, dm)
    print(f"gradient step (incl. its share of collection): Lightning {lit:.2f} ms, plain PyTorch loop "
          f"{plain:.2f} ms -> Lightning overhead x{lit / plain:.2f}")
    print(f"batched env step ({dm.num_envs} CartPoles): TorchRL collector {env['collector_step_ms']:.2f} ms "
          f"(policy alone {env['policy_ms']:.2f} ms), raw gymnasium vector env {env['raw_env_step_ms']:.2f} ms")
    print(json.dumps({"lightning_step_ms": round(lit, 3), "plain_step_ms": round(plain, 3),
                      "lightning_ratio": round(lit / plain, 3),
                      **{k: round(v, 3) for k, v in env.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
