"""Environment factories: a small spec (an id string plus keyword arguments) -> a batched TorchRL env.

``"CartPole-v1"`` or any registered gymnasium id -> `ppo_lightning.envs.gymnasium_env` (any space:
`ppo_lightning.envs.spaces` packs it into one observation and one action vector);
``"procgen:<game>"`` -> `ppo_lightning.envs.procgen_env` (issue 3);
``"minatar:<game>"`` -> `ppo_lightning.envs.minatar_env`; ``"ALE/<Game>-v5"`` (Atari, ale-py) ->
`ppo_lightning.envs.atari_env`; ``"ppo_lightning/CartPoleNoVel-v1"`` (CartPole without the
velocities, a memory task) is a gymnasium id that importing this package registers
(`ppo_lightning.envs.partial`). Every env is batched over
``num_envs`` on its first dimension, reports ``episode_reward`` and ``step_count`` in ``next`` and
resets through TorchRL (no fake transitions from a vector env's autoreset).

Each family's module is imported by `_family`, only for an id of that family: Procgen and MinAtar
are optional at run time and cost start-up (procgen pulls gym and gym3); the gymnasium module
likewise (it pulls TorchRL), so that `minatar_scores` reads without the training stack.
"""

from __future__ import annotations

from typing import Any

from ppo_lightning.envs import partial as _partial  # gymnasium and numpy only

_partial.register()  # the package's own gymnasium ids, known to every path that checks or builds an env

PROCGEN_PREFIX = "procgen:"
MINATAR_PREFIX = "minatar:"
ATARI_PREFIX = "ALE/"


def is_procgen(env_id: str) -> bool:
    return env_id.startswith(PROCGEN_PREFIX)


def is_minatar(env_id: str) -> bool:
    return env_id.startswith(MINATAR_PREFIX)


def is_atari(env_id: str) -> bool:
    return env_id.startswith(ATARI_PREFIX)


def _family(env_id: str):
    """(the family's module, the id within the family). Each family module has ``check(name)``,
    ``spaces(name, env_kwargs)``, ``make(name, num_envs, seed, env_kwargs, timeout_s)`` and
    ``recordable(name, num_envs, seed, env_kwargs)``."""
    if is_minatar(env_id):
        from ppo_lightning.envs import minatar_env as family  # optional at run time: only for minatar ids

        return family, env_id[len(MINATAR_PREFIX):]
    if is_atari(env_id):  # optional at run time: ale-py, the `atari` extra
        from ppo_lightning.envs import atari_env as family

        return family, env_id[len(ATARI_PREFIX):]
    if is_procgen(env_id):
        # optional at run time, seconds to import (gym, gym3): only for procgen ids
        from ppo_lightning.envs import procgen_env as family

        return family, env_id[len(PROCGEN_PREFIX):]
    from ppo_lightning.envs import gymnasium_env as family  # start-up cost: TorchRL

    return family, env_id


def check_env_id(env_id: str) -> None:
    """Raise ValueError naming ``data.env_id`` if the id is unknown."""
    family, name = _family(env_id)
    family.check(name)


def env_spaces(env_id: str, env_kwargs: dict[str, Any] | None = None) -> tuple[dict, dict]:
    """(observation_space, action_space) as plain dicts, without building the vector env."""
    family, name = _family(env_id)
    return family.spaces(name, env_kwargs or {})


def make_env(env_id: str, num_envs: int, seed: int, env_kwargs: dict[str, Any] | None = None,
             timeout_s: float | None = None):
    """A batched TorchRL env for the spec. ``timeout_s``: gymnasium envs only, a step or reset that
    takes longer is an `ppo_lightning.core.faults.EnvFault` (None: the default, 60 s; 0: no limit)."""
    family, name = _family(env_id)
    return family.make(name, num_envs, seed, env_kwargs or {}, timeout_s)


def make_recordable_env(env_id: str, num_envs: int, seed: int, env_kwargs: dict[str, Any] | None = None):
    """(env, frame_fn): `make_env` plus a function returning env 0's current RGB frame ``[H, W, 3]``
    uint8 numpy array, or None if the env's observations are the frames (Procgen)."""
    family, name = _family(env_id)
    return family.recordable(name, num_envs, seed, dict(env_kwargs or {}))
