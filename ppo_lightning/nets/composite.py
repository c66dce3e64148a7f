"""The action distribution of a composite action space: one distribution whose log-prob, entropy and KL
are the sums over its parts.

An action space that is neither ``Discrete`` nor ``Box`` (``MultiDiscrete``, ``MultiBinary``, and
``Tuple`` / ``Dict`` of any of these, ``Discrete`` and ``Box`` included) is described as
``{"type": "composite", "shape": [size], "space": <description>}`` (`ppo_lightning.nets.encoders`'s
descriptions). Its action is one float32 vector of ``size`` numbers, the leaves in order: a
``discrete`` leaf's index, a ``multi_discrete`` leaf's k indices, a ``multi_binary`` leaf's bits, a
``box`` leaf's values (the env wrapper, `ppo_lightning.envs.spaces.SpacesWrapper`, unpacks it). Its
parameters are one tensor, the leaves in order: ``discrete`` n logits, ``multi_discrete`` ``sum(nvec)``
logits (independent categoricals), ``multi_binary`` n logits (independent Bernoullis), ``box`` k means
then k standard deviations (independent normals).

Our own class, not TorchRL's ``CompositeDistribution``: that one reads a nested TensorDict of
parameters and writes nested actions, and has no KL; the objectives here read one parameter tensor and
one action tensor per sample, and the KL terms need the exact KL. Masked logits (`MASKED_LOGIT`) give
an illegal action probability 0: it is never sampled and adds nothing to the entropy or the KL.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ppo_lightning.envs.space_layout import leaf_layout, space_leaves

MASKED_LOGIT = -1e9
"""The logit of an illegal action: ``exp(MASKED_LOGIT - logsumexp)`` is 0 in float32, and a finite value
keeps ``0 * log p`` at 0 in the entropy and the KL (-inf would give nan)."""


def mask_logits(logits: Tensor, mask: Tensor | None) -> Tensor:
    """``logits`` where ``mask`` is true, `MASKED_LOGIT` elsewhere (``mask`` None: unchanged)."""
    if mask is None:
        return logits
    return torch.where(mask, logits, torch.full_like(logits, MASKED_LOGIT))


def head_sizes(space: dict) -> tuple[int, int]:
    """(outputs of the policy head, standard deviations): a ``box`` leaf takes k outputs (the means)
    and k state-independent log standard deviations; every other leaf its logits."""
    heads, stds = 0, 0
    for leaf, _, a_size, _, p_size in leaf_layout(space):
        if leaf["type"] == "box":
            heads, stds = heads + a_size, stds + a_size
        else:
            heads += p_size
    return heads, stds


def categorical_groups(leaf: dict) -> list[int]:
    """The category counts of a categorical leaf's independent categoricals ([] for other leaves)."""
    if leaf["type"] == "discrete":
        return [int(leaf["n"])]
    if leaf["type"] == "multi_discrete":
        return [int(n) for n in leaf["nvec"]]
    return []


def assemble_params(space: dict, head: Tensor, log_std: Tensor | None, mask: Tensor | None) -> Tensor:
    """The distribution's parameter tensor from the policy head's outputs ``[..., heads]``, the box
    leaves' log standard deviations and the action mask (over the categorical leaves' logits, in order)."""
    parts, h, s, m = [], 0, 0, 0
    for leaf, _, a_size, _, p_size in leaf_layout(space):
        if leaf["type"] == "box":
            loc = head[..., h:h + a_size]
            parts += [loc, log_std[s:s + a_size].exp().expand_as(loc)]
            h, s = h + a_size, s + a_size
            continue
        logits = head[..., h:h + p_size]
        if categorical_groups(leaf) and mask is not None:
            logits = mask_logits(logits, mask[..., m:m + p_size])
            m += p_size
        parts.append(logits)
        h += p_size
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def policy_params(action_space: dict, head: Tensor, log_std: Tensor | None, mask: Tensor | None) -> tuple[Tensor, ...]:
    """The policy's distribution parameters (`ppo_lightning.nets.actor_critic.dist_param_keys`) from its head's
    outputs for any action space: a composite action's one tensor (`assemble_params`), a ``Discrete``
    action's logits with the mask applied, a ``Box`` action's mean and the scale of its log standard deviations."""
    if action_space["type"] == "composite":
        return (assemble_params(action_space["space"], head, log_std, mask),)
    if action_space["type"] == "discrete":
        return (mask_logits(head, mask),)
    return (head, log_std.exp().expand_as(head))


def _categorical_terms(logits: Tensor, groups: list[int]):
    """Per group: its log-probabilities ``[..., n]``."""
    out, start = [], 0
    for n in groups:
        out.append(torch.log_softmax(logits[..., start:start + n], dim=-1))
        start += n
    return out


def _sample_categorical(logp: Tensor, generator) -> Tensor:
    probs = logp.exp()
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, True, generator=generator).reshape(probs.shape[:-1])


class CompositeDistribution(torch.distributions.Distribution):
    """The distribution of a composite action space (module docstring) with parameters ``params``
    ``[..., parameters]``: ``log_prob`` / ``entropy`` (sums over the leaves, ``[...]``), ``sample``
    (optionally on a given generator), ``mode``. A ``torch.distributions.Distribution`` (TorchRL's
    actor samples it), without argument validation."""

    has_rsample = False
    arg_constraints = {}

    def __init__(self, params: Tensor, space: dict) -> None:
        self.params, self.space = params, space
        self.layout = leaf_layout(space)
        size = sum(a_size for _, _, a_size, _, _ in self.layout)
        super().__init__(params.shape[:-1], torch.Size([size]), validate_args=False)

    def _leaf(self, p_off: int, p_size: int) -> Tensor:
        return self.params[..., p_off:p_off + p_size]

    def log_prob(self, action: Tensor) -> Tensor:
        total = torch.zeros(self.batch_shape, dtype=self.params.dtype, device=self.params.device)
        for leaf, a_off, a_size, p_off, p_size in self.layout:
            a = action[..., a_off:a_off + a_size]
            p = self._leaf(p_off, p_size)
            if leaf["type"] == "box":
                loc, scale = p[..., :a_size], p[..., a_size:]
                z = (a - loc) / scale
                total = total + (-0.5 * z * z - scale.log() - 0.5 * math.log(2 * math.pi)).sum(-1)
            elif leaf["type"] == "multi_binary":
                total = total - torch.nn.functional.binary_cross_entropy_with_logits(p, a.to(p.dtype),
                                                                                     reduction="none").sum(-1)
            else:
                for i, logp in enumerate(_categorical_terms(p, categorical_groups(leaf))):
                    total = total + logp.gather(-1, a[..., i:i + 1].long()).squeeze(-1)
        return total

    def entropy(self) -> Tensor:
        total = torch.zeros(self.batch_shape, dtype=self.params.dtype, device=self.params.device)
        for leaf, _, a_size, p_off, p_size in self.layout:
            p = self._leaf(p_off, p_size)
            if leaf["type"] == "box":
                total = total + (0.5 + 0.5 * math.log(2 * math.pi) + p[..., a_size:].log()).sum(-1)
            elif leaf["type"] == "multi_binary":
                q = torch.sigmoid(p)
                total = total + torch.nn.functional.binary_cross_entropy_with_logits(p, q, reduction="none").sum(-1)
            else:
                for logp in _categorical_terms(p, categorical_groups(leaf)):
                    total = total - (logp.exp() * logp).sum(-1)
        return total

    def sample(self, sample_shape=torch.Size(), generator: torch.Generator | None = None) -> Tensor:
        """One action per batch element, the leaves drawn in order (on ``generator``, else torch's global one)."""
        if tuple(sample_shape):
            raise ValueError("CompositeDistribution.sample draws one action per batch element")
        parts = []
        for leaf, _, a_size, p_off, p_size in self.layout:
            p = self._leaf(p_off, p_size).detach()
            if leaf["type"] == "box":
                loc, scale = p[..., :a_size], p[..., a_size:]
                eps = torch.empty_like(loc).normal_(generator=generator)
                parts.append(loc + eps * scale)
            elif leaf["type"] == "multi_binary":
                parts.append(torch.bernoulli(torch.sigmoid(p), generator=generator))
            else:
                parts += [_sample_categorical(logp, generator).to(p.dtype).unsqueeze(-1)
                          for logp in _categorical_terms(p, categorical_groups(leaf))]
        return torch.cat(parts, dim=-1).float()

    @property
    def mode(self) -> Tensor:
        parts = []
        for leaf, _, a_size, p_off, p_size in self.layout:
            p = self._leaf(p_off, p_size).detach()
            if leaf["type"] == "box":
                parts.append(p[..., :a_size])
            elif leaf["type"] == "multi_binary":
                parts.append((p > 0).to(p.dtype))
            else:
                parts += [logp.argmax(-1, keepdim=True).to(p.dtype) for logp in _categorical_terms(p, categorical_groups(leaf))]
        return torch.cat(parts, dim=-1).float()

    deterministic_sample = mode


def composite_kl(space: dict, anchor: Tensor, params: Tensor) -> Tensor:
    """Exact ``KL[anchor || current]`` per sample: the sum over the leaves of each leaf's KL."""
    total = torch.zeros(params.shape[:-1], dtype=params.dtype, device=params.device)
    for leaf, _, a_size, p_off, p_size in leaf_layout(space):
        pa, pc = anchor[..., p_off:p_off + p_size], params[..., p_off:p_off + p_size]
        if leaf["type"] == "box":
            la, sa, lc, sc = pa[..., :a_size], pa[..., a_size:], pc[..., :a_size], pc[..., a_size:]
            total = total + (torch.log(sc / sa) + (sa * sa + (la - lc) ** 2) / (2 * sc * sc) - 0.5).sum(-1)
        elif leaf["type"] == "multi_binary":
            qa = torch.sigmoid(pa)
            # KL = qa (log qa - log qc) + (1 - qa) (log(1 - qa) - log(1 - qc)), in logsigmoid form
            ls = torch.nn.functional.logsigmoid
            total = total + (qa * (ls(pa) - ls(pc)) + (1 - qa) * (ls(-pa) - ls(-pc))).sum(-1)
        else:
            groups = categorical_groups(leaf)
            for la, lc in zip(_categorical_terms(pa, groups), _categorical_terms(pc, groups)):
                total = total + (la.exp() * (la - lc)).sum(-1)
    return total
