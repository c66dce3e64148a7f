"""Small gymnasium envs of every space kind, registered on import (``tests.spaces_envs:<Id>``).

Each draws its observations from its observation space on its own seeded generator, ends after 8
steps and rewards the first action leaf agreeing with the observation's first number's parity (a
signal a policy can learn). The masked envs draw a random legal subset per step (at least one legal
choice per categorical) and raise on an illegal action.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


def _first_number(value) -> float:
    if isinstance(value, dict):
        return _first_number(next(iter(value.values())))
    if isinstance(value, tuple):
        return _first_number(value[0])
    return float(np.asarray(value).reshape(-1)[0])


def sample(space: gym.Space, rng: np.random.Generator):
    """An element of ``space`` drawn on ``rng`` (the env's own generator: its state is the env's, which
    exact resume saves; a space's own generator is structure, not saved)."""
    if isinstance(space, spaces.Dict):
        return {k: sample(s, rng) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(sample(s, rng) for s in space.spaces)
    if isinstance(space, spaces.Discrete):
        return np.int64(space.start + rng.integers(space.n))
    if isinstance(space, spaces.MultiDiscrete):
        return (space.start + rng.integers(space.nvec)).astype(space.dtype)
    if isinstance(space, spaces.MultiBinary):
        return rng.integers(0, 2, space.shape).astype(space.dtype)
    if isinstance(space, spaces.Box):
        return rng.uniform(space.low, space.high).astype(space.dtype)
    return space.sample()


class SpacesToy(gym.Env):
    def __init__(self, observation_space: gym.Space, action_space: gym.Space, mask: str | None = None,
                 length: int = 8) -> None:
        self.observation_space, self.action_space = observation_space, action_space
        self.mask, self.length = mask, length  # mask: None, "info" or "dict"
        self.t = 0
        self._legal = None

    def _groups(self) -> list[int]:
        if isinstance(self.action_space, spaces.Discrete):
            return [int(self.action_space.n)]
        return [int(n) for n in np.asarray(self.action_space.nvec).reshape(-1)]

    def _draw_mask(self) -> np.ndarray:
        parts = []
        for n in self._groups():
            legal = self.np_random.random(n) < 0.5
            legal[self.np_random.integers(n)] = True
            parts.append(legal.astype(np.int8))
        return np.concatenate(parts)

    def _obs(self):
        if self.mask == "dict":
            inner = {k: s for k, s in self.observation_space.spaces.items() if k != "action_mask"}
            obs = {k: sample(s, self.np_random) for k, s in inner.items()}
        else:
            obs = sample(self.observation_space, self.np_random)
        if self.mask is not None:
            self._legal = self._draw_mask()
            if self.mask == "dict":
                obs["action_mask"] = self._legal
        return obs

    def _info(self) -> dict:
        return {"action_mask": self._legal} if self.mask == "info" else {}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self._last = self._obs()
        return self._last, self._info()

    def step(self, action):
        if self._legal is not None:
            chosen, start = np.atleast_1d(np.asarray(action)).reshape(-1), 0
            for i, n in enumerate(self._groups()):
                if not self._legal[start + int(chosen[i])]:
                    raise ValueError(f"illegal action {action} (mask {self._legal})")
                start += n
        target = int(_first_number(self._last)) % 2
        reward = 1.0 if int(round(_first_number(action))) % 2 == target else 0.0
        self.t += 1
        self._last = self._obs()
        return self._last, reward, False, self.t >= self.length, self._info()



def box3() -> spaces.Box:  # a new space per env: a space carries its own generator
    return spaces.Box(-1.0, 1.0, (3,), np.float32)


ENVS = {
    "DiscreteObs-v0": lambda: SpacesToy(spaces.Discrete(5), spaces.Discrete(2)),
    "MultiDiscreteObs-v0": lambda: SpacesToy(spaces.MultiDiscrete([3, 4]), spaces.Discrete(3)),
    "MultiBinary-v0": lambda: SpacesToy(spaces.MultiBinary(4), spaces.MultiBinary(3)),
    "DictObsMultiDiscreteAct-v0": lambda: SpacesToy(
        spaces.Dict({"cell": spaces.Discrete(4), "pos": box3(),
                     "more": spaces.Tuple((spaces.MultiBinary(2), spaces.MultiDiscrete([2, 3])))}),
        spaces.MultiDiscrete([3, 2])),
    "TupleAct-v0": lambda: SpacesToy(box3(), spaces.Tuple((spaces.Discrete(2), spaces.Box(-1.0, 1.0, (2,), np.float32)))),
    "DictAct-v0": lambda: SpacesToy(spaces.Tuple((spaces.Discrete(3), box3())),
                                   spaces.Dict({"move": spaces.Discrete(3), "fire": spaces.MultiBinary(2)})),
    "InfoMask-v0": lambda: SpacesToy(spaces.Discrete(6), spaces.Discrete(4), mask="info"),
    "DictMask-v0": lambda: SpacesToy(spaces.Dict({"obs": box3(), "action_mask": spaces.MultiBinary(5)}),
                                    spaces.MultiDiscrete([2, 3]), mask="dict"),
    "TextObs-v0": lambda: SpacesToy(spaces.Text(5), spaces.Discrete(2)),
}
for _name, _make in ENVS.items():
    if _name not in gym.registry:
        gym.register(_name, entry_point=_make)
if "StartDiscrete-v0" not in gym.registry:  # gymnasium's start: actions -1, 0, 1 and observations 10..14
    gym.register("StartDiscrete-v0", entry_point=lambda: SpacesToy(spaces.Discrete(5, start=10),
                                                                   spaces.Discrete(3, start=-1)))
