"""gymnasium's MuJoCo tasks stepped by envpool's C++ (``data.env_kwargs: {backend: envpool}``).

For a MuJoCo id such as ``Hopper-v5``, the env step is most of a member group's time (two thirds of a Hopper
group of 16's CPU time on the AVX-512 EPYC: docs/benchmarks/env-steps.md); envpool 1.2.5's v5 tasks step the
same models in C++ at less than half the CPU time of gymnasium's Python loop. Its v5 tasks give the rewards,
terminations and observations of gymnasium's from the same state (envpool's own tests, to 1e-6;
tests/test_envpool.py checks Hopper). Seeds do not give gymnasium's trajectories (another generator).

The envs of a run are one envpool pool in synchronous mode (``num_threads``: 1 unless set), seeded
``seed`` (env i draws from ``seed + i``). As the gymnasium path, actions are clipped to the action space's
bounds (`gymnasium.wrappers.ClipAction`); an episode's final observation comes with ``done`` and the ended
envs are reset by ``reset(env_id)`` (a partial reset: no extra step, no fake transition). The pool steps as
one batch (``step_games`` / ``reset_games``), so `ppo_lightning.data.batched_rollout` drives it, for a single
run and for a group's members. Exact resume: the simulators' states are not saved (the envs restart).

envpool is not installed by ``make``: with its asset packages (``envpool-assets``,
``envpool-assets-mujoco-large``) it is about 500 MB, and it asks for ``glfw>=2.10`` where constraints.txt pins
1.12, so it is no extra of the project: ``pip install envpool==1.2.5`` into the virtualenv (it upgrades glfw).
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data.tensor_specs import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import Compose, EnvBase, RewardSum, StepCounter, TransformedEnv

INSTALL = "pip install envpool==1.2.5"
BACKEND_KEY = "backend"  # data.env_kwargs: {backend: envpool}


def _envpool():
    try:
        import envpool
    except ImportError:
        raise ValueError(f"data.env_kwargs.backend: envpool is not installed: {INSTALL}") from None
    return envpool


def check_envpool_task(env_id: str) -> None:
    envpool = _envpool()
    if env_id not in envpool.list_all_envs() or "mujoco" not in str(_gym_entry_point(env_id)):
        raise ValueError(f"data.env_kwargs.backend: envpool is offered for gymnasium's MuJoCo tasks, not {env_id!r}")


def _gym_entry_point(env_id: str) -> str:
    import gymnasium as gym

    spec = gym.registry.get(env_id)
    return "" if spec is None else str(spec.entry_point)


class EnvpoolTorchEnv(EnvBase):
    """``num_envs`` copies of a gymnasium MuJoCo task in one envpool pool, as a TorchRL env of batch
    ``[num_envs]``: ``observation`` (float64, as gymnasium's), ``action`` (float32, clipped to the bounds),
    ``next``: ``reward``, ``done``, ``terminated``, ``truncated`` (the task's time limit)."""

    array_actions = True  # step_games takes a numpy array of actions

    def __init__(self, env_id: str, num_envs: int, seed: int = 0, num_threads: int = 1, **task_kwargs) -> None:
        check_envpool_task(env_id)
        super().__init__(batch_size=torch.Size([num_envs]))
        self.env_id, self.num_envs, self.num_threads, self.task_kwargs = env_id, num_envs, num_threads, task_kwargs
        self._build(int(seed))
        space = self._pool.action_space
        self.low, self.high = space.low.astype(np.float64), space.high.astype(np.float64)
        obs_shape = tuple(self._pool.observation_space.shape)
        b = self.batch_size
        self.observation_spec = Composite(observation=Unbounded(shape=(*b, *obs_shape), dtype=torch.float64), shape=b)
        shape = (*b, *space.shape)
        self.action_spec = Bounded(torch.as_tensor(self.low, dtype=torch.float32).expand(shape),
                                   torch.as_tensor(self.high, dtype=torch.float32).expand(shape),
                                   shape=shape, dtype=torch.float32)
        self.reward_spec = Unbounded(shape=(*b, 1), dtype=torch.float32)
        flag = Categorical(2, shape=(*b, 1), dtype=torch.bool)
        self.done_spec = Composite(done=flag.clone(), terminated=flag.clone(), truncated=flag.clone(), shape=b)

    def _build(self, seed: int) -> None:
        envpool = _envpool()
        self._pool = envpool.make_gymnasium(self.env_id, num_envs=self.num_envs, num_threads=self.num_threads,
                                            seed=seed, **self.task_kwargs)
        obs, _ = self._pool.reset()
        self._obs = np.array(obs, dtype=np.float64)
        self._seed = seed

    def _set_seed(self, seed: int | None) -> None:
        if seed is not None and seed != self._seed:
            self._pool.close()
            self._build(int(seed))

    def reset_games(self, asked: np.ndarray) -> None:
        """Reset the envs where ``asked``; their first observations go into ``self._obs``."""
        ids = np.flatnonzero(asked).astype(np.int32)
        if len(ids):
            obs, info = self._pool.reset(ids)
            self._obs[np.asarray(info["env_id"])] = obs

    def step_games(self, actions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Step every env once (actions clipped to the bounds); observations into ``self._obs``."""
        action = np.clip(np.asarray(actions, dtype=np.float64), self.low, self.high)
        obs, reward, terminated, truncated, info = self._pool.step(action)
        order = np.asarray(info["env_id"])
        self._obs[order] = obs
        out_reward = np.empty(self.num_envs, dtype=np.float32)
        out_term, out_trunc = np.empty(self.num_envs, dtype=bool), np.empty(self.num_envs, dtype=bool)
        out_reward[order], out_term[order], out_trunc[order] = reward, terminated, truncated & ~terminated
        return out_reward, out_term, out_trunc

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        mask = None if tensordict is None else tensordict.get("_reset", None)
        asked = np.ones(self.num_envs, dtype=bool) if mask is None else mask.reshape(self.num_envs).numpy()
        self.reset_games(asked)
        zeros = torch.zeros((self.num_envs, 1), dtype=torch.bool)
        return TensorDict({"observation": torch.from_numpy(self._obs.copy()), "done": zeros,
                           "terminated": zeros.clone(), "truncated": zeros.clone()}, batch_size=self.batch_size)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        reward, terminated, truncated = self.step_games(tensordict.get("action").numpy())
        term, trunc = torch.from_numpy(terminated).unsqueeze(-1), torch.from_numpy(truncated).unsqueeze(-1)
        return TensorDict({"observation": torch.from_numpy(self._obs.copy()),
                           "reward": torch.from_numpy(reward).unsqueeze(-1),
                           "done": term | trunc, "terminated": term, "truncated": trunc}, batch_size=self.batch_size)


def make_envpool_env(env_id: str, num_envs: int, seed: int, **env_kwargs):
    """``env_id`` stepped by envpool, as a batched TorchRL env with episode statistics."""
    env = EnvpoolTorchEnv(env_id, num_envs, seed=seed, **env_kwargs)
    return TransformedEnv(env, Compose(RewardSum(), StepCounter()))
