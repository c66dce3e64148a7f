"""IMPALA CNN actor-critic (Espeholt et al. 2018), as used by Procgen, PPG and PPO-EWMA.

Architecture and init follow the reference code (openai/phasic-policy-gradient ``impala_cnn.py``,
also used by openai/ppo-ewma): per stack a 3x3 conv, a 3x3 stride-2 max-pool and ``nblock`` residual
blocks ``x + conv(relu(conv(relu(x))))``; then relu, a dense layer and relu; a shared trunk feeds the
policy and value heads. Every weight is normalised per output unit to a given norm (``NormedConv2d``
/ ``NormedLinear``): first convs 1, block convs ``sqrt(1 / sqrt(len(channels)) / sqrt(nblock))``,
dense 1.4, policy and value heads 0.1; biases zero.

Speed on CPU: observations arrive as uint8 NHWC; ``permute`` gives an NCHW view that is already
channels_last in memory, so every convolution runs in oneDNN's channels_last kernels without a copy.
Precision is the Trainer's (``--trainer.precision``, `ppo_lightning.training.precision`): under
``bf16-mixed`` Lightning's autocast runs the convolutions and dense layers in bf16; the heads'
outputs are cast back, so the network always returns float32. A copy of the network cast to bf16
(``.to(torch.bfloat16)``) computes the same values as the float32 network under bf16 autocast
(``BF16_WEIGHTS_EXACT``: the EWMA proximal forward uses it to skip autocast's per-call weight casts).

Without autograd (rollouts, the PPO-EWMA proximal forward, evaluation) the trunk takes a faster
path. The 3x3/2 max-pool is two separable passes of ``torch.maximum`` over strided views (in a
profile of the bf16 forward, ``max_pool2d_with_indices``, which also writes an int64 index per
output, took nearly as long as all the convolutions) and residual sums are in place, both bit for
bit the same values. And batches run in chunks of ``inference_chunk`` samples (the first stack's
activations of 64 samples stay near the 2 MiB per-core L2; 256 at once were 1.3x slower in fp32),
which changes only float rounding (~1e-8). Training keeps ``F.max_pool2d`` (its backward sends a tie's gradient to one input).
See benchmarks/impala_step.py.

A bf16 copy's forward without autograd (the EWMA proximal forward under bf16-mixed) runs, on CPUs
with native bf16, on oneDNN tensors (``Tensor.to_mkldnn``, as ``torch.utils.mkldnn`` does): the
convolutions are the same oneDNN kernels, but the max-pool is one oneDNN pass instead of four
elementwise passes over strided views, and no layout checks run between layers; the ReLU after a
residual block's first conv is that conv's oneDNN post-op. Bit for bit the same values (max, ReLU
and bf16 sums round the same way; tested); see benchmarks/proximal_cost.py.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ppo_lightning.adapters.torch import has_onednn_conv_relu, is_batched, onednn_conv_relu
from ppo_lightning.core.hardware import bf16_native_cpu

_ONEDNN_BF16: bool | None = None


def onednn_bf16_inference() -> bool:
    """Whether bf16 no-grad forwards take the oneDNN-tensor path: oneDNN is built in and the CPU has
    native bf16 (``avx512_bf16``/``amx_bf16``, not hidden by ``ONEDNN_MAX_CPU_ISA``). Read once."""
    global _ONEDNN_BF16
    if _ONEDNN_BF16 is None:
        _ONEDNN_BF16 = torch.backends.mkldnn.is_available() and bf16_native_cpu()[0]
    return _ONEDNN_BF16



def normed_linear(in_features: int, out_features: int, scale: float = 1.0) -> nn.Linear:
    """``nn.Linear`` whose weight rows have L2 norm ``scale``; zero bias (reference ``NormedLinear``)."""
    layer = nn.Linear(in_features, out_features)
    with torch.no_grad():
        layer.weight.mul_(scale / layer.weight.norm(dim=1, p=2, keepdim=True))
        layer.bias.zero_()
    return layer


def normed_conv2d(in_channels: int, out_channels: int, kernel_size: int = 3, scale: float = 1.0) -> nn.Conv2d:
    """3x3 same-padding ``nn.Conv2d`` whose filters have L2 norm ``scale``; zero bias (``NormedConv2d``)."""
    layer = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
    with torch.no_grad():
        layer.weight.mul_(scale / layer.weight.norm(dim=(1, 2, 3), p=2, keepdim=True))
        layer.bias.zero_()
    return layer


def max_pool_3x3_s2(x: Tensor) -> Tensor:
    """``F.max_pool2d(x, 3, stride=2, padding=1)``, bit for bit; without autograd and for even H, W
    as two separable passes over strided views (1.3-1.6x faster on CPU channels_last, fp32 and bf16)."""
    h, w = x.shape[-2:]
    # under torch.vmap (the members of a seed group, `ppo_lightning.nets.seed_stack`) ``out=`` has no batching rule
    if (torch.is_grad_enabled() and x.requires_grad) or h % 2 or w % 2 or is_batched(x):
        return F.max_pool2d(x, kernel_size=3, stride=2, padding=1)
    # Output row i covers input rows 2i-1, 2i, 2i+1 (row -1 is padding): the max of the even and
    # odd rows, then from i = 1 on also the previous odd row (written in place). Then the columns.
    even, odd = x[..., 0::2, :], x[..., 1::2, :]
    rows = torch.maximum(even, odd)
    torch.maximum(rows[..., 1:, :], odd[..., :-1, :], out=rows[..., 1:, :])
    even, odd = rows[..., 0::2], rows[..., 1::2]
    out = torch.maximum(even, odd)
    torch.maximum(out[..., 1:], odd[..., :-1], out=out[..., 1:])
    return out


# The ReLU after a residual block's first conv as a oneDNN post-op of that conv (the op inductor
# emits for conv + relu; `ppo_lightning.adapters.torch.onednn_conv_relu`). Same values bit for bit
# (tested). False: a separate in-place ReLU (benchmarks/proximal_cost.py --paths onednn,onednn_unfused).
_FUSE_CONV_RELU: bool = has_onednn_conv_relu()


def _onednn_conv(x: Tensor, conv: nn.Conv2d, relu: bool = False) -> Tensor:
    """``conv(x)`` (``relu(conv(x))`` if ``relu``) for a oneDNN tensor ``x`` (the module's dense bf16
    weights; a oneDNN tensor out)."""
    if relu and _FUSE_CONV_RELU:
        return onednn_conv_relu(x, conv)
    y = torch.mkldnn_convolution(x, conv.weight, conv.bias, conv.padding, conv.stride, conv.dilation, conv.groups)
    return y.relu_() if relu else y


class ResidualBlock(nn.Module):
    def __init__(self, channels: int, scale: float) -> None:
        super().__init__()
        s = math.sqrt(scale)
        self.conv0 = normed_conv2d(channels, channels, scale=s)
        self.conv1 = normed_conv2d(channels, channels, scale=s)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv0(F.relu(x))  # not in place: x is kept for the skip connection
        h = self.conv1(F.relu(h, inplace=True))  # the conv's output is not needed by its backward
        return x + h if h.requires_grad else h.add_(x)


class DownStack(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, nblock: int, scale: float) -> None:
        super().__init__()
        self.firstconv = normed_conv2d(in_channels, out_channels)
        self.blocks = nn.ModuleList(ResidualBlock(out_channels, scale / math.sqrt(nblock)) for _ in range(nblock))

    def forward(self, x: Tensor) -> Tensor:
        x = max_pool_3x3_s2(self.firstconv(x))
        for block in self.blocks:
            x = block(x)
        return x


class ImpalaEncoder(nn.Module):
    """The IMPALA trunk: the stacks (`DownStack` per entry of ``channels``), ReLU, a dense layer of
    ``dense`` units (norm 1.4) and ReLU. `features` maps observations ``[..., H, W, C]`` to
    ``[..., dense]``, with the no-autograd fast paths of the module doc. `ImpalaActorCritic` adds the
    heads; a recurrent network (`ppo_lightning.nets.recurrent`) reads it as its encoder."""

    def __init__(self, observation_space: dict, channels: tuple[int, ...] = (16, 32, 32), dense: int = 256,
                 nblock: int = 2, inference_chunk: int = 64) -> None:
        super().__init__()
        shape = list(observation_space["shape"])
        if len(shape) != 3:
            raise ValueError(f"model.network: impala_cnn needs [H, W, C] observations, got shape {shape}")
        if not (isinstance(inference_chunk, int) and inference_chunk > 0):
            raise ValueError(f"model.network.inference_chunk must be a positive integer, got {inference_chunk!r}")
        self.inference_chunk = inference_chunk
        h, w, c = shape
        stack_scale = 1.0 / math.sqrt(len(channels))
        stacks = []
        for out in channels:
            stacks.append(DownStack(c, out, nblock, stack_scale))
            c, h, w = out, (h + 1) // 2, (w + 1) // 2
        self.stacks = nn.ModuleList(stacks)
        self.dense = normed_linear(c * h * w, dense, scale=1.4)
        self.out_dim = dense

    def features(self, obs: Tensor) -> Tensor:
        """Trunk output ``[..., dense]`` (float32; bf16 under bf16 autocast or with bf16 weights)."""
        lead = obs.shape[:-3]
        x = obs.reshape(-1, *obs.shape[-3:]).permute(0, 3, 1, 2)  # NHWC memory = NCHW channels_last
        scale = obs.dtype == torch.uint8
        if torch.is_grad_enabled() or x.shape[0] <= self.inference_chunk:
            x = self._trunk(x, scale)
        else:
            x = torch.cat([self._trunk(c, scale) for c in x.split(self.inference_chunk)])
        return x.reshape(*lead, x.shape[-1])

    def _trunk(self, x: Tensor, scale: bool) -> Tensor:
        if (self.dense.weight.dtype == torch.bfloat16 and x.device.type == "cpu" and not torch.is_grad_enabled()
                and onednn_bf16_inference()):
            return self._trunk_onednn(x, scale)
        x = x.to(self.dense.weight.dtype)  # float32, or bf16 when the module itself was cast
        x = x * (1.0 / 255.0) if scale else x
        for stack in self.stacks:
            x = stack(x)
        x = F.relu(x).flatten(1)
        return F.relu(self.dense(x), inplace=True)

    def _trunk_onednn(self, x: Tensor, scale: bool) -> Tensor:
        """`_trunk` of a bf16 copy without autograd, on oneDNN tensors (see the module): same values."""
        x = x.to(torch.bfloat16)
        x = (x * (1.0 / 255.0) if scale else x).contiguous(memory_format=torch.channels_last).to_mkldnn()
        with torch.autocast("cpu", enabled=False):  # weights and inputs are bf16 already
            for stack in self.stacks:
                x = torch.mkldnn_max_pool2d(_onednn_conv(x, stack.firstconv), [3, 3], [2, 2], [1, 1])
                for block in stack.blocks:
                    h = _onednn_conv(torch.relu(x), block.conv0, relu=True)
                    x = _onednn_conv(h, block.conv1).add_(x)
            x = torch.relu(x).to_dense().flatten(1)
            return F.relu(self.dense(x), inplace=True)


class ImpalaActorCritic(ImpalaEncoder):
    """IMPALA CNN with a shared trunk (`ImpalaEncoder`) and policy / value heads; same interface as `ActorCritic`.

    Args:
        observation_space: ``{"shape": [H, W, C], "dtype": "uint8"}`` (HWC images; a uint8 tensor is
            scaled by 1/255, a float one is taken as already scaled).
        action_space: ``{"type": "discrete", "n": k}``.
        channels: output channels of the stacks. dense: width of the dense layer.
        nblock: residual blocks per stack.
        inference_chunk: without autograd, run the trunk on at most this many samples at a time.
    Accepts any leading batch dimensions: ``obs`` of shape ``[..., H, W, C]``.
    """

    # A bf16 copy (``.to(torch.bfloat16)``) computes what the float32 network computes under bf16
    # autocast, bit for bit (no normalization layers; tested in tests/test_procgen.py).
    BF16_WEIGHTS_EXACT = True

    def __init__(
        self,
        observation_space: dict,
        action_space: dict,
        channels: tuple[int, ...] = (16, 32, 32),
        dense: int = 256,
        nblock: int = 2,
        inference_chunk: int = 64,
    ) -> None:
        if action_space.get("type") != "discrete":
            raise ValueError(f"model.network: impala_cnn needs a discrete action space, got {action_space!r}")
        super().__init__(observation_space, channels, dense, nblock, inference_chunk)
        self.action_space = action_space
        self.discrete = True
        self.shared_trunk = True
        self.policy_head = normed_linear(dense, action_space["n"], scale=0.1)
        self.value_head = normed_linear(dense, 1, scale=0.1)

    def _heads(self, x: Tensor, value: bool = True, policy: bool = True):
        """Float32 logits and value (the loss, GAE and the ratios are computed in float32)."""
        logits = self.policy_head(x).float() if policy else None
        v = self.value_head(x).float() if value else None
        return logits, v

    def policy(self, obs: Tensor) -> tuple[Tensor]:
        """Distribution parameters ``(logits,)``."""
        return (self._heads(self.features(obs), value=False)[0],)

    def value(self, obs: Tensor) -> Tensor:
        """State value, shape ``[..., 1]``."""
        return self._heads(self.features(obs), policy=False)[1]

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """``(logits, value)`` from one trunk pass."""
        return self._heads(self.features(obs))
