"""Small-batch diagnostics (Hilton, Cobbe & Schulman 2021, section 6 and appendix).

Two quantities tell whether a (small) batch size is healthy:

* the **clip fraction** (fraction of samples whose ratio to the anchor policy left ``[1-eps, 1+eps]``):
  the paper's runs sit around 1%-10%. Far below 1% (default threshold 0.1%) the clipping never acts
  and the step size could grow; above 10% with one epoch (20% with several) the policy moves too far
  per iteration, typically because the learning rate was not scaled down with the batch;
* the **advantage-std estimate** used for advantage normalization: with small batches it is a noisy
  estimate, which rescales the policy gradient at random from iteration to iteration; the EWMA span
  rule (span * c) averages it over more samples. Its sampling error is measured within each
  iteration, from the minibatches the update sees: they partition the batch at random, so the spread
  of their advantage stds, divided by sqrt(number of minibatches), is the relative standard error of
  the whole batch's std, and an EWMA over ``span`` iterations divides it by sqrt(span). We flag a
  mean relative error above 25% over a window. The max/min of the estimate over the window
  (``diagnostics/adv_std_oscillation``) is logged too, not judged: it also moves when the advantage
  scale itself changes with the policy (on CartPole it falls 20x when the policy first survives a whole
  rollout, while the halves of each batch agree within a few percent), which normalization is for.

`SmallBatchDiagnostics` logs them once per iteration (``diagnostics/clip_fraction_window``,
``diagnostics/adv_std_error``, ``diagnostics/adv_std_oscillation``) and warns at most once per condition
per run. The clip fraction is the fraction outside the objective's own clip range
(`ppo_lightning.algos.registry.Objective.clip_range`; the KL objectives have none and report none); it
is judged for the objectives that declare what they use (the built-in ``clip``, and those registered
with ``uses=``). It is added by default by ``ppo-lightning fit``.
"""

from __future__ import annotations

import math
import warnings

from lightning.pytorch.callbacks import Callback

from ppo_lightning.nets.recurrent import IS_INIT_KEY

class SmallBatchDiagnosticsWarning(UserWarning):
    pass


def clip_fraction_problem(clip_fraction: float, update_epochs: int, low: float = 1e-3,
                          high_one_epoch: float = 0.10, high_many_epochs: float = 0.20) -> str | None:
    """``"low"``, ``"high"`` or None for an iteration-mean clip fraction."""
    if not math.isfinite(clip_fraction):
        return None
    if clip_fraction < low:
        return "low"
    if clip_fraction > (high_one_epoch if update_epochs <= 1 else high_many_epochs):
        return "high"
    return None


def std_oscillation(history: list[float], window: int = 10) -> float:
    """max / min of the last ``window`` advantage-std estimates (1.0 with fewer than 2 values)."""
    recent = [s for s in history[-window:] if math.isfinite(s)]
    if len(recent) < 2:
        return 1.0
    lo = min(recent)
    return math.inf if lo <= 0 else max(recent) / lo


def std_relative_error(minibatch_stds: list[float], num_minibatches: int, span: float = 1.0) -> float:
    """Relative standard error of an advantage-std estimate, from the stds of the minibatches that
    partition its batch at random (several epochs: several partitions of the same batch).

    A minibatch of ``m`` samples estimates the std with relative spread ``sd / mean`` of the minibatch
    stds; the batch's ``k = num_minibatches`` times more samples divide it by ``sqrt(k)``, and an EWMA
    over ``span`` iterations' worth of samples by ``sqrt(span)``. NaN with fewer than 2 minibatches."""
    stds = [s for s in minibatch_stds if math.isfinite(s)]
    if len(stds) < 2 or num_minibatches < 2:
        return math.nan
    mean = sum(stds) / len(stds)
    if mean <= 0:
        return math.nan
    sd = math.sqrt(sum((s - mean) ** 2 for s in stds) / (len(stds) - 1))
    return sd / mean / math.sqrt(num_minibatches * max(span, 1.0))


def _judged(pl_module) -> bool:
    """Whether the module's objective declares what it uses (`ppo_lightning.algos.registry.register_objective`'s
    ``uses`` or ``clip_range``): only then is its clip fraction judged (without a loss module: the
    ``clip`` objective)."""
    spec = getattr(getattr(pl_module, "loss_module", None), "objective_spec", None)
    if spec is None:
        return (pl_module.hparams.get("objective", "clip") if hasattr(pl_module, "hparams") else "clip") == "clip"
    return spec.declared_uses is not None or spec.declared_clip_range is not None


class SmallBatchDiagnostics(Callback):
    """Clip fraction and the advantage-std estimate's sampling error, logged each iteration, warned about once.

    Args:
        window: iterations averaged (clip fraction) or spanned (std oscillation).
        warmup: iterations of the unscaled configuration before any warning (the first iterations
            are atypical: the EWMA anchor and the advantage moments start from scratch).
        clip_low, clip_high_one_epoch, clip_high_many_epochs: the clip-fraction range.
        max_std_error: the threshold of the advantage-std estimate's relative sampling error (mean
            over the window).
        scale: the batch-size factor c of ``--scale c``: an iteration then has 1/c of the frames
            (and the proximal COM and advantage span are c times longer in iterations), so the
            warm-up lasts ``ceil(warmup * c)`` iterations, the same frames as at c = 1.
    """

    def __init__(self, window: int = 10, warmup: int = 10, clip_low: float = 1e-3,
                 clip_high_one_epoch: float = 0.10, clip_high_many_epochs: float = 0.20,
                 max_std_error: float = 0.25, scale: float = 1.0) -> None:
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be a positive number, got {scale!r}")
        self.window, self.scale = window, float(scale)
        self.warmup = math.ceil(warmup * self.scale - 1e-9)  # in iterations of this (scaled) run
        self.clip_low, self.clip_high_one, self.clip_high_many = clip_low, clip_high_one_epoch, clip_high_many_epochs
        self.max_std_error = max_std_error
        self.clip_history: list[float] = []
        self.error_history: list[float] = []
        self._minibatch_stds: list[float] = []  # this iteration's
        self.warned: set[str] = set()

    def _warn(self, key: str, message: str) -> None:
        if key in self.warned:
            return
        self.warned.add(key)
        warnings.warn(message, SmallBatchDiagnosticsWarning, stacklevel=2)

    def _iteration_clip_fraction(self, pl_module) -> float:
        stats = getattr(pl_module, "step_stats", None)
        if not stats or "clip_fraction" not in stats[0]:
            return math.nan
        return sum(float(s["clip_fraction"].mean()) for s in stats) / len(stats)  # a seed group: the mean over seeds

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        adv = batch.get("advantage", None) if hasattr(batch, "get") else None
        if adv is None:
            return
        adv = adv.detach().float()
        if IS_INIT_KEY in batch.keys():  # a recurrent run's segments [S, B, L(, 1)]: its samples [S, B * L]
            adv = adv.reshape(*batch.batch_size[:-2], -1)
        if adv.dim() > 1 and adv.shape[-1] == 1:  # [B, 1]; a seed group's [S, B, 1]
            adv = adv.squeeze(-1)
        if adv.dim() and adv.shape[-1] > 1:  # a seed group: the mean of the seeds' stds
            self._minibatch_stds.append(float(adv.std(dim=-1).mean()))

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        dm = trainer.datamodule
        metrics: dict[str, float] = {}
        cf = self._iteration_clip_fraction(pl_module)
        if math.isfinite(cf):
            self.clip_history.append(cf)
            del self.clip_history[: -self.window]
            mean_cf = sum(self.clip_history) / len(self.clip_history)
            metrics["diagnostics/clip_fraction_window"] = mean_cf
            epochs = getattr(dm, "update_epochs", 1)
            problem = clip_fraction_problem(mean_cf, epochs, self.clip_low, self.clip_high_one, self.clip_high_many)
            iteration = getattr(dm, "iteration", len(self.clip_history))
            if problem and _judged(pl_module) and iteration > self.warmup:
                high = self.clip_high_one if epochs <= 1 else self.clip_high_many
                self._warn(
                    f"clip_fraction_{problem}",
                    f"clip fraction {mean_cf:.4f} (mean of the last {len(self.clip_history)} iterations) is "
                    + (f"far below 1% (< {self.clip_low:g}): the clipping never acts"
                       if problem == "low" else
                       f"above {high:.0%} with {epochs} epoch(s): steps too large for this batch size "
                       "(scale model.lr by 1/sqrt(c) with the batch, see --scale)"),
                )
        moments = dm.states[0].advantage_moments if getattr(dm, "states", None) else None
        if moments is not None and moments.history:
            ratio = std_oscillation(moments.history, self.window)
            metrics["diagnostics/adv_std_oscillation"] = ratio if math.isfinite(ratio) else 1e9
        minibatches = getattr(dm, "num_minibatches", 1) * max(1, getattr(trainer, "world_size", 1) or 1)
        error = std_relative_error(self._minibatch_stds, minibatches, getattr(moments, "span", 1.0))
        self._minibatch_stds = []
        if math.isfinite(error) and getattr(dm, "normalize_advantage", True):
            self.error_history.append(error)
            del self.error_history[: -self.window]
            mean_error = sum(self.error_history) / len(self.error_history)
            metrics["diagnostics/adv_std_error"] = mean_error
            iteration = getattr(dm, "iteration", len(self.error_history))
            if mean_error > self.max_std_error and iteration > self.warmup:
                self._warn(
                    "adv_std_error",
                    f"advantage-std estimate off by {mean_error:.0%} (relative sampling error, mean of the last "
                    f"{len(self.error_history)} iterations; > {self.max_std_error:.0%}): small batches make the "
                    "advantage normalization noisy; raise data.advantage_norm_span (span * c, see --scale)",
                )
        if metrics and hasattr(pl_module, "record_metrics"):
            pl_module.record_metrics(metrics)
        elif metrics:
            pl_module.log_dict(metrics, on_step=False, on_epoch=True)
