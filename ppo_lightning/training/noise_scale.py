"""Gradient noise scale B_simple (McCandlish et al. 2018, "An empirical model of large-batch training").

``B_simple = tr(Sigma) / |G|^2``: Sigma is the per-sample gradient covariance, G the true gradient.
Hilton et al. (2021) use it to say when batch-size invariance can hold: the scaling rules assume the
minibatch is below the noise scale (appendix; the paper's Procgen minibatches are below it).

Estimator (McCandlish et al., appendix A.1): from gradients averaged over batches of two sizes
``b_small < b_big``, ``E|G_b|^2 = |G|^2 + tr(Sigma) / b``, so

    |G|^2     ~ (b_big |G_big|^2 - b_small |G_small|^2) / (b_big - b_small)
    tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1 / b_small - 1 / b_big)

Both are unbiased but noisy; B_simple is the ratio of their averages over many iterations (not the
average of per-iteration ratios). Here ``G_small`` are the minibatch gradients of the first epoch of
an iteration (``|G_small|^2`` averaged over them) and ``G_big`` their mean, the gradient of the
whole rollout batch. The minibatch gradients are taken at the successive parameters of the first
epoch (the optimizer steps between them): a small approximation, also made by the paper's
measurements on PPO.

With a recurrent network a minibatch is B segments of L steps (`ppo_lightning.nets.recurrent`); its
gradient is the gradient of the mean over its ``B L`` samples, as a feed-forward minibatch's, and the
batch sizes count samples: ``B_simple`` reads in samples (the steps of a segment are correlated, so
the independent unit is the segment: ``B_simple / L`` in segments). The ratio ``b_big / b_small``,
the number of minibatches, is the same in either unit.
"""

from __future__ import annotations

import math

import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from ppo_lightning.core.members import PerMember


def noise_scale_from_norms(small_sq: float, big_sq: float, k: int, b_small: int) -> tuple[float, float]:
    """``(|G|^2 estimate, tr(Sigma) estimate)`` (McCandlish et al. 2018, appendix A.1; the module doc)
    from ``small_sq``, the mean of ``|G_small|^2`` over ``k >= 2`` minibatch gradients of ``b_small``
    samples each, and ``big_sq = |G_big|^2``, the squared norm of their mean (``k * b_small`` samples)."""
    if k < 2:
        raise ValueError("the noise scale needs at least 2 minibatch gradients per batch")
    b_big = k * b_small
    grad_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
    return grad_sq, trace


def noise_scale_terms(small_grads: Tensor, b_small: int) -> tuple[float, float]:
    """`noise_scale_from_norms` of ``k >= 2`` minibatch gradients ``[k, P]`` of ``b_small`` samples each."""
    g = small_grads.double()
    return noise_scale_from_norms(g.pow(2).sum(1).mean().item(), g.mean(0).pow(2).sum().item(),
                                  small_grads.shape[0], b_small)


class NormAccumulator:
    """The two norms of `noise_scale_from_norms`, accumulated one minibatch gradient at a time, per row
    (a vectorized seed group: one row per seed): a running sum of the gradients (in their dtype) and
    of their squared norms (float64). No copy of every minibatch gradient is kept: at 8 seeds x 140k
    parameters those float64 copies, their stack and squares were ~14% of a c = 64 iteration.
    Float32 sums of 2-16 gradients and float32 norms are exact to ~1e-6 relative, far below the
    estimator's own noise (it is averaged over many iterations)."""

    def __init__(self) -> None:
        self.k = 0
        self._sq: Tensor | None = None  # [rows] float64: sum of |g_i|^2
        self._sums: list[Tensor] = []  # per parameter [rows, n]: sum of g_i

    def add(self, grads: list[Tensor]) -> None:
        """One minibatch gradient, as a list of ``[rows, n]`` pieces (one per parameter)."""
        sq = sum(torch.linalg.vector_norm(g, dim=1).double().square() for g in grads)
        if self.k == 0:
            self._sq, self._sums = sq, [g.clone() for g in grads]  # never an alias of a grad
        else:
            self._sq += sq
            for acc, g in zip(self._sums, grads):
                acc.add_(g)
        self.k += 1

    def norms(self) -> tuple[Tensor, Tensor]:
        """``(small_sq, big_sq)`` per row, float64."""
        big = sum(torch.linalg.vector_norm(acc, dim=1).double().square() for acc in self._sums) / self.k ** 2
        return self._sq / self.k, big


class GradientNoiseScale(Callback):
    """Logs ``noise/B_simple`` (ratio of the run's averages so far; not logged while the average
    ``|G|^2`` estimate is <= 0, i.e. the gradient is not resolved from its noise), ``noise/grad_sq``
    and ``noise/trace_cov`` (this iteration's estimates) and their running means
    (``noise/grad_sq_mean``, ``noise/trace_cov_mean``) once per iteration, from the gradients of the
    first ``data.num_minibatches`` optimizer steps of each iteration (the first epoch)."""

    def __init__(self) -> None:
        self._acc = NormAccumulator()
        self._sum_grad_sq: list[float] = []
        self._sum_trace: list[float] = []
        self._n = 0

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._acc = NormAccumulator()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self._acc.k >= trainer.datamodule.num_minibatches:
            return
        # One row per seed: a vectorized seed group's parameters have a leading seed dimension.
        rows = pl_module.members
        grads = [p.grad.detach().reshape(rows, -1) for p in pl_module.network.parameters() if p.grad is not None]
        if grads:
            self._acc.add(grads)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        k = self._acc.k
        if k < 2:
            return
        small_sq, big_sq = (t.tolist() for t in self._acc.norms())
        rows = len(small_sq)
        if not self._sum_grad_sq:
            self._sum_grad_sq, self._sum_trace = [0.0] * rows, [0.0] * rows
        self._n += 1
        cols: dict[str, list[float]] = {}
        for r in range(rows):  # one row per member of the run
            grad_sq, trace = noise_scale_from_norms(small_sq[r], big_sq[r], k, trainer.datamodule.minibatch_size)
            self._sum_grad_sq[r] += grad_sq
            self._sum_trace[r] += trace
            # B_simple is NaN (not logged) until |G|^2 is resolved from the noise: "very large"
            b_simple = self._sum_trace[r] / self._sum_grad_sq[r] if self._sum_grad_sq[r] > 0 else math.nan
            for name, v in (("grad_sq", grad_sq), ("trace_cov", trace), ("grad_sq_mean", self._sum_grad_sq[r] / self._n),
                            ("trace_cov_mean", self._sum_trace[r] / self._n), ("B_simple", b_simple)):
                cols.setdefault(f"noise/{name}", []).append(v)
        out = {name: PerMember(values) for name, values in cols.items()}
        pl_module.record_metrics(out)
