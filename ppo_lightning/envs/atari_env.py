"""Atari 2600 games (the Arcade Learning Environment) as a batched TorchRL env: ``ALE/<Game>-v5`` ids.

Stepped by ale-py's C++ vector env (`ale_py.AtariVectorEnv`: every game of the batch in C++, frames
preprocessed there, no Python per game), with the preprocessing of the PPO paper (Schulman et al.
2017, section 6.3 and its Table 5, after Mnih et al. 2015) as CleanRL's ``ppo_atari.py`` applies it:

- up to 30 no-op actions at the start of a game (``noop_max``), FIRE at the start where the game has
  it (``use_fire_reset``);
- each action repeated for 4 frames, the observation the maximum of the last two (``frameskip``, ``maxpool``);
- 84x84 grayscale frames, the last 4 stacked: observations ``uint8 [4, 84, 84]`` (CHW; the networks
  scale them to [0, 1], `ppo_lightning.nets.pixel_cnn`);
- for training, the loss of a life ends an episode (``terminated``: no bootstrap; the game goes on
  with the next life) and rewards are clipped to their sign (``episodic_life``, ``reward_clipping``).
  The returns logged (``episode/return_mean20``, the records of studies) are those of whole games,
  unclipped: the env reports every game's end and score beside the training signal (``game_over``,
  ``game_return``, ``game_length`` in ``next``; `ppo_lightning.data.episodes.EpisodeStats` reads them);
- sticky actions off (``repeat_action_probability: 0``, as the PPO paper and CleanRL's ``NoFrameskip-v4``
  envs); ``data.env_kwargs: {repeat_action_probability: 0.25}`` gives Machado et al.'s (2018) protocol,
  gymnasium's default for ``-v5`` ids;
- a game is cut after 108,000 frames (30 minutes of play; ``max_num_frames_per_episode``), ``truncated``.

One difference from CleanRL's gym wrappers: after the loss of a life the frame stack goes on (CleanRL's
``EpisodicLifeEnv`` takes a no-op step and its frame stack restarts from that frame).

The vector env resets a game that ended in the same step (``autoreset_mode=SameStep``); the observation
returned with ``done`` is the game's final one (bootstrapping on truncation), and `reset_games` puts the
new game's first observation in its place, as a partial reset of a TorchRL env does.

Exact resume: the emulators' states are not saved (a resumed run starts new games; the weights,
optimizer and statistics resume exactly).
"""

from __future__ import annotations

import re

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data.tensor_specs import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import Compose, EnvBase, RewardSum, StepCounter, TransformedEnv

PREFIX = "ALE/"
INSTALL = 'pip install -e ".[atari]" (ale-py, with its ROMs)'
# The PPO paper's / CleanRL's preprocessing (module docstring); each is a data.env_kwargs setting.
DEFAULTS = {
    "noop_max": 30,
    "frameskip": 4,
    "maxpool": True,
    "img_height": 84,
    "img_width": 84,
    "grayscale": True,
    "stack_num": 4,
    "episodic_life": True,
    "reward_clipping": True,
    "use_fire_reset": True,
    "repeat_action_probability": 0.0,
    "max_num_frames_per_episode": 108_000,
    "full_action_space": False,
    "num_threads": 1,
}


def _ale():
    try:
        import ale_py
    except ImportError:
        raise ValueError(f"data.env_id: Atari needs ale-py, which is not installed: {INSTALL}") from None
    return ale_py


def rom_name(game: str) -> str:
    """ale-py's ROM name of a gymnasium game name: ``Breakout-v5`` -> ``breakout``,
    ``SpaceInvaders-v5`` -> ``space_invaders``."""
    base = re.sub(r"-v\d+$", "", game)
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", base).lower()


def check_atari_game(game: str) -> str:
    """The ROM name of ``game`` (the part of ``ALE/<Game>-v5`` after ``ALE/``); ValueError naming
    ``data.env_id`` if ale-py is missing or has no such game."""
    if not re.fullmatch(r"[A-Za-z0-9]+-v5", game):
        raise ValueError(f"data.env_id: Atari ids are ALE/<Game>-v5 (e.g. ALE/Breakout-v5), got {PREFIX + game!r}")
    ale_py = _ale()
    rom = rom_name(game)
    if ale_py.roms.get_rom_path(rom) is None:
        close = [r for r in ale_py.roms.get_all_rom_ids() if r.startswith(rom[:3])][:5]
        hint = f" (similar ROMs: {', '.join(close)})" if close else ""
        raise ValueError(f"data.env_id: ale-py has no Atari game {game!r}{hint}")
    return rom


def _settings(env_kwargs: dict) -> dict:
    unknown = sorted(set(env_kwargs) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"data.env_kwargs: {', '.join(unknown)} not an Atari setting; the settings: {', '.join(DEFAULTS)}")
    return {**DEFAULTS, **env_kwargs}


def atari_spaces(game: str, env_kwargs: dict) -> tuple[dict, dict]:
    """(observation_space, action_space) as plain dicts, from a vector env of one game."""
    env = AtariTorchEnv(game, 1, 0, **env_kwargs)
    try:
        shape = list(env.obs_shape)
        return {"shape": shape, "dtype": "uint8"}, {"type": "discrete", "n": env.num_actions}
    finally:
        env.close_games()


class AtariTorchEnv(EnvBase):
    """``num_envs`` Atari games in one `ale_py.AtariVectorEnv`, as a TorchRL env of batch ``[num_envs]``.

    Keys: ``observation`` (uint8 ``[4, 84, 84]``), ``action`` (int64), and in ``next``: ``reward``
    (clipped), ``done``, ``terminated`` (a life lost or the game over), ``truncated`` (the frame limit),
    ``game_over`` (the game ended: over or cut), ``game_return`` (its unclipped score, where
    ``game_over``) and ``game_length`` (its agent steps, where ``game_over``).
    It steps as one batch (``step_games`` / ``reset_games``), so `ppo_lightning.data.batched_rollout`
    drives it without TorchRL's per-step collector, for a single run and for the members of a group.
    """

    GAME_RECORD = True  # next: game_over, game_return, game_length (`ppo_lightning.data.episodes`)
    array_actions = True  # step_games takes a numpy array of actions

    def __init__(self, game: str, num_envs: int, seed: int = 0, **env_kwargs) -> None:
        rom = check_atari_game(game)
        settings = _settings(env_kwargs)
        if not 0.0 <= settings["repeat_action_probability"] < 1.0:
            raise ValueError("data.env_kwargs.repeat_action_probability must lie in [0, 1), got "
                             f"{settings['repeat_action_probability']!r}")
        super().__init__(batch_size=torch.Size([num_envs]))
        self.game, self.num_envs, self.settings = game, num_envs, settings
        episodic_life = settings.pop("episodic_life")
        self.reward_clipping = settings.pop("reward_clipping")
        ale_py = _ale()
        # The game's raw rewards and every life loss come out of the C++ env (life_loss_info: terminated
        # on a life lost, the game going on); the clipping and the end of a game are read here.
        self._vec = ale_py.AtariVectorEnv(rom, num_envs, reward_clipping=False, episodic_life=False,
                                          life_loss_info=episodic_life, autoreset_mode="SameStep", **settings)
        self.obs_shape = tuple(int(s) for s in self._vec.single_observation_space.shape)
        self.num_actions = int(self._vec.single_action_space.n)
        self._obs = np.zeros((num_envs, *self.obs_shape), dtype=np.uint8)
        self._next_obs = np.zeros_like(self._obs)  # the new games' first observations, until reset_games
        self._lives = np.zeros(num_envs, dtype=np.int64)
        self._score = np.zeros(num_envs, dtype=np.float64)
        self._length = np.zeros(num_envs, dtype=np.int64)
        self.game_over = np.zeros(num_envs, dtype=bool)
        self.game_return = np.zeros(num_envs, dtype=np.float32)
        self.game_length = np.zeros(num_envs, dtype=np.int64)
        self._make_specs()
        self._seed_games(int(seed))

    def _make_specs(self) -> None:
        b = self.batch_size
        self.observation_spec = Composite(
            observation=Bounded(0, 255, shape=(*b, *self.obs_shape), dtype=torch.uint8), shape=b)
        self.action_spec = Categorical(self.num_actions, shape=b, dtype=torch.int64)
        self.reward_spec = Unbounded(shape=(*b, 1), dtype=torch.float32)
        flag = Categorical(2, shape=(*b, 1), dtype=torch.bool)
        self.done_spec = Composite(done=flag.clone(), terminated=flag.clone(), truncated=flag.clone(), shape=b)

    def _seed_games(self, seed: int) -> None:
        """Every game restarts; game i of an env seeded s is seeded s + i (ale-py's rule)."""
        self._seed = seed
        obs, info = self._vec.reset(seed=seed)
        self._obs[:] = obs
        self._next_obs[:] = obs
        self._lives[:] = info["lives"]
        self._score[:] = 0.0
        self._length[:] = 0

    def _set_seed(self, seed: int | None) -> None:
        if seed is not None:
            self._seed_games(int(seed))

    def close_games(self) -> None:
        self._vec.close()

    # ------------------------------------------------------------------ stepping
    def reset_games(self, asked: np.ndarray) -> None:
        """After ``done`` where ``asked``: a game that ended is already new in the C++ env (same-step
        reset), its first observation goes into ``self._obs``; after the loss of a life the game goes on
        (the observation is the same)."""
        self._obs[asked] = self._next_obs[asked]

    def step_games(self, actions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Step every game once; observations go into ``self._obs`` (a game's final one where it
        ended). Returns ``(reward, terminated, truncated)``, each ``[num_envs]``, the training signal;
        ``game_over``, ``game_return``, ``game_length`` are set for the whole games' record."""
        obs, reward, terminated, truncated, info = self._vec.step(np.asarray(actions, dtype=np.int64))
        lives = info["lives"]
        reward = reward.astype(np.float64)
        self._score += reward
        self._length += 1
        # A life lost (lives went down, the game goes on) or the game ended (over or cut; reset already):
        life_lost = terminated & (lives < self._lives)
        over = (terminated | truncated) & ~life_lost
        self.game_over[:] = over
        self.game_return[:] = np.where(over, self._score, 0.0)
        self.game_length[:] = np.where(over, self._length, 0)
        self._score[over] = 0.0
        self._length[over] = 0
        self._lives[:] = lives
        self._next_obs[:] = obs
        self._obs[:] = obs
        if over.any():  # reset in the same step: the final observation (only there: it is not set elsewhere)
            self._obs[over] = info["final_obs"][over]
        clipped = np.sign(reward) if self.reward_clipping else reward
        return clipped.astype(np.float32), terminated.astype(bool), (truncated & ~terminated).astype(bool)

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        mask = None if tensordict is None else tensordict.get("_reset", None)
        asked = np.ones(self.num_envs, dtype=bool) if mask is None else mask.reshape(self.num_envs).numpy()
        self.reset_games(asked)
        zeros = torch.zeros((self.num_envs, 1), dtype=torch.bool)
        return TensorDict({"observation": torch.from_numpy(self._obs.copy()), "done": zeros,
                           "terminated": zeros.clone(), "truncated": zeros.clone()}, batch_size=self.batch_size)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        reward, terminated, truncated = self.step_games(tensordict.get("action").reshape(self.num_envs).numpy())
        term = torch.from_numpy(terminated).unsqueeze(-1)
        trunc = torch.from_numpy(truncated).unsqueeze(-1)
        return TensorDict({
            "observation": torch.from_numpy(self._obs.copy()),
            "reward": torch.from_numpy(reward).unsqueeze(-1),
            "done": term | trunc, "terminated": term, "truncated": trunc,
            "game_over": torch.from_numpy(self.game_over.copy()).unsqueeze(-1),
            "game_return": torch.from_numpy(self.game_return.copy()).unsqueeze(-1),
            "game_length": torch.from_numpy(self.game_length.copy()).unsqueeze(-1),
        }, batch_size=self.batch_size)


def make_atari_env(game: str, num_envs: int, seed: int, **env_kwargs):
    """``ALE/<game>`` as a batched TorchRL env with episode statistics (``episode_reward``,
    ``step_count`` of the training signal; whole games in ``game_*``)."""
    env = AtariTorchEnv(game, num_envs, seed=seed, **env_kwargs)
    return TransformedEnv(env, Compose(RewardSum(), StepCounter()))


# ---------------------------------------------------------------- the family interface of `ppo_lightning.envs`
def check(name: str) -> None:
    check_atari_game(name)


def spaces(name: str, env_kwargs: dict) -> tuple[dict, dict]:
    return atari_spaces(name, env_kwargs)


def make(name: str, num_envs: int, seed: int, env_kwargs: dict, timeout_s: float | None = None):
    return make_atari_env(name, num_envs=num_envs, seed=seed, **env_kwargs)


def recordable(name: str, num_envs: int, seed: int, env_kwargs: dict):
    """The env and env 0's newest preprocessed frame, as RGB."""
    env = make(name, num_envs, seed, env_kwargs)

    def frame():
        last = env.base_env._obs[0][-1]
        return np.repeat(last[:, :, None], 3, axis=2) if last.ndim == 2 else last

    return env, frame
