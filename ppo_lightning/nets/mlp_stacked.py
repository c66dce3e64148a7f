"""The MLP actor-critic (`ppo_lightning.nets.actor_critic.ActorCritic`) for S members at once, parameters
and buffers stacked ``[S, *shape]``.

Used by `ppo_lightning.nets.seed_stack.SeedStack` for the members of a group on gymnasium envs
(classic control, MuJoCo), instead of ``torch.vmap`` over ``functional_call``, whose per-call cost
(mostly Python) was paid on every step of a rollout. Each layer is member k's ``F.linear`` on its own
slices, the call its network's ``nn.Linear`` makes, so that a member's floats are its single run's
whatever its group: one batched matmul over the members (``baddbmm``) sums in another order (a
64 -> 1 head is a matrix-vector product in ``F.linear``; a few rows take another kernel), and MKL's
sgemm rounds some shapes (2 or 3 rows of 11) by its operands' alignment, so a member's operands are
copied to 64-byte-aligned memory, where a single run's freshly allocated tensors lie, when its slice
is not (`_aligned`).
The observation normalizer (`ppo_lightning.nets.obs_norm.RunningObservationNorm`) reads each member's
own statistics. Kept apart from the network's own file, which `export-hf` copies into self-contained
model code.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ppo_lightning.nets.actor_critic import ActorCritic


ALIGNMENT = 64  # bytes: torch's CPU allocator aligns every tensor's memory so


def _aligned(t: Tensor) -> Tensor:
    """``t``, or a copy in fresh (aligned) memory where ``t`` starts off a 64-byte boundary."""
    return t if t.data_ptr() % ALIGNMENT == 0 else t.clone()


class _AlignedGrad(torch.autograd.Function):
    """The identity, whose backward hands its gradient on in aligned memory (`_aligned`): a member's slice
    of the stacked output's gradient, which ``F.linear``'s backward multiplies."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return _aligned(grad)


def _stacked_linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``x [S, B, in]`` through each member's Linear layer (``weight [S, out, in]``, ``bias [S, out]``) ->
    ``[S, B, out]``: member k's ``F.linear`` on its own slices, each in aligned memory (see the module
    doc), so that its forward and (autograd's) backward are its network's bitwise."""
    outs = [F.linear(_aligned(xk), _aligned(wk), _aligned(bk)) for xk, wk, bk in zip(x.unbind(0), weight.unbind(0),
                                                                                  bias.unbind(0))]
    if torch.is_grad_enabled() and (outs[0].numel() * outs[0].element_size()) % ALIGNMENT:
        outs = [_AlignedGrad.apply(y) for y in outs]  # member k's slice of the gradient starts off a boundary
    return torch.stack(outs)


def _body(body: nn.Sequential, prefix: str, p: dict[str, Tensor], x: Tensor) -> Tensor:
    """``body``'s Linear layers on the members' stacked weights, its activations as they are (elementwise)."""
    for i, layer in enumerate(body):
        if isinstance(layer, nn.Linear):
            x = _stacked_linear(x, p[f"{prefix}{i}.weight"], p[f"{prefix}{i}.bias"])
        else:
            x = layer(x)
    return x


def stacked_call(net: ActorCritic, p: dict[str, Tensor], b: dict[str, Tensor], method: str, obs: Tensor):
    """``net``'s ``method`` ("forward", "policy", "value", "forward_aux") for S members at once: ``p`` and
    ``b`` map ``net``'s parameter and buffer names to stacked tensors, ``obs`` is ``[S, ..., *obs_shape]``;
    the outputs are ``[S, ..., k]``, each member's those of its own network (up to float summation order)."""
    S = obs.shape[0]
    lead = obs.shape[1:obs.dim() - net.obs_ndim]
    x = obs.float().reshape(S, math.prod(lead), -1)  # [S, B, dim]
    if net.obs_norm is not None:  # RunningObservationNorm.forward, each member with its own statistics
        norm = net.obs_norm
        mean = b["obs_norm.mean"].to(x.dtype).unsqueeze(1)
        std = (b["obs_norm.var"] + norm.eps).sqrt().to(x.dtype).unsqueeze(1)
        x = ((x - mean) / std).clamp(-norm.clip, norm.clip)

    def head(name: str, f: Tensor) -> Tensor:
        out = _stacked_linear(f, p[name + ".weight"], p[name + ".bias"]).float()  # float32 under any autocast
        return out.reshape(S, *lead, out.shape[-1])

    def dist_params(f: Tensor) -> tuple[Tensor, ...]:
        out = head("policy_head", f)
        if net.discrete:
            return (out,)
        scale = p["log_std"].exp().view(S, *([1] * len(lead)), -1).expand_as(out)
        return (out, scale)

    f = None if method == "value" and net.value_body is not None else _body(net.policy_body, "policy_body.", p, x)
    if method == "policy":
        return dist_params(f)
    if net.value_body is not None:
        vf = _body(net.value_body, "value_body.", p, x)
    else:
        vf = f.detach() if net.arch == "detach" else f
    value = head("value_head", vf)
    if method == "value":
        return value
    if method == "forward":
        return (*dist_params(f), value)
    if method == "forward_aux":
        if net.aux_value_head is None:
            raise ValueError("this network has no auxiliary value head (model.network.aux_value_head)")
        return (*dist_params(f), value, head("aux_value_head", f))
    raise ValueError(f"unknown method {method!r}")
