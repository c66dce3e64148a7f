"""What a single run's rollout source and a vectorized seed group both use: the keys a minibatch
carries to the loss and the record of finished episodes (so that a group's source need not import
the data module that dispatches to it)."""

from __future__ import annotations

import collections

from tensordict import TensorDictBase

from ppo_lightning.nets.models import OBS_KEY, VALUE_KEY

# Keys a minibatch carries to the loss (besides the distribution parameters).
BATCH_KEYS = (OBS_KEY, "action", "action_log_prob", VALUE_KEY, "advantage", "value_target")
# An env's record of whole games beside its training episodes (``next``: game_over, game_return, game_length)
GAME_OVER = "game_over"


def episode_keys(next_td: TensorDictBase) -> tuple[str, str, str]:
    """The keys of ``next`` that mark the episodes a user reads, their returns and their lengths: ``done``
    with RewardSum's and StepCounter's sums; or, for an env that trains on other episodes than its games
    (Atari: a life lost ends one, rewards clipped; `ppo_lightning.envs.atari_env`), the whole games it
    reports (``game_over``, ``game_return``, ``game_length``)."""
    if GAME_OVER in next_td.keys():
        return GAME_OVER, "game_return", "game_length"
    return "done", "episode_reward", "step_count"


class EpisodeStats:
    """Returns and lengths of the episodes that ended, most recent last."""

    def __init__(self, window: int = 100) -> None:
        self.returns: collections.deque[float] = collections.deque(maxlen=window)
        self.lengths: collections.deque[int] = collections.deque(maxlen=window)
        self.count = 0

    def add_rollout(self, rollout: TensorDictBase) -> None:
        """The episodes that ended in ``rollout`` (`episode_keys`)."""
        keys = episode_keys(rollout.get("next"))
        done = rollout.get(("next", keys[0])).squeeze(-1)
        if not done.any():
            return
        # Time-major order, so that "most recent" means most recent across envs.
        order = done.T
        self.returns.extend(rollout.get(("next", keys[1])).squeeze(-1).T[order].tolist())
        self.lengths.extend(rollout.get(("next", keys[2])).squeeze(-1).T[order].tolist())
        self.count += int(done.sum())

    def mean_return(self, last: int = 20) -> float:
        if not self.returns:
            return float("nan")
        recent = list(self.returns)[-last:]
        return sum(recent) / len(recent)

    def mean_length(self, last: int = 20) -> float:
        if not self.lengths:
            return float("nan")
        recent = list(self.lengths)[-last:]
        return sum(recent) / len(recent)

    def state_dict(self) -> dict:
        return {"returns": list(self.returns), "lengths": list(self.lengths), "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.returns.clear(), self.lengths.clear()
        self.returns.extend(state["returns"]), self.lengths.extend(state["lengths"])
        self.count = state["count"]
