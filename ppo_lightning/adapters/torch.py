"""torch's private ops that the hot paths call, each where no public API does the same work.

Read against torch 2.13 (pyproject pins ``torch==2.13.0``); `check` names any that moved.
"""

from __future__ import annotations

import torch
from torch import Tensor

VERIFIED = "2.13."

# The private names read here (`check`): what a new torch release must still provide.
PRIVATE = ("_fused_adam_", "_foreach_add_", "_foreach_lerp_", "_foreach_copy_",
           "_amp_foreach_non_finite_check_and_unscale_")


def fused_adam_(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
                steps: list[Tensor], *, lr: float, beta1: float, beta2: float, weight_decay: float, eps: float) -> None:
    """One Adam step over tensor lists in one kernel: the op ``torch.optim.Adam(fused=True)`` calls
    after advancing the steps. A seed group steps each member's slices with its own lr and betas,
    which one ``Adam`` object cannot (its hyperparameters are per param group, not per slice);
    tests/test_group_members.py checks each member against ``torch.optim.Adam``."""
    torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=lr, beta1=beta1,
                       beta2=beta2, weight_decay=weight_decay, eps=eps, maximize=False, grad_scale=None, found_inf=None)


def foreach_add_(tensors: list[Tensor], value: float) -> None:
    """``t += value`` for every tensor in one call (the optimizers' own step counter update)."""
    torch._foreach_add_(tensors, value)


def foreach_lerp_(tensors: list[Tensor], ends: list[Tensor], weight: float) -> None:
    """``t.lerp_(end, weight)`` for every pair in one call (the EWMA's update after every gradient step)."""
    torch._foreach_lerp_(tensors, ends, weight)


def foreach_copy_(tensors: list[Tensor], sources: list[Tensor]) -> None:
    """``t.copy_(source)`` for every pair in one call."""
    torch._foreach_copy_(tensors, sources)


def non_finite_check_(tensors: list[Tensor], found: Tensor, one: Tensor) -> None:
    """Sets ``found`` to 1 if any value of ``tensors`` (one device and dtype) is non-finite, in one
    fused kernel: the check ``torch.amp.GradScaler`` runs on every step (multiplying by ``one``, 1,
    leaves the values as they are). ``torch.isfinite`` per tensor costs a kernel and a reduction each."""
    torch._amp_foreach_non_finite_check_and_unscale_(tensors, found, one)


def is_batched(x: Tensor) -> bool:
    """Whether ``x`` is a batched tensor of ``torch.vmap`` (no public test; ops with ``out=`` have no
    batching rule, so a fast path must step aside for it)."""
    return bool(torch._C._functorch.is_batchedtensor(x))


def has_onednn_conv_relu() -> bool:
    """Whether this build has oneDNN's convolution with a fused post-op (`onednn_conv_relu`)."""
    return hasattr(torch.ops.mkldnn, "_convolution_pointwise")


def onednn_conv_relu(x: Tensor, conv: torch.nn.Conv2d) -> Tensor:
    """``relu(conv(x))`` for a oneDNN tensor ``x`` as one oneDNN convolution with a ReLU post-op (the
    op inductor emits for conv + relu; torch has no public name for it); same values bit for bit as
    the convolution then the ReLU (tests/test_procgen.py)."""
    return torch.ops.mkldnn._convolution_pointwise(
        x, conv.weight, conv.bias, conv.padding, conv.stride, conv.dilation, conv.groups, "relu", [], "")


def rnn_layer(kind: str, x: Tensor, h: Tensor, c: Tensor | None, weights: list[Tensor]
              ) -> tuple[Tensor, Tensor, Tensor | None]:
    """One LSTM or GRU layer (``kind``) over ``x [N, T, in]`` from ``h, c [N, H]`` (``c`` None for a GRU)
    with ``weights`` = [weight_ih, weight_hh, bias_ih, bias_hh] in ``nn.LSTM``'s layout: (outputs
    ``[N, T, H]``, h, c after). The op ``nn.LSTM`` / ``nn.GRU`` call (``torch.lstm`` / ``torch.gru``,
    undocumented), with the weights as arguments: through ``functional_call`` on an ``nn.LSTM`` the
    module's parameter swap costs ~100-150 us per call, most of a collection step's core. On the CPU it
    runs oneDNN's RNN: a forward and backward over 8 sequences of 32 steps of 64 units ~1.9 ms, against
    ~6-15 ms for torch's own per-step kernels or the equations as tensor ops (EPYC-AVX2, one thread).
    oneDNN's inference and training kernels (autograd off or on) round differently (~1e-7)."""
    hx = h.unsqueeze(0).contiguous()
    if c is None:
        out, h = torch.gru(x, hx, weights, True, 1, 0.0, True, False, True)
        return out, h[0], None
    out, h, c = torch.lstm(x, (hx, c.unsqueeze(0).contiguous()), weights, True, 1, 0.0, True, False, True)
    return out, h[0], c[0]


def compiled_graphs() -> int:
    """How many graphs TorchDynamo has compiled in this process (its counters have no public reader)."""
    from torch._dynamo.utils import counters  # loads TorchDynamo: only once model.compile is on

    return int(counters["stats"]["unique_graphs"])


def check() -> list[str]:
    """What moved: a different torch release than ``VERIFIED``, or a private name gone."""
    moved = [] if torch.__version__.startswith(VERIFIED) else [f"torch {torch.__version__} (read against {VERIFIED}x)"]
    moved += [f"torch.{name}" for name in PRIVATE if not hasattr(torch, name)]
    moved += [f"torch.{name}" for name in ("lstm", "gru") if not callable(getattr(torch, name, None))]
    if not hasattr(torch._C, "_functorch") or not hasattr(torch._C._functorch, "is_batchedtensor"):
        moved.append("torch._C._functorch.is_batchedtensor")
    return moved
