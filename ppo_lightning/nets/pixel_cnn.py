"""Convolutional actor-critics for image observations from any env, and the rule that picks one.

``model.network.name: nature_cnn``: the network of the DQN paper (Mnih et al. 2015, "Human-level
control through deep reinforcement learning", Methods), which the PPO paper used for Atari (Schulman
et al. 2017, section 6.3, after Mnih et al. 2016): conv 32 8x8 stride 4, conv 64 4x4 stride 2,
conv 64 3x3 stride 1, dense 512, each followed by ReLU. It needs at least 36x36 pixels (36 -> 8 ->
3 -> 1). ``small_cnn`` is for smaller images (MinAtar's 10x10, gridworlds): conv 32 3x3 stride 1,
conv 64 3x3 stride 2, conv 64 3x3 stride 2 (padding 1: any size >= 1 works), dense 256.

Both: orthogonal init, gain sqrt(2) for the trunk, 0.01 for the policy head, 1 for the value head
(CleanRL's ``ppo_atari.py``); a shared trunk (``arch: shared``, the default, as in the PPO paper's
Atari network) or ``dual`` / ``detach`` and PPG's ``aux_value_head`` as the other networks
(`ppo_lightning.nets.actor_critic.resolve_arch`). Discrete actions get logits; ``Box`` actions a
Gaussian with a state-independent log standard deviation, as the MLP's.

Observations ``[..., H, W, C]`` (``layout: hwc``, gymnasium's image convention) or ``[..., C, H, W]``
(``chw``: ale-py's stacked frames); ``uint8`` is scaled by 1/255 to [0, 1], any other dtype is taken as
is. `image_layout` reads the layout from a shape; `resolve_network` turns ``name: auto`` into a
network for the observation space (`choose_network`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ppo_lightning.nets.actor_critic import orthogonal_init_, resolve_arch
from ppo_lightning.adapters.torch import is_batched

# (out_channels, kernel, stride, padding) per convolution
NATURE_CONVS = ((32, 8, 4, 0), (64, 4, 2, 0), (64, 3, 1, 0))
SMALL_CONVS = ((32, 3, 1, 1), (64, 3, 2, 1), (64, 3, 2, 1))
NATURE_MIN_SIZE = 36  # the smallest side the Nature CNN's three convolutions reduce to 1x1
MAX_CHANNELS = 16  # an image's channel axis is its first or last, of at most this many (RGB, stacked frames)
MIN_SIDE = 4  # and both other sides at least this long
CORE_SETTINGS = ("core", "core_size", "post_core_sizes")  # a recurrent core after either kind's encoder (ppo_lightning.nets.recurrent)
CNN_SETTINGS = ("layout", "dense", "shared_trunk", "arch", "aux_value_head", *CORE_SETTINGS)
MLP_SETTINGS = ("hidden_sizes", "activation", "shared_trunk", "arch", "aux_value_head", "normalize_observation",
                *CORE_SETTINGS)


def image_layout(shape, dtype: str = "float32") -> str | None:
    """``"hwc"``, ``"chw"`` or None: whether a ``Box`` of ``shape`` is an image and where its channels are.

    An image is rank 3 with a channel axis, first or last, of at most `MAX_CHANNELS` and both other
    sides at least `MIN_SIDE` (``[64, 64, 3]``, ``[4, 84, 84]``, MinAtar's ``[10, 10, 4]``): the smaller
    end is the channel axis, the last one on a tie (gymnasium's HWC). A rank-2 ``uint8`` box is a
    grayscale image (``[84, 84]``: HWC with one channel, ``"hw"``). Anything else: None (an MLP's input).
    """
    shape = [int(s) for s in shape]
    if len(shape) == 2 and str(dtype) == "uint8" and min(shape) >= MIN_SIDE:
        return "hw"
    if len(shape) != 3:
        return None
    first, last = shape[0], shape[-1]
    if last <= MAX_CHANNELS and last <= first and min(shape[0], shape[1]) >= MIN_SIDE:
        return "hwc"
    if first <= MAX_CHANNELS and min(shape[1], shape[2]) >= MIN_SIDE:
        return "chw"
    return None


def image_hwc(shape, layout: str) -> tuple[int, int, int]:
    """(height, width, channels) of an image ``shape`` in ``layout``."""
    if layout == "hw":
        return int(shape[0]), int(shape[1]), 1
    if layout == "hwc":
        return int(shape[0]), int(shape[1]), int(shape[2])
    if layout == "chw":
        return int(shape[1]), int(shape[2]), int(shape[0])
    raise ValueError(f"model.network.layout must be 'hwc', 'chw' or 'hw', got {layout!r}")


def choose_network(observation_space: dict) -> str:
    """The network ``name: auto`` picks for an observation space: ``nature_cnn`` for an image
    (`image_layout`) whose smaller side is at least `NATURE_MIN_SIZE`, ``small_cnn`` for a smaller
    image, ``mlp`` for anything else (vectors; spaces without a ``shape``)."""
    shape = observation_space.get("shape") if isinstance(observation_space, dict) else None
    layout = None if shape is None else image_layout(shape, observation_space.get("dtype", "float32"))
    if layout is None:
        return "mlp"
    h, w, _ = image_hwc(shape, layout)
    return "nature_cnn" if min(h, w) >= NATURE_MIN_SIZE else "small_cnn"


def resolve_network(observation_space: dict, network: dict) -> tuple[dict, str | None]:
    """(the network config, a line to print or None). ``name: auto`` becomes `choose_network`'s
    choice; the chosen kind's settings are kept (an image's ``layout`` filled in; a recurrent core's
    ``core`` and ``core_size`` with either), the other kind's dropped and named in the line. Any other
    name is returned as is (it overrides the choice)."""
    network = dict(network)
    if network.get("name", "mlp") != "auto":
        return network, None
    name = choose_network(observation_space)
    keep = MLP_SETTINGS if name == "mlp" else CNN_SETTINGS
    dropped = sorted(k for k in network if k not in keep and k != "name")
    out = {"name": name, **{k: v for k, v in network.items() if k in keep}}
    if name == "mlp":
        return out, None  # vectors: the MLP, as a config without a name gives; nothing to say
    shape = list(observation_space["shape"])
    out["layout"] = image_layout(shape, observation_space.get("dtype", "float32"))
    scaled = " (uint8, scaled to [0, 1])" if observation_space.get("dtype") == "uint8" else ""
    line = (f"model.network: {name} for image observations {shape} {out['layout'].upper()}{scaled}; "
            f"model.network.name overrides it")
    if dropped:
        line += f" ({', '.join(dropped)}: an mlp's, unused)"
    return out, line


def _init_pixel_layer(layer: nn.Module, gain: float) -> nn.Module:
    orthogonal_init_(layer.weight, gain)  # in one thread: the same weights whatever the thread count
    nn.init.zeros_(layer.bias)
    return layer


def conv_output_side(side: int, convs) -> int:
    """An image side after ``convs`` ((out, kernel, stride, padding) each)."""
    for _, kernel, stride, padding in convs:
        side = (side + 2 * padding - kernel) // stride + 1
    return side


def image_input(observation_space: dict, convs, dense: int, name: str, layout: str | None = None
                ) -> tuple[str, int, int, int]:
    """(layout, height, width, channels) of the images a trunk of ``convs`` and a ``dense`` layer reads
    (``layout``: given, or `image_layout`'s); a one-line ``ValueError`` naming network ``name`` for
    observations that are not images, too small for ``convs``, or a ``dense`` that is not a positive integer."""
    shape = list(observation_space["shape"])
    layout = layout or image_layout(shape, observation_space.get("dtype", "float32"))
    if layout is None or len(shape) != (2 if layout == "hw" else 3):
        raise ValueError(f"model.network: {name} needs image observations ([H, W, C], [C, H, W] or uint8 "
                         f"[H, W]), got shape {shape}")
    if not isinstance(dense, int) or dense <= 0:
        raise ValueError(f"model.network.dense must be a positive integer, got {dense!r}")
    h, w, c = image_hwc(shape, layout)
    if min(conv_output_side(h, convs), conv_output_side(w, convs)) < 1:
        raise ValueError(f"model.network: {name} needs images of at least {NATURE_MIN_SIZE}x{NATURE_MIN_SIZE}, "
                         f"got {h}x{w} (small_cnn takes any size)")
    return layout, h, w, c


def image_batch(obs: Tensor, layout: str, dtype: torch.dtype) -> tuple[Tensor, torch.Size]:
    """Observations ``[*lead, <image in layout>]`` as one NCHW batch of ``dtype`` (``uint8`` scaled to
    [0, 1]; channels_last memory outside ``torch.vmap``) and their leading dimensions ``lead``."""
    rank = 2 if layout == "hw" else 3
    lead = obs.shape[:-rank]
    x = obs.reshape(-1, *obs.shape[-rank:])
    if layout == "hw":
        x = x.unsqueeze(1)
    elif layout == "hwc":
        x = x.permute(0, 3, 1, 2)  # NHWC memory = NCHW channels_last
    scale = x.dtype == torch.uint8
    # channels_last: oneDNN's faster convolutions, forward and backward (a Nature CNN step of 256 Atari
    # frames ~1.2x on the AVX-512 EPYC); one copy with the dtype conversion
    # (not under torch.vmap, a group's stacked members: no channels_last for its batched tensors)
    batched = is_batched(x)
    x = x.to(dtype, memory_format=torch.preserve_format if batched else torch.channels_last)
    return (x.mul_(1.0 / 255.0) if scale else x), lead  # a fresh tensor where scaled


class ConvTrunk(nn.Module):
    """Convolutions (``convs``: (out_channels, kernel, stride, padding) each), ReLU after each, then a
    dense layer of ``dense`` units and ReLU: NCHW images ``[N, c, h, w]`` -> features ``[N, dense]``.
    Orthogonal init, gain sqrt(2), zero biases."""

    def __init__(self, h: int, w: int, c: int, convs, dense: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for out, kernel, stride, padding in convs:
            layers += [_init_pixel_layer(nn.Conv2d(c, out, kernel, stride, padding), math.sqrt(2)), nn.ReLU()]
            c = out
        self.convs = nn.Sequential(*layers)
        flat = c * conv_output_side(h, convs) * conv_output_side(w, convs)
        self.dense = _init_pixel_layer(nn.Linear(flat, dense), math.sqrt(2))

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.dense(self.convs(x).flatten(1)))


class ConvActorCritic(nn.Module):
    """A stack of convolutions, a dense layer and policy / value heads; the interface of
    `ppo_lightning.nets.actor_critic.ActorCritic` (``forward``, ``policy``, ``value``, ``forward_aux``;
    any leading batch dimensions). ``convs``: (out_channels, kernel, stride, padding) per layer."""

    def __init__(self, observation_space: dict, action_space: dict, convs, dense: int, name: str,
                 layout: str | None = None, shared_trunk: bool | None = None, arch: str | None = None,
                 aux_value_head: bool = False) -> None:
        super().__init__()
        layout, h, w, c = image_input(observation_space, convs, dense, name, layout)
        self.action_space = action_space
        self.layout = layout
        self.discrete = action_space["type"] == "discrete"
        out_dim = action_space["n"] if self.discrete else int(math.prod(action_space["shape"]))
        self.arch = resolve_arch(arch or ("dual" if shared_trunk is False else "shared"), bool(shared_trunk))
        self.shared_trunk = self.arch != "dual"
        self.policy_body = ConvTrunk(h, w, c, convs, dense)
        self.value_body = None if self.shared_trunk else ConvTrunk(h, w, c, convs, dense)
        self.policy_head = _init_pixel_layer(nn.Linear(dense, out_dim), 0.01)
        self.value_head = _init_pixel_layer(nn.Linear(dense, 1), 1.0)
        self.log_std = None if self.discrete else nn.Parameter(torch.zeros(out_dim))
        self.aux_value_head = _init_pixel_layer(nn.Linear(dense, 1), 1.0) if aux_value_head else None

    def _nchw(self, obs: Tensor) -> tuple[Tensor, torch.Size]:
        """Observations as a float NCHW batch (uint8 scaled to [0, 1]) and their leading dimensions."""
        return image_batch(obs, self.layout, self.policy_head.weight.dtype)

    def _dist_params(self, features: Tensor, lead) -> tuple[Tensor, ...]:
        out = self.policy_head(features).float().reshape(*lead, -1)  # float32 under any autocast
        if self.discrete:
            return (out,)
        return (out, self.log_std.exp().expand_as(out))

    def _value_features(self, x: Tensor, policy_features: Tensor | None = None) -> Tensor:
        if self.value_body is not None:
            return self.value_body(x)
        features = self.policy_body(x) if policy_features is None else policy_features
        return features.detach() if self.arch == "detach" else features

    def policy(self, obs: Tensor) -> tuple[Tensor, ...]:
        """Distribution parameters (``(logits,)`` or ``(loc, scale)``)."""
        x, lead = self._nchw(obs)
        return self._dist_params(self.policy_body(x), lead)

    def value(self, obs: Tensor) -> Tensor:
        """State value, shape ``[..., 1]``."""
        x, lead = self._nchw(obs)
        return self.value_head(self._value_features(x)).float().reshape(*lead, 1)

    def forward(self, obs: Tensor) -> tuple[Tensor, ...]:
        """Distribution parameters and value, computing a shared trunk once."""
        x, lead = self._nchw(obs)
        f = self.policy_body(x)
        return (*self._dist_params(f, lead), self.value_head(self._value_features(x, f)).float().reshape(*lead, 1))

    def forward_aux(self, obs: Tensor) -> tuple[Tensor, ...]:
        """Distribution parameters, value and the auxiliary value (PPG's auxiliary phase)."""
        if self.aux_value_head is None:
            raise ValueError("this network has no auxiliary value head (model.network.aux_value_head)")
        x, lead = self._nchw(obs)
        f = self.policy_body(x)
        return (*self._dist_params(f, lead), self.value_head(self._value_features(x, f)).float().reshape(*lead, 1),
                self.aux_value_head(f).float().reshape(*lead, 1))


class NatureActorCritic(ConvActorCritic):
    """The Nature CNN (`NATURE_CONVS`, dense 512) actor-critic: ``model.network.name: nature_cnn``."""

    def __init__(self, observation_space: dict, action_space: dict, dense: int = 512, layout: str | None = None,
                 shared_trunk: bool | None = None, arch: str | None = None, aux_value_head: bool = False) -> None:
        super().__init__(observation_space, action_space, NATURE_CONVS, dense, "nature_cnn", layout, shared_trunk,
                         arch, aux_value_head)


class SmallActorCritic(ConvActorCritic):
    """The small CNN (`SMALL_CONVS`, dense 256) actor-critic: ``model.network.name: small_cnn``."""

    def __init__(self, observation_space: dict, action_space: dict, dense: int = 256, layout: str | None = None,
                 shared_trunk: bool | None = None, arch: str | None = None, aux_value_head: bool = False) -> None:
        super().__init__(observation_space, action_space, SMALL_CONVS, dense, "small_cnn", layout, shared_trunk,
                         arch, aux_value_head)
