"""Environment factories: a small spec (an id string plus keyword arguments) -> a batched TorchRL env.

``"CartPole-v1"`` or any registered gymnasium id -> `ppo_lightning.envs.gymnasium_env`;
``"procgen:<game>"`` -> `ppo_lightning.envs.procgen_env` (issue 3);
``"minatar:<game>"`` -> `ppo_lightning.envs.minatar_env`. Every env is batched over
``num_envs`` on its first dimension, reports ``episode_reward`` and ``step_count`` in ``next`` and
resets through TorchRL (no fake transitions from a vector env's autoreset).

Procgen's and MinAtar's modules are imported inside the functions below, only for an id of their
family: they are optional at run time and cost start-up (procgen pulls gym and gym3); the gymnasium
module likewise (it pulls TorchRL), so that `minatar_scores` reads without the training stack.
"""

from __future__ import annotations

from typing import Any

PROCGEN_PREFIX = "procgen:"
MINATAR_PREFIX = "minatar:"


def is_procgen(env_id: str) -> bool:
    return env_id.startswith(PROCGEN_PREFIX)


def is_minatar(env_id: str) -> bool:
    return env_id.startswith(MINATAR_PREFIX)


def check_env_id(env_id: str) -> None:
    """Raise ValueError naming ``data.env_id`` if the id is unknown."""
    if is_minatar(env_id):
        # optional at run time: only for minatar ids
        # optional at run time (minatar): only for minatar ids
        from ppo_lightning.envs.minatar_env import check_minatar_game

        check_minatar_game(env_id[len(MINATAR_PREFIX):])
    elif is_procgen(env_id):
        # optional at run time, seconds to import (gym, gym3): only for procgen ids
        from ppo_lightning.envs.procgen_env import check_procgen_game

        check_procgen_game(env_id[len(PROCGEN_PREFIX):])
    else:
        from ppo_lightning.envs.gymnasium_env import check_gymnasium_id  # start-up cost: TorchRL

        check_gymnasium_id(env_id)


def env_spaces(env_id: str, env_kwargs: dict[str, Any] | None = None) -> tuple[dict, dict]:
    """(observation_space, action_space) as plain dicts, without building the vector env."""
    env_kwargs = env_kwargs or {}
    if is_minatar(env_id):
        # optional at run time: only for minatar ids
        # optional at run time (minatar): only for minatar ids
        from ppo_lightning.envs.minatar_env import minatar_spaces

        return minatar_spaces(env_id[len(MINATAR_PREFIX):])
    if is_procgen(env_id):
        # optional at run time, seconds to import (gym, gym3): only for procgen ids
        from ppo_lightning.envs.procgen_env import procgen_spaces

        return procgen_spaces()
    from ppo_lightning.envs.gymnasium_env import gymnasium_spaces  # start-up cost: TorchRL

    return gymnasium_spaces(env_id, env_kwargs)


def make_env(env_id: str, num_envs: int, seed: int, env_kwargs: dict[str, Any] | None = None,
             timeout_s: float | None = None):
    """A batched TorchRL env for the spec. ``timeout_s``: gymnasium envs only, a step or reset that
    takes longer is an `ppo_lightning.core.faults.EnvFault` (None: the default, 60 s; 0: no limit)."""
    env_kwargs = env_kwargs or {}
    if is_minatar(env_id):
        # optional at run time: only for minatar ids
        # optional at run time (minatar): only for minatar ids
        from ppo_lightning.envs.minatar_env import make_minatar_env

        return make_minatar_env(env_id[len(MINATAR_PREFIX):], num_envs=num_envs, seed=seed, **env_kwargs)
    if is_procgen(env_id):
        # optional at run time, seconds to import (gym, gym3): only for procgen ids
        from ppo_lightning.envs.procgen_env import make_procgen_env

        return make_procgen_env(env_id[len(PROCGEN_PREFIX):], num_envs=num_envs, seed=seed, **env_kwargs)
    from ppo_lightning.envs.gymnasium_env import make_gymnasium_env  # start-up cost: TorchRL

    if timeout_s is not None:
        env_kwargs = {**env_kwargs, "timeout_s": timeout_s}
    return make_gymnasium_env(env_id, num_envs=num_envs, seed=seed, **env_kwargs)


def make_recordable_env(env_id: str, num_envs: int, seed: int, env_kwargs: dict[str, Any] | None = None):
    """(env, frame_fn): `make_env` plus a function returning env 0's current RGB frame ``[H, W, 3]``
    uint8 numpy array, or None if the env's observations are the frames (Procgen)."""
    env_kwargs = dict(env_kwargs or {})
    if is_procgen(env_id):
        return make_env(env_id, num_envs, seed, env_kwargs), None
    if is_minatar(env_id):  # 10x10xC boolean states: drawn as coloured cells
        # optional at run time: only for minatar ids
        from ppo_lightning.envs.minatar_env import render_state

        env = make_env(env_id, num_envs, seed, env_kwargs)
        return env, lambda: render_state(env.base_env._obs[0])
    import os

    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame (classic control) renders off-screen
    os.environ.setdefault("MUJOCO_GL", "egl")  # MuJoCo renders headless (GLFW needs a display)
    from ppo_lightning.envs.gymnasium_env import build_gymnasium_env

    env_kwargs.setdefault("render_mode", "rgb_array")
    env, vec = build_gymnasium_env(env_id, num_envs=num_envs, seed=seed, **env_kwargs)
    return env, lambda: vec.envs[0].render()
