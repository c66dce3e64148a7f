"""TorchRL's private state that exact resume and the members' rollouts need.

Read against TorchRL 0.14 (pyproject pins ``torchrl>=0.14.1,<0.15``); `check` names what moved.
TorchRL is imported only by `check`: the functions read the objects they are given.
"""

from __future__ import annotations

from typing import Any

VERIFIED = "0.14."

# The private attributes read here (`check`).
PRIVATE = ("_carrier", "_env")


def carried_step(collector: Any) -> Any:
    """The step a collector carries to its next rollout (observation, done flags, step counts,
    episode-return accumulators): TorchRL's ``Collector`` keeps it as ``_carrier`` and its
    ``state_dict`` leaves it out, so exact resume reads and restores it here. The package's own
    rollouts (`ppo_lightning.data.batched_rollout`, `ppo_lightning.data.lockstep`) keep theirs under
    the same name, so one reader serves both. None where there is none."""
    return getattr(collector, "_carrier", None)


def gym_env(env: Any) -> Any:
    """The gymnasium env inside TorchRL's ``GymWrapper`` (``env.base_env`` of a transformed env), or
    None: the wrapper keeps it as ``_env`` and forwards attribute reads to it, but has no reader of
    the env itself, which env state (resume) and the direct vector step (`ppo_lightning.data.lockstep`) need."""
    return getattr(env, "_env", None)


def check() -> list[str]:
    """What moved: a different TorchRL release than ``VERIFIED``, or a private name gone (read from a
    CartPole ``GymEnv`` and a ``Collector`` over it, before and after one batch)."""
    import gymnasium as gym
    import torchrl
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv

    moved = [] if torchrl.__version__.startswith(VERIFIED) else [f"torchrl {torchrl.__version__} (read against {VERIFIED}x)"]
    env = GymEnv("CartPole-v1")
    if not isinstance(gym_env(env), gym.Env):
        moved.append("torchrl.envs.GymWrapper._env")
    collector = Collector(env, policy=None, frames_per_batch=4, total_frames=4, auto_register_policy_transforms=False)
    try:
        before = carried_step(collector)
        next(iter(collector))
        if before is None or carried_step(collector) is None or "observation" not in carried_step(collector).keys():
            moved.append("torchrl.collectors.Collector._carrier")
    finally:
        collector.shutdown()
    return moved
