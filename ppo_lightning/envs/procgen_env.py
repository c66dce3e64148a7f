"""Procgen (Cobbe et al. 2020) as a batched TorchRL env, a thin layer over ``procgen.ProcgenGym3Env``.

Why not TorchRL's ``ProcgenWrapper``: it prints a warning on every partial reset, permutes the
observation to CHW (a copy per step), drops ``info`` and goes through gym3's baselines adapter. This
env talks to the C env directly: ``act`` + ``observe`` per step, observations stay uint8 HWC
(``[num_envs, 64, 64, 3]``; the IMPALA network views them as NCHW channels_last without a copy).

Episode ends and resets. Procgen resets every sub-env itself: the observation returned with
``done=True`` is already the *first observation of the next episode*, and the partial reset that
TorchRL then asks for just hands back the stored observation (no warning, no work). GAE is still
right: every Procgen end is reported as ``terminated`` (the games' time limits included, as in the
Procgen / PPG / PPO-EWMA reference code), so ``ppo_lightning.algos.advantages.next_values`` may evaluate
V(next observation) at done steps but GAE multiplies it by ``1 - terminated = 0``: no bootstrap
from the wrong episode. A *full* reset requested while episodes are running (not after an end)
restarts the C env with the same options and a seed derived from the reset count.

Threads: Procgen steps its sub-envs on its own worker threads (``num_threads``), torch runs the
network on its intra-op pool; the two alternate (the policy needs the observation), so on a small
machine they would only fight. `auto_procgen_threads` gives Procgen 1 worker thread per 32 envs,
at most one per core minus one and at least 0 (0 = step in the calling thread); override with
``num_threads``.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data.tensor_specs import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import Compose, EnvBase, RewardSum, StepCounter, TransformedEnv

from ppo_lightning.core.errors import CheckpointError
from ppo_lightning.core.hardware import core_count

GAMES = (
    "bigfish", "bossfight", "caveflyer", "chaser", "climber", "coinrun", "dodgeball", "fruitbot",
    "heist", "jumper", "leaper", "maze", "miner", "ninja", "plunder", "starpilot",
)  # fmt: skip
DISTRIBUTION_MODES = ("easy", "hard", "extreme", "memory", "exploration")
OBS_SHAPE = (64, 64, 3)
NUM_ACTIONS = 15


def _procgen():
    """Import procgen without gym's 'unmaintained' notice on stderr."""
    with contextlib.redirect_stderr(io.StringIO()):
        import procgen
    return procgen


def check_procgen_game(game: str) -> None:
    """Raise ValueError naming ``data.env_id`` if ``game`` is not a Procgen game."""
    if game not in GAMES:
        raise ValueError(f"data.env_id: unknown Procgen game {game!r} in 'procgen:{game}'; games: {', '.join(GAMES)}")


def procgen_spaces() -> tuple[dict, dict]:
    """(observation_space, action_space) of every Procgen game, as plain dicts."""
    return {"shape": list(OBS_SHAPE), "dtype": "uint8"}, {"type": "discrete", "n": NUM_ACTIONS}


def auto_procgen_threads(num_envs: int) -> int:
    """Procgen worker threads that do not oversubscribe the cores torch also uses (see module doc)."""
    return max(0, min(num_envs // 32, core_count() - 1))


class ProcgenTorchEnv(EnvBase):
    """A vector of ``num_envs`` Procgen games as one TorchRL env with batch size ``[num_envs]``.

    Keys: ``observation`` (uint8 ``[64, 64, 3]``), ``action`` (int64 index in [0, 15)), and in
    ``next``: ``reward``, ``done``, ``terminated`` (== done), ``truncated`` (always False).
    """

    def __init__(
        self,
        game: str,
        num_envs: int,
        seed: int = 0,
        distribution_mode: str = "hard",
        num_levels: int = 0,
        start_level: int = 0,
        num_threads: int | None = None,
        pin_memory: bool = False,
        **procgen_kwargs: Any,
    ) -> None:
        check_procgen_game(game)
        if distribution_mode not in DISTRIBUTION_MODES:
            raise ValueError(f"data.env_kwargs.distribution_mode must be one of {DISTRIBUTION_MODES}, got {distribution_mode!r}")
        if num_levels < 0 or start_level < 0:
            raise ValueError(f"data.env_kwargs.num_levels / start_level must be >= 0, got {num_levels} / {start_level}")
        super().__init__(batch_size=torch.Size([num_envs]))
        self.game, self.num_envs = game, num_envs
        self.distribution_mode, self.num_levels, self.start_level = distribution_mode, num_levels, start_level
        self.num_threads = auto_procgen_threads(num_envs) if num_threads is None else int(num_threads)
        self.procgen_kwargs = dict(procgen_kwargs)
        self._seed = int(seed)
        self._resets = 0
        self._venv = None
        self._obs: torch.Tensor | None = None
        self._first = np.ones(num_envs, dtype=bool)
        self._started = False
        # pin_memory (a policy on a GPU, see ppo_lightning.data.devices): observations are copied into a
        # ring of two pinned host buffers, so that their copy to the GPU is asynchronous. A returned
        # observation is overwritten two steps later: only for consumers that copy it every step.
        self._pinned = [torch.empty((num_envs, *OBS_SHAPE), dtype=torch.uint8).pin_memory() for _ in range(2)] \
            if pin_memory else None
        self._pin_index = 0
        self._make_specs()
        self._build()

    # ------------------------------------------------------------------ construction
    def _make_specs(self) -> None:
        b = self.batch_size
        self.observation_spec = Composite(
            observation=Bounded(0, 255, shape=(*b, *OBS_SHAPE), dtype=torch.uint8), shape=b
        )
        self.action_spec = Categorical(NUM_ACTIONS, shape=b, dtype=torch.int64)
        self.reward_spec = Unbounded(shape=(*b, 1), dtype=torch.float32)
        flag = Categorical(2, shape=(*b, 1), dtype=torch.bool)
        self.done_spec = Composite(done=flag.clone(), terminated=flag.clone(), truncated=flag.clone(), shape=b)

    def _build(self) -> None:
        if self._venv is not None:
            self._venv.close()
        procgen = _procgen()
        # Distinct, reproducible Procgen seeds for (seed, number of hard resets).
        rand_seed = int(np.random.SeedSequence([self._seed, self._resets]).generate_state(1)[0] % (2**31 - 1))
        self._venv = procgen.ProcgenGym3Env(
            num=self.num_envs,
            env_name=self.game,
            distribution_mode=self.distribution_mode,
            num_levels=self.num_levels,
            start_level=self.start_level,
            num_threads=self.num_threads,
            rand_seed=rand_seed,
            **self.procgen_kwargs,
        )
        _, ob, first = self._venv.observe()
        self._obs = self._host_obs(ob["rgb"])
        self._first = first
        self._started = False
        self._zeros = torch.zeros((self.num_envs, 1), dtype=torch.bool)

    def _host_obs(self, rgb: np.ndarray) -> torch.Tensor:
        if self._pinned is None:
            return torch.from_numpy(rgb)
        self._pin_index ^= 1
        return self._pinned[self._pin_index].copy_(torch.from_numpy(rgb))

    def _set_seed(self, seed: int | None) -> None:
        if seed is None or int(seed) == self._seed:
            return
        self._seed, self._resets = int(seed), 0
        self._build()

    # ------------------------------------------------------------------ stepping
    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        mask = None if tensordict is None else tensordict.get("_reset", None)
        asked = np.ones(self.num_envs, dtype=bool) if mask is None else mask.reshape(self.num_envs).numpy()
        if self._started and bool((asked & ~self._first).any()):
            # A reset of running episodes: Procgen cannot reset one env, so restart them all.
            self._resets += 1
            self._build()
        self._started = True
        return TensorDict(
            {"observation": self._obs, "done": self._zeros, "terminated": self._zeros, "truncated": self._zeros},
            batch_size=self.batch_size,
        )

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = tensordict.get("action").reshape(self.num_envs).numpy().astype(np.int32)
        self._venv.act(action)
        rew, ob, first = self._venv.observe()
        self._obs = self._host_obs(ob["rgb"])
        self._first = first
        done = torch.from_numpy(first).unsqueeze(-1)
        return TensorDict(
            {
                "observation": self._obs,
                "reward": torch.from_numpy(rew).float().unsqueeze(-1),
                "done": done,
                "terminated": done.clone(),
                "truncated": self._zeros.clone(),
            },
            batch_size=self.batch_size,
        )

    # ------------------------------------------------------------------ exact resume
    def get_state(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue these episodes exactly (`ppo_lightning.data.resume_state`):
        each game's serialized state (Procgen's ``get_state``: level, entities, RNG) as uint8 tensors,
        plus this wrapper's current observation, episode-start flags and reset count."""
        return {
            "games": [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in self._venv.get_state()],
            "obs": self._obs.clone(),
            "first": torch.from_numpy(np.asarray(self._first, dtype=bool).copy()),
            "started": self._started,
            "seed": self._seed,
            "resets": self._resets,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        if len(state["games"]) != self.num_envs:
            raise CheckpointError(f"the checkpoint has {len(state['games'])} Procgen envs per rank, the config "
                                  f"{self.num_envs} (data.num_envs): resume with the same data.num_envs")
        if (state["seed"], state["resets"]) != (self._seed, self._resets):
            self._seed, self._resets = int(state["seed"]), int(state["resets"])
            self._build()
        self._venv.set_state([bytes(t.numpy().tobytes()) for t in state["games"]])
        self._obs = state["obs"].clone()
        self._first = state["first"].numpy().copy()
        self._started = bool(state["started"])

    def close(self, *, raise_if_closed: bool = True) -> None:
        if self._venv is not None:
            self._venv.close()
            self._venv = None
        super().close(raise_if_closed=raise_if_closed)


def make_procgen_env(
    game: str,
    num_envs: int,
    seed: int,
    distribution_mode: str = "hard",
    num_levels: int = 0,
    start_level: int = 0,
    num_threads: int | None = None,
    pin_memory: bool = False,
    **procgen_kwargs: Any,
):
    """Procgen ``game`` as a batched TorchRL env (batch ``[num_envs]``) with episode statistics.

    ``num_levels=0`` is the full level distribution; ``start_level`` shifts the level seeds (train on
    ``num_levels`` levels from 0, test on the full distribution from a disjoint start level).
    ``num_threads``: Procgen's worker threads (None: `auto_procgen_threads`). ``pin_memory``: hand
    observations over in pinned host memory (set by the data side for a policy on a GPU). Other keyword arguments
    (``use_backgrounds``, ``restrict_themes``, ``paint_vel_info``, ...) go to ``ProcgenGym3Env``.
    """
    env = ProcgenTorchEnv(
        game,
        num_envs,
        seed=seed,
        distribution_mode=distribution_mode,
        num_levels=num_levels,
        start_level=start_level,
        num_threads=num_threads,
        pin_memory=pin_memory,
        **procgen_kwargs,
    )
    return TransformedEnv(env, Compose(RewardSum(), StepCounter()))

# ---------------------------------------------------------------- the family interface of `ppo_lightning.envs`
def check(name: str) -> None:
    check_procgen_game(name)


def spaces(name: str, env_kwargs: dict) -> tuple[dict, dict]:
    return procgen_spaces()


def make(name: str, num_envs: int, seed: int, env_kwargs: dict, timeout_s: float | None = None):
    return make_procgen_env(name, num_envs=num_envs, seed=seed, **env_kwargs)


def recordable(name: str, num_envs: int, seed: int, env_kwargs: dict):
    """The env and None: its observations are the frames."""
    return make(name, num_envs, seed, env_kwargs), None
