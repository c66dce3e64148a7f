"""The rollout configuration: every ``data.*`` setting of a run, validated, and what follows from it.

`RolloutConfig` is what the data module (`ppo_lightning.data.datamodule`) is configured with and
what the rollout source (`ppo_lightning.data.source`) is built from; it holds no state of the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ppo_lightning.algos.staleness import validate_staleness
from ppo_lightning.core import faults
from ppo_lightning.core.members import validate_member_values
from ppo_lightning.envs import check_env_id, env_spaces


def validate_member_hparams(member_hparams: dict[str, list], num_seeds: int) -> None:
    """One-line errors for ``member_hparams`` (``{name: [one value per member]}``)."""
    if num_seeds < 2:
        raise ValueError("member_hparams needs a seed group (data.num_seeds > 1, --seeds, or data.member_seeds)")
    validate_member_values(member_hparams, num_seeds)


@dataclass
class RolloutConfig:
    """Environment and rollout configuration of a run (the data module's arguments, documented there).

    ``seed`` None means 0 (the CLI fills it with ``seed_everything``); ``member_seeds`` sets
    ``num_seeds`` when that is left at 1. The env's spaces are read once, on construction."""

    env_id: str = "CartPole-v1"
    env_kwargs: dict[str, Any] | None = None
    num_envs: int = 8
    rollout_steps: int = 32
    num_minibatches: int = 4
    update_epochs: int = 10
    total_frames: int = 100_000
    gamma: float = 0.99
    gae_lambda: float = 0.95
    normalize_advantage: bool = True
    advantage_norm_span: float = 1.0
    normalize_reward: bool = False
    seed: int | None = None
    num_threads: int | None = None
    staleness: int = 0
    staleness_mode: str = "decoupled"
    env_timeout_s: float = faults.DEFAULT_ENV_TIMEOUT_S
    batched_rollout: bool = True
    num_seeds: int = 1
    member_seeds: list[int] | None = None
    member_hparams: dict[str, list] | None = None
    sequence_length: int | None = None
    observation_space: Any = field(init=False, repr=False, compare=False)
    action_space: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.env_kwargs = dict(self.env_kwargs or {})
        self.seed = 0 if self.seed is None else self.seed
        self.batched_rollout = bool(self.batched_rollout)
        if self.member_seeds is not None:
            self.member_seeds = [int(x) for x in self.member_seeds]
            if self.num_seeds == 1:
                self.num_seeds = len(self.member_seeds)  # member_seeds says how many
        if self.member_hparams is not None:
            self.member_hparams = {k: list(v) for k, v in dict(self.member_hparams).items()}
        self.validate()
        self.observation_space, self.action_space = env_spaces(self.env_id, self.env_kwargs)

    @property
    def members(self) -> int:
        """S, the size of the seed axis every per-member tensor carries: one for a single run."""
        return self.num_seeds

    @property
    def seeds(self) -> list[int]:
        """The seeds of this run: ``[seed]``, or ``seed, seed + 1, ...`` for a seed group (or ``member_seeds``)."""
        if self.member_seeds is not None:
            return list(self.member_seeds)
        return [self.seed + k for k in range(self.members)]

    def member_values(self, name: str) -> list[float]:
        """Each member's value of a data-side setting (`ppo_lightning.core.members.DATA_MEMBER_SETTINGS`):
        ``member_hparams[name]``, else this config's own value for every member."""
        values = (self.member_hparams or {}).get(name)
        return [float(x) for x in values] if values is not None else [float(getattr(self, name))] * self.members

    @property
    def frames_per_iteration(self) -> int:
        return self.num_envs * self.rollout_steps

    @property
    def minibatch_size(self) -> int:
        return self.frames_per_iteration // self.num_minibatches

    @property
    def sequence_steps(self) -> int:
        """L, the steps of one training sequence of a recurrent network: ``sequence_length``, or the
        whole rollout (``rollout_steps``) when it is null."""
        return self.rollout_steps if self.sequence_length is None else self.sequence_length

    @property
    def segments_per_iteration(self) -> int:
        """The segments of L consecutive steps of one env that a rollout ``[num_envs, rollout_steps]`` is cut into."""
        return self.num_envs * (self.rollout_steps // self.sequence_steps)

    def check_segments(self) -> None:
        """The segments of a recurrent network's rollout split into ``num_minibatches`` equal minibatches."""
        if self.segments_per_iteration % self.num_minibatches:
            raise ValueError(
                f"data.num_minibatches={self.num_minibatches} does not split the {self.segments_per_iteration} "
                f"sequences of a rollout (num_envs*rollout_steps/sequence_length = {self.num_envs}*"
                f"{self.rollout_steps}/{self.sequence_steps}) into equal minibatches")

    def validate(self) -> None:
        """Fail before training, naming the field."""
        check_env_id(self.env_id)
        for name in ("num_envs", "rollout_steps", "num_minibatches", "update_epochs", "total_frames"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"data.{name} must be a positive integer, got {value!r}")
        if self.frames_per_iteration % self.num_minibatches:
            raise ValueError(
                f"data.num_minibatches={self.num_minibatches} does not split a batch of "
                f"num_envs*rollout_steps={self.frames_per_iteration} frames into equal minibatches"
            )
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"data.gamma must lie in [0, 1], got {self.gamma}")
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError(f"data.gae_lambda must lie in [0, 1], got {self.gae_lambda}")
        if self.advantage_norm_span < 1:
            raise ValueError(f"data.advantage_norm_span must be >= 1, got {self.advantage_norm_span}")
        if self.num_threads is not None and self.num_threads <= 0:
            raise ValueError(f"data.num_threads must be positive, got {self.num_threads}")
        validate_staleness(self.staleness, self.staleness_mode)
        if not isinstance(self.num_seeds, int) or isinstance(self.num_seeds, bool) or self.num_seeds < 1:
            raise ValueError(f"data.num_seeds must be a positive integer, got {self.num_seeds!r}")
        if self.num_seeds > 1:
            if self.staleness:
                raise ValueError("data.num_seeds > 1 does not support data.staleness yet")
        if self.member_seeds is not None and len(self.member_seeds) != self.num_seeds:
            raise ValueError(f"data.member_seeds has {len(self.member_seeds)} seeds but data.num_seeds (--seeds) is "
                             f"{self.num_seeds}: give one of them, or make them agree")
        if self.member_seeds is not None and self.num_seeds < 2:
            raise ValueError("data.member_seeds needs at least two members (a single run takes data.seed)")
        if self.member_hparams is not None:
            validate_member_hparams(self.member_hparams, self.num_seeds)
        L = self.sequence_length
        if L is not None:
            if isinstance(L, bool) or not isinstance(L, int) or L <= 0:
                raise ValueError(f"data.sequence_length must be a positive integer, or null for the whole rollout, got {L!r}")
            if self.rollout_steps % L:
                raise ValueError(f"data.sequence_length={L} does not divide data.rollout_steps={self.rollout_steps} "
                                 f"(a rollout is cut into sequences of L steps)")
            self.check_segments()
        if not (isinstance(self.env_timeout_s, (int, float)) and self.env_timeout_s >= 0):
            raise ValueError(f"data.env_timeout_s must be a number of seconds >= 0 (0: no limit), got {self.env_timeout_s!r}")
