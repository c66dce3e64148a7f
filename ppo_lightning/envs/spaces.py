"""Every gymnasium space as one observation vector and one action vector.

The training stack reads one observation tensor and one action tensor per step. A gymnasium env whose
spaces are a ``Box`` observation and a ``Discrete`` or ``Box`` action, without an action mask, is used
as it is. Any other env is wrapped in `SpacesWrapper`, which

- packs each observation into one float32 vector: the leaves of the space (``Box``, ``Discrete``,
  ``MultiDiscrete``, ``MultiBinary``, inside ``Dict`` / ``Tuple`` to any depth) in order, each leaf's raw
  values (a ``Discrete`` leaf its index from 0), then the action mask where there is one (a ``Box``
  observation without a mask stays as it is);
- unpacks each action vector into the env's action (a ``Discrete`` action stays an index; a
  ``MultiDiscrete``, ``MultiBinary``, ``Tuple`` or ``Dict`` action is one vector, its leaves in order;
  ``Box`` leaves are clipped to their bounds, as `gymnasium.wrappers.ClipAction` does for a ``Box`` action).

An action mask is gymnasium's ``info["action_mask"]`` (Taxi's convention; on reset and every step) or an
``"action_mask"`` key of a ``Dict`` observation (PettingZoo's), for a ``Discrete`` action (n entries)
or the categorical leaves of any other action (``MultiDiscrete``: ``sum(nvec)`` entries, flat or one
array per part). `describe_env` writes the spaces as the plain dicts the network reads
(`ppo_lightning.nets.encoders`, `ppo_lightning.nets.composite`).
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np

from ppo_lightning.envs.space_layout import leaf_layout, raw_size, space_leaves

MASK_KEY = "action_mask"
SUPPORTED = ("Box, Discrete, MultiDiscrete, MultiBinary, and Dict / Tuple of these (observations and actions; "
             "Text, Graph, Sequence and OneOf are not)")


class UnsupportedSpace(ValueError):
    """A gymnasium space the framework cannot read or act in."""


def describe(space: gym.Space, where: str) -> dict:
    """A gymnasium space as the plain dict of `ppo_lightning.nets.encoders` (``where``: named in errors)."""
    if isinstance(space, gym.spaces.Box):
        return {"type": "box", "shape": [int(s) for s in space.shape], "dtype": str(np.dtype(space.dtype))}
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "discrete", "n": int(space.n)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "multi_discrete", "nvec": [int(n) for n in np.asarray(space.nvec).reshape(-1)]}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "multi_binary", "n": int(math.prod(np.atleast_1d(space.n)))}
    if isinstance(space, gym.spaces.Dict):
        return {"type": "dict", "parts": [[str(k), describe(s, f"{where}[{k!r}]")] for k, s in space.spaces.items()]}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "tuple", "parts": [describe(s, f"{where}[{i}]") for i, s in enumerate(space.spaces)]}
    raise UnsupportedSpace(f"{where} is a {type(space).__name__} space, which cannot be used: supported are {SUPPORTED}. "
                           "Wrap the env in a gymnasium.ObservationWrapper (an observation) or ActionWrapper (an "
                           "action) of your own that maps it to one of them")


def _leaves(space: gym.Space) -> list[gym.Space]:
    if isinstance(space, gym.spaces.Dict):
        return [leaf for s in space.spaces.values() for leaf in _leaves(s)]
    if isinstance(space, gym.spaces.Tuple):
        return [leaf for s in space.spaces for leaf in _leaves(s)]
    return [space]


def _values(space: gym.Space, value) -> list:
    """The leaves' values of ``value`` (an element of ``space``), in `_leaves` order."""
    if isinstance(space, gym.spaces.Dict):
        return [v for k, s in space.spaces.items() for v in _values(s, value[k])]
    if isinstance(space, gym.spaces.Tuple):
        return [v for s, x in zip(space.spaces, value) for v in _values(s, x)]
    return [value]


def _pack_leaf(space: gym.Space, value) -> np.ndarray:
    value = np.asarray(value)
    if isinstance(space, gym.spaces.Discrete):
        return np.asarray([int(value) - int(space.start)], dtype=np.float32)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return (value - np.asarray(space.start)).reshape(-1).astype(np.float32)
    return value.reshape(-1).astype(np.float32)


def _unpack_leaf(space: gym.Space, values: np.ndarray):
    if isinstance(space, gym.spaces.Discrete):
        return np.int64(int(round(float(values[0]))) + int(space.start))
    if isinstance(space, gym.spaces.MultiDiscrete):
        index = np.rint(values).astype(np.int64).reshape(np.shape(space.nvec))
        return (index + np.asarray(space.start)).astype(space.dtype)
    if isinstance(space, gym.spaces.MultiBinary):
        return (values > 0.5).astype(space.dtype).reshape(space.shape)
    action = values.reshape(space.shape).astype(space.dtype)
    return np.clip(action, space.low, space.high)


def _rebuild(space: gym.Space, leaves: list):
    """An element of ``space`` from its leaves' values (consumed from the front of ``leaves``)."""
    if isinstance(space, gym.spaces.Dict):
        return {k: _rebuild(s, leaves) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_rebuild(s, leaves) for s in space.spaces)
    return leaves.pop(0)


def _leaf_size(space: gym.Space) -> int:
    if isinstance(space, gym.spaces.Discrete):
        return 1
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.asarray(space.nvec).size)
    return int(math.prod(space.shape))


def _categorical_size(space: gym.Space) -> int:
    """Entries of an action mask over ``space``'s categorical leaves."""
    total = 0
    for leaf in _leaves(space):
        if isinstance(leaf, gym.spaces.Discrete):
            total += int(leaf.n)
        elif isinstance(leaf, gym.spaces.MultiDiscrete):
            total += int(np.asarray(leaf.nvec).sum())
    return total


def _flat_mask(mask) -> np.ndarray:
    if isinstance(mask, (tuple, list)):  # gymnasium's MultiDiscrete mask: one array per part
        return np.concatenate([np.asarray(m).reshape(-1) for m in mask]).astype(np.float32)
    return np.asarray(mask).reshape(-1).astype(np.float32)


def plain(env: gym.Env, info_mask: bool) -> bool:
    """Whether ``env`` needs no `SpacesWrapper`: a ``Box`` observation, a ``Discrete`` or ``Box`` action, no mask."""
    return (isinstance(env.observation_space, gym.spaces.Box) and not info_mask
            and isinstance(env.action_space, (gym.spaces.Discrete, gym.spaces.Box))
            and int(getattr(env.action_space, "start", 0)) == 0)


def info_has_mask(env: gym.Env) -> bool:
    """Whether the env's ``reset`` info carries an ``action_mask`` (gymnasium's convention, e.g. Taxi).
    Resets ``env`` once (seed 0)."""
    _, info = env.reset(seed=0)
    return isinstance(info, dict) and MASK_KEY in info


class SpacesWrapper(gym.Wrapper):
    """``env`` with one float32 ``Box`` observation and one ``Discrete`` or ``Box`` action (module docstring)."""

    def __init__(self, env: gym.Env, info_mask: bool) -> None:
        super().__init__(env)
        obs_space = env.observation_space
        self.dict_mask = isinstance(obs_space, gym.spaces.Dict) and MASK_KEY in obs_space.spaces
        if self.dict_mask:
            obs_space = gym.spaces.Dict({k: s for k, s in obs_space.spaces.items() if k != MASK_KEY})
        self.info_mask = info_mask and not self.dict_mask
        self.inner_observation_space = obs_space
        # leaves as gymnasium Tuples: structure, which exact resume (ppo_lightning.data.resume_state) skips
        self.obs_leaves = gym.spaces.Tuple(_leaves(obs_space))
        self.mask_size = _categorical_size(env.action_space) if (self.dict_mask or self.info_mask) else 0
        if (self.dict_mask or self.info_mask) and not self.mask_size:
            raise UnsupportedSpace(f"the env has an action mask and a {type(env.action_space).__name__} action space: "
                                   "masks apply to Discrete and MultiDiscrete actions (and their Dict / Tuple)")
        # a Box observation without a mask stays as it is (normalizable; a composite action alone is unpacked)
        self.pack_obs = not (isinstance(obs_space, gym.spaces.Box) and not self.mask_size)
        size = sum(_leaf_size(s) for s in self.obs_leaves.spaces) + self.mask_size
        if self.pack_obs:
            self.observation_space = gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)
        self.composite_action = not isinstance(env.action_space, (gym.spaces.Discrete, gym.spaces.Box))
        if self.composite_action:
            self.action_leaves = gym.spaces.Tuple(_leaves(env.action_space))
            self.action_sizes = [_leaf_size(s) for s in self.action_leaves.spaces]
            self.action_space = gym.spaces.Box(-np.inf, np.inf, (sum(self.action_sizes),), np.float32)

    def _pack(self, obs, info) -> np.ndarray:
        if not self.pack_obs:
            return obs
        if self.dict_mask:
            mask = obs[MASK_KEY]
            obs = {k: v for k, v in obs.items() if k != MASK_KEY}
        elif self.info_mask:
            mask = info.get(MASK_KEY) if isinstance(info, dict) else None
            if mask is None:
                raise ValueError(f"the env gave no info[{MASK_KEY!r}] (it gave one on its first reset)")
        parts = [_pack_leaf(s, v) for s, v in zip(self.obs_leaves.spaces, _values(self.inner_observation_space, obs))]
        if self.mask_size:
            mask = _flat_mask(mask)
            if mask.size != self.mask_size:
                raise ValueError(f"the env's action mask has {mask.size} entries, its action space {self.mask_size} choices")
            parts.append(mask)
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def _unpack(self, action):
        if not self.composite_action:  # a Discrete action's index from 0 (gymnasium's start added back)
            return action + int(self.env.action_space.start) if isinstance(self.env.action_space, gym.spaces.Discrete) else action
        values, start, leaves = np.asarray(action, dtype=np.float32).reshape(-1), 0, []
        for space, size in zip(self.action_leaves.spaces, self.action_sizes):
            leaves.append(_unpack_leaf(space, values[start:start + size]))
            start += size
        return _rebuild(self.env.action_space, leaves)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self._pack(obs, info), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(self._unpack(action))
        return self._pack(obs, info), reward, terminated, truncated, info


def describe_env(env: gym.Env) -> tuple[dict, dict, bool]:
    """(observation space, action space, whether the env needs `SpacesWrapper`) as the network's plain dicts.

    A plain env (`plain`): ``{"shape", "dtype"}`` and ``{"type": "discrete", "n"}`` / ``{"type": "continuous",
    "shape"}`` as before. Otherwise the observation is ``{"shape": [size], "dtype": "float32", "space":
    <description>}`` plus ``"action_mask": m`` with a mask, and a composite action ``{"type": "composite",
    "shape": [size], "space": <description>}``."""
    obs_space, act_space = env.observation_space, env.action_space
    describe(obs_space, "the observation space")  # an unsupported space: its line before the env runs
    action = describe(act_space, "the action space")
    info_mask = info_has_mask(env)
    if plain(env, info_mask):
        obs = describe(obs_space, "the observation space")
        return {"shape": obs["shape"], "dtype": obs["dtype"]}, _plain_action(action), False
    dict_mask = isinstance(obs_space, gym.spaces.Dict) and MASK_KEY in obs_space.spaces
    if dict_mask:
        obs_space = gym.spaces.Dict({k: s for k, s in obs_space.spaces.items() if k != MASK_KEY})
    inner = describe(obs_space, "the observation space")
    mask = _categorical_size(act_space) if (dict_mask or info_mask) else 0
    if (dict_mask or info_mask) and not mask:
        raise UnsupportedSpace(f"the env has an action mask and a {type(act_space).__name__} action space: "
                               "masks apply to Discrete and MultiDiscrete actions (and their Dict / Tuple)")

    size = sum(raw_size(leaf) for leaf in space_leaves(inner)) + mask
    if isinstance(obs_space, gym.spaces.Box) and not mask:  # as it is (`SpacesWrapper.pack_obs`)
        obs = {"shape": inner["shape"], "dtype": inner["dtype"]}
    else:
        obs = {"shape": [size], "dtype": "float32", "space": inner}
    if mask:
        obs["action_mask"] = mask
    if isinstance(act_space, (gym.spaces.Discrete, gym.spaces.Box)):
        return obs, _plain_action(action), True

    layout = leaf_layout(action)
    return obs, {"type": "composite", "shape": [sum(a_size for _, _, a_size, _, _ in layout)], "space": action}, True


def _plain_action(action: dict) -> dict:
    if action["type"] == "discrete":
        return action
    return {"type": "continuous", "shape": action["shape"]}
