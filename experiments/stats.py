"""Statistics for the paper-figure experiments (issue 11): seed-bootstrap confidence intervals of the
headline statistics and the number of seeds a target precision needs.

Headline statistics, per run: the *normalized AUC* (mean normalized return over the run's frames,
i.e. the area under the learning curve divided by its length) and the *final normalized return*
(mean over the last 10% of frames). Games are pooled as in the paper: a seed's score is the mean
over games of its per-game normalized statistic, and seeds are resampled (the same seed indices for
every game: a bootstrap sample draws seeds, each carrying its result on every game).

Pure numpy (scipy for t quantiles); no plotting. ``bootstrap_ci`` for one arm, ``bootstrap_diff_ci``
for the difference of two arms (independent seeds per arm), ``seeds_needed`` for the seed count from a
pilot sd. Below 5 seeds a percentile bootstrap can only resample the few values seen and its CI is too
narrow; ``t_ci`` and ``welch_diff_ci`` give Student / Welch t intervals for those (exact for normal
seed scores, and wide at n = 2-4 as they should be).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

Z95 = 1.959963984540054


def pooled_scores(per_game: dict[str, Sequence[float]]) -> np.ndarray:
    """Per-seed scores pooled over games: ``{game: [score of seed 0, seed 1, ...]}`` -> mean over
    games, per seed index (games must have the same number of seeds; nan seeds are skipped per game)."""
    arr = np.array([list(v) for v in per_game.values()], dtype=float)  # [games, seeds]
    if arr.ndim != 2:
        raise ValueError("every game needs the same number of seeds")
    return np.nanmean(arr, axis=0)


def _finite(x: Sequence[float]) -> np.ndarray:
    """The finite values of ``x`` (a seed without a result is nan) as a float array."""
    return np.asarray([v for v in x if math.isfinite(v)], dtype=float)


def bootstrap_ci(x: Sequence[float], n_boot: int = 10_000, alpha: float = 0.05, seed: int = 0) -> tuple[float, float, float]:
    """``(mean, low, high)``: percentile bootstrap over seeds of the mean of ``x``."""
    x = _finite(x)
    if x.size == 0:
        return float("nan"), float("nan"), float("nan")
    if x.size == 1:
        return float(x[0]), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(x.mean()), float(lo), float(hi)


def bootstrap_diff_ci(a: Sequence[float], b: Sequence[float], n_boot: int = 10_000, alpha: float = 0.05,
                      seed: int = 0) -> tuple[float, float, float]:
    """``(mean(a) - mean(b), low, high)``: seeds of ``a`` and ``b`` resampled independently."""
    a = _finite(a)
    b = _finite(b)
    if a.size < 2 or b.size < 2:
        return float(a.mean() - b.mean()) if a.size and b.size else float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    da = a[rng.integers(0, a.size, size=(n_boot, a.size))].mean(1)
    db = b[rng.integers(0, b.size, size=(n_boot, b.size))].mean(1)
    lo, hi = np.quantile(da - db, [alpha / 2, 1 - alpha / 2])
    return float(a.mean() - b.mean()), float(lo), float(hi)


def t_ci(x: Sequence[float], alpha: float = 0.05) -> tuple[float, float, float]:
    """``(mean, low, high)``: Student t interval of the mean, ``mean +- t(1 - alpha/2, n - 1) s / sqrt(n)``."""
    from scipy.stats import t

    x = _finite(x)
    if x.size < 2:
        return (float(x[0]) if x.size else float("nan")), float("nan"), float("nan")
    half = t.ppf(1 - alpha / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def welch_diff_ci(a: Sequence[float], b: Sequence[float], alpha: float = 0.05) -> tuple[float, float, float]:
    """``(mean(a) - mean(b), low, high)``: Welch's t interval (unequal variances), with the
    Welch-Satterthwaite degrees of freedom ``(va + vb)^2 / (va^2 / (na - 1) + vb^2 / (nb - 1))``,
    ``va = s_a^2 / n_a``."""
    from scipy.stats import t

    a = _finite(a)
    b = _finite(b)
    d = float(a.mean() - b.mean()) if a.size and b.size else float("nan")
    if a.size < 2 or b.size < 2:
        return d, float("nan"), float("nan")
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    if va + vb == 0:
        return d, d, d
    dof = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    half = t.ppf(1 - alpha / 2, dof) * math.sqrt(va + vb)
    return d, d - half, d + half


def seeds_needed(sd: float, half_width: float = 0.05, arms: int = 1) -> int:
    """Seeds per arm for a 95% CI of half-width ``half_width`` (normal approximation).

    One arm (a mean): ``n = (z sd / h)^2``. The difference of two independent arms with the same sd
    (``arms=2``): ``n = 2 (z sd / h)^2`` seeds per arm. At least 2.
    """
    if sd < 0 or half_width <= 0:
        raise ValueError("sd must be >= 0 and half_width > 0")
    if arms not in (1, 2):
        raise ValueError("arms must be 1 (a mean) or 2 (a difference of two means)")
    return max(2, math.ceil(arms * (Z95 * sd / half_width) ** 2))


def curve_auc(curve: Sequence[tuple[float, float]], total: float) -> float:
    """Mean of a step-interpolated learning curve ``[(frames, value), ...]`` over ``[0, total]``
    (each value holds from its frame count to the next point; before the first point, the first
    value). The "area under the curve" divided by ``total``."""
    pts = sorted((float(f), float(v)) for f, v in curve if math.isfinite(v))
    if not pts or total <= 0:
        return float("nan")
    area, prev_f, prev_v = 0.0, 0.0, pts[0][1]
    for f, v in pts:
        f = min(f, total)
        area += prev_v * (f - prev_f)
        prev_f, prev_v = f, v
    area += prev_v * max(total - prev_f, 0.0)
    return area / total


def final_value(curve: Sequence[tuple[float, float]], total: float, tail: float = 0.1) -> float:
    """Mean of the curve points in the last ``tail`` fraction of ``total`` frames (else the last point)."""
    pts = [(f, v) for f, v in curve if math.isfinite(v)]
    if not pts:
        return float("nan")
    last = [v for f, v in pts if f >= (1 - tail) * total]
    return float(np.mean(last)) if last else float(pts[-1][1])
