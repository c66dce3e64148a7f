"""sb3-contrib's RecurrentPPO with RL Zoo's ``CartPoleNoVel-v1`` settings on ``ppo_lightning/CartPoleNoVel-v1``:
the peer side of `benchmarks/recurrent_cartpole.py`, run in a Python that has sb3-contrib (not the
project's venv):

    /path/to/sb3venv/bin/python benchmarks/recurrent_cartpole_sb3.py --seed 1 [--frames 100000] [--stop-at-475]

RL Zoo's ``hyperparams/ppo_lstm.yml`` entry for ``CartPoleNoVel-v1``: 8 envs x 32 steps, batch 256,
20 epochs, gamma 0.98, lambda 0.8, no entropy bonus, learning rate and clip range linear from 1e-3
and 0.2 to 0 over the run (``lin_0.001``, ``lin_0.2``), 100k frames, ``MlpLstmPolicy`` with
``ortho_init=False``, ReLU, an LSTM of 64 for the actor and one for the critic, ``net_arch`` pi [64]
and vf [64], ``VecNormalize`` of the observations (not the rewards); sb3's other defaults (value
coefficient 0.5, gradient norm 0.5, advantage normalization). The env is the package's (the cart
position and the pole angle, 2 entries) where RL Zoo's zeroes the two velocities of 4 entries: the
same information; this module imports only ``ppo_lightning.envs.partial`` from the package
(gymnasium and numpy), so it runs where the package's dependencies are not installed.

Criterion, as ``benchmarks/recurrent_cartpole.py`` applies it to ours: after each rollout (256
frames), the mean return of the last 20 finished training episodes (fewer while fewer have
finished). Prints one JSON object: ``frames_to_475`` (None: not reached), ``wall_s_to_475``,
``frames``, ``wall_s``, ``cpu_s`` (this process's CPU time), ``final_mean20``, ``curve``
([frames, mean20] after each rollout) and the versions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

THRESHOLD = 475.0
ROOT = Path(__file__).resolve().parents[1]


def linear(initial: float):
    """RL Zoo's ``lin_<x>``: ``initial`` times the fraction of the run still to go."""
    return lambda progress_remaining: progress_remaining * initial


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--frames", type=int, default=100_000, help="the run's length (RL Zoo: 100k); the schedules span it")
    parser.add_argument("--stop-at-475", action="store_true", help="stop after the rollout where the criterion first holds")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(ROOT))
    import sb3_contrib
    import stable_baselines3
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize
    from torch import nn

    from ppo_lightning.envs.partial import CARTPOLE_NOVEL_ID, register

    register()

    class Track(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.returns: list[float] = []
            self.curve: list[list[float]] = []
            self.t0 = time.perf_counter()
            self.crossing = None
            self.stop = False

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(float(info["episode"]["r"]))
            return not self.stop

        def _on_rollout_end(self) -> None:
            if not self.returns:
                return
            recent = self.returns[-20:]
            mean20 = sum(recent) / len(recent)
            self.curve.append([self.num_timesteps, round(mean20, 2)])
            if self.crossing is None and mean20 >= THRESHOLD:
                self.crossing = {"frames_to_475": self.num_timesteps, "wall_s_to_475": time.perf_counter() - self.t0,
                                 "cpu_s_to_475": time.process_time() - cpu0}
                self.stop = args.stop_at_475

    env = make_vec_env(CARTPOLE_NOVEL_ID, n_envs=8, seed=args.seed)
    env = VecNormalize(env, norm_obs=True, norm_reward=False)
    policy_kwargs = dict(ortho_init=False, activation_fn=nn.ReLU, lstm_hidden_size=64, enable_critic_lstm=True,
                         net_arch=dict(pi=[64], vf=[64]))
    model = RecurrentPPO("MlpLstmPolicy", env, n_steps=32, batch_size=256, n_epochs=20, gamma=0.98, gae_lambda=0.8,
                         ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2), policy_kwargs=policy_kwargs,
                         seed=args.seed, device="cpu", verbose=0)
    track = Track()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    track.t0 = t0
    model.learn(total_timesteps=args.frames, callback=track)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    recent = track.returns[-20:]
    out = {"impl": "sb3-contrib RecurrentPPO", "seed": args.seed, "frames": int(model.num_timesteps),
           "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "episodes": len(track.returns),
           "final_mean20": round(sum(recent) / len(recent), 2) if recent else None,
           **(track.crossing or {"frames_to_475": None, "wall_s_to_475": None, "cpu_s_to_475": None}),
           "curve": track.curve, "torch_threads": torch.get_num_threads(),
           "versions": {"sb3_contrib": sb3_contrib.__version__, "stable_baselines3": stable_baselines3.__version__,
                        "torch": torch.__version__}}
    for key in ("wall_s_to_475", "cpu_s_to_475"):
        if out[key] is not None:
            out[key] = round(out[key], 2)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
