"""MinAtar (Young & Tian 2019) as a batched TorchRL env: ``minatar:<game>`` with MinAtar's own names.

Games: asterix, breakout, freeway, seaquest, space_invaders. Observations are the games' 10x10xC
boolean state (C = 4 for Breakout, up to 10 for Seaquest), kept HWC and ``torch.bool``: the networks
take it as 0/1 floats (`ppo_lightning.nets.minatar_cnn`; the IMPALA CNN only rescales uint8). Every game
has MinAtar's 6 actions (``minatar.Environment.num_actions``), as the MinAtar paper's agents use.

Why not ``minatar.gym``: its registration targets gym, not gymnasium 1.x, and a gymnasium vector env
adds a wrapper layer per step. Here ``num_envs`` ``minatar.Environment`` objects are stepped in one
Python loop and their states written into one preallocated array (MinAtar steps at ~140k steps/s
single-threaded, so a batched step of 64 games is well under a millisecond, next to TorchRL's
~0.3-0.75 ms per collector step).

MinAtar's defaults, kept (MinAtar paper, section 3): sticky actions with probability 0.1
(``sticky_action_prob``: with that probability the previous action is repeated; the env's own
random stream, so it is seeded) and difficulty ramping on (``difficulty_ramping``).

Episode ends. A game's own end (``terminal``) is reported as ``terminated`` (no bootstrap). MinAtar
has no time limit except Freeway's 2500 frames, which the game reports as terminal (as MinAtar
does). A run-away episode is cut at ``max_episode_steps`` (default 10,000 frames, e.g. a Breakout
agent that never misses): reported as ``truncated``, so GAE bootstraps from V(final observation).
The observation returned with ``done`` is the *final* observation; TorchRL then asks for a partial
reset (``_reset`` mask) and only those games restart.

Seeding: game ``i`` of an env seeded ``s`` draws from ``np.random.RandomState`` seeded with
``SeedSequence([s, i])`` (sticky actions and game randomness share that stream, as in MinAtar),
so two envs built with the same seed produce the same trajectories for the same actions.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data.tensor_specs import Binary, Categorical, Composite, Unbounded
from torchrl.envs import Compose, EnvBase, RewardSum, StepCounter, TransformedEnv

GAMES = ("asterix", "breakout", "freeway", "seaquest", "space_invaders")
NUM_ACTIONS = 6
DEFAULT_MAX_EPISODE_STEPS = 10_000
_CHANNELS = {"asterix": 4, "breakout": 4, "freeway": 7, "seaquest": 10, "space_invaders": 6}


def _minatar():
    """Import minatar without its logging warning about rendering (seaborn/matplotlib)."""
    with contextlib.redirect_stderr(io.StringIO()):
        level = logging.root.level
        logging.root.setLevel(logging.ERROR)
        try:
            import minatar
        finally:
            logging.root.setLevel(level)
    return minatar


def check_minatar_game(game: str) -> None:
    """Raise ValueError naming ``data.env_id`` if ``game`` is not a MinAtar game."""
    if game not in GAMES:
        raise ValueError(f"data.env_id: unknown MinAtar game {game!r} in 'minatar:{game}'; games: {', '.join(GAMES)}")


def minatar_spaces(game: str) -> tuple[dict, dict]:
    """(observation_space, action_space) of a MinAtar game, as plain dicts."""
    check_minatar_game(game)
    return {"shape": [10, 10, _CHANNELS[game]], "dtype": "bool"}, {"type": "discrete", "n": NUM_ACTIONS}


class MinAtarTorchEnv(EnvBase):
    """``num_envs`` MinAtar games as one TorchRL env with batch size ``[num_envs]``.

    Keys: ``observation`` (bool ``[10, 10, C]``), ``action`` (int64 in [0, 6)), and in ``next``:
    ``reward``, ``done``, ``terminated`` (the game ended), ``truncated`` (``max_episode_steps``).
    """

    def __init__(
        self,
        game: str,
        num_envs: int,
        seed: int = 0,
        sticky_action_prob: float = 0.1,
        difficulty_ramping: bool = True,
        max_episode_steps: int | None = DEFAULT_MAX_EPISODE_STEPS,
    ) -> None:
        check_minatar_game(game)
        if not 0.0 <= sticky_action_prob < 1.0:
            raise ValueError(f"data.env_kwargs.sticky_action_prob must lie in [0, 1), got {sticky_action_prob}")
        if max_episode_steps is not None and (not isinstance(max_episode_steps, int) or max_episode_steps <= 0):
            raise ValueError(f"data.env_kwargs.max_episode_steps must be a positive integer or null, got {max_episode_steps!r}")
        super().__init__(batch_size=torch.Size([num_envs]))
        self.game, self.num_envs = game, num_envs
        self.sticky_action_prob, self.difficulty_ramping = float(sticky_action_prob), bool(difficulty_ramping)
        self.max_episode_steps = max_episode_steps
        minatar = _minatar()
        self._games = [minatar.Environment(game, sticky_action_prob=self.sticky_action_prob,
                                           difficulty_ramping=self.difficulty_ramping) for _ in range(num_envs)]
        shape = self._games[0].state_shape()
        self.obs_shape = (int(shape[0]), int(shape[1]), int(shape[2]))
        self._obs = np.zeros((num_envs, *self.obs_shape), dtype=bool)
        self._steps = np.zeros(num_envs, dtype=np.int64)
        self._make_specs()
        self._seed_games(int(seed))

    def _make_specs(self) -> None:
        b = self.batch_size
        self.observation_spec = Composite(
            observation=Binary(shape=(*b, *self.obs_shape), dtype=torch.bool), shape=b
        )
        self.action_spec = Categorical(NUM_ACTIONS, shape=b, dtype=torch.int64)
        self.reward_spec = Unbounded(shape=(*b, 1), dtype=torch.float32)
        flag = Categorical(2, shape=(*b, 1), dtype=torch.bool)
        self.done_spec = Composite(done=flag.clone(), terminated=flag.clone(), truncated=flag.clone(), shape=b)

    def _seed_games(self, seed: int) -> None:
        self._seed = seed
        for i, g in enumerate(self._games):
            g.seed(int(np.random.SeedSequence([seed, i]).generate_state(1)[0]))
            g.last_action = 0
            g.reset()
            self._obs[i] = g.state()
        self._steps[:] = 0

    def _set_seed(self, seed: int | None) -> None:
        if seed is not None:
            self._seed_games(int(seed))

    # ------------------------------------------------------------------ exact resume
    def get_raw_state(self) -> dict:
        """Every game's state, as MinAtar keeps it (plain Python and numpy data, each game's
        ``RandomState`` included), plus the current observations and step counts; encoded for a
        checkpoint by `ppo_lightning.data.resume_state`."""
        games = [{"outer": {k: copy.deepcopy(v) for k, v in vars(g).items() if k != "env"},
                  "inner": {k: copy.deepcopy(v) for k, v in vars(g.env).items() if k != "random"}}
                 for g in self._games]
        return {"games": games, "obs": self._obs.copy(), "steps": self._steps.copy()}

    def set_raw_state(self, state: dict) -> None:
        if len(state["games"]) != self.num_envs:
            raise ValueError(f"the saved MinAtar state has {len(state['games'])} games, this env {self.num_envs} "
                             f"(data.num_envs): resume with the same data.num_envs")
        for g, saved in zip(self._games, state["games"]):
            for k, v in saved["outer"].items():
                if k == "random":  # the game shares this generator: restore it in place
                    g.random.set_state(v.get_state())
                else:
                    setattr(g, k, v)
            for k, v in saved["inner"].items():
                setattr(g.env, k, v)
        self._obs[:] = state["obs"]
        self._steps[:] = state["steps"]

    # ------------------------------------------------------------------ stepping
    def reset_games(self, asked: np.ndarray) -> None:
        """Restart the games where ``asked`` (bool ``[num_envs]``); their states go into ``self._obs``."""
        for i in np.flatnonzero(asked):
            g = self._games[i]
            g.reset()
            g.last_action = 0
            self._obs[i] = g.state()
        self._steps[asked] = 0

    def step_games(self, actions: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Step every game once (one Python loop); states go into ``self._obs`` in place.
        Returns ``(reward float32, terminated bool, truncated bool)``, each ``[num_envs]``. The one
        implementation of a step: `_step` and the batched rollout (`ppo_lightning.data.batched_rollout`)
        both call it."""
        reward = np.zeros(self.num_envs, dtype=np.float32)
        terminal = np.zeros(self.num_envs, dtype=bool)
        obs = self._obs
        for i, (g, a) in enumerate(zip(self._games, actions)):
            r, t = g.act(a)
            reward[i], terminal[i] = r, t
            obs[i] = g.state()
        self._steps[:] += 1  # in place: no module __setattr__ per step
        if self.max_episode_steps is not None:
            truncated = (self._steps >= self.max_episode_steps) & ~terminal
        else:
            truncated = np.zeros(self.num_envs, dtype=bool)
        return reward, terminal, truncated

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        mask = None if tensordict is None else tensordict.get("_reset", None)
        asked = np.ones(self.num_envs, dtype=bool) if mask is None else mask.reshape(self.num_envs).numpy()
        self.reset_games(asked)
        zeros = torch.zeros((self.num_envs, 1), dtype=torch.bool)
        return TensorDict(
            {"observation": torch.from_numpy(self._obs.copy()), "done": zeros, "terminated": zeros.clone(),
             "truncated": zeros.clone()},
            batch_size=self.batch_size,
        )

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        reward, terminal, truncated = self.step_games(tensordict.get("action").reshape(self.num_envs).tolist())
        obs = self._obs
        term = torch.from_numpy(terminal).unsqueeze(-1)
        trunc = torch.from_numpy(truncated).unsqueeze(-1)
        return TensorDict(
            {
                "observation": torch.from_numpy(obs.copy()),
                "reward": torch.from_numpy(reward).unsqueeze(-1),
                "done": term | trunc,
                "terminated": term,
                "truncated": trunc,
            },
            batch_size=self.batch_size,
        )


def make_minatar_env(
    game: str,
    num_envs: int,
    seed: int,
    sticky_action_prob: float = 0.1,
    difficulty_ramping: bool = True,
    max_episode_steps: int | None = DEFAULT_MAX_EPISODE_STEPS,
):
    """MinAtar ``game`` as a batched TorchRL env (batch ``[num_envs]``) with episode statistics
    (``episode_reward``, ``step_count`` in ``next``)."""
    env = MinAtarTorchEnv(game, num_envs, seed=seed, sticky_action_prob=sticky_action_prob,
                          difficulty_ramping=difficulty_ramping, max_episode_steps=max_episode_steps)
    return TransformedEnv(env, Compose(RewardSum(), StepCounter()))


def render_state(state: np.ndarray, scale: int = 32) -> np.ndarray:
    """An RGB frame ``[H*scale, W*scale, 3]`` uint8 of a MinAtar state ``[H, W, C]``: black background,
    one colour per channel (evenly spaced hues; the last active channel wins, as in MinAtar's own
    display), each cell a ``scale`` x ``scale`` square. For videos (`ppo_lightning.interop.video`)."""
    import colorsys

    state = np.asarray(state, dtype=bool)
    h, w, c = state.shape
    palette = np.array([[0, 0, 0]] + [[int(255 * x) for x in colorsys.hsv_to_rgb(i / c, 0.65, 0.95)] for i in range(c)],
                       dtype=np.uint8)
    index = np.zeros((h, w), dtype=np.int64)
    for ch in range(c):
        index[state[:, :, ch]] = ch + 1
    frame = palette[index]
    return np.repeat(np.repeat(frame, scale, axis=0), scale, axis=1)

# ---------------------------------------------------------------- the family interface of `ppo_lightning.envs`
def check(name: str) -> None:
    check_minatar_game(name)


def spaces(name: str, env_kwargs: dict) -> tuple[dict, dict]:
    return minatar_spaces(name)


def make(name: str, num_envs: int, seed: int, env_kwargs: dict, timeout_s: float | None = None):
    return make_minatar_env(name, num_envs=num_envs, seed=seed, **env_kwargs)


def recordable(name: str, num_envs: int, seed: int, env_kwargs: dict):
    """The env and env 0's state drawn as coloured cells (10x10xC boolean states)."""
    env = make(name, num_envs, seed, env_kwargs)
    return env, lambda: render_state(env.base_env._obs[0])
