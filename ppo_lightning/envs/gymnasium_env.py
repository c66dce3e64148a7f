"""Any gymnasium environment as a batched TorchRL env.

One gymnasium ``SyncVectorEnv`` (many envs in one process: TorchRL's collector adds ~0.5 ms per
batched step, so one vector env beats `SerialEnv`/`ParallelEnv` of single envs) with
``autoreset_mode=DISABLED``: TorchRL resets the ended sub-envs itself. Gymnasium's default
NEXT_STEP autoreset would put a fake zero-reward transition after every episode end.
"""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym
import numpy as np
from torchrl.envs import Compose, GymWrapper, RewardSum, StepCounter, TransformedEnv

from ppo_lightning.core.faults import DEFAULT_ENV_TIMEOUT_S, make_guarded_env_class
from ppo_lightning.envs import envpool_env  # envpool itself is imported only for backend: envpool
from ppo_lightning.envs.spaces import SpacesWrapper, UnsupportedSpace, describe, describe_env

# What a gymnasium env family needs (the word in gymnasium's DependencyNotInstalled message or the
# entry point's module) -> the package extra that installs it.
DEPENDENCY_EXTRAS = {"box2d": "box2d", "mujoco": "mujoco"}


def quiet_mujoco(env_id: str) -> None:
    """MuJoCo 4 warns on stderr and in ./MUJOCO_LOG.TXT that gymnasium's v5 models use the
    deprecated ``settotalmass`` attribute, for every env built: nothing a user can act on. Other
    MuJoCo warnings go through Python's ``warnings``."""
    spec = gym.registry.get(env_id)
    if spec is None or "mujoco" not in str(spec.entry_point):
        return
    try:
        import mujoco
    except ImportError:
        return

    def on_warning(message: str) -> None:
        if "settotalmass" not in message:
            import warnings

            warnings.warn(f"MuJoCo: {message}", RuntimeWarning, stacklevel=2)

    mujoco.set_mju_user_warning(on_warning)


def check_gymnasium_id(env_id: str) -> str:
    """``Id`` registered with gymnasium, or ``module:Id`` (gymnasium's syntax: importing ``module``
    registers ``Id``; custom envs from the command line, also in every DDP rank)."""
    if ":" in env_id:
        import importlib

        module, _, name = env_id.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ValueError(f"data.env_id: cannot import {module!r} for {env_id!r} ({err})") from None
        if name not in gym.registry:
            raise ValueError(f"data.env_id: importing {module!r} did not register {name!r}")
        return name
    if env_id not in gym.registry:
        close = [k for k in gym.registry if k.lower().startswith(env_id.split("-")[0].lower()[:4])][:5]
        hint = f" (similar: {', '.join(close)})" if close else ""
        raise ValueError(f"data.env_id: unknown gymnasium environment {env_id!r}{hint}")
    check_dependencies(env_id)
    return env_id


def missing_dependency_line(env_id: str, err: Exception) -> str:
    """The one line for an env whose dependency is not installed: what is missing and the extra to install."""
    entry = str(getattr(gym.registry.get(env_id), "entry_point", "") or "")
    text = f"{entry} {err}".lower()
    extra = next((extra for word, extra in DEPENDENCY_EXTRAS.items() if word in text), None)
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if extra is None:  # gymnasium's own advice
        return f"data.env_id: {env_id} needs a package that is not installed: {first}"
    what = first.split(",")[0].rstrip(".")  # "Box2D is not installed" (gymnasium's advice names its own extra)
    return f"data.env_id: {env_id} cannot be made ({what}): pip install 'ppo-lightning[{extra}]'"

def check_dependencies(env_id: str) -> None:
    """Import ``env_id``'s entry point (gymnasium's env module): a missing dependency is one ValueError
    naming the extra to install (`missing_dependency_line`) instead of gymnasium's traceback."""
    spec = gym.registry.get(env_id)
    entry = getattr(spec, "entry_point", None)
    if not isinstance(entry, str):
        return
    try:
        gym.envs.registration.load_env_creator(entry)
    except (gym.error.DependencyNotInstalled, ImportError) as err:
        raise ValueError(missing_dependency_line(env_id, err)) from None


def space_to_dict(space: gym.Space) -> dict:
    """A ``Discrete`` or ``Box`` gymnasium space as a plain dict (JSON- and weights_only-safe); any
    other space: `ppo_lightning.envs.spaces.describe`."""
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "discrete", "n": int(space.n)}
    if isinstance(space, gym.spaces.Box):
        out = {"shape": [int(s) for s in space.shape], "dtype": str(np.dtype(space.dtype))}
        return out
    return describe(space, "the space")


def gymnasium_spaces(env_id: str, env_kwargs: dict[str, Any]) -> tuple[dict, dict]:
    """(observation space, action space) as the network's plain dicts (`ppo_lightning.envs.spaces.describe_env`)."""
    registered = check_gymnasium_id(env_id)
    quiet_mujoco(registered)
    env = _make(registered, env_kwargs)
    try:
        obs, act, _ = _describe(env, env_id)
    finally:
        env.close()
    return obs, act


def _describe(env: gym.Env, env_id: str) -> tuple[dict, dict, bool]:
    """`describe_env`, an unsupported space's line naming ``env_id``."""
    try:
        return describe_env(env)
    except UnsupportedSpace as err:
        message = f"data.env_id: {env_id}: {err}"
    raise UnsupportedSpace(message)  # outside the handler: no chained cause (the CLI prints the innermost)


def _make(registered: str, env_kwargs: dict[str, Any]) -> gym.Env:
    """``gym.make``, a missing dependency as one line (`missing_dependency_line`)."""
    try:
        return gym.make(registered, **env_kwargs)
    except gym.error.DependencyNotInstalled as err:
        raise ValueError(missing_dependency_line(registered, err)) from None


def make_gymnasium_env(env_id: str, num_envs: int, seed: int, timeout_s: float | None = DEFAULT_ENV_TIMEOUT_S,
                       **env_kwargs):
    return build_gymnasium_env(env_id, num_envs, seed, timeout_s, **env_kwargs)[0]


def build_gymnasium_env(env_id: str, num_envs: int, seed: int, timeout_s: float | None = DEFAULT_ENV_TIMEOUT_S,
                        **env_kwargs):
    """``num_envs`` copies of ``env_id`` in one ``SyncVectorEnv``, each wrapped in
    `ppo_lightning.core.faults.GuardedEnv` (exceptions, hangs past ``timeout_s`` and malformed
    observations become an `EnvFault` naming the env index), as a TorchRL env with episode stats.
    Returns (the TorchRL env, the ``SyncVectorEnv`` inside it: ``.envs[i].render()``)."""
    registered = check_gymnasium_id(env_id)  # the id without a "module:" prefix
    quiet_mujoco(registered)
    wrappers = []
    if isinstance(gym.spec(registered), gym.envs.registration.EnvSpec):
        probe = _make(registered, env_kwargs)
        if isinstance(probe.action_space, gym.spaces.Box):
            wrappers.append(gym.wrappers.ClipAction)  # sample unbounded Gaussians, clip in the env
        _, _, packed = _describe(probe, env_id)
        if packed:  # any other space or an action mask: one observation and one action vector
            info_mask = "action_mask" in probe.reset(seed=0)[1]
            wrappers.append(lambda env: SpacesWrapper(env, info_mask))
        probe.close()
    guarded = make_guarded_env_class()

    def sub_env(index: int):
        def make():
            env = gym.make(registered, **env_kwargs)
            for wrapper in wrappers:
                env = wrapper(env)
            return guarded(env, env_id, index, timeout_s)

        return make

    # As gym.make_vec(vectorization_mode="sync") builds it, with the guard around each sub-env.
    vec = gym.vector.SyncVectorEnv([sub_env(i) for i in range(num_envs)],
                                   autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    env = GymWrapper(vec, categorical_action_encoding=True)
    env = TransformedEnv(env, Compose(RewardSum(), StepCounter()))
    env.set_seed(seed)
    return env, vec

# ---------------------------------------------------------------- the family interface of `ppo_lightning.envs`
def check(name: str) -> None:
    check_gymnasium_id(name)


BACKENDS = ("gymnasium", "envpool")


def split_backend(name: str, env_kwargs: dict) -> tuple[str, dict]:
    """(``data.env_kwargs.backend``: ``gymnasium``, the default, or ``envpool`` for MuJoCo tasks,
    `ppo_lightning.envs.envpool_env`; the other settings)."""
    env_kwargs = dict(env_kwargs)
    backend = env_kwargs.pop("backend", "gymnasium")
    if backend not in BACKENDS:
        raise ValueError(f"data.env_kwargs.backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "envpool":
        envpool_env.check_envpool_task(name)
    return backend, env_kwargs


def spaces(name: str, env_kwargs: dict) -> tuple[dict, dict]:
    return gymnasium_spaces(name, split_backend(name, env_kwargs)[1])  # the same spaces with either backend


def make(name: str, num_envs: int, seed: int, env_kwargs: dict, timeout_s: float | None = None):
    backend, env_kwargs = split_backend(name, env_kwargs)
    if backend == "envpool":
        return envpool_env.make_envpool_env(name, num_envs=num_envs, seed=seed, **env_kwargs)
    if timeout_s is not None:
        env_kwargs = {**env_kwargs, "timeout_s": timeout_s}
    return make_gymnasium_env(name, num_envs=num_envs, seed=seed, **env_kwargs)


def recordable(name: str, num_envs: int, seed: int, env_kwargs: dict):
    """The env and env 0's ``render()``, off-screen."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame (classic control) renders off-screen
    os.environ.setdefault("MUJOCO_GL", "egl")  # MuJoCo renders headless (GLFW needs a display)
    env_kwargs = split_backend(name, env_kwargs)[1]  # videos: gymnasium renders (the same task)
    env, vec = build_gymnasium_env(name, num_envs=num_envs, seed=seed, **{"render_mode": "rgb_array", **env_kwargs})
    return env, lambda: vec.envs[0].render()
