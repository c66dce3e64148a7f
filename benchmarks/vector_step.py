"""A gymnasium member's env step: ``SyncVectorEnv.step`` against `VectorGames.step_games` (CPU time per call).

    python benchmarks/vector_step.py                    # Hopper-v5, 1 env, 3 rounds of 3,000 steps each way

`ppo_lightning.data.lockstep.VectorGames.step_games` steps the sub-envs of a DISABLED-autoreset vector env
itself, leaving out the vector env's info merge, deep copy and action iterator. Both sides step the same
env (built by `ppo_lightning.envs.make_env`, with the fault guard), interleaved round by round, with uniform
random actions and partial resets where episodes end. Prints the machine, one line per round, then
one JSON line (the rounds and the median saving).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="Hopper-v5")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    from ppo_lightning.core.hardware import machine_line
    from ppo_lightning.data.lockstep import vector_games
    from ppo_lightning.envs import make_env

    env = make_env(args.env, 1, 0, {})
    env.reset()
    games = vector_games(env)
    vec, rng = games.vec, np.random.default_rng(0)
    low, high = np.clip(vec.single_action_space.low, -1, 1), np.clip(vec.single_action_space.high, -1, 1)

    def through_vector_env(actions):  # what step_games did before: the vector env's own step
        obs, reward, terminated, truncated, _ = vec.step(actions)
        games._obs = np.asarray(obs).astype(games.obs_dtype, copy=False)
        return reward.astype(np.float32), np.asarray(terminated, dtype=bool), np.asarray(truncated, dtype=bool)

    def per_call_us(step) -> float:
        t0 = time.process_time()
        for _ in range(args.steps):
            _, terminated, truncated = step(rng.uniform(low, high, size=(1, *low.shape)).astype(np.float32))
            if terminated[0] or truncated[0]:
                games.reset_games(terminated | truncated)
        return (time.process_time() - t0) / args.steps * 1e6

    print(machine_line(), flush=True)
    rounds = []
    for r in range(args.rounds):
        a, b = per_call_us(through_vector_env), per_call_us(games.step_games)
        rounds.append((a, b))
        print(f"{args.env} round {r}: SyncVectorEnv.step {a:.1f} us, step_games {b:.1f} us per call ({a - b:+.1f} us)",
              flush=True)
    print(json.dumps({"env": args.env, "machine": machine_line(), "rounds_us": rounds,
                      "median_saving_us": statistics.median(a - b for a, b in rounds)}))


if __name__ == "__main__":
    main()
