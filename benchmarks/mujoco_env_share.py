"""The MuJoCo env step's share of a Hopper group's time, and what envpool would change (issue 62, item 6).

    python benchmarks/mujoco_env_share.py [--members 16] [--iterations 1] [--envpool-path DIR]

1. A group of ``--members`` seeds of ``mujoco/ppo_hopper`` (4 envs x 512 steps, 10 epochs x 32 minibatches of
   64 per member) trains ``--iterations`` iterations in one thread; the CPU time (``time.process_time``) of the
   whole fit and of the members' gymnasium env steps and resets (`ppo_lightning.data.lockstep.VectorGames`,
   timed from outside) gives the env's share.
2. One thread, random actions, 16 Hopper-v5 envs: CPU time per env step of gymnasium's ``SyncVectorEnv`` and,
   where importable (``--envpool-path``: a folder with envpool 1.2.5 and its asset packages, e.g. ``pip install
   --no-deps --target DIR envpool==1.2.5 envpool-assets envpool-assets-mujoco-large dm-env optree``), of
   envpool's ``make_gymnasium("Hopper-v5", num_threads=1)``.
3. The group's member-frames per core-second with envpool's step in place of gymnasium's, by Amdahl's law
   (``1 / ((1 - share) + share * envpool_us / gymnasium_us)`` times gymnasium's) and measured: the same group
   with ``data.env_kwargs: {backend: envpool}`` (`ppo_lightning.envs.envpool_env`). Issue 62's bar for
   offering envpool as a backend is 1.5x.

Prints one JSON line per part. CPU times are of this process only; on a loaded machine they are what one
core gives it (read the load with ``uptime``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def group_share(members: int, iterations: int, backend: str = "gymnasium") -> dict:
    import lightning.pytorch as pl
    import torch

    sys.path.insert(0, ROOT)
    from ppo_lightning.data import lockstep
    from ppo_lightning.data.datamodule import RolloutDataModule
    from ppo_lightning.training.module import PPOLightningModule

    torch.set_num_threads(1)
    spent = {"env_s": 0.0}
    if backend == "envpool":
        from ppo_lightning.envs.envpool_env import EnvpoolTorchEnv as games
    else:
        games = lockstep.VectorGames
    for name in ("step_games", "reset_games"):
        original = getattr(games, name)

        def timed(self, *args, _original=original, **kwargs):
            t0 = time.process_time()
            try:
                return _original(self, *args, **kwargs)
            finally:
                spent["env_s"] += time.process_time() - t0

        setattr(games, name, timed)
    frames = 2048 * iterations
    dm = RolloutDataModule(env_id="Hopper-v5", num_envs=4, rollout_steps=512, num_minibatches=32, update_epochs=10,
                           total_frames=frames, seed=1, num_seeds=members, num_threads=1, normalize_reward=True,
                           env_kwargs={"backend": backend})
    model = PPOLightningModule(dm.observation_space, dm.action_space, seeds=dm.seeds, lr=3e-4, lr_schedule="linear",
                               value_clip_eps=0.2, entropy_coef=0.0,
                               network={"name": "mlp", "hidden_sizes": [64, 64], "activation": "tanh",
                                        "normalize_observation": True})
    trainer = pl.Trainer(max_epochs=-1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, gradient_clip_val=0.5)
    spent["env_s"] = 0.0
    t0 = time.process_time()
    trainer.fit(model, datamodule=dm)
    total = time.process_time() - t0
    member_frames = members * frames
    return {"part": "group", "backend": backend, "members": members, "member_frames": member_frames, "cpu_s": round(total, 2),
            "env_cpu_s": round(spent["env_s"], 2), "env_share": round(spent["env_s"] / total, 3),
            "member_frames_per_core_s": round(member_frames / total, 1)}


def step_cost(kind: str, envs: int = 16, steps: int = 400) -> dict:
    rng = np.random.default_rng(0)
    if kind == "gymnasium":
        import gymnasium as gym

        vec = gym.vector.SyncVectorEnv([lambda: gym.make("Hopper-v5") for _ in range(envs)],
                                       autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    else:
        import envpool

        vec = envpool.make_gymnasium("Hopper-v5", num_envs=envs, num_threads=1, seed=0)
    vec.reset(seed=0) if kind == "gymnasium" else vec.reset()
    actions = rng.uniform(-1, 1, (steps, envs, 3))
    for a in actions[:20]:
        vec.step(a)
    t0 = time.process_time()
    for a in actions:
        vec.step(a)
    us = (time.process_time() - t0) / (steps * envs) * 1e6
    return {"part": "step", "backend": kind, "envs": envs, "cpu_us_per_env_step": round(us, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--envpool-path", default=None)
    parser.add_argument("--skip-group", action="store_true")
    a = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(json.dumps({"load_1min": os.getloadavg()[0], "cpus": os.cpu_count()}), flush=True)
    gym_row = step_cost("gymnasium")
    print(json.dumps(gym_row), flush=True)
    pool_row = None
    if a.envpool_path:
        sys.path.insert(0, a.envpool_path)
    try:
        pool_row = step_cost("envpool")
        print(json.dumps(pool_row), flush=True)
    except ImportError as err:
        print(json.dumps({"part": "step", "backend": "envpool", "error": str(err)}), flush=True)
    if a.skip_group:
        return
    group = group_share(a.members, a.iterations)
    print(json.dumps(group), flush=True)
    if pool_row:
        ratio = pool_row["cpu_us_per_env_step"] / gym_row["cpu_us_per_env_step"]
        share = group["env_share"]
        print(json.dumps({"part": "envpool_estimate", "step_ratio": round(ratio, 3),
                          "group_speedup": round(1 / ((1 - share) + share * ratio), 3), "bar": 1.5}), flush=True)
        pooled = group_share(a.members, a.iterations, "envpool")
        print(json.dumps(pooled), flush=True)
        print(json.dumps({"part": "envpool_measured", "group_speedup": round(
            pooled["member_frames_per_core_s"] / group["member_frames_per_core_s"], 3), "bar": 1.5}), flush=True)


if __name__ == "__main__":
    main()
