"""The MLP actor-critic, the conventions every network shares, and their TensorDict wrappers.

An `ActorCritic` is a plain `nn.Module` (so Lightning, FSDP and safetensors see ordinary
parameters) with three entry points: ``forward`` (distribution parameters and value in one trunk
pass, used by the loss), ``policy`` (collection, proximal forward) and ``value`` (GAE). The
`make_*_operator` functions wrap them as TensorDict modules for TorchRL's collector and GAE.

Spaces are plain dicts so they survive ``torch.load(weights_only=True)`` and JSON:
``{"type": "discrete", "n": 2}`` or ``{"type": "continuous", "shape": [k]}`` for actions,
``{"shape": [...], "dtype": "float32" | "uint8"}`` for observations. Any other gymnasium space (a
``Discrete`` or ``Dict`` observation, a ``MultiDiscrete`` or ``Tuple`` action, an action mask) is packed
into one vector and described under ``"space"`` (`ppo_lightning.nets.encoders`,
`ppo_lightning.nets.composite`); `ppo_lightning.nets.spaces_net` reads it.
"""

from __future__ import annotations

import math

import torch
from tensordict.nn import TensorDictModule
from torch import Tensor, nn
from torch.distributions import Categorical, Independent, Normal

from ppo_lightning.nets.obs_norm import RunningObservationNorm
from ppo_lightning.nets.composite import CompositeDistribution

OBS_KEY = "observation"
VALUE_KEY = "state_value"

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU}


def dist_param_keys(action_space: dict) -> tuple[str, ...]:
    """TensorDict keys of the action distribution's parameters."""
    if action_space["type"] == "composite":  # one tensor, the leaves' parameters in order (nets.composite)
        return ("params",)
    return ("logits",) if action_space["type"] == "discrete" else ("loc", "scale")


def make_distribution(action_space: dict, *params: Tensor) -> torch.distributions.Distribution:
    """The policy's action distribution from its parameters (see `dist_param_keys`)."""
    # No argument validation: it checks every call on the hot path; the network's outputs are
    # well-formed by construction.
    if action_space["type"] == "discrete":
        return Categorical(logits=params[0], validate_args=False)
    if action_space["type"] == "composite":
        return CompositeDistribution(params[0], action_space["space"])
    return Independent(Normal(params[0], params[1], validate_args=False), 1, validate_args=False)


def orthogonal_init_(weight: Tensor, gain: float) -> Tensor:
    """``nn.init.orthogonal_`` in one intra-op thread, the caller's thread count restored after.

    Its QR (MKL's LAPACK on x86) gives other bits in other thread counts (a 128 x 1024 or 64 x 64
    weight differs between 1 and 2 threads), so without this a network's initial weights would depend
    on the thread count at the time it is built: a fresh process's default (the machine's cores) or
    whatever an earlier run in the same process left (``data.num_threads``). In one thread they are a
    function of the seed alone (on one CPU type)."""
    threads = torch.get_num_threads()
    if threads != 1:
        torch.set_num_threads(1)
    try:
        return nn.init.orthogonal_(weight, gain)
    finally:
        if threads != 1:
            torch.set_num_threads(threads)


def _init_linear(layer: nn.Linear, gain: float) -> nn.Linear:
    """Orthogonal init with the given gain and zero bias (the PPO implementations' convention)."""
    orthogonal_init_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def mlp(in_dim: int, hidden: tuple[int, ...], activation: str) -> tuple[nn.Sequential, int]:
    """A stack of orthogonally initialised Linear + activation layers; returns (module, out_dim)."""
    layers: list[nn.Module] = []
    dim = in_dim
    for width in hidden:
        layers += [_init_linear(nn.Linear(dim, width), math.sqrt(2)), ACTIVATIONS[activation]()]
        dim = width
    return nn.Sequential(*layers), dim


ARCHS = ("dual", "shared", "detach")


def resolve_arch(arch: str | None, shared_trunk: bool = False) -> str:
    """The encoder layout: "dual" (separate policy and value encoders), "shared" (one encoder for
    both heads) or "detach" (one encoder; the value head reads it through a stop-gradient, so value
    losses train only the head; Phasic Policy Gradient, Cobbe et al. 2021, and the reference code's
    ``PhasicValueModel``). None: from the older ``shared_trunk`` flag."""
    if arch is None:
        return "shared" if shared_trunk else "dual"
    if arch not in ARCHS:
        raise ValueError(f"model.network.arch must be one of {ARCHS}, got {arch!r}")
    if shared_trunk and arch == "dual":
        raise ValueError("model.network: shared_trunk=true contradicts arch='dual' (set one of them)")
    return arch


class ActorCritic(nn.Module):
    """Actor-critic over flat observations: separate MLPs (default) or one shared trunk.

    Policy head init scale 0.01 and value head 1.0, as in CleanRL and the PPO baselines.
    Continuous actions use a state-independent log standard deviation.

    ``arch`` (see `resolve_arch`) overrides ``shared_trunk``. ``aux_value_head`` adds PPG's
    auxiliary value head on the policy encoder, read by `forward_aux` (the auxiliary phase) only.
    """

    def __init__(
        self,
        observation_space: dict,
        action_space: dict,
        hidden_sizes: tuple[int, ...] = (64, 64),
        activation: str = "tanh",
        shared_trunk: bool = False,
        arch: str | None = None,
        aux_value_head: bool = False,
        normalize_observation: bool = False,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"model.activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.action_space = action_space
        in_dim = int(math.prod(observation_space["shape"]))
        self.obs_ndim = len(observation_space["shape"])
        self.discrete = action_space["type"] == "discrete"
        out_dim = action_space["n"] if self.discrete else int(math.prod(action_space["shape"]))
        self.arch = resolve_arch(arch, shared_trunk)
        self.shared_trunk = self.arch != "dual"
        self.policy_body, feat = mlp(in_dim, tuple(hidden_sizes), activation)
        if self.shared_trunk:
            self.value_body = None
            value_feat = feat
        else:
            self.value_body, value_feat = mlp(in_dim, tuple(hidden_sizes), activation)
        self.policy_head = _init_linear(nn.Linear(feat, out_dim), 0.01)
        self.value_head = _init_linear(nn.Linear(value_feat, 1), 1.0)
        self.log_std = None if self.discrete else nn.Parameter(torch.zeros(out_dim))
        self.aux_value_head = _init_linear(nn.Linear(feat, 1), 1.0) if aux_value_head else None
        # Running observation statistics inside the network (ppo_lightning.nets.obs_norm): saved,
        # exported and evaluated with the weights.
        self.obs_norm = RunningObservationNorm(in_dim) if normalize_observation else None

    def _flat(self, obs: Tensor) -> Tensor:
        obs = obs.float()
        obs = obs.flatten(-self.obs_ndim) if self.obs_ndim > 1 else obs
        return obs if self.obs_norm is None else self.obs_norm(obs)

    def _dist_params(self, features: Tensor) -> tuple[Tensor, ...]:
        out = self.policy_head(features).float()  # float32 under any autocast (the loss's ratios)
        if self.discrete:
            return (out,)
        return (out, self.log_std.exp().expand_as(out))

    def _value_features(self, obs: Tensor, policy_features: Tensor | None = None) -> Tensor:
        if self.value_body is not None:
            return self.value_body(obs)
        features = self.policy_body(obs) if policy_features is None else policy_features
        return features.detach() if self.arch == "detach" else features

    def policy(self, obs: Tensor) -> tuple[Tensor, ...]:
        """Distribution parameters for `make_distribution`."""
        return self._dist_params(self.policy_body(self._flat(obs)))

    def value(self, obs: Tensor) -> Tensor:
        """State value, shape ``[..., 1]``."""
        return self.value_head(self._value_features(self._flat(obs))).float()

    def forward(self, obs: Tensor) -> tuple[Tensor, ...]:
        """Distribution parameters and value, computing a shared trunk once."""
        obs = self._flat(obs)
        features = self.policy_body(obs)
        return (*self._dist_params(features), self.value_head(self._value_features(obs, features)).float())

    def forward_aux(self, obs: Tensor) -> tuple[Tensor, ...]:
        """Distribution parameters, value and the auxiliary value (PPG's auxiliary phase)."""
        if self.aux_value_head is None:
            raise ValueError("this network has no auxiliary value head (model.network.aux_value_head)")
        obs = self._flat(obs)
        features = self.policy_body(obs)
        value = self.value_head(self._value_features(obs, features)).float()
        return (*self._dist_params(features), value, self.aux_value_head(features).float())


def is_sharded(network: nn.Module) -> bool:
    """Whether ``network`` has been sharded with FSDP2's ``fully_shard``."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(network, FSDPModule)


def shard_network(network: nn.Module, mesh) -> nn.Module:
    """``fully_shard`` an actor-critic (FSDP2) so that ``forward``, ``policy``, ``value`` (and a recurrent
    network's ``step``) all work."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    fully_shard(network, mesh=mesh)
    for method in ("policy", "value", "forward_aux", "step"):
        if hasattr(network, method):
            register_fsdp_forward_method(network, method)
    return network


class _Method(nn.Module):
    """Expose one method of the network as a module, for TensorDictModule (shares parameters)."""

    def __init__(self, net: nn.Module, method: str) -> None:
        super().__init__()
        self.net = net
        self.method = method

    def forward(self, obs: Tensor):
        # __call__ for forward: module hooks (FSDP's weight gathering) must run.
        return self.net(obs) if self.method == "forward" else getattr(self.net, self.method)(obs)


def make_policy_operator(net: nn.Module, action_space: dict, with_value: bool = False):
    """TorchRL ProbabilisticActor that samples actions and records their log-prob and parameters.

    ``with_value``: run the network's joint ``forward`` instead of ``policy``, so the same pass also
    records ``state_value`` (the collection policy: GAE then needs no second value pass).
    """
    from torchrl.modules import IndependentNormal, ProbabilisticActor

    keys = list(dist_param_keys(action_space))
    method, out_keys = ("forward", [*keys, VALUE_KEY]) if with_value else ("policy", keys)
    module = TensorDictModule(_Method(net, method), in_keys=[OBS_KEY], out_keys=out_keys)
    if action_space["type"] == "composite":
        return ProbabilisticActor(module, in_keys=keys, distribution_class=CompositeDistribution,
                                  distribution_kwargs={"space": action_space["space"]}, return_log_prob=True)
    dist_cls = Categorical if action_space["type"] == "discrete" else IndependentNormal
    return ProbabilisticActor(module, in_keys=keys, distribution_class=dist_cls, return_log_prob=True)


def make_value_operator(net: nn.Module):
    """TorchRL ValueOperator writing ``state_value`` (used by GAE)."""
    from torchrl.modules import ValueOperator

    return ValueOperator(_Method(net, "value"), in_keys=[OBS_KEY])
