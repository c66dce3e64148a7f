"""Observation normalization that travels with the policy.

`RunningObservationNorm` is a module inside the actor-critic (``network.normalize_observation:
true``): its running mean and variance are buffers, so they are saved in every checkpoint, exported
to Hugging Face folders and applied by ``evaluate`` and by the exported model, with no separate
statistics file to lose (the usual pitfall of env-side normalizers such as a ``VecNormalize``).

The statistics follow gymnasium's ``NormalizeObservation`` / CleanRL's ``ppo_continuous_action``:
``y = clip((x - mean) / sqrt(var + eps), -clip, clip)`` with mean and variance over every observation
seen, merged batch by batch with the parallel-variance rule (Chan, Golub & LeVeque 1979):
``delta = mu_b - mu; n' = n + n_b; mu' = mu + delta n_b / n'; M' = var n + var_b n_b + delta^2 n n_b / n'``,
``var' = M' / n'``. They are updated by the data side with each rollout's observations, *before*
the next rollout is collected, so that the behaviour log-probabilities and the update of an
iteration see the same normalization (`update_observation_norm`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class RunningObservationNorm(nn.Module):
    """``clip((x - mean) / sqrt(var + eps), -clip, clip)`` with running statistics (see module doc)."""

    def __init__(self, dim: int, clip: float = 10.0, eps: float = 1e-8) -> None:
        super().__init__()
        self.clip, self.eps = float(clip), float(eps)
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        """Merge a batch of (flat) observations ``[..., dim]`` into the running moments."""
        merge_moments_(self.mean, self.var, self.count, x)

    @torch.no_grad()
    def update_member(self, k: int, x: Tensor) -> None:
        """In a members' stacked network (`ppo_lightning.nets.seed_stack.SeedStack`: buffers ``[S, dim]``),
        merge member ``k``'s observations into its own moments: its single run's `update`, on its slices."""
        merge_moments_(self.mean[k], self.var[k], self.count[k], x)

    def forward(self, x: Tensor) -> Tensor:
        mean, std = self.mean.to(x.dtype), (self.var + self.eps).sqrt().to(x.dtype)
        return ((x - mean) / std).clamp(-self.clip, self.clip)


def merge_moments_(mean: Tensor, var: Tensor, count: Tensor, x: Tensor) -> None:
    """Merge ``x [..., dim]`` into the running ``mean``, ``var`` and ``count`` in place (see module doc)."""
    x = x.reshape(-1, mean.shape[0]).to(torch.float64)
    n_b = x.shape[0]
    if n_b == 0:
        return
    mu_b, var_b = x.mean(0), x.var(0, unbiased=False)
    n = count
    total = n + n_b
    delta = mu_b - mean
    m2 = var * n + var_b * n_b + delta.square() * n * n_b / total
    mean.add_(delta * n_b / total)
    var.copy_(m2 / total)
    count.fill_(total)


def update_observation_norm(network: nn.Module, observations: Tensor) -> bool:
    """Update every `RunningObservationNorm` in ``network`` with a rollout's observations."""
    found = False
    for module in network.modules():
        if isinstance(module, RunningObservationNorm):
            module.update(observations)  # [..., *obs_shape] -> [-1, dim] inside
            found = True
    return found


def update_member_observation_norms(stack: nn.Module, observations: list[Tensor]) -> bool:
    """`update_observation_norm` for each member of a stacked network: member k's normalizers (its
    slices of the stacked buffers) with ``observations[k]``."""
    norms = [m for m in stack.modules() if isinstance(m, RunningObservationNorm)]
    for m in norms:
        for k, obs in enumerate(observations):
            m.update_member(k, obs)
    return bool(norms)
