"""gymnasium's ``SyncVectorEnv`` arrays, written as its own ``step`` writes them.

Read against gymnasium 1.4 (pyproject: ``gymnasium>=1.0,<2``); `check` names what moved. gymnasium
is imported only by `check`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

VERIFIED = "1.4."

# The SyncVectorEnv attributes `step_rows` writes (`check`).
PRIVATE = ("_env_obs", "_rewards", "_terminations", "_truncations", "_autoreset_envs")


def step_rows(vec: Any, actions: np.ndarray) -> tuple[list, np.ndarray, np.ndarray, np.ndarray]:
    """``vec.step(actions)`` of a DISABLED-autoreset ``SyncVectorEnv`` without the per-call work that
    a caller reading only the arrays does not need (the merge of the sub-envs' infos, a deep copy of
    the observations, the action iterator): each sub-env steps on its row of ``actions`` and the
    vector env's own arrays are written as its ``step`` writes them, since its partial ``reset`` reads
    them (no public method steps the sub-envs into them). Returns (the sub-envs' observations, rewards,
    terminations, truncations): the vector env's own arrays, which its next step overwrites."""
    for i, env in enumerate(vec.envs):
        vec._env_obs[i], vec._rewards[i], vec._terminations[i], vec._truncations[i], _ = env.step(actions[i])
    vec._autoreset_envs = np.logical_or(vec._terminations, vec._truncations)
    return vec._env_obs, vec._rewards, vec._terminations, vec._truncations


def check() -> list[str]:
    """What moved: a different gymnasium release than ``VERIFIED``, or an array `step_rows` writes gone."""
    import gymnasium as gym

    moved = [] if gym.__version__.startswith(VERIFIED) else [f"gymnasium {gym.__version__} (read against {VERIFIED}x)"]
    vec = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")], autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    try:
        vec.reset(seed=0)
        moved += [f"gymnasium.vector.SyncVectorEnv.{name}" for name in PRIVATE if not hasattr(vec, name)]
    finally:
        vec.close()
    return moved
