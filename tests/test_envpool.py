"""Issue 62, item 6: envpool as the stepping backend of gymnasium's MuJoCo tasks (``data.env_kwargs.backend``).

The oracle: gymnasium's own Hopper-v5 put into envpool's state (``set_state`` from the full position and
velocity, ``exclude_current_positions_from_observation: false`` on both) gives the same rewards,
terminations and next observations for the same actions; then a Hopper group of 2 on envpool trains with
member k equal to seed k alone. Skipped where envpool is not installed (it is not in ``make``'s extras).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("envpool")
pytest.importorskip("mujoco")


def test_envpool_hopper_equals_gymnasium_from_the_same_state():
    import gymnasium as gym

    from ppo_lightning.envs.envpool_env import EnvpoolTorchEnv

    ours = EnvpoolTorchEnv("Hopper-v5", 1, seed=3, exclude_current_positions_from_observation=False)
    ref = gym.make("Hopper-v5", exclude_current_positions_from_observation=False)
    ref.reset(seed=0)
    rng = np.random.default_rng(0)
    steps = ends = 0
    while steps < 600:
        qpos, qvel = ours._obs[0][:6], ours._obs[0][6:]
        ref.unwrapped.set_state(qpos, qvel)
        action = rng.uniform(-1, 1, (1, 3))
        reward, terminated, truncated = ours.step_games(action)
        obs, r, term, trunc, _ = ref.step(action[0])
        np.testing.assert_allclose(ours._obs[0], obs, rtol=0, atol=1e-6)
        assert abs(reward[0] - r) < 1e-5 and bool(terminated[0]) == term, f"step {steps}"
        steps += 1
        if terminated[0] or truncated[0]:
            ends += 1
            ours.reset_games(np.array([True]))
    assert ends >= 3  # episode ends were compared, and the partial resets start new ones


def test_backend_names_and_refusals():
    from ppo_lightning.envs import env_spaces, make_env

    assert env_spaces("Hopper-v5", {"backend": "envpool"}) == env_spaces("Hopper-v5")
    env = make_env("Hopper-v5", 2, seed=1, env_kwargs={"backend": "envpool"})
    assert type(env.base_env).__name__ == "EnvpoolTorchEnv"
    with pytest.raises(ValueError, match="backend must be one of gymnasium, envpool"):
        env_spaces("Hopper-v5", {"backend": "jax"})
    with pytest.raises(ValueError, match="MuJoCo tasks, not 'CartPole-v1'"):
        env_spaces("CartPole-v1", {"backend": "envpool"})


def test_envpool_group_member_k_trains_as_seed_k_alone():
    from tests.test_members_every_env import MLP, assert_member_is_alone

    worst = assert_member_is_alone(
        "Hopper-v5", 3, rtol=1e-4, atol=1e-4, same_episodes=False,
        data_kwargs={"normalize_reward": True, "env_kwargs": {"backend": "envpool"}}, collector="BatchedRollout",
        trainer_kwargs={"gradient_clip_val": 0.5}, network={**MLP, "normalize_observation": True}, lr=3e-4,
        value_clip_eps=0.2)
    assert worst < 1e-4
