"""Issue 62, item 4: Atari through ale-py's C++ vector env with the PPO paper's preprocessing.

The oracle: ale-py's single env with gymnasium's own ``AtariPreprocessing`` (frame skip 4 with max-pooling,
84x84 grayscale) and ``FrameStackObservation`` (4 frames, zero padding), on the same seed and actions: the
same frames, the same rewards (ours clipped to their sign), a training episode's end where the emulator's
life counter goes down; and the game's score and length as ours records them. (``AtariPreprocessing``'s own
``terminal_on_life_loss`` stops its frame skip at the frame the life is lost, so that step's frame differs;
CleanRL's ``EpisodicLifeEnv`` and ale-py's vector env finish the 4 frames.) No-op starts and fire reset are off on both sides
(the reference wrappers draw no-ops from another generator and take no FIRE).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ale_py")

from ppo_lightning.envs import env_spaces, make_env  # noqa: E402
from ppo_lightning.envs.atari_env import AtariTorchEnv, rom_name  # noqa: E402


def reference(game: str, seed: int):
    pytest.importorskip("cv2")  # gymnasium's AtariPreprocessing resizes with OpenCV
    import ale_py
    import gymnasium as gym
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gym.register_envs(ale_py)
    env = gym.make(f"ALE/{game}", frameskip=1, repeat_action_probability=0.0)
    env = AtariPreprocessing(env, noop_max=0, frame_skip=4, screen_size=84, grayscale_obs=True)
    env = FrameStackObservation(env, 4, padding_type="zero")
    obs, _ = env.reset(seed=seed)
    return env, obs


@pytest.mark.parametrize("game, steps", [("Breakout-v5", 3000), ("SpaceInvaders-v5", 400)])
def test_preprocessing_equals_gymnasiums_wrappers(game, steps):
    ref, ref_obs = reference(game, seed=3)
    ours = AtariTorchEnv(game, 1, seed=3, noop_max=0, use_fire_reset=False)
    assert np.array_equal(ours._obs[0], ref_obs)
    rng = np.random.default_rng(0)
    score, lives_lost, clipped = 0.0, 0, 0
    lives = ref.unwrapped.ale.lives()
    for t in range(steps):
        action = int(rng.integers(ours.num_actions))
        obs, r, terminated, truncated, _ = ref.step(action)
        reward, term, trunc = ours.step_games(np.array([action]))
        assert np.array_equal(ours._obs[0], obs), f"step {t}: frames differ"
        assert reward[0] == np.sign(r), f"step {t}: reward {reward[0]} for the game's {r}"
        clipped += r != np.sign(r)
        score += r
        life_lost = ref.unwrapped.ale.lives() < lives
        lives = ref.unwrapped.ale.lives()
        assert bool(term[0]) == (life_lost or terminated) and not trunc[0], f"step {t}"
        assert bool(ours.game_over[0]) == terminated
        if terminated:  # the game's end: its whole, unclipped score and its length
            assert ours.game_return[0] == score and ours.game_length[0] == t + 1
            break
        lives_lost += life_lost
        ours.reset_games(np.array([bool(term[0])]))
    if game == "Breakout-v5":
        assert ours.game_over[0] and lives_lost == 4  # a whole game of 5 lives was compared
    else:
        assert clipped > 0  # rewards above 1 were clipped


def test_spaces_and_one_line_errors():
    obs, act = env_spaces("ALE/Pong-v5")
    assert obs == {"shape": [4, 84, 84], "dtype": "uint8"} and act == {"type": "discrete", "n": 6}
    assert rom_name("SpaceInvaders-v5") == "space_invaders"
    with pytest.raises(ValueError, match="ale-py has no Atari game 'Pongg-v5'"):
        env_spaces("ALE/Pongg-v5")
    with pytest.raises(ValueError, match="not an Atari setting"):
        env_spaces("ALE/Pong-v5", {"frame_skip": 4})


def test_missing_ale_py_names_the_extra(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_ale(name, *args, **kwargs):
        if name == "ale_py":
            raise ImportError("No module named 'ale_py'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ale)
    with pytest.raises(ValueError, match=r'Atari needs ale-py, which is not installed: pip install -e ".\[atari\]"'):
        env_spaces("ALE/Pong-v5")


def test_torchrl_env_records_whole_games():
    """Through TorchRL's rollout: a life lost ends a training episode, the game's end is recorded apart."""
    env = make_env("ALE/Breakout-v5", 2, seed=1, env_kwargs={"noop_max": 0})
    nxt = env.rollout(400, break_when_any_done=False)["next"]
    games = nxt["game_over"]
    assert 0 < int(games.sum()) < int(nxt["done"].sum())  # lives lost end episodes that are not games
    assert (nxt["game_return"][~games] == 0).all() and (nxt["game_length"][games] > 100).all()


def test_video_frames_are_rgb():
    """The frames a training video records (env 0's newest preprocessed frame, as RGB)."""
    from ppo_lightning.envs import make_recordable_env

    env, frame = make_recordable_env("ALE/Pong-v5", 2, 0, {})
    env.rand_step(env.reset())
    shot = frame()
    assert shot.shape == (84, 84, 3) and shot.dtype == np.uint8 and shot.any()


def test_atari_trains_alone_and_as_a_group_member_k_equals_seed_k():
    """The atari/ppo recipe at a tiny size (2 envs x 8 steps, 2 iterations): member k of a group of 2 trains
    as seed k alone (the MinAtar path: the games step as one batch)."""
    import torch

    from tests.test_members_every_env import assert_member_is_alone

    torch.set_num_threads(1)
    worst = assert_member_is_alone(
        "ALE/Breakout-v5", 2, data_kwargs={"num_envs": 2, "rollout_steps": 8, "num_minibatches": 2, "update_epochs": 1,
                                           "normalize_reward": False},
        collector="BatchedRollout", trainer_kwargs={"gradient_clip_val": 0.5}, network={"name": "nature_cnn"},
        lr=2.5e-4, clip_eps=0.1, value_clip_eps=0.1, value_coef=1.0, entropy_coef=0.01)
    assert worst < 1e-5


def test_evaluate_scores_whole_games(tmp_path):
    """``evaluate`` on an Atari checkpoint counts games (all lives) and their unclipped scores."""
    import torch

    from ppo_lightning.interop.evaluation import evaluate_policy
    from ppo_lightning.nets.models import build_network

    obs, act = env_spaces("ALE/Breakout-v5")
    torch.manual_seed(0)
    net = build_network(obs, act, {"name": "auto"})
    result = evaluate_policy(net, "ALE/Breakout-v5", episodes=2, num_envs=2, seed=0)
    assert len(result["returns"]) == 2
    assert all(length > 100 for length in result["lengths"])  # five lives of a random policy, not one
