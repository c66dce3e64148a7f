"""S independent copies of a network as one module: the seed is a leading dimension of every tensor.

`SeedStack` holds one copy of the network's structure whose parameters and buffers are replaced by
stacked tensors ``[S, *shape]`` (`torch.func.stack_module_state`); its ``forward``, ``policy``,
``value`` and ``forward_aux`` take inputs ``[S, ...]`` and run seed k's slice of the weights on
seed k's slice of the input with ``torch.vmap`` over ``torch.func.functional_call``. Parameter
names are the single network's (``policy_body.conv.weight``), so seed k of a group's state dict is
``{name: tensor[k]}`` (`seed_state_dict`), a plain single-seed state dict for export and evaluation.

A recurrent network (`ppo_lightning.nets.recurrent`) runs member by member instead: member k's
``functional_call`` on its own slices of the weights and of every input (observations, start states,
``is_init``), in aligned memory as its single run's tensors are (`ppo_lightning.nets.mlp_stacked`), so
that its outputs and gradients are its single run's bit for bit (vmap's batched matmuls sum in another
order, and a sequence multiplies the difference step by step). Its methods take the recurrent inputs
with a leading [S] as the network's (``step``, ``forward``, ``policy``, ``value``, ``forward_aux``), and
the group forwards ``recurrent``, ``state_size`` and ``initial_state``.

A feed-forward network class may have its own batched form for S seeds in `STACKED_FORMS`: the MinAtar CNN
(`ppo_lightning.nets.minatar_stacked`: batched matmuls are much faster there than vmap's grouped
convolutions) and the MLP actor-critic (`ppo_lightning.nets.mlp_stacked`: vmap's per-call cost
dominated a rollout's forwards); otherwise (a subclass, any other network) ``torch.vmap`` runs the module.

Elementwise code acts per seed over the stacked tensors (the EWMA proximal update is S independent
EWMAs), except where a kernel rounds an element by its place in the tensor: torch's fused Adam runs
each member's slice on its own (`ppo_lightning.training.seed_group.MemberAdam`).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state

from ppo_lightning.nets import actor_critic, minatar_cnn, minatar_stacked, mlp_stacked
from ppo_lightning.nets.mlp_stacked import _AlignedGrad, _aligned
from ppo_lightning.nets.recurrent import is_recurrent


def _minatar_form(net, params, buffers, method, *inputs):
    return None if buffers else minatar_stacked.stacked_call(net, params, method, *inputs)  # no buffers of its own


# network class (exactly: a subclass may change a method) -> fn(network, stacked params, stacked buffers,
# method, *inputs): its own form for S seeds at once, or None where it does not apply (then vmap)
STACKED_FORMS = {minatar_cnn.MinAtarActorCritic: _minatar_form, actor_critic.ActorCritic: mlp_stacked.stacked_call}


class SeedStack(nn.Module):
    """``networks`` (same architecture, one per seed) stacked into one module."""

    def __init__(self, networks: list[nn.Module]) -> None:
        super().__init__()
        if not networks:
            raise ValueError("SeedStack needs at least one network")
        self.members = len(networks)  # S, the stacked dimension's size
        params, buffers = stack_module_state(networks)
        inner = copy.deepcopy(networks[0])
        for name, value in {**params, **buffers}.items():
            owner, _, leaf = name.rpartition(".")
            mod = inner.get_submodule(owner) if owner else inner
            if name in params:
                setattr(mod, leaf, nn.Parameter(value.detach().clone()))
            else:
                mod.register_buffer(leaf, value.detach().clone())
        self.inner = inner
        self._tensors = None
        for attr in ("action_space", "discrete", "arch", "shared_trunk", "recurrent", "state_size"):
            if hasattr(inner, attr):
                setattr(self, attr, getattr(inner, attr))

    def _named_tensors(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The stacked parameters and buffers by name (kept: ``named_parameters`` walks the module
        tree, ~20 us on every policy forward of a rollout); rebuilt after ``_apply`` (``.to``,
        ``.float()``...), which may replace them."""
        if self._tensors is None:
            self._tensors = (dict(self.inner.named_parameters()), dict(self.inner.named_buffers()))
        return self._tensors

    def _apply(self, fn, recurse=True):
        self._tensors = None
        return super()._apply(fn, recurse)

    def initial_state(self, *batch_shape: int, device=None) -> Tensor:
        """A recurrent network's zero state ``[*batch_shape, D]`` (pass S first for every member's)."""
        return self.inner.initial_state(*batch_shape, device=device)

    def _call(self, method: str, *inputs: Tensor):
        inner = self.inner
        params, buffers = self._named_tensors()
        if is_recurrent(inner):  # member by member (see the module doc)
            outs = [self._member_call(k, method, *(x[k] for x in inputs)) for k in range(self.members)]
            if isinstance(outs[0], Tensor):
                return torch.stack(outs)
            return tuple(torch.stack(parts) for parts in zip(*outs))
        stacked = STACKED_FORMS.get(type(inner))
        out = None if stacked is None else stacked(inner, params, buffers, method, *inputs)
        if out is not None:  # the network's own batched form
            return out

        def one(p, b, *x):
            with _swapped(inner, method):
                return functional_call(inner, (p, b), x)

        return torch.vmap(one, randomness="error")(params, buffers, *inputs)

    def _member_call(self, k: int, method: str, *inputs: Tensor):
        """Member ``k``'s ``method`` on its own inputs (no seed dimension): its network's call on its
        slices of the weights, each operand in aligned memory, the outputs' gradients handed back in
        aligned memory (`ppo_lightning.nets.mlp_stacked`)."""
        inner = self.inner
        params, buffers = self._named_tensors()
        params = {n: _aligned(p[k]) for n, p in params.items()}
        buffers = {n: _aligned(b[k]) for n, b in buffers.items()}
        with _swapped(inner, method):
            out = functional_call(inner, (params, buffers), tuple(_aligned(x) for x in inputs))
        if not torch.is_grad_enabled():
            return out
        grad = lambda y: _AlignedGrad.apply(y) if y.requires_grad else y  # noqa: E731
        return grad(out) if isinstance(out, Tensor) else tuple(grad(y) for y in out)

    # The inputs: observations [S, ...]; a recurrent network's also its states and is_init, [S, ...] each
    # (`ppo_lightning.nets.recurrent`: ``[S, B, L, ...]`` sequences from ``[S, B, D]`` states).
    def forward(self, obs: Tensor, *recurrent: Tensor):
        return self._call("forward", obs, *recurrent)

    def policy(self, obs: Tensor, *recurrent: Tensor):
        return self._call("policy", obs, *recurrent)

    def value(self, obs: Tensor, *recurrent: Tensor) -> Tensor:
        return self._call("value", obs, *recurrent)

    def forward_aux(self, obs: Tensor, *recurrent: Tensor):
        return self._call("forward_aux", obs, *recurrent)

    def step(self, obs: Tensor, state: Tensor, is_init: Tensor):
        """A recurrent network's one step for every member: ``obs [S, *, ...]``, ``state [S, *, D]``,
        ``is_init [S, *]`` -> (*dist params, value, new state), each ``[S, *, ...]``."""
        return self._call("step", obs, state, is_init)

    def value_of_seed(self, k: int, obs: Tensor, *recurrent: Tensor) -> Tensor:
        """Seed ``k``'s value of ``obs`` (no seed dimension; a recurrent network's states and is_init
        after it): its network alone, same kernels as a single run."""
        return self.call_seed(k, "value", obs, *recurrent)

    def call_seed(self, k: int, method: str, *inputs: Tensor):
        """Seed ``k``'s ``method`` on ``inputs`` without the seed dimension."""
        if is_recurrent(self.inner):
            return self._member_call(k, method, *inputs)
        inner = self.inner
        params = {n: p[k] for n, p in inner.named_parameters()}
        buffers = {n: b[k] for n, b in inner.named_buffers()}
        with _swapped(inner, method):
            return functional_call(inner, (params, buffers), inputs)

    def seed_state_dict(self, k: int) -> dict[str, Tensor]:
        """Seed ``k``'s weights as the single network's state dict."""
        return {name: t[k].detach().clone() for name, t in self.inner.state_dict().items()}


class _swapped:
    """Within ``functional_call``, make ``forward`` run ``method`` of the module."""

    def __init__(self, module: nn.Module, method: str) -> None:
        self.module, self.method = module, method

    def __enter__(self):
        if self.method != "forward":
            self.module.forward = getattr(self.module, self.method)

    def __exit__(self, *exc):
        if self.method != "forward":
            del self.module.forward


def unstack_state_dict(state: dict[str, Tensor], k: int, prefix: str = "network.") -> dict[str, Tensor]:
    """Seed ``k`` of a group checkpoint's ``state_dict``: ``network.inner.X[k]`` -> ``network.X``."""
    inner = prefix + "inner."
    return {prefix + name[len(inner):]: t[k].clone() for name, t in state.items() if name.startswith(inner)}
