"""Rollouts of S members' TorchRL envs (any family: gymnasium, MuJoCo, Procgen) stepped in lockstep.

A group of members on an env that does not step all its games
in one batch (MinAtar's does: `ppo_lightning.data.batched_rollout`) holds one TorchRL env per member,
each built and seeded as that member's single run builds its own (`ppo_lightning.envs.make_env`:
a gymnasium ``SyncVectorEnv`` with autoreset DISABLED, TorchRL resetting the ended sub-envs; one
Procgen vector env). Per time step: one forward of the stacked network on the members'
observations ``[S, envs, ...]``, each member's actions drawn on its own generator exactly as the
single run's collector draws them from torch's global generator, then each member's
``env.step_and_maybe_reset`` - the call TorchRL's `Collector` makes for a single run - so the
transitions, partial resets and episode statistics are the single run's.

The draws: `ppo_lightning.data.batched_rollout.sample_members`. A gymnasium vector env skips TorchRL's
per-step wrapper altogether: `VectorGames` lets `ppo_lightning.data.batched_rollout.BatchedRollout`
(MinAtar's loop) step it directly, the same transitions at a fraction of the per-step cost.

The rollouts carry the collector's keys and shapes (``("collector", "traj_ids")``, which nothing
downstream reads, is left out), ``[envs, time]`` per member.

A recurrent network (`ppo_lightning.nets.recurrent`) collects through this loop where
`ppo_lightning.data.batched_rollout.BatchedRollout` does not apply (Procgen, ``data.batched_rollout:
false``, a policy on a GPU), a single run's too: its plain network, its actions drawn from torch's
global generator as the collector draws them. The carried step keeps every env's state after the last
step and whether its next step starts an episode, so the next rollout continues the episodes.
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDictBase

from ppo_lightning.adapters import gymnasium as gym_arrays
from ppo_lightning.adapters.torchrl import gym_env
from ppo_lightning.data.batched_rollout import (collector_draw, first_recurrent_step, recurrent_state_size,
                                                 sample_members, state_into_step)
from ppo_lightning.data.devices import network_device
from ppo_lightning.nets.models import OBS_KEY, VALUE_KEY, dist_param_keys, make_distribution
from ppo_lightning.nets.recurrent import IS_INIT_KEY, STATE_KEY, is_recurrent


class VectorGames:
    """A gymnasium ``SyncVectorEnv`` (autoreset DISABLED; `ppo_lightning.envs.gymnasium_env`) inside a TorchRL
    env, driven directly with `ppo_lightning.data.batched_rollout.BatchedRollout`'s interface
    (``step_games``, ``reset_games``, ``_obs``, ``num_envs``) instead of through TorchRL's wrapper and
    transforms on every step (~1-2 ms per vector step, most of a small env's collection). It converts
    as TorchRL's ``GymWrapper`` does: observations to the TorchRL spec's dtype, rewards to float32, done =
    terminated | truncated; partial resets as ``reset(options={"reset_mask": ...})``, the call TorchRL
    makes for a DISABLED-autoreset vector env. The first reset stays TorchRL's (``env.reset()``, which
    seeds); a member's rollouts are then its single run's (tests/test_members_every_env.py)."""

    array_actions = True  # step_games takes the actions as one array (MinAtar's: a list)

    def __init__(self, env) -> None:
        self.vec = gym_env(env.base_env)
        self.num_envs = int(self.vec.num_envs)
        spec = env.observation_spec[OBS_KEY]
        self.obs_dtype = torch.empty((), dtype=spec.dtype).numpy().dtype
        self._obs = np.zeros((self.num_envs, *spec.shape[1:]), dtype=self.obs_dtype)

    def step_games(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``SyncVectorEnv.step`` of a DISABLED-autoreset vector env without its per-call work that nothing
        here reads (`ppo_lightning.adapters.gymnasium.step_rows`). A median 22 us of a Hopper member's
        ~200-300 us step (EPYC-AVX512, loaded: `benchmarks/vector_step.py`)."""
        obs, rewards, terminations, truncations = gym_arrays.step_rows(self.vec, actions)
        self._obs = np.stack(obs).astype(self.obs_dtype, copy=False)
        return rewards.astype(np.float32), terminations.copy(), truncations.copy()

    def reset_games(self, asked: np.ndarray) -> None:
        obs, _ = self.vec.reset(options={"reset_mask": np.asarray(asked, dtype=bool)})
        self._obs = np.asarray(obs).astype(self.obs_dtype, copy=False)


def vector_games(env) -> VectorGames | None:
    """`VectorGames` over ``env`` (from `ppo_lightning.envs.make_env`) if it is a gymnasium vector env with
    autoreset DISABLED (any gymnasium id, MuJoCo included), else None (Procgen: `LockstepRollout`)."""
    try:
        import gymnasium as gym
    except ImportError:
        return None
    vec = gym_env(getattr(env, "base_env", None))
    if not isinstance(vec, gym.vector.SyncVectorEnv) or vec.autoreset_mode != gym.vector.AutoresetMode.DISABLED:
        return None
    return VectorGames(env)


class LockstepRollout:
    """An iterator of every member's rollout ``[num_envs, frames_per_batch / num_envs]``.

    ``envs``: one TorchRL env per member (`ppo_lightning.envs.make_env`), ``network``: the members'
    stacked network (`ppo_lightning.nets.seed_stack.SeedStack`), ``generators``: one action generator
    per member. ``generators`` None: a single run (``envs`` its one env, ``network`` its own, the
    actions from torch's global generator, `collector_draw`; ``next()`` gives its rollout). Like the
    collector, every env is reset once when this is built. The rollouts and the carried step stay on
    the envs' device; the network's inputs go to its own device."""

    def __init__(self, envs: list, network: torch.nn.Module, action_space: dict, frames_per_batch: int,
                 generators: list[torch.Generator] | None = None) -> None:
        self.envs, self.network, self.action_space = list(envs), network, action_space
        self.single = generators is None
        self.generators = None if self.single else list(generators)
        n = int(self.envs[0].batch_size[0])
        if frames_per_batch % n:
            raise ValueError(f"frames per iteration ({frames_per_batch}) must be a multiple of data.num_envs ({n})")
        self.num_envs, self.steps = n, frames_per_batch // n
        self.param_keys = dist_param_keys(action_space)
        self.state_size = recurrent_state_size(network) if is_recurrent(network) else None
        carriers = [self._first_step(env) for env in self.envs]
        self._carrier = carriers[0] if self.single else torch.stack(carriers)  # [S, n]: each member's carried step

    def _first_step(self, env) -> TensorDictBase:
        """The env's first reset, with a recurrent network's zero states and ``is_init`` True."""
        td = env.reset()
        if self.state_size is not None:
            td.update(first_recurrent_step((self.num_envs,), self.state_size))
        return td

    def reset_member(self, k: int, env, generator: torch.Generator) -> None:
        """Member k starts again with ``env`` (fresh, seeded) and its action ``generator``: the carried
        step is the env's first reset, as when a single run's collector is built."""
        self.envs[k], self.generators[k] = env, generator
        self._carrier[k] = self._first_step(env)

    def __iter__(self):
        return self

    def __next__(self) -> TensorDictBase:
        return self.rollouts()[0]

    def shutdown(self) -> None:
        """Nothing to stop (the envs are the source's)."""

    @torch.no_grad()
    def rollouts(self) -> list[TensorDictBase]:
        S, T = len(self.envs), self.steps
        carriers = [self._carrier] if self.single else list(self._carrier.unbind(0))
        records: list[list[TensorDictBase]] = [[] for _ in range(S)]
        recurrent, noise = self.state_size is not None, None
        device = network_device(self.network)
        env_device = carriers[0].get(OBS_KEY).device

        def inputs(key):  # every member's carried entries, on the network's device ([n, ...] for a single run)
            x = carriers[0].get(key) if self.single else torch.stack([c.get(key) for c in carriers])
            return x.to(device, non_blocking=True)

        for _ in range(T):
            obs = inputs(OBS_KEY)
            if recurrent:
                state = state_into_step(inputs(STATE_KEY), inputs(IS_INIT_KEY))
                *params, value, next_state = self.network.step(obs, state, inputs(IS_INIT_KEY))
            else:
                *params, value = self.network(obs)
            if self.single:
                dist = make_distribution(self.action_space, *params)
                action = collector_draw(dist)
                outputs = [x.unsqueeze(0) for x in (*params, value, action, dist.log_prob(action))]
                if recurrent:
                    outputs += [state.unsqueeze(0), next_state.unsqueeze(0)]
            else:
                if noise is None:
                    noise = torch.empty_like(params[0])  # logits [S, n, A] or loc [S, n, A]
                action = sample_members(self.action_space, params, self.generators, noise)
                log_prob = make_distribution(self.action_space, *params).log_prob(action)
                outputs = [*params, value, action, log_prob] + ([state, next_state] if recurrent else [])
            outputs = [x.to(env_device) for x in outputs]
            *params, value, action, log_prob = outputs[:len(params) + 3]
            for k, env in enumerate(self.envs):
                td = carriers[k]
                for key, p in zip(self.param_keys, params):
                    td.set(key, p[k])
                td.set(VALUE_KEY, value[k])
                td.set("action", action[k])
                td.set("action_log_prob", log_prob[k])
                if recurrent:
                    td.set(STATE_KEY, outputs[-2][k])  # the state into this step (zeroed where is_init)
                out, carriers[k] = env.step_and_maybe_reset(td)
                if recurrent:  # the state after it; the next step starts an episode where this one ended
                    out.set(("next", STATE_KEY), outputs[-1][k])
                    carriers[k].set(STATE_KEY, outputs[-1][k])
                    carriers[k].set(IS_INIT_KEY, out.get(("next", "done")).reshape(self.num_envs).clone())
                records[k].append(out)
        self._carrier = carriers[0] if self.single else torch.stack(carriers)
        rollouts = [torch.stack(r, dim=-1).contiguous() for r in records]  # [n, T], as the collector's
        return rollouts
