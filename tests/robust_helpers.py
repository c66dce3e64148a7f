"""Helpers for tests/test_robust.py that subprocesses import by class path (PYTHONPATH includes tests/):
callbacks that SIGKILL their own process at a chosen moment, one that dumps each rank's parameters,
and deliberately faulty gymnasium environments."""

from __future__ import annotations

import os
import signal
import time

import gymnasium as gym
import lightning.pytorch as pl
import numpy as np
import torch
from gymnasium.envs.classic_control import CartPoleEnv


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _KillOnPickle:
    """Put into a checkpoint: the process dies while ``torch.save`` is writing the file."""

    def __reduce__(self):
        _die()


class KillAt(pl.Callback):
    """SIGKILL this process at a chosen moment of iteration ``iteration`` (1-based):

    ``collect``: inside the 5th env step of that iteration's collection; ``update``: after the
    ``step``-th optimizer step of that iteration; ``checkpoint``: while writing the ``write``-th
    checkpoint file of that iteration (ModelCheckpoint writes iteration-N.ckpt, then last.ckpt).
    """

    rank: int | None = None  # the global rank it acts on (None: every rank)

    def __init__(self, phase: str, iteration: int, step: int = 1, write: int = 2) -> None:
        self.phase, self.iteration, self.step, self.write = phase, iteration, step, write
        self._steps = self._writes = 0

    def _act(self) -> None:
        """What happens at the chosen moment (`SignalAt` sends a signal instead)."""
        _die()

    def _here(self, trainer) -> bool:
        return self.rank is None or trainer.global_rank == self.rank

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        dm = trainer.datamodule
        if self.phase != "collect" or dm.iteration + 1 != self.iteration or not self._here(trainer):
            return
        sub = dm.source.env.base_env._env.envs[0]
        step, calls = sub.step, [0]

        def acting_step(action):
            calls[0] += 1
            if calls[0] == 5:
                self._act()
            return step(action)

        sub.step = acting_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.phase == "update" and trainer.datamodule.iteration == self.iteration and self._here(trainer):
            self._steps += 1
            if self._steps == self.step:
                self._act()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if self.phase == "checkpoint" and trainer.datamodule.iteration == self.iteration:
            self._writes += 1
            if self._writes == self.write:
                checkpoint["die_while_writing"] = _KillOnPickle()


class DumpParams(pl.Callback):
    """Each rank writes its network parameters (and data state) to ``<dirpath>/rank<r>.pt`` at the end."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath = dirpath

    def on_train_end(self, trainer, pl_module) -> None:
        os.makedirs(self.dirpath, exist_ok=True)
        dm = trainer.datamodule
        torch.save({"params": {k: v.detach().clone() for k, v in pl_module.network.state_dict().items()},
                    "adv": dm.states[0].advantage_moments.state_dict(),
                    "reward": dm.states[0].reward_normalizer.state_dict() if dm.states[0].reward_normalizer is not None else None,
                    "kl_beta": float(pl_module.loss_module.kl_beta),
                    "episodes_count": dm.states[0].episodes.count,
                    "episodes_logged": float(trainer.callback_metrics.get("episodes", torch.tensor(-1.0)))},
                   os.path.join(self.dirpath, f"rank{trainer.global_rank}.pt"))


# ---------------------------------------------------------------------------- faulty environments


class FaultyCartPole(CartPoleEnv):
    """CartPole that misbehaves from its ``after``-th step on (counted over resets), in the sub-env
    seeded ``fault_seed`` only (a vector env seeds sub-env i with ``seed + i``)."""

    def __init__(self, fault: str = "raise", after: int = 20, fault_seed: int = 1, hang_s: float = 30.0,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.fault, self.after, self.fault_seed, self.hang_s = fault, after, fault_seed, hang_s
        self.steps = 0

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self.steps += 1
        one_shot = self.fault in ("nan_obs", "nan_reward")  # numerical faults: once; the others persist
        if self.np_random_seed == self.fault_seed and (self.steps == self.after if one_shot else self.steps >= self.after):
            if self.fault == "raise":
                raise RuntimeError("simulator crashed")
            if self.fault == "hang":
                time.sleep(self.hang_s)
            if self.fault == "shape":
                obs = np.concatenate([obs, obs])
            if self.fault == "nan_obs":
                obs = obs * np.nan
            if self.fault == "nan_reward":
                reward = float("nan")
        return obs, reward, terminated, truncated, info


def register_faulty_envs() -> None:
    if "FaultyCartPole-v0" not in gym.registry:
        gym.register("FaultyCartPole-v0", entry_point=FaultyCartPole, max_episode_steps=500)


register_faulty_envs()
