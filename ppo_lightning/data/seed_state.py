"""What a run keeps on its data side: its progress (`RolloutProgress`), and per seed a `SeedState`.

A single run is a group of one: the data module holds one `SeedState` per seed (``data.seeds``),
and the rollout source (`ppo_lightning.data.source`) reads and updates them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ppo_lightning.algos.advantages import AdvantageMoments, RewardNormalizer
from ppo_lightning.core import faults
from ppo_lightning.data.config import RolloutConfig
from ppo_lightning.data.episodes import EpisodeStats


@dataclass
class RolloutProgress:
    """The run's counters: ``frames`` (per seed, all ranks) and ``iteration`` (one per pass of the source)."""

    frames: int = 0
    iteration: int = 0
    started: float | None = None  # perf_counter at the start of the current iteration

    def start_iteration(self) -> None:
        self.iteration += 1
        self.started = time.perf_counter()


class SeedState:
    """What a single run keeps on its data side, for one seed: episode statistics, advantage moments,
    reward normalizer, minibatch shuffling generator and (in a group) its action generator.

    ``action_generator`` is None for a single run (its actions come from torch's global generator,
    saved with the rank's RNGs); a group member's starts where the module hands it over
    (`ppo_lightning.training.seed_group.SeedGroup.action_rng_states`)."""

    def __init__(self, config: RolloutConfig, seed: int, advantage_norm_span: float | None = None,
                 gamma: float | None = None) -> None:
        self.seed = seed
        self.episodes = EpisodeStats()
        self.advantage_moments = AdvantageMoments(config.advantage_norm_span if advantage_norm_span is None else advantage_norm_span)
        gamma = config.gamma if gamma is None else gamma
        self.reward_normalizer = RewardNormalizer(config.num_envs, gamma) if config.normalize_reward else None
        self.shuffle_generator = torch.Generator().manual_seed(seed)
        self.action_generator: torch.Generator | None = None

    @classmethod
    def of_members(cls, config: RolloutConfig) -> list["SeedState"]:
        """One state per seed of ``config`` (member k with its own span and gamma, where it has them)."""
        return [cls(config, s, span, g) for s, span, g in
                zip(config.seeds, config.member_values("advantage_norm_span"), config.member_values("gamma"))]

    def set_action_rng_state(self, state: torch.Tensor) -> None:
        """Set the action generator's state (in place: a group's collector holds the generator)."""
        if self.action_generator is None:
            self.action_generator = torch.Generator()
        self.action_generator.set_state(state)

    def run_state_dict(self) -> dict[str, Any]:
        """The entries a single run's checkpoint keeps (beside its frames and iteration)."""
        return {"episodes": self.episodes.state_dict(),
                "advantage_moments": self.advantage_moments.state_dict(),
                "reward_normalizer": None if self.reward_normalizer is None else self.reward_normalizer.state_dict(),
                "shuffle_generator": self.shuffle_generator.get_state()}

    def load_run_state_dict(self, state: dict[str, Any]) -> None:
        self.episodes.load_state_dict(state["episodes"])
        self.advantage_moments.load_state_dict(state["advantage_moments"])
        if self.reward_normalizer is not None and state["reward_normalizer"] is not None:
            self.reward_normalizer.load_state_dict(state["reward_normalizer"])
        self.shuffle_generator.set_state(state["shuffle_generator"])

    def state_dict(self) -> dict[str, Any]:
        """A group member's entry: its seed, the single run's entries and its action generator."""
        return {"seed": self.seed, **self.run_state_dict(), "action_generator": self.action_generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["seed"] != self.seed:
            raise faults.CheckpointError(f"the checkpoint's seed group has seed {state['seed']} where the config has {self.seed}")
        self.load_run_state_dict(state)
        self.set_action_rng_state(state["action_generator"])
