"""The MinAtar paper's small CNN as an actor-critic (``model.network.name: minatar_cnn``).

Young & Tian (2019), MinAtar, section 4: one 3x3 convolution with 16 channels, stride 1, no padding
(10x10 -> 8x8x16), ReLU, a dense layer of 128 units, ReLU, then the heads. Here the trunk is shared
by a policy head (init scale 0.01) and a value head (1.0), orthogonal init with gain sqrt(2) for the
trunk (the PPO implementations' convention, as `ppo_lightning.nets.actor_critic.ActorCritic`);
``shared_trunk: false`` (or ``arch: dual``) gives the policy and the value function a trunk each;
``arch: detach`` and ``aux_value_head: true`` are PPG's layouts, as in `ppo_lightning.nets.actor_critic.ActorCritic`
(PPG picks ``dual`` with the auxiliary head by default).

Observations: ``[..., H, W, C]`` (MinAtar's 10x10xC bool state, taken as 0/1 floats; any numeric
dtype is taken as is). The IMPALA-style option for MinAtar is the existing ``impala_cnn`` network
(`ppo_lightning.nets.impala`), which accepts the bool observations unchanged, e.g.
``{"name": "impala_cnn", "channels": [16, 32], "dense": 256}`` (10x10 -> 5x5 -> 3x3).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ppo_lightning.nets.actor_critic import ActorCritic, orthogonal_init_, resolve_arch


def _init(layer: nn.Module, gain: float) -> nn.Module:
    orthogonal_init_(layer.weight, gain)  # in one thread: the same weights whatever the thread count
    nn.init.zeros_(layer.bias)
    return layer


def minatar_input(observation_space: dict, channels: int, hidden: int, kernel_size: int) -> tuple[int, int, int]:
    """(H, W, C) of the ``[H, W, C]`` observations a `MinAtarTrunk` reads; a one-line ``ValueError`` for
    other shapes or settings that are not positive integers."""
    shape = list(observation_space["shape"])
    if len(shape) != 3 or min(shape[0], shape[1]) < kernel_size:
        raise ValueError(f"model.network: minatar_cnn needs [H, W, C] observations with H, W >= {kernel_size}, got {shape}")
    for name, v in (("channels", channels), ("hidden", hidden), ("kernel_size", kernel_size)):
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"model.network.{name} must be a positive integer, got {v!r}")
    h, w, c = shape
    return h, w, c


def minatar_nchw(obs: Tensor) -> tuple[Tensor, torch.Size]:
    """Observations ``[*lead, H, W, C]`` as one float NCHW batch, and their leading dimensions ``lead``."""
    lead = obs.shape[:-3]
    x = obs.reshape(-1, *obs.shape[-3:]).permute(0, 3, 1, 2).float()
    return x, lead


class MinAtarTrunk(nn.Module):
    """Conv(``kernel`` x ``kernel``, ``channels``, stride 1, no padding), ReLU, dense(``hidden``), ReLU:
    NCHW ``[N, c, h, w]`` -> ``[N, hidden]``; orthogonal init, gain sqrt(2), zero biases."""

    def __init__(self, h: int, w: int, c: int, channels: int, kernel: int, hidden: int) -> None:
        super().__init__()
        self.conv = _init(nn.Conv2d(c, channels, kernel), math.sqrt(2))
        self.dense = _init(nn.Linear(channels * (h - kernel + 1) * (w - kernel + 1), hidden), math.sqrt(2))

    def forward(self, x: Tensor) -> Tensor:
        x = torch.relu(self.conv(x)).flatten(1)
        return torch.relu(self.dense(x))


class MinAtarActorCritic(nn.Module):
    """Conv(3x3, ``channels``) -> dense(``hidden``) trunk with policy and value heads.

    Same interface as `ppo_lightning.nets.actor_critic.ActorCritic`: ``forward`` -> ``(logits, value)``,
    ``policy`` -> ``(logits,)``, ``value`` -> ``[..., 1]``; any leading batch dimensions.
    """

    def __init__(self, observation_space: dict, action_space: dict, channels: int = 16, hidden: int = 128,
                 kernel_size: int = 3, shared_trunk: bool | None = None, arch: str | None = None,
                 aux_value_head: bool = False) -> None:
        super().__init__()
        if action_space.get("type") != "discrete":
            raise ValueError(f"model.network: minatar_cnn needs a discrete action space, got {action_space!r}")
        h, w, c = minatar_input(observation_space, channels, hidden, kernel_size)
        self.action_space = action_space
        self.discrete = True
        # A shared trunk unless told otherwise (the MinAtar paper's network); PPG asks for "dual".
        self.arch = resolve_arch(arch or ("dual" if shared_trunk is False else "shared"), bool(shared_trunk))
        self.shared_trunk = self.arch != "dual"
        self.policy_body = MinAtarTrunk(h, w, c, channels, kernel_size, hidden)
        self.value_body = None if self.shared_trunk else MinAtarTrunk(h, w, c, channels, kernel_size, hidden)
        self.policy_head = _init(nn.Linear(hidden, action_space["n"]), 0.01)
        self.value_head = _init(nn.Linear(hidden, 1), 1.0)
        self.aux_value_head = _init(nn.Linear(hidden, 1), 1.0) if aux_value_head else None

    _nchw = staticmethod(minatar_nchw)

    def policy(self, obs: Tensor) -> tuple[Tensor]:
        x, lead = self._nchw(obs)
        return (self.policy_head(self.policy_body(x)).float().reshape(*lead, -1),)

    # The value head's input by layout (own trunk; shared; shared through a stop-gradient): the MLP's
    # rule, on the same attributes (value_body, policy_body, arch).
    _value_features = ActorCritic._value_features

    def value(self, obs: Tensor) -> Tensor:
        x, lead = self._nchw(obs)
        return self.value_head(self._value_features(x)).float().reshape(*lead, 1)

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        x, lead = self._nchw(obs)
        f = self.policy_body(x)
        # float32 outputs under any autocast (the loss's ratios, GAE)
        return (self.policy_head(f).float().reshape(*lead, -1),
                self.value_head(self._value_features(x, f)).float().reshape(*lead, 1))

    def forward_aux(self, obs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Logits, value and the auxiliary value on the policy trunk (PPG's auxiliary phase)."""
        if self.aux_value_head is None:
            raise ValueError("this network has no auxiliary value head (model.network.aux_value_head)")
        x, lead = self._nchw(obs)
        f = self.policy_body(x)
        return (self.policy_head(f).float().reshape(*lead, -1),
                self.value_head(self._value_features(x, f)).float().reshape(*lead, 1),
                self.aux_value_head(f).float().reshape(*lead, 1))
