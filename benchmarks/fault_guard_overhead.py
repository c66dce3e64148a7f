"""Cost of the fault guards (issue 13) on the hot path, in CPU time of this process (robust to a
shared, loaded machine), round-robin:

- one CartPole PPO-EWMA gradient step as the project's config runs it (minibatch 32, MLP 64x64:
  loss, backward, fused Adam), without and with the `NumericalGuard` checks (minibatch inputs, loss
  and gradients before the step, parameters after it);
- one batched env step of 8 CartPole sub-envs, gymnasium's ``SyncVectorEnv`` with and without
  `GuardedEnv` around each sub-env (shape and finiteness checks, the SIGALRM timer).

    python benchmarks/fault_guard_overhead.py [--reps 2000] [--rounds 5]

Prints the median per-call CPU time of each variant and the overheads, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_step():
    from tensordict import TensorDict

    from ppo_lightning.data.datamodule import RolloutDataModule
    from ppo_lightning.core.faults import NumericalGuard
    from ppo_lightning.training.module import PPOLightningModule

    dm = RolloutDataModule(num_envs=8, rollout_steps=32, num_minibatches=8)
    model = PPOLightningModule(dm.observation_space, dm.action_space,
                               network={"name": "mlp", "hidden_sizes": [64, 64], "activation": "tanh"},
                               decoupled=True, lr=0.002)
    opt = model.configure_optimizers()
    n = 32
    obs = torch.randn(n, 4)
    with torch.no_grad():
        logits = model.network.policy(obs)[0]
    batch = TensorDict({"observation": obs, "action": torch.randint(0, 2, (n,)), "logits": logits,
                        "action_log_prob": torch.log_softmax(logits, -1)[:, 0], "state_value": torch.randn(n, 1),
                        "advantage": torch.randn(n), "value_target": torch.randn(n, 1)}, batch_size=[n])
    guard = NumericalGuard(100)

    def step(guarded: bool) -> None:
        if guarded:
            guard.check_batch(batch)
        opt.zero_grad()
        loss, _ = model.loss_and_stats(batch)
        loss.backward()
        if guarded:
            guard.after_backward(model, opt, loss)
        opt.step()
        if guarded:
            guard.check_parameters(model, opt)

    return step


def make_env_step():
    import gymnasium as gym
    import numpy as np

    from ppo_lightning.core.faults import make_guarded_env_class

    guarded_cls = make_guarded_env_class()

    def vec(guarded: bool):
        fns = [(lambda i=i: guarded_cls(gym.make("CartPole-v1"), "CartPole-v1", i, 60.0)) if guarded
               else (lambda: gym.make("CartPole-v1")) for i in range(8)]
        v = gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        v.reset(seed=0)
        return v

    envs = {True: vec(True), False: vec(False)}
    actions = np.zeros(8, dtype=np.int64)

    def step(guarded: bool) -> None:
        envs[guarded].step(actions)

    return step


def cpu_per_call(fn, guarded: bool, reps: int) -> float:
    t0 = time.process_time()
    for _ in range(reps):
        fn(guarded)
    return (time.process_time() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    benches = {"train_step": make_step(), "env_step": make_env_step()}
    res = {f"{b}_{v}": [] for b in benches for v in ("off", "on")}
    for _ in range(args.rounds):
        for name, fn in benches.items():
            for guarded in (False, True):
                res[f"{name}_{'on' if guarded else 'off'}"].append(cpu_per_call(fn, guarded, args.reps))
    med = {k: statistics.median(v) * 1e6 for k, v in res.items()}
    out = {}
    for name in benches:
        off, on = med[f"{name}_off"], med[f"{name}_on"]
        out[name] = {"off_us": round(off, 1), "on_us": round(on, 1), "overhead": round(on / off - 1, 4)}
        print(f"{name}: {off:.1f} us -> {on:.1f} us per call with the guards (+{100 * (on / off - 1):.1f}%)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
