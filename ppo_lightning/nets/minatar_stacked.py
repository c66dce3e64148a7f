"""The MinAtar CNN (`ppo_lightning.nets.minatar_cnn`) for S seeds at once, parameters stacked ``[S, *shape]``.

Used by `ppo_lightning.nets.seed_stack.SeedStack` for vectorized seeds. Written with batched matmuls
(the 3x3 convolution as stacked windows @ kernel) instead of ``torch.vmap`` over the module: vmap
turns the convolution into a grouped one and transposes the dense weights into copies on every
call, which made a step of 8 seeds cost about 5 single steps. Kept apart from the network's own
file, which `export-hf` copies into self-contained model code.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ppo_lightning.nets.minatar_cnn import MinAtarActorCritic

def _linear_forward(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``x [S, B, in] @ weight[S, out, in]^T + bias [S, out]`` -> ``[S, B, out]``. With few rows per seed
    (a rollout's forward, c = 64 minibatches: up to 8) ``x @ weight^T`` directly, a matrix-vector-like
    product over each weight, the faster order there; with more rows ``(weight @ x^T)^T``, the faster
    one from ~16 rows on (measured: docs/benchmarks/small-batch.md). Under autocast always the latter:
    autocast caches its bf16 copy of a leaf parameter for the whole autocast region (a rollout's
    forwards: one cast per rollout), but casts a transposed view of it anew on every call (a
    rollout's forward at c = 64 went 0.87 -> 0.36 ms for 8 seeds; same values)."""
    if x.shape[1] <= SMALL_ROWS and not torch.is_autocast_enabled(x.device.type):
        return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))
    return torch.baddbmm(bias.unsqueeze(-1), weight, x.transpose(1, 2)).transpose(1, 2)


SMALL_ROWS = 8


class _StackedLinear(torch.autograd.Function):
    """`_linear_forward` with the backward written out: ``grad_x = g @ weight`` and ``grad_weight = g^T @ x``,
    both batched matmuls over contiguous operands that produce the gradients in their tensors' own
    layouts (autograd's backward of either forward order transposes one of them: a copy of every
    weight gradient, or a transposed input gradient that the layers below copy)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        ctx.save_for_backward(x, weight)
        return _linear_forward(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        grad_x = torch.bmm(grad, weight) if ctx.needs_input_grad[0] else None
        grad_weight = torch.bmm(grad.transpose(1, 2), x) if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(1) if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


def _stacked_linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``x [S, B, in] @ weight[S, out, in]^T + bias [S, out]`` -> ``[S, B, out]``: `_StackedLinear` when
    gradients are needed (autocast keeps autograd's own backward: its casts belong to it)."""
    if torch.is_grad_enabled() and not torch.is_autocast_enabled(x.device.type):
        return _StackedLinear.apply(x, weight, bias)
    return _linear_forward(x, weight, bias)


def _stacked_trunk(p: dict[str, Tensor], prefix: str, x: Tensor, kernel: int) -> Tensor:
    """``x [S, C, B, H, W]`` floats -> ``[S, B, hidden]``: conv (valid, stride 1), ReLU, dense, ReLU.

    The convolution is ``kernel [S, out, C*k*k] @ patches [S, C*k*k, B*H'*W']``; the patches are
    the k*k shifted windows stacked on a dimension after C (runs of W' contiguous values per copy,
    in the kernel's (C, kh, kw) order, no transpose for the matmul). Its output
    ``[S, out, B*H'*W']`` goes to the dense layer in NCHW flatten order (c, h, w)."""
    S, C, B, H, W = x.shape
    ho, wo = H - kernel + 1, W - kernel + 1
    windows = [x[..., i:i + ho, j:j + wo] for i in range(kernel) for j in range(kernel)]
    patches = torch.stack(windows, dim=2).view(S, C * kernel * kernel, B * ho * wo)
    w = p[prefix + "conv.weight"]
    O = w.shape[1]
    dense_w = p[prefix + "dense.weight"]
    if B > dense_w.shape[1]:
        # Many rows (c = 1's minibatches of 512): the convolution's output comes out as [S, B, (h, w), c]
        # (the patches as the matmul's transposed operand) and the dense weight's columns are reordered
        # to (h, w, c) instead: a copy of the weight (hidden x O*H'*W') instead of the activations'
        # transposition (B x O*H'*W'), forward and backward.
        h = torch.baddbmm(p[prefix + "conv.bias"].unsqueeze(1), patches.transpose(1, 2), w.reshape(S, O, -1).transpose(1, 2))
        h = torch.relu(h).view(S, B, -1)
        dense_w = dense_w.view(S, -1, O, ho * wo).transpose(2, 3).reshape(S, -1, O * ho * wo)
    else:
        h = torch.baddbmm(p[prefix + "conv.bias"].unsqueeze(-1), w.reshape(S, O, -1), patches)
        h = torch.relu(h).view(S, O, B, ho * wo).transpose(1, 2).reshape(S, B, -1)
    return torch.relu(_stacked_linear(h, dense_w, p[prefix + "dense.bias"]))


def stacked_call(net: MinAtarActorCritic, p: dict[str, Tensor], method: str, obs: Tensor):
    """``net``'s ``method`` ("forward", "policy", "value", "forward_aux") for S seeds at once:
    ``p`` maps ``net``'s parameter names to stacked tensors, ``obs`` is ``[S, ..., H, W, C]``."""
    S, lead = obs.shape[0], obs.shape[1:-3]
    H, W, C = obs.shape[-3:]
    # [S, B, H, W, C] -> floats [S, C, B, H, W]: one copy that converts and transposes. Under autocast
    # in autocast's dtype: the convolution's patches (9x the input) are then built in bf16 instead of
    # built in float32 and cast by the matmul on every call (a third of a c = 1 group's time; the
    # same values: autocast would round each patch element as this rounds the input element).
    device = obs.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else torch.float32
    if obs.dtype == torch.bool:  # MinAtar's: transpose the bytes, then convert (~2x faster than one strided converting copy)
        x = obs.view(torch.uint8).reshape(S, -1, H, W, C).permute(0, 4, 1, 2, 3).contiguous().to(dtype)
    else:
        x = torch.empty((S, C, obs[0].numel() // (H * W * C), H, W), dtype=dtype, device=obs.device).copy_(
            obs.reshape(S, -1, H, W, C).permute(0, 4, 1, 2, 3))
    k = net.policy_body.conv.kernel_size[0]

    def head(name, f):
        return _stacked_linear(f, p[name + ".weight"], p[name + ".bias"])

    def out(t):
        return t.float().reshape(S, *lead, t.shape[-1])  # float32 under any autocast

    f = None if method == "value" and net.value_body is not None else _stacked_trunk(p, "policy_body.", x, k)
    if method == "policy":
        return (out(head("policy_head", f)),)

    if net.value_body is not None:
        vf = _stacked_trunk(p, "value_body.", x, k)
    else:
        vf = f.detach() if net.arch == "detach" else f
    value = out(head("value_head", vf))
    if method == "value":
        return value
    if method == "forward":
        return out(head("policy_head", f)), value
    if method == "forward_aux":
        return out(head("policy_head", f)), value, out(head("aux_value_head", f))
    raise ValueError(f"unknown method {method!r}")

