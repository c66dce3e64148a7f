"""Rollouts of S members' TorchRL envs (any family: gymnasium, MuJoCo, Procgen) stepped in lockstep.

A vectorized seed group (`ppo_lightning.data.seed_group`) of an env that does not step all its games
in one batch (MinAtar's does: `ppo_lightning.data.batched_rollout`) holds one TorchRL env per member,
each built and seeded as that member's single run builds its own (`ppo_lightning.envs.make_env`:
a gymnasium ``SyncVectorEnv`` with autoreset DISABLED, TorchRL resetting the ended sub-envs; one
Procgen vector env). Per time step: one forward of the stacked network on the members'
observations ``[S, envs, ...]``, each member's actions drawn on its own generator exactly as the
single run's collector draws them from torch's global generator, then each member's
``env.step_and_maybe_reset`` - the call TorchRL's `Collector` makes for a single run - so the
transitions, partial resets and episode statistics are the single run's.

The draws, per member k (the single run's `ProbabilisticActor` samples with ``rsample`` where the
distribution has it, else ``sample``):

- discrete (``Categorical.sample``, i.e. ``multinomial(probs, 1, True)``): `sample_per_seed`;
- continuous (``Normal.rsample``: ``loc + eps * scale`` with ``eps = empty(shape).normal_()``):
  ``eps[k].normal_(generator=g_k)`` on a contiguous slice of the same size, then the same
  elementwise arithmetic for all members at once.

The rollouts carry the collector's keys and shapes (``("collector", "traj_ids")``, which nothing
downstream reads, is left out), ``[envs, time]`` per member.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from ppo_lightning.data.batched_rollout import sample_per_seed
from ppo_lightning.nets.models import OBS_KEY, VALUE_KEY, dist_param_keys, make_distribution


def sample_members(action_space: dict, params: list[torch.Tensor], generators: list[torch.Generator],
                   noise: torch.Tensor) -> torch.Tensor:
    """Every member's actions ``[S, n, ...]`` from its distribution parameters ``[S, n, ...]``, member k's
    on ``generators[k]``, as its single run's actor draws them from the global generator."""
    if action_space["type"] == "discrete":
        return sample_per_seed(make_distribution(action_space, *params).probs, generators, noise)
    loc, scale = params
    for eps, g in zip(noise, generators):
        eps.normal_(generator=g)  # Normal.rsample's _standard_normal, on the member's generator
    return loc + noise * scale


class LockstepRollout:
    """An iterator of every member's rollout ``[num_envs, frames_per_batch / num_envs]``.

    ``envs``: one TorchRL env per member (`ppo_lightning.envs.make_env`), ``network``: the members'
    stacked network (`ppo_lightning.nets.seed_stack.SeedStack`), ``generators``: one action generator
    per member. Like the collector, every env is reset once when this is built."""

    def __init__(self, envs: list, network: torch.nn.Module, action_space: dict, frames_per_batch: int,
                 generators: list[torch.Generator]) -> None:
        self.envs, self.network, self.action_space = list(envs), network, action_space
        self.generators = list(generators)
        n = int(self.envs[0].batch_size[0])
        if frames_per_batch % n:
            raise ValueError(f"frames per iteration ({frames_per_batch}) must be a multiple of data.num_envs ({n})")
        self.num_envs, self.steps = n, frames_per_batch // n
        self.param_keys = dist_param_keys(action_space)
        self._carrier = torch.stack([env.reset() for env in self.envs])  # [S, n]: each member's carried step
        self.stacked: dict[str, torch.Tensor] = {}  # the last rollouts' entries GAE reads, [S, n, time, 1]

    def reset_member(self, k: int, env, generator: torch.Generator) -> None:
        """Member k starts again with ``env`` (fresh, seeded) and its action ``generator``: the carried
        step is the env's first reset, as when a single run's collector is built."""
        self.envs[k], self.generators[k] = env, generator
        self._carrier[k] = env.reset()

    def __iter__(self):
        return self

    def shutdown(self) -> None:
        """Nothing to stop (the envs are the source's)."""

    @torch.no_grad()
    def rollouts(self) -> list[TensorDictBase]:
        S, T = len(self.envs), self.steps
        carriers = list(self._carrier.unbind(0))
        records: list[list[TensorDictBase]] = [[] for _ in range(S)]
        noise = None
        for _ in range(T):
            obs = torch.stack([c.get(OBS_KEY) for c in carriers])
            *params, value = self.network(obs)
            if noise is None:
                like = params[0] if self.action_space["type"] != "discrete" else params[0]
                noise = torch.empty_like(like)
            action = sample_members(self.action_space, params, self.generators, noise)
            log_prob = make_distribution(self.action_space, *params).log_prob(action)
            for k, env in enumerate(self.envs):
                td = carriers[k]
                for key, p in zip(self.param_keys, params):
                    td.set(key, p[k])
                td.set(VALUE_KEY, value[k])
                td.set("action", action[k])
                td.set("action_log_prob", log_prob[k])
                out, carriers[k] = env.step_and_maybe_reset(td)
                records[k].append(out)
        self._carrier = torch.stack(carriers)
        rollouts = [torch.stack(r, dim=-1).contiguous() for r in records]  # [n, T], as the collector's
        self.stacked = {"reward": torch.stack([r.get(("next", "reward")) for r in rollouts]),
                        "done": torch.stack([r.get(("next", "done")) for r in rollouts]),
                        "terminated": torch.stack([r.get(("next", "terminated")) for r in rollouts]),
                        VALUE_KEY: torch.stack([r.get(VALUE_KEY) for r in rollouts])}
        return rollouts
