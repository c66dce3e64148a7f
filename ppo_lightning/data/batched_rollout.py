"""Rollouts of envs that already step as one batch (MinAtar), without TorchRL's per-step collector.

TorchRL's `Collector` pays for its generality on every env step: a TensorDict per step, the
probabilistic actor's wrappers, ``step_mdp`` and the reset bookkeeping. At small batch sizes that is
most of the collection time (MinAtar Breakout, 4 envs: ~2.7 ms per vector step, of which the
network's forward is ~0.35 ms and the games' own step ~0.1 ms; benchmarks/README.md). An env that
already steps all its games in one Python loop into one preallocated array (``step_games`` /
``reset_games``, `ppo_lightning.envs.minatar_env.MinAtarTorchEnv`) is driven here directly: one
network forward, one sample, one env step per time step, written into preallocated ``[envs, time]``
tensors, and one TensorDict per rollout.

It produces the collector's rollout: the same keys, shapes and values (bitwise), drawing from the
same random streams in the same order (torch's global generator for the actions, each game's own
for its dynamics), so a run is the same with either path (``tests/test_data.py`` compares them).
Only ``("collector", "traj_ids")``, which nothing downstream reads, is left out. The carried step
is kept as ``_carrier``, like the collector's, so exact resume (`ppo_lightning.data.resume_state`)
treats both alike.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from ppo_lightning.nets.models import OBS_KEY, VALUE_KEY, dist_param_keys, make_distribution


def supports_batched_rollout(env, device: torch.device) -> bool:
    """Whether ``env`` (from `ppo_lightning.envs.make_env`) can be driven by `BatchedRollout`."""
    base = getattr(env, "base_env", None)
    return (torch.device(device).type == "cpu" and base is not None
            and callable(getattr(base, "step_games", None)) and callable(getattr(base, "reset_games", None)))


class BatchedRollout:
    """An iterator of rollouts ``[num_envs, frames_per_batch / num_envs]`` by ``network``'s policy.

    ``env`` is the TorchRL env from `ppo_lightning.envs.make_env` (its base env has ``step_games``,
    ``reset_games``, ``_obs``; episode statistics as `RewardSum` / `StepCounter` keep them).
    Like the collector, it resets every env once when built.
    """

    def __init__(self, env, network: torch.nn.Module, action_space: dict, frames_per_batch: int) -> None:
        self.env, self.base, self.network, self.action_space = env, env.base_env, network, action_space
        n = self.base.num_envs
        if frames_per_batch % n:
            raise ValueError(f"frames per iteration ({frames_per_batch}) must be a multiple of data.num_envs ({n})")
        self.num_envs, self.steps = n, frames_per_batch // n
        self.param_keys = dist_param_keys(action_space)
        first = env.reset()  # as the collector does when built: every game restarts
        self._carrier = TensorDict(
            {OBS_KEY: first.get(OBS_KEY).clone(),
             "episode_reward": torch.zeros((n, 1), dtype=torch.float32),
             "step_count": torch.zeros((n, 1), dtype=torch.int64)},
            batch_size=[n],
        )

    def __iter__(self):
        return self

    def shutdown(self) -> None:
        """Nothing to stop (same interface as the collector)."""

    @torch.no_grad()
    def __next__(self) -> TensorDictBase:
        n, T, base = self.num_envs, self.steps, self.base
        carrier = self._carrier
        obs = carrier.get(OBS_KEY)
        ep_reward, step_count = carrier.get("episode_reward").clone(), carrier.get("step_count").clone()
        obs_buf = torch.empty((n, T, *obs.shape[1:]), dtype=obs.dtype)
        next_obs_buf = torch.empty_like(obs_buf)
        action_buf = torch.empty((n, T), dtype=torch.int64)
        logp_buf = torch.empty((n, T), dtype=torch.float32)
        value_buf = torch.empty((n, T, 1), dtype=torch.float32)
        reward_buf = torch.empty((n, T, 1), dtype=torch.float32)
        term_buf = torch.empty((n, T, 1), dtype=torch.bool)
        trunc_buf = torch.empty((n, T, 1), dtype=torch.bool)
        ep_buf, next_ep_buf = torch.empty((n, T, 1)), torch.empty((n, T, 1))
        sc_buf, next_sc_buf = torch.empty((n, T, 1), dtype=torch.int64), torch.empty((n, T, 1), dtype=torch.int64)
        param_bufs = None
        for t in range(T):
            *params, value = self.network(obs)
            dist = make_distribution(self.action_space, *params)
            action = dist.sample()
            if param_bufs is None:
                param_bufs = [torch.empty((n, T, *p.shape[1:]), dtype=p.dtype) for p in params]
            for buf, p in zip(param_bufs, params):
                buf[:, t] = p
            action_buf[:, t] = action
            logp_buf[:, t] = dist.log_prob(action)
            value_buf[:, t] = value
            obs_buf[:, t] = obs
            ep_buf[:, t], sc_buf[:, t] = ep_reward, step_count
            reward, terminal, truncated = base.step_games(action.tolist())
            reward_t = torch.from_numpy(reward).unsqueeze(-1)
            next_obs_buf[:, t] = torch.from_numpy(base._obs)
            reward_buf[:, t] = reward_t
            term_buf[:, t, 0] = torch.from_numpy(terminal)
            trunc_buf[:, t, 0] = torch.from_numpy(truncated)
            ep_reward = ep_reward + reward_t  # RewardSum
            step_count = step_count + 1  # StepCounter
            next_ep_buf[:, t], next_sc_buf[:, t] = ep_reward, step_count
            done = terminal | truncated
            if done.any():  # partial reset, as the collector asks for it
                base.reset_games(done)
                mask = torch.from_numpy(done).unsqueeze(-1)
                ep_reward = ep_reward.masked_fill(mask, 0.0)
                step_count = step_count.masked_fill(mask, 0)
            obs = torch.from_numpy(base._obs.copy())
        done_buf = term_buf | trunc_buf
        zeros = torch.zeros((n, T, 1), dtype=torch.bool)
        self._carrier = TensorDict({OBS_KEY: obs, "episode_reward": ep_reward, "step_count": step_count}, batch_size=[n])
        return TensorDict(
            {
                OBS_KEY: obs_buf, "action": action_buf, "action_log_prob": logp_buf, VALUE_KEY: value_buf,
                **dict(zip(self.param_keys, param_bufs)),
                "done": zeros, "terminated": zeros.clone(), "truncated": zeros.clone(),
                "episode_reward": ep_buf, "step_count": sc_buf,
                "next": TensorDict(
                    {OBS_KEY: next_obs_buf, "reward": reward_buf, "done": done_buf, "terminated": term_buf,
                     "truncated": trunc_buf, "episode_reward": next_ep_buf, "step_count": next_sc_buf},
                    batch_size=[n, T],
                ),
            },
            batch_size=[n, T],
        )
