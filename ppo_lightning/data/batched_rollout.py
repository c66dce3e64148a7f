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

The same loop collects the rollouts of a group of S members: S
envs, one policy forward of the stacked network for all S x n envs per time step, each seed's
actions drawn on its own generator (`sample_per_seed`), the games stepped seed after seed. A single
run is the group of one (no seed dimension in its network's input, actions from torch's global
generator as the collector draws them). Per time step the records are written into preallocated
time-major numpy buffers; episode sums and counters in numpy (the same float32 and int64
arithmetic as RewardSum's and StepCounter's torch ops).

A recurrent network (`ppo_lightning.nets.recurrent`) always collects through this loop or
`ppo_lightning.data.lockstep.LockstepRollout` (a single run's gymnasium vector env too, through
`ppo_lightning.data.lockstep.VectorGames`): one ``network.step`` per time step, the state of every
env carried from step to step and from one rollout to the next (`BatchedRollout.rollouts`).
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from ppo_lightning.nets.models import OBS_KEY, VALUE_KEY, dist_param_keys, make_distribution
from ppo_lightning.nets.recurrent import IS_INIT_KEY, STATE_KEY, is_recurrent


def supports_batched_rollout(env, device: torch.device) -> bool:
    """Whether ``env`` (from `ppo_lightning.envs.make_env`) can be driven by `BatchedRollout`."""
    base = getattr(env, "base_env", None)
    return (torch.device(device).type == "cpu" and base is not None
            and callable(getattr(base, "step_games", None)) and callable(getattr(base, "reset_games", None)))


def sample_per_seed(probs: torch.Tensor, generators: list[torch.Generator], noise: torch.Tensor) -> torch.Tensor:
    """``torch.multinomial(probs[k], 1, True, generator=generators[k])`` (what ``Categorical.sample``
    draws) for every seed k at once: actions ``[S, n]`` from probabilities ``[S, n, A]``.

    For one sample, ATen's ``multinomial`` draws ``q ~ Exp(1)`` shaped like the probabilities with
    ``exponential_`` on the generator and takes ``argmax(p / q)`` (Gumbel-max; ``Distributions.cpp``).
    Drawing each seed's ``q`` on its own generator into ``noise`` and dividing and taking the argmax
    once gives the same actions and leaves every generator where the per-seed call leaves it
    (tests/test_seed_group.py), at one kernel per seed instead of one multinomial's validation,
    allocation and reductions per seed. Invalid probabilities raise as ``multinomial`` does."""
    if not bool(((probs.max() < float("inf")) & (probs.min() >= 0)).item()):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if bool((probs.sum(-1) == 0).any()):
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    for q, g in zip(noise, generators):
        q.exponential_(1, generator=g)
    return torch.div(probs, noise, out=noise).argmax(-1)


def collector_draw(dist: torch.distributions.Distribution) -> torch.Tensor:
    """A single run's actions, drawn from torch's global generator as TorchRL's `Collector` draws
    them (its ``ProbabilisticActor``: ``rsample`` where the distribution has it, else ``sample``)."""
    return dist.rsample() if dist.has_rsample else dist.sample()


def recurrent_state_size(network: torch.nn.Module) -> int:
    """D, the numbers of one env's recurrent state (a group's stacked network: its member's)."""
    size = getattr(network, "state_size", None)
    return int(size if size is not None else network.inner.state_size)


def first_recurrent_step(batch_shape: tuple[int, ...], size: int) -> dict[str, torch.Tensor]:
    """The carried recurrent entries before a run's first step: zero states ``[*batch, D]`` and
    ``is_init`` True ``[*batch]`` (every env starts an episode)."""
    return {STATE_KEY: torch.zeros((*batch_shape, size), dtype=torch.float32),
            IS_INIT_KEY: torch.ones(batch_shape, dtype=torch.bool)}


def state_into_step(state: torch.Tensor, is_init: torch.Tensor) -> torch.Tensor:
    """The state going into a step: the carried one, zeros where ``is_init`` (an episode starts)."""
    return torch.where(is_init.unsqueeze(-1), torch.zeros((), dtype=state.dtype), state)


def sample_members(action_space: dict, params: list[torch.Tensor], generators: list[torch.Generator],
                   noise: torch.Tensor) -> torch.Tensor:
    """Every member's actions ``[S, n, ...]`` from its distribution parameters ``[S, n, ...]``, member k's
    on ``generators[k]``, as its single run's actor draws them from the global generator (TorchRL's
    `ProbabilisticActor` calls ``rsample`` where the distribution has it, else ``sample``):

    - discrete (``Categorical.sample``, i.e. ``multinomial(probs, 1, True)``): `sample_per_seed`;
    - composite (`ppo_lightning.nets.composite.CompositeDistribution.sample`): member k's distribution
      sampled on ``generators[k]``;
    - continuous (``Normal.rsample``: ``loc + eps * scale`` with ``eps = empty(shape).normal_()``):
      ``eps[k].normal_(generator=g_k)`` on a contiguous slice of the same size, then the same
      elementwise arithmetic for all members at once.

    ``noise``: a buffer shaped like ``params[0]`` (overwritten)."""
    if action_space["type"] == "discrete":
        return sample_per_seed(make_distribution(action_space, *params).probs, generators, noise)
    if action_space["type"] == "composite":  # CompositeDistribution.sample on each member's generator
        return torch.stack([make_distribution(action_space, p).sample(generator=g) for p, g in zip(params[0], generators)])
    loc, scale = params
    for eps, g in zip(noise, generators):
        eps.normal_(generator=g)  # Normal.rsample's _standard_normal, on the member's generator
    return loc + noise * scale


class BatchedRollout:
    """An iterator of rollouts ``[num_envs, frames_per_batch / num_envs]`` by ``network``'s policy.

    ``env`` is the TorchRL env from `ppo_lightning.envs.make_env` (its base env has ``step_games``,
    ``reset_games``, ``_obs``; episode statistics as `RewardSum` / `StepCounter` keep them), or a
    seed group's list of them with ``generators`` (one per env: its seed's action generator) and a
    stacked ``network`` (`rollouts` then gives one rollout per seed). Like the collector, it resets
    every env once when built.
    """

    def __init__(self, env, network: torch.nn.Module, action_space: dict, frames_per_batch: int,
                 generators: list[torch.Generator] | None = None, games=None) -> None:
        self.envs = [env] if generators is None else list(env)
        self.games = games  # env -> what steps its games (default: its base env; gymnasium: `lockstep.VectorGames`)
        self.bases = [self._games_of(e) for e in self.envs]
        self.env, self.base, self.network, self.action_space = self.envs[0], self.bases[0], network, action_space
        self.generators = generators
        n = self.base.num_envs
        if frames_per_batch % n:
            raise ValueError(f"frames per iteration ({frames_per_batch}) must be a multiple of data.num_envs ({n})")
        self.num_envs, self.steps = n, frames_per_batch // n
        self.param_keys = dist_param_keys(action_space)
        # A recurrent network's carried state (`rollouts`): D numbers per env, else None.
        self.state_size = recurrent_state_size(network) if is_recurrent(network) else None
        carriers = [self._first_step(e) for e in self.envs]  # as the collector does when built: every game restarts
        self._carrier = carriers[0] if generators is None else torch.stack(carriers)  # a group's: [S, n]

    def _first_step(self, env) -> TensorDict:
        """The carried step of a fresh run: ``env`` reset (every game), episode sums zero and, for a
        recurrent network, zero states with every env at an episode's first step."""
        n = self.num_envs
        first = env.reset()
        entries = {OBS_KEY: first.get(OBS_KEY).clone(), "episode_reward": torch.zeros((n, 1), dtype=torch.float32),
                   "step_count": torch.zeros((n, 1), dtype=torch.int64)}
        if self.state_size is not None:
            entries.update(first_recurrent_step((n,), self.state_size))
        return TensorDict(entries, batch_size=[n])

    def reset_member(self, k: int, env, generator: torch.Generator) -> None:
        """Member k of a group starts again with ``env`` (fresh, seeded) and its action ``generator``:
        the carried step of a fresh run (every game reset, as when a single run's collector is built)."""
        self.envs[k], self.bases[k], self.generators[k] = env, self._games_of(env), generator
        self.env, self.base = self.envs[0], self.bases[0]
        self._carrier[k] = self._first_step(env)

    def _games_of(self, env):
        return env.base_env if self.games is None else self.games(env)

    def __iter__(self):
        return self

    def shutdown(self) -> None:
        """Nothing to stop (same interface as the collector)."""

    def __next__(self) -> TensorDictBase:
        return self.rollouts()[0]

    @torch.no_grad()
    def rollouts(self) -> list[TensorDictBase]:
        """The next rollout of every env (one per seed), ``[num_envs, time]`` each."""
        single, bases = self.generators is None, self.bases
        S, n, T = len(bases), self.num_envs, self.steps
        carrier = self._carrier.unsqueeze(0) if single else self._carrier  # [S, n]
        obs0 = carrier.get(OBS_KEY).numpy()
        obs_np = np.empty((T + 1, *obs0.shape), dtype=obs0.dtype)  # obs_np[t + 1]: after step t's resets
        next_np = np.empty((T, *obs0.shape), dtype=obs0.dtype)  # before them
        reward_np = np.empty((T, S, n), dtype=np.float32)
        term_np, trunc_np = np.empty((T, S, n), dtype=bool), np.empty((T, S, n), dtype=bool)
        ep_np, sc_np = np.empty((T + 1, S, n), dtype=np.float32), np.empty((T + 1, S, n), dtype=np.int64)
        next_ep_np, next_sc_np = np.empty((T, S, n), dtype=np.float32), np.empty((T, S, n), dtype=np.int64)
        obs_np[0] = obs0
        ep_np[0] = carrier.get("episode_reward").numpy()[..., 0]
        sc_np[0] = carrier.get("step_count").numpy()[..., 0]
        obs_t = torch.from_numpy(obs_np)
        action_buf = None
        logp_buf, value_buf = torch.empty((T, S, n)), torch.empty((T, S, n, 1))
        param_bufs = None
        space = self.action_space
        noise = None
        arrays = getattr(bases[0], "array_actions", False)
        # whole games beside the training episodes (Atari: `ppo_lightning.envs.atari_env`)
        games = getattr(bases[0], "GAME_RECORD", False)
        if games:
            game_np = {"game_over": np.empty((T, S, n), dtype=bool), "game_return": np.empty((T, S, n), dtype=np.float32),
                       "game_length": np.empty((T, S, n), dtype=np.int64)}
        recurrent = self.state_size is not None
        if recurrent:  # [T, S, n, D]: the state into step t (zeroed where is_init) and after it
            state, is_init = carrier.get(STATE_KEY), carrier.get(IS_INIT_KEY)
            state_buf, next_state_buf = torch.empty((2, T, S, n, self.state_size))
            init_buf = torch.empty((T, S, n), dtype=torch.bool)
        for t in range(T):
            obs = obs_t[t, 0] if single else obs_t[t]
            if recurrent:
                state = state_into_step(state, is_init)
                state_buf[t], init_buf[t] = state, is_init
                *params, value, state = self.network.step(obs, state[0] if single else state,
                                                          is_init[0] if single else is_init)
                state = state.unsqueeze(0) if single else state
                next_state_buf[t] = state
            else:
                *params, value = self.network(obs)
            if single:
                params, value = [p.unsqueeze(0) for p in params], value.unsqueeze(0)
            if param_bufs is None:
                param_bufs = [torch.empty((T, S, n, *p.shape[2:]), dtype=p.dtype) for p in params]
                noise = None if single else torch.empty_like(params[0])
            for buf, p in zip(param_bufs, params):
                buf[t] = p
            value_buf[t] = value
            dist = make_distribution(space, *params)  # all seeds' distributions [S, n]
            # torch's global generator (as the collector samples), or each seed's own (the same draws)
            if single:  # torch's global generator (as the collector samples)
                action = collector_draw(dist)
            elif space["type"] == "discrete":  # each member's own generator (the same draws)
                action = sample_per_seed(dist.probs, self.generators, noise)
            else:
                action = sample_members(space, params, self.generators, noise)
            if action_buf is None:
                action_buf = torch.empty((T, *action.shape), dtype=action.dtype)
            action_buf[t] = action
            logp_buf[t] = dist.log_prob(action)
            for k, (actions, base) in enumerate(zip(action.numpy() if arrays else action.tolist(), bases)):
                reward_np[t, k], term_np[t, k], trunc_np[t, k] = base.step_games(actions)
                next_np[t, k] = base._obs
                if games:
                    for key, buf in game_np.items():
                        buf[t, k] = getattr(base, key)
            done = term_np[t] | trunc_np[t]
            if recurrent:  # the next step of an ended episode starts a new one
                is_init = torch.from_numpy(done)
            ep, sc = ep_np[t] + reward_np[t], sc_np[t] + 1  # RewardSum, StepCounter
            next_ep_np[t], next_sc_np[t] = ep, sc
            if done.any():  # partial resets, as the collector asks for them
                for k in np.flatnonzero(done.any(1)):
                    bases[k].reset_games(done[k])
                ep[done], sc[done] = 0.0, 0
                obs_np[t + 1] = np.stack([base._obs for base in bases])
            else:
                obs_np[t + 1] = next_np[t]
            ep_np[t + 1], sc_np[t + 1] = ep, sc
        last = TensorDict({OBS_KEY: torch.from_numpy(obs_np[T].copy()),
                           "episode_reward": torch.from_numpy(ep_np[T, ..., None].copy()),
                           "step_count": torch.from_numpy(sc_np[T, ..., None].copy())}, batch_size=[S, n])
        if recurrent:  # the state after the last step, not reset: the next rollout resets it where is_init
            last.update({STATE_KEY: state.clone(), IS_INIT_KEY: is_init.clone()})
        self._carrier = last[0] if single else last

        def seed_major(x, trailing_one=False):  # [T, S, n, ...] -> [S, n, T, ...] contiguous
            x = torch.as_tensor(x).movedim(0, 2).contiguous()
            return x.unsqueeze(-1) if trailing_one else x

        obs_b, next_b = seed_major(obs_np[:T]), seed_major(next_np)
        action_b, logp_b, value_b = seed_major(action_buf), seed_major(logp_buf), seed_major(value_buf)
        params_b = [seed_major(b) for b in param_bufs]
        reward_b, term_b, trunc_b = (seed_major(x, True) for x in (reward_np, term_np, trunc_np))
        ep_b, sc_b = seed_major(ep_np[:T], True), seed_major(sc_np[:T], True)
        next_ep_b, next_sc_b = seed_major(next_ep_np, True), seed_major(next_sc_np, True)
        done_b = term_b | trunc_b
        game_b = {key: seed_major(buf, True) for key, buf in game_np.items()} if games else {}
        rec_b = next_rec_b = {}
        if recurrent:
            rec_b = {STATE_KEY: seed_major(state_buf), IS_INIT_KEY: seed_major(init_buf)}
            next_rec_b = {STATE_KEY: seed_major(next_state_buf)}  # V(next observation) reads it (next_values)
        out = []
        for k in range(S):
            zeros = torch.zeros((n, T, 1), dtype=torch.bool)
            out.append(TensorDict(
                {OBS_KEY: obs_b[k], "action": action_b[k], "action_log_prob": logp_b[k], VALUE_KEY: value_b[k],
                 **{key: b[k] for key, b in zip(self.param_keys, params_b)},
                 "done": zeros, "terminated": zeros.clone(), "truncated": zeros.clone(),
                 "episode_reward": ep_b[k], "step_count": sc_b[k], **{key: b[k] for key, b in rec_b.items()},
                 "next": TensorDict({OBS_KEY: next_b[k], "reward": reward_b[k], "done": done_b[k],
                                     "terminated": term_b[k], "truncated": trunc_b[k],
                                     "episode_reward": next_ep_b[k], "step_count": next_sc_b[k],
                                     **{key: b[k] for key, b in game_b.items()},
                                     **{key: b[k] for key, b in next_rec_b.items()}}, batch_size=[n, T])},
                batch_size=[n, T]))
        return out
