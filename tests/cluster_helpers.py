"""Helpers for tests/test_cluster.py that subprocesses import by class path (PYTHONPATH includes tests/):
a callback that sends a real signal to its own process at a chosen moment, and an env that raises on
one data-parallel rank only."""

from __future__ import annotations

import os
import signal

import gymnasium as gym
import lightning.pytorch as pl
from gymnasium.envs.classic_control import CartPoleEnv

from robust_helpers import KillAt  # SignalAt is KillAt's moments with a signal (tests/ is on the path)


class SignalAt(KillAt):
    """Send ``signum`` (a name: "SIGTERM", ...) to this process at a moment of iteration
    ``iteration`` (1-based), on global rank ``rank``: ``collect``: inside the 5th env step of that
    iteration's collection; ``update``: after its ``step``-th optimizer step (`KillAt`'s moments,
    another action)."""

    def __init__(self, signum: str, phase: str, iteration: int, step: int = 1, rank: int = 0) -> None:
        if phase not in ("collect", "update"):
            raise ValueError(f"SignalAt phase must be 'collect' or 'update', got {phase!r}")
        super().__init__(phase, iteration, step)
        self.signum, self.rank = signum, rank

    def _act(self) -> None:
        os.kill(os.getpid(), getattr(signal, self.signum))


class RankFaultyCartPole(CartPoleEnv):
    """CartPole whose sub-envs on one data-parallel rank raise from their ``after``-th step on.
    The rank is read from the env seed: rank r seeds its envs ``seed + 1_000_003 r + i``."""

    def __init__(self, rank: int = 1, after: int = 20, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fault_rank, self.after, self.steps = rank, after, 0

    def step(self, action):
        self.steps += 1
        seed = self.np_random_seed or 0
        if seed // 1_000_003 == self.fault_rank and self.steps >= self.after:
            raise RuntimeError(f"simulator crashed on rank {self.fault_rank}")
        return super().step(action)


if "RankFaultyCartPole-v0" not in gym.registry:
    gym.register("RankFaultyCartPole-v0", entry_point=RankFaultyCartPole, max_episode_steps=500)


class DumpRankState(pl.Callback):
    """Each rank writes, at the end of fit, its full network parameters (gathered when sharded), the
    EWMA proximal weights and resets, and PPG's phase bookkeeping to ``<dirpath>/rank<r>.pt``."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath = dirpath

    def on_train_end(self, trainer, pl_module) -> None:
        import torch

        def full(sd):
            return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in sd.items()}

        prox = pl_module.proximal_source
        phases = pl_module.ppg_phases
        os.makedirs(self.dirpath, exist_ok=True)
        torch.save({"params": full(pl_module.network.state_dict()),
                    "proximal": None if prox is None else full(prox.proximal.state_dict()),
                    "resets": None if prox is None else prox.num_resets,
                    "ewma_updates": None if prox is None else prox.num_updates,
                    "phase": None if phases is None else phases.phase,
                    "phase_iteration": None if phases is None else phases.phase_iteration},
                   os.path.join(self.dirpath, f"rank{trainer.global_rank}.pt"))
