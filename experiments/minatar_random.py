"""R_random per MinAtar game: the mean episode return of a uniform random policy.

    python experiments/minatar_random.py [--games breakout,space_invaders] [--episodes 300] [--out DIR]

MinAtar's defaults (sticky actions 0.1, difficulty ramping, all 6 actions), 32 envs, seed 12345;
writes ``<out>/random_returns.csv`` (default ``experiments/results/minatar``), the file that
`ppo_lightning.envs.minatar_scores.RETURN_RANGES` takes its ``R_random`` constants from.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from common import write_csv

GAMES = ("breakout", "space_invaders", "asterix", "freeway", "seaquest")
OUT = Path(__file__).resolve().parent / "results" / "minatar"


def measure_random(games: list[str], episodes: int, out: Path, seed: int = 12345) -> list[dict]:
    """Mean return of a uniform random policy over ``episodes`` finished episodes per game."""
    import torch

    from ppo_lightning.envs.minatar_env import NUM_ACTIONS, make_minatar_env

    rows = []
    for game in games:
        env = make_minatar_env(game, num_envs=32, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        td = env.reset()
        rets: list[float] = []
        steps = 0
        while len(rets) < episodes:
            td["action"] = torch.randint(0, NUM_ACTIONS, (32,), generator=gen)
            td = env.step(td)
            steps += 32
            done = td["next", "done"].squeeze(-1)
            rets += td["next", "episode_reward"].squeeze(-1)[done].tolist()
            td = env.step_mdp(td)
            if done.any():
                td["_reset"] = done.unsqueeze(-1)
                td = env.reset(td)
        rets = rets[:episodes]
        m, sd = float(np.mean(rets)), float(np.std(rets, ddof=1)) if len(rets) > 1 else 0.0
        rows.append({"game": game, "episodes": len(rets), "mean_return": round(m, 4), "sd": round(sd, 4),
                     "sem": round(sd / math.sqrt(len(rets)), 4), "frames": steps, "seed": seed})
        print(f"  {game:15s} R_random {m:.3f} +- {sd / math.sqrt(len(rets)):.3f} (sem, {len(rets)} episodes)", flush=True)
    write_csv(out / "random_returns.csv", rows)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--games", default=",".join(GAMES))
    p.add_argument("--episodes", type=int, default=300, help="finished episodes per game")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    games = a.games.split(",")
    for g in games:
        if g not in GAMES:
            p.error(f"--games: unknown MinAtar game {g!r}; games: {', '.join(GAMES)}")
    a.out.mkdir(parents=True, exist_ok=True)
    measure_random(games, a.episodes, a.out)


if __name__ == "__main__":
    main()
