"""The partially observed CartPole the package registers, and the recurrent CartPole configs (issue 64).

Whether ``cartpole/ppo_lstm`` reaches 475 is `benchmarks/recurrent_cartpole.py`'s figure, not a test.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import ppo_lightning.envs as envs
from ppo_lightning.envs.partial import CARTPOLE_NOVEL_ID


def test_cartpole_novel_is_registered_by_importing_the_envs_package():
    assert CARTPOLE_NOVEL_ID == "ppo_lightning/CartPoleNoVel-v1"
    assert CARTPOLE_NOVEL_ID in gym.registry
    spec = gym.spec(CARTPOLE_NOVEL_ID)
    assert spec.namespace == "ppo_lightning" and spec.max_episode_steps == 500
    envs.check_env_id(CARTPOLE_NOVEL_ID)  # the path fit, study, evaluate and export check ids through
    obs_space, act_space = envs.env_spaces(CARTPOLE_NOVEL_ID)
    assert obs_space == {"shape": [2], "dtype": "float32"} and act_space == {"type": "discrete", "n": 2}


def test_cartpole_novel_observes_positions_with_cartpole_dynamics():
    """From the same seed and actions: CartPole-v1's trajectory (rewards, terminations, truncations),
    each observation CartPole-v1's entries 0 (x) and 2 (theta), over episodes that end by falling."""
    novel, full = gym.make(CARTPOLE_NOVEL_ID), gym.make("CartPole-v1")
    assert novel.observation_space.shape == (2,)
    np.testing.assert_array_equal(novel.observation_space.high, full.observation_space.high[[0, 2]])
    rng = np.random.default_rng(0)
    ends = 0
    for episode in range(3):
        obs, _ = novel.reset(seed=10 + episode)
        ref, _ = full.reset(seed=10 + episode)
        assert obs.shape == (2,) and obs.dtype == np.float32
        np.testing.assert_array_equal(obs, np.array([ref[0], ref[2]]))
        done = False
        while not done:
            action = int(rng.integers(2))
            obs, reward, terminated, truncated, _ = novel.step(action)
            ref, ref_reward, ref_terminated, ref_truncated, _ = full.step(action)
            np.testing.assert_array_equal(obs, np.array([ref[0], ref[2]]))
            assert (reward, terminated, truncated) == (ref_reward, ref_terminated, ref_truncated)
            assert novel.observation_space.contains(obs) or terminated
            done = terminated or truncated
        ends += terminated
    assert ends == 3


def test_cartpole_novel_truncates_at_500_steps():
    env = gym.make(CARTPOLE_NOVEL_ID)
    env.reset(seed=0)
    env.unwrapped.theta_threshold_radians = float("inf")  # never falls: the time limit ends the episode
    env.unwrapped.x_threshold = float("inf")
    steps, truncated = 0, False
    while not truncated:
        _, _, terminated, truncated, _ = env.step(steps % 2)
        assert not terminated
        steps += 1
    assert steps == 500


def test_cartpole_novel_with_a_module_prefix_outside_the_package_path():
    """gymnasium's ``module:Id`` form, as a script that has not imported the package would write it."""
    env = gym.make(f"ppo_lightning.envs:{CARTPOLE_NOVEL_ID}")
    assert env.observation_space.shape == (2,)


def test_cartpole_novel_batched_env_observes_two_entries():
    env = envs.make_env(CARTPOLE_NOVEL_ID, num_envs=3, seed=1)
    try:
        td = env.reset()
        assert td["observation"].shape == (3, 2)
    finally:
        env.close()


# ---------------------------------------------------------------- the shipped recurrent CartPole configs
def _fit(tmp_path, config: str, *extra: str):
    from ppo_lightning.run.builder import fit_main

    return fit_main(["fit", "--config", config, "--mlflow.enabled", "false", "--run_dir", str(tmp_path),
                     "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
                     "--trainer.enable_checkpointing", "false", "--data.update_epochs", "2",
                     "--data.total_frames", "512", *extra])


@pytest.mark.parametrize("config, decoupled, lstms", [("cartpole/ppo_lstm", False, 1), ("cartpole/ppo_ewma_lstm", True, 2)])
def test_recurrent_cartpole_configs_train_two_iterations(tmp_path, config, decoupled, lstms):
    """The configs as shipped (epochs cut to 2): the registered env, sb3-contrib's MlpLstmPolicy layout
    (the observation into an LSTM of 64, a layer of 64 per head; one LSTM for both heads or one each),
    2 iterations of 256 frames."""
    from ppo_lightning.nets.recurrent import is_recurrent

    cli = _fit(tmp_path, config)
    dm, module = cli.datamodule, cli.model
    assert dm.config.env_id == CARTPOLE_NOVEL_ID
    net = module.network
    assert is_recurrent(net) and net.state_size == lstms * 2 * 64  # (h, c) of each LSTM of 64
    assert net.policy_core.weight_ih.shape == (4 * 64, 2) and net.policy_post[0].weight.shape == (64, 64)
    assert module.hparams.decoupled is decoupled
    assert dm.frames == 512 and cli.trainer.global_step == 2 * 2  # 2 iterations x 2 epochs x 1 minibatch
    assert np.isfinite(dm.states[0].episodes.mean_return(20))


def test_feed_forward_cartpole_config_trains_on_the_partially_observed_env(tmp_path):
    """benchmarks/recurrent_cartpole.py's MLP baseline: cartpole/ppo with --data.env_id set to the task."""
    cli = _fit(tmp_path, "cartpole/ppo", "--data.env_id", CARTPOLE_NOVEL_ID)
    assert cli.datamodule.frames == 512 and not getattr(cli.model.network, "recurrent", False)
