"""PPO-EWMA: the proximal policy as an exponentially weighted moving average of the policy weights.

Hilton, Cobbe & Schulman (2021), section 4 and the reference code (github.com/openai/ppo-ewma):
start from a copy of the weights with weight W = 1; after every optimizer step

    W' = beta W + 1;   theta_prox = theta_prox * beta W / W' + theta / W';   W = W'

which is exactly ``theta_prox.lerp_(theta, 1 / W')``: early on the average is a plain mean of the
weights seen so far, later an EWMA with decay beta. Its age is a center of mass in gradient steps,
``COM = beta / (1 - beta)`` (default 8, beta = 0.889).

Why not `torch.optim.swa_utils.AveragedModel` or Lightning's `EMAWeightAveraging`: the update runs
after every gradient step, so one fused foreach lerp over the parameter list
(`ppo_lightning.adapters.torch.foreach_lerp_`) is what we want on the hot path; and Lightning's callback swaps the averaged weights into the model for
validation and at the end of fit, which is wrong for a proximal policy (it is an anchor, never the
policy that acts).

With a recurrent network (`ppo_lightning.nets.recurrent`) the EWMA averages the weights of the core
as of every other layer; the proximal policy's outputs on a minibatch are the averaged network unrolled
over the minibatch's segments from the states stored at their first steps (which the behavior network
produced: the proximal network's own states are never carried), with the same resets.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable

import torch
from lightning.pytorch import Callback
from tensordict import TensorDictBase
from torch import Tensor, nn

from ppo_lightning.adapters import torch as torch_ops
from ppo_lightning.core.members import PerMember
from ppo_lightning.nets import recurrent
from ppo_lightning.nets.models import is_sharded, shard_network


def beta_from_com(com: float) -> float:
    """EWMA decay for a center of mass of ``com`` steps: ``beta = com / (1 + com)``."""
    if com < 0:
        raise ValueError(f"proximal center of mass must be >= 0, got {com}")
    return com / (1.0 + com)


def com_from_beta(beta: float) -> float:
    """Center of mass of an EWMA with decay beta: ``1 / (1 - beta) - 1 = beta / (1 - beta)``."""
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"EWMA beta must lie in [0, 1), got {beta}")
    return beta / (1.0 - beta)


@torch.no_grad()
def ewma_update_(proximal_params: list[Tensor], params: list[Tensor], beta: float | list[float],
                 weight: float | list[float]) -> float | list[float]:
    """One weighted EWMA step in place (reference code of Hilton et al.); returns the new weight W'.

    ``W' = beta W + 1``; ``prox = prox * beta W / W' + theta / W'`` for every pair of tensors.
    ``beta`` and ``weight`` may be lists, one per seed of a group (stacked tensors ``[S, ...]``):
    seed k's slices then move by its own ``beta[k]`` (members with their own center of mass).
    """
    proximal_params = list(proximal_params)
    if not isinstance(beta, (list, tuple)):
        new_weight = beta * weight + 1.0
        if proximal_params:
            torch_ops.foreach_lerp_(proximal_params, [p.detach() for p in params], 1.0 / new_weight)
        return new_weight
    new_weights = [b * w + 1.0 for b, w in zip(beta, weight)]
    if proximal_params:
        step = torch.tensor([1.0 / w for w in new_weights], dtype=proximal_params[0].dtype, device=proximal_params[0].device)
        for q, p in zip(proximal_params, params):
            q.lerp_(p.detach(), step.view(-1, *([1] * (q.dim() - 1))))
    return new_weights


def _copy_network(network: nn.Module, make_network: Callable[[], nn.Module] | None = None) -> nn.Module:
    """A copy with its own parameters. An FSDP2-sharded network is rebuilt by ``make_network`` and
    sharded on the same mesh (a deep copy would share FSDP's hooks and state with the original)."""
    if not is_sharded(network):
        return copy.deepcopy(network)
    if make_network is None:
        raise ValueError("copying an FSDP-sharded network needs make_network (the LightningModule's)")
    params = list(network.parameters())
    with torch.random.fork_rng(devices=[]):  # its random init is overwritten: leave the RNG stream as it was
        clone = shard_network(make_network(), params[0].device_mesh)
    with torch.no_grad():
        for q, p in zip(clone.parameters(), params):
            q.copy_(p)
    return clone


def _full_state_dict(module: nn.Module) -> dict[str, Tensor]:
    """Plain, full tensors (gathered from all ranks when sharded: every rank must call it)."""
    if is_sharded(module):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))
        return {k: v.detach().clone() for k, v in state.items()}
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _load_full_state_dict(module: nn.Module, state: dict[str, Tensor]) -> None:
    if is_sharded(module):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True))
    else:
        module.load_state_dict(state)


class ProximalPolicyEWMA:
    """The EWMA proximal copy of a network: owned by the LightningModule (``proximal_source``).

    The module asks it for proximal distribution parameters (`proximal_policy`), calls `update`
    after every policy optimizer step (told *when* by the `ProximalEWMAStep` callback), and saves
    `state_dict` (weight, age, proximal parameters) in its checkpoint. `reset` restarts it from the
    current weights with W = 1 (PPG does so after each auxiliary phase, reference ``EwmaModel.reset``).
    """

    def __init__(self, com: float | list[float] = 8.0, bf16: bool = False) -> None:
        # A list: one center of mass per seed of a group (members with their own EWMA; weight and
        # age are then lists too).
        self.per_seed = isinstance(com, (list, tuple))
        self.com = [float(x) for x in com] if self.per_seed else float(com)
        # The Trainer's precision is bf16-mixed: the proximal forward (inside the training step's
        # autocast) may then run on a bf16 copy of the averaged weights where that is exact (the
        # network's ``BF16_WEIGHTS_EXACT``). The averaged weights themselves stay float32.
        self.bf16 = bf16
        self.beta = [beta_from_com(x) for x in self.com] if self.per_seed else beta_from_com(self.com)
        self.proximal: nn.Module | None = None
        self.weight, self.age_sum = self._initial()  # age_sum = sum_i w_i * age_i, so that age = age_sum / weight
        self.num_updates = 0
        self.num_resets = 0
        self._pending_state: dict[str, Any] | None = None
        self._ready = False  # True between start() and stop(): a restored state applies at once
        self._prox_params: list[Tensor] = []
        self._params: list[Tensor] = []
        # With bf16: a bf16 copy of the averaged weights, refreshed after every update, whose
        # forward skips autocast's weight casts (Lightning's autocast casts every weight per call).
        self._forward_net: nn.Module | None = None
        self._forward_params: list[Tensor] = []
        # Buffers are not weights: the network's (observation statistics) and the proximal copy's,
        # whose values the proximal forward takes from the network's (see `_sync_buffers`).
        self._buffers: list[Tensor] = []
        self._prox_buffers: list[Tensor] = []
        self._make_network: Callable[[], nn.Module] | None = None

    def _initial(self):
        """(weight, age_sum) of a fresh average: W = 1, age 0 (per seed with per-seed centers of mass)."""
        return ([1.0] * len(self.com), [0.0] * len(self.com)) if self.per_seed else (1.0, 0.0)

    @property
    def age(self) -> float | list[float]:
        """Center of mass of the current average, in gradient steps (tends to ``com``)."""
        if self.per_seed:
            return [a / w for a, w in zip(self.age_sum, self.weight)]
        return self.age_sum / self.weight

    def start(self, network: nn.Module, make_network: Callable[[], nn.Module] | None = None) -> None:
        """At fit start, once (sharded) parameters are final: copy the weights, apply a restored state."""
        self._make_network = make_network
        self.reset(network)
        self.num_resets = 0
        self._ready = True
        if self._pending_state is not None:
            self._apply_state(self._pending_state)
            self._pending_state = None

    def stop(self) -> None:
        self._ready = False

    def reset(self, network: nn.Module, make_network: Callable[[], nn.Module] | None = None) -> None:
        """Start again from a copy of the current weights with W = 1 (``make_network`` builds an
        unsharded network of the same shape; needed only when ``network`` is FSDP-sharded)."""
        self.proximal = _copy_network(network, make_network or self._make_network).requires_grad_(False)
        self._prox_params = list(self.proximal.parameters())
        self._params = list(network.parameters())
        self._buffers = list(network.buffers())
        self._prox_buffers = list(self.proximal.buffers())
        self.weight, self.age_sum = self._initial()
        self.num_resets += 1
        self._forward_net, self._forward_params = None, []
        if self.bf16 and getattr(self.proximal, "BF16_WEIGHTS_EXACT", False) and not is_sharded(self.proximal):
            # Same values as the bf16-autocast forward of the float32 average (tested): autocast
            # casts weights and conv inputs to bf16 with the same rounding.
            self._forward_net = copy.deepcopy(self.proximal).to(torch.bfloat16)
            self._forward_params = list(self._forward_net.parameters())
            self._prox_buffers += list(self._forward_net.buffers())

    @torch.no_grad()
    def reset_member(self, k: int, com: float) -> None:
        """Seed k of a group starts again (a refilled slot of a tuning group): its average restarts from
        its current weights with W = 1 and age 0, at center of mass ``com``; the other seeds' go on. A
        group with one center of mass for all becomes one with a center of mass per seed."""
        if not self.per_seed:
            n = self._params[0].shape[0]
            self.per_seed, self.com, self.beta = True, [self.com] * n, [self.beta] * n
            self.weight, self.age_sum = [self.weight] * n, [self.age_sum] * n
        self.com[k], self.beta[k] = float(com), beta_from_com(float(com))
        self.weight[k], self.age_sum[k] = 1.0, 0.0
        for q, p in zip(self._prox_params, self._params):
            q[k].copy_(p.detach()[k])
        self._sync_forward_net()

    def _sync_forward_net(self) -> None:
        if self._forward_params:
            torch_ops.foreach_copy_(self._forward_params, self._prox_params)

    def update(self) -> None:
        """Apply one EWMA step towards the current weights."""
        if self.per_seed:
            self.age_sum = [b * (a + w) for b, a, w in zip(self.beta, self.age_sum, self.weight)]
        else:
            self.age_sum = self.beta * (self.age_sum + self.weight)
        self.weight = ewma_update_(self._prox_params, self._params, self.beta, self.weight)
        self._sync_forward_net()
        self.num_updates += 1

    @torch.no_grad()
    def _sync_buffers(self) -> None:
        """The proximal copy reads the observation through the network's current buffers.

        The EWMA averages weights; buffers such as a `RunningObservationNorm`'s statistics belong to
        the environment's side of the network, updated once per rollout. An anchor that normalized
        with the statistics frozen at its copy (or averaged) would see other inputs than the policy
        it anchors: its ratio to the policy would measure the normalizer's drift, not the update.
        """
        n = len(self._buffers)
        if n:
            for copies in (self._prox_buffers[:n], self._prox_buffers[n:]):
                if copies:
                    torch_ops.foreach_copy_(copies, self._buffers)

    @torch.no_grad()
    def proximal_policy(self, obs: Tensor | TensorDictBase) -> tuple[Tensor, ...]:
        """Distribution parameters of the proximal policy (its averaged weights, the network's buffers)
        on observations, or on a minibatch (a TensorDict): a recurrent network's segments ``[*, B, L]``
        are unrolled from the states stored at their first steps, with the resets where ``is_init``
        (the same inputs as the current policy's: `ppo_lightning.nets.recurrent.call`)."""
        self._sync_buffers()
        net = self._forward_net if self._forward_net is not None else self.proximal
        if isinstance(obs, TensorDictBase):
            return recurrent.call(net, "policy", obs)
        return net.policy(obs)

    def metrics(self) -> dict[str, float]:
        if self.per_seed:  # each member's own EWMA
            return {f"proximal/{name}": PerMember(v) for name, v in (("age", self.age), ("com", self.com), ("weight", self.weight))}
        return {"proximal/age": self.age, "proximal/com": self.com, "proximal/weight": self.weight}

    def state_dict(self) -> dict[str, Any]:
        return {
            "com": self.com,
            "weight": self.weight,
            "age_sum": self.age_sum,
            "num_updates": self.num_updates,
            "proximal": _full_state_dict(self.proximal) if self.proximal is not None else None,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Lightning restores checkpoints before on_fit_start (single device) or after it (sharded).
        if self._ready:
            self._apply_state(state_dict)
        else:
            self._pending_state = state_dict

    def _apply_state(self, state: dict[str, Any]) -> None:
        saved = state["com"] if isinstance(state["com"], (list, tuple)) else [state["com"]]
        mine = self.com if self.per_seed else [self.com]
        if len(saved) != len(mine) or not all(math.isclose(a, b) for a, b in zip(saved, mine)):
            raise ValueError(
                f"checkpoint's proximal center of mass {state['com']} differs from the config's {self.com}"
            )
        self.weight, self.age_sum, self.num_updates = state["weight"], state["age_sum"], state["num_updates"]
        if state["proximal"] is not None:
            _load_full_state_dict(self.proximal, state["proximal"])
            self._sync_forward_net()


def validate_proximal_com(proximal_com, decoupled: bool) -> None:
    """One-line errors for ``model.proximal_com`` (None: no EWMA)."""
    if proximal_com is None:
        return
    if proximal_com < 0:
        raise ValueError(f"model.proximal_com (center of mass, gradient steps) must be >= 0, got {proximal_com}")
    if not decoupled:
        raise ValueError("model.proximal_com needs model.decoupled=true (the EWMA is the decoupled anchor)")


class ProximalEWMAStep(Callback):
    """Says *when* the module's EWMA proximal policy moves: after every optimizer step.

    ``trainer.global_step`` counts optimizer steps (gradient accumulation does not step); for each
    new one the module's ``step_proximal`` runs, which updates the EWMA only after steps that
    changed the policy (not after PPG's value-only or auxiliary steps).
    """

    def __init__(self) -> None:
        self._seen_step = 0

    def on_train_start(self, trainer, pl_module) -> None:
        self._seen_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        while self._seen_step < trainer.global_step:
            pl_module.step_proximal()
            self._seen_step += 1
