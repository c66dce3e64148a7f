"""The random policy's return on the PPO paper's Table 1 tasks (gymnasium v5): the 0 of the Table 1 score.

    python experiments/mujoco_random_returns.py [--episodes 100] [--out experiments/results/mujoco/random_returns.csv]

Per task: mean undiscounted return of ``--episodes`` episodes of uniformly random actions (the action
space's own ``sample()``, seeded), each episode to its natural end or gymnasium's time limit (1000 steps;
Reacher 50, InvertedPendulum / InvertedDoublePendulum 1000). Writes ``env,return,episodes,std`` rows.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import gymnasium as gym
import numpy as np

TASKS = ("HalfCheetah-v5", "Hopper-v5", "InvertedDoublePendulum-v5", "InvertedPendulum-v5", "Reacher-v5", "Swimmer-v5",
         "Walker2d-v5")


def random_return(env_id: str, episodes: int, seed: int = 0) -> tuple[float, float]:
    env = gym.make(env_id)
    env.action_space.seed(seed)
    returns = []
    for k in range(episodes):
        env.reset(seed=seed + k)
        total, done = 0.0, False
        while not done:
            _, r, term, trunc, _ = env.step(env.action_space.sample())
            total += float(r)
            done = term or trunc
        returns.append(total)
    env.close()
    return float(np.mean(returns)), float(np.std(returns))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--out", type=Path, default=Path("experiments/results/mujoco/random_returns.csv"))
    a = p.parse_args()
    rows = []
    for env_id in TASKS:
        mean, std = random_return(env_id, a.episodes)
        rows.append({"env": env_id, "return": round(mean, 3), "episodes": a.episodes, "std": round(std, 3)})
        print(f"{env_id}: {mean:.3f} (std {std:.3f}, {a.episodes} episodes)", flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["env", "return", "episodes", "std"])
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
