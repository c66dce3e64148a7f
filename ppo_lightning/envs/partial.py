"""Partially observed tasks that the package registers with gymnasium (memory tasks for recurrent networks).

``ppo_lightning/CartPoleNoVel-v1``: CartPole-v1 with the velocities removed. The observation is the cart
position and the pole angle (``[x, theta]``, float32); the dynamics, rewards, terminations, the 500-step
time limit, the seeding and the rendering are CartPole-v1's (the same states from the same seed and
actions). One observation does not tell which way the pole falls: a feed-forward policy cannot balance
it for long, a recurrent one can (it can infer the velocities from consecutive positions). The same task
as RL Zoo's ``CartPoleNoVel-v1`` (which zeroes the two velocity entries of a 4-entry observation) and
popgym's ``StatelessCartPole`` (which removes them, as here).

The id lives in the ``ppo_lightning`` namespace (gymnasium's ``namespace/Name-vN`` ids, as ``ALE/...``):
it can clash neither with an id gymnasium may add nor with RL Zoo's ``CartPoleNoVel-v1`` (whose
observation has 4 entries) when both packages are imported. `register` runs when `ppo_lightning.envs`
is imported, so every path that checks or builds an env id (fit, study, evaluate, video, export) knows
it; outside the package, ``gymnasium.make("ppo_lightning.envs:ppo_lightning/CartPoleNoVel-v1")``
imports it first.

This module imports gymnasium and numpy only (no torch).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

CARTPOLE_NOVEL_ID = "ppo_lightning/CartPoleNoVel-v1"
CARTPOLE_POSITIONS = (0, 2)  # CartPole's [x, x_dot, theta, theta_dot]: the cart position and the pole angle


def positions_only(observation: np.ndarray) -> np.ndarray:
    """CartPole's observation ``[x, x_dot, theta, theta_dot]`` -> ``[x, theta]`` (the velocities removed)."""
    return observation[list(CARTPOLE_POSITIONS)]


class CartPoleNoVelEnv(CartPoleEnv):
    """CartPole-v1 observing ``[x, theta]`` only (module docstring). Keyword arguments: CartPoleEnv's
    (``render_mode``, ``sutton_barto_reward``)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        full = self.observation_space
        self.observation_space = gym.spaces.Box(positions_only(full.low), positions_only(full.high), dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        observation, info = super().reset(seed=seed, options=options)
        return positions_only(observation), info

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        return positions_only(observation), reward, terminated, truncated, info


def register() -> None:
    """Register the package's partially observed tasks with gymnasium (idempotent)."""
    if CARTPOLE_NOVEL_ID not in gym.registry:
        gym.register(id=CARTPOLE_NOVEL_ID, entry_point=f"{__name__}:CartPoleNoVelEnv",
                     max_episode_steps=500, reward_threshold=475.0)
