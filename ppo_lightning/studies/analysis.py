"""Statistics of a study, each from the library that has the method:

- rliable (Agarwal et al. 2021, "Deep RL at the edge of the statistical precipice"): interquartile
  mean and mean with stratified bootstrap CIs (runs resampled within each environment), probability
  of improvement, performance profiles and sample-efficiency curves with bands. Its bootstrap is
  evaluated here on every replicate at once (`stratified_bootstrap`: rliable's replicates, drawn in
  its order, and arch's percentile interval); the library is imported only as ``rliable.metrics``
  (numpy and scipy), because ``rliable.library`` imports arch 7, which does not import on the pinned
  pandas 3 (arch 7 calls pandas' private ``deprecate_kwarg`` in its 2.x form).
- scipy: `welch_diff_ci` and `welch_p`, Welch's t interval and two-sided p-value
  (``scipy.stats.ttest_ind(..., equal_var=False)``), for the difference of two arms from fewer than
  `MIN_SEEDS_FOR_BOOTSTRAP` seeds (a percentile bootstrap can only resample the few values seen and
  comes out too narrow) and for each environment's effect.
- statsmodels: `tost`, two one-sided tests of equivalence within a margin (Schuirmann 1987;
  ``ttost_ind``, Welch's t); `noninferiority`, its lower half (``ttest_ind(..., alternative="larger")``),
  for "at least as good as" claims such as a tuned setting against a hand-picked one; `holm`, Holm's
  step-down adjustment (Holm 1979; ``multipletests(method="holm")``) over a family of p-values (one
  comparison's environments on one metric), so that a bold per-game claim holds at a family-wise 0.05.

Written here, as no library has them: `seeds_needed`, the seeds per arm a CI of a target half-width
needs (normal approximation), and `interaction`, how a factor (precision) changes an effect,
``(a2 - b2) - (a1 - b1)``, with its CI (Welch's t on the four arms' summed variances below 5 seeds).

Every interval is 95%, from `REPS` stratified-bootstrap replicates (rliable's examples use 50,000;
5,000 keeps a report within seconds); a difference never says "equal": only an equivalence test at
the margin its study file states does.

A seed's score on a metric is the mean over the comparison's environments of its per-environment
statistic (AUC or final return, in the study's ``score:`` units), as the paper pools games.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

Z95 = 1.959963984540054
MIN_SEEDS_FOR_BOOTSTRAP = 5
REPS = 5000  # bootstrap replicates per interval (rliable's examples use 50,000; at least 2,000, issue 47)
ALPHA = 0.05  # the level of every test: two-sided 95% CIs, TOST at 0.05, Holm at a family-wise 0.05


# ----------------------------------------------------------------------------------- scipy, statsmodels
def _quiet(fn):
    """``fn`` without scipy's "precision loss ... nearly identical" warning, which arms of runs that
    agree to many digits (a precision-parity study) raise: the values are the formula's to 1e-9
    there (tests/test_study_statistics.py), and a report's output stays its own."""
    @functools.wraps(fn)
    def quiet(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Precision loss occurred in moment calculation", category=RuntimeWarning)
            return fn(*args, **kwargs)

    return quiet


def _arms(a: Sequence[float], b: Sequence[float]) -> tuple[np.ndarray, np.ndarray, float, bool]:
    """``(a, b, mean(a) - mean(b), constant)`` as float arrays; ``constant``: both arms without spread
    (Welch's statistic is then undefined, and the libraries answer NaN)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    return a, b, float(a.mean() - b.mean()), bool(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size == 0)


@_quiet
def welch_diff_ci(a: Sequence[float], b: Sequence[float], alpha: float = ALPHA) -> tuple[float, float, float]:
    """``(mean(a) - mean(b), low, high)``: Welch's t interval (Welch-Satterthwaite degrees of freedom),
    ``scipy.stats.ttest_ind(a, b, equal_var=False).confidence_interval(1 - alpha)``. NaN bounds below 2
    runs an arm; a point interval where neither arm varies."""
    from scipy.stats import ttest_ind

    a, b = np.asarray(a, float), np.asarray(b, float)
    d = float(a.mean() - b.mean())
    if a.size < 2 or b.size < 2:
        return d, float("nan"), float("nan")
    if _arms(a, b)[3]:
        return d, d, d
    ci = ttest_ind(a, b, equal_var=False).confidence_interval(confidence_level=1 - alpha)
    return d, float(ci.low), float(ci.high)


@_quiet
def noninferiority(a: Sequence[float], b: Sequence[float], margin: float) -> float:
    """p-value of the one-sided Welch test of H0: ``mean(a) - mean(b) <= -margin`` (a is worse than b
    by the margin or more): statsmodels' ``ttest_ind(a, b, alternative="larger", usevar="unequal",
    value=-margin)``. Non-inferiority at level alpha when p < alpha, which is the lower bound of the
    (1 - 2 alpha) Welch interval lying above ``-margin``."""
    from statsmodels.stats.weightstats import ttest_ind

    if margin <= 0:
        raise ValueError(f"noninferiority: the margin must be > 0, got {margin}")
    a, b, d, constant = _arms(a, b)
    if constant:
        return 0.0 if d > -margin else 1.0
    return float(ttest_ind(a, b, alternative="larger", usevar="unequal", value=-margin)[1])


@_quiet
def tost(a: Sequence[float], b: Sequence[float], margin: float) -> float:
    """p-value of two one-sided tests that ``|mean(a) - mean(b)| < margin`` (Welch's t): the larger
    of the p-values of H0: d <= -margin and H0: d >= +margin, statsmodels' ``ttost_ind(a, b, -margin,
    margin, usevar="unequal")``. Equivalence at level alpha when p < alpha, which is the (1 - 2 alpha)
    Welch interval lying inside (-margin, +margin)."""
    from statsmodels.stats.weightstats import ttost_ind

    if margin <= 0:
        raise ValueError(f"tost: the margin must be > 0, got {margin}")
    a, b, d, constant = _arms(a, b)
    if constant:
        return 0.0 if -margin < d < margin else 1.0
    return float(ttost_ind(a, b, -margin, margin, usevar="unequal")[0])


@_quiet
def welch_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of Welch's t test of H0: ``mean(a) == mean(b)``, ``scipy.stats.ttest_ind(a, b,
    equal_var=False)`` (NaN below 2 runs an arm; 0 or 1 where neither arm varies)."""
    from scipy.stats import ttest_ind

    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.size < 2 or b.size < 2:
        return float("nan")
    _, _, d, constant = _arms(a, b)
    if constant:
        return 0.0 if d != 0 else 1.0
    return float(ttest_ind(a, b, equal_var=False).pvalue)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979) of one family of tests, statsmodels'
    ``multipletests(p, method="holm")``: a test rejects at family-wise level alpha where its adjusted
    p < alpha. NaN p-values (a test not made) stay NaN and do not count in the family."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    made = np.isfinite(p)
    if made.any():
        out[made] = multipletests(p[made], method="holm")[1]
    return out.tolist()


# ----------------------------------------------------------------------------------- written here
def seeds_needed(sd: float, half_width: float, arms: int = 2) -> int:
    """Seeds per arm for a 95% CI of half-width ``half_width``: ``arms (z sd / h)^2`` (``arms=2``: the
    difference of two independent arms with the same sd; 1: one mean). At least 2."""
    if not (sd >= 0) or half_width <= 0:
        return 0
    return max(2, math.ceil(arms * (Z95 * sd / half_width) ** 2))


# ----------------------------------------------------------------------------------- rliable
class _seeded:
    """rliable 1.2 draws its bootstrap indices from numpy's global generator (``np.random.choice``),
    not from the ``random_state`` it passes to arch: seed that generator for the call (and restore it),
    so that a report is the same every time it is made."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __enter__(self):
        self.state = np.random.get_state()
        np.random.seed(self.seed)

    def __exit__(self, *exc):
        np.random.set_state(self.state)


def _strata(shape: tuple[int, ...]) -> list[np.ndarray]:
    """rliable's fixed indices of every axis but the runs' (``np.ogrid`` over ``(0, *shape[1:])``)."""
    return list(np.ogrid[tuple(slice(n) for n in (0, *shape[1:]))][1:])


def _draws(arrays: tuple[np.ndarray, ...], reps: int) -> list[np.ndarray]:
    """rliable's resampling indices for ``reps`` replicates, in its order: per replicate, per array,
    ``np.random.choice(runs, shape)``. Arrays with the same number of runs take them in one call:
    choice with replacement is ``randint(0, runs)``, whose values follow one another in the generator's
    stream however the calls split them (tested against rliable)."""
    if len({a.shape[0] for a in arrays}) == 1:
        flat = np.random.choice(arrays[0].shape[0], (reps, sum(a.size for a in arrays)), replace=True)
        cuts = np.cumsum([a.size for a in arrays])[:-1]
        return [part.reshape(reps, *a.shape) for a, part in zip(arrays, np.split(flat, cuts, axis=1))]
    idx = [np.empty((reps, *a.shape), dtype=np.int64) for a in arrays]
    for r in range(reps):
        for i, a in enumerate(arrays):
            idx[i][r] = np.random.choice(a.shape[0], a.shape, replace=True)
    return idx


def stratified_bootstrap(data: dict[str, tuple[np.ndarray, ...]], stat, reps: int, seed: int = 0) -> dict[str, tuple]:
    """rliable's ``library.get_interval_estimates`` (stratified bootstrap, percentile 95% CI), with the
    statistic evaluated on every replicate at once. Per key, ``data[key]``: one array (runs x tasks x
    ...) or several resampled independently (rliable's ``StratifiedIndependentBootstrap``);
    ``stat(*arrays)`` takes them with a leading replicate axis and returns ``(replicates, k)``. Returns
    ``{key: (point (k,), low (k,), high (k,))}``.

    The replicates are rliable's, drawn in its order from the same generator (per replicate, per
    array: ``np.random.choice(runs, shape)``, each task's runs resampled within the task), and the
    interval is arch's percentile interval, so the result equals ``get_interval_estimates`` (tested);
    rliable calls the statistic replicate by replicate in Python (~0.3 s per interval of 1,000
    replicates here), which put a 500k report at 45-67 s."""
    out = {}
    alpha = (1.0 - 0.95) / 2  # as arch computes it
    q = [100 * alpha, 100 * (1.0 - alpha)]
    with _seeded(seed):
        for key, arrays in data.items():
            idx = _draws(arrays, reps)
            samples = [a[(ix, *_strata(a.shape))] for a, ix in zip(arrays, idx)]
            point = np.asarray(stat(*(a[None] for a in arrays)), dtype=float)[0]
            values = np.asarray(stat(*samples), dtype=float).reshape(reps, -1)
            low, high = np.array([np.percentile(values[:, i], q) for i in range(values.shape[1])]).T  # column by column, as arch
            out[key] = (np.atleast_1d(point), low, high)
    return out


def mean_of_task_means(s: np.ndarray) -> np.ndarray:
    """rliable's ``aggregate_mean`` per replicate: ``s`` is (replicates, runs, tasks, ...)."""
    return np.mean(np.mean(s, axis=1), axis=1)


def iqm(s: np.ndarray) -> np.ndarray:
    """rliable's ``aggregate_iqm`` (scipy's 25% trimmed mean of all runs and tasks) per replicate."""
    from scipy.stats import trim_mean

    return trim_mean(s.reshape(len(s), -1), proportiontocut=0.25, axis=1)


def interval_estimates(scores: dict[str, np.ndarray], reps: int = REPS, seed: int = 0) -> dict[str, dict[str, tuple]]:
    """Per arm (``scores[arm]``: seeds x environments): mean and IQM, each ``(value, low, high)``,
    95% stratified bootstrap (rliable's, `stratified_bootstrap`)."""
    est = stratified_bootstrap({a: (m,) for a, m in scores.items()},
                               lambda s: np.stack([mean_of_task_means(s), iqm(s)], axis=1), reps, seed)
    return {arm: {"mean": (float(p[0]), float(lo[0]), float(hi[0])), "iqm": (float(p[1]), float(lo[1]), float(hi[1]))}
            for arm, (p, lo, hi) in est.items()}


def difference(x: np.ndarray, y: np.ndarray, reps: int = REPS, seed: int = 0) -> tuple[float, float, float]:
    """``mean(x) - mean(y)`` with its 95% CI: rliable's stratified bootstrap of independent samples
    (each arm's seeds resampled within each environment, the two arms independently)."""
    p, lo, hi = stratified_bootstrap({"d": (x, y)}, lambda a, b: mean_of_task_means(a) - mean_of_task_means(b), reps, seed)["d"]
    return float(p[0]), float(lo[0]), float(hi[0])


def interaction(x1: np.ndarray, y1: np.ndarray, x2: np.ndarray, y2: np.ndarray, reps: int = REPS,
                seed: int = 0) -> tuple[float, float, float]:
    """How a factor changes an effect: ``(mean(x2) - mean(y2)) - (mean(x1) - mean(y1))`` (e.g. PPO-EWMA
    - PPO in bf16-mixed minus the same in 32-true) with its 95% CI, the four arms resampled
    independently within each environment (rliable's stratified bootstrap; Welch's t on the summed
    variances below 5 seeds an arm)."""
    arrays = (x1, y1, x2, y2)
    if min(len(a) for a in arrays) < MIN_SEEDS_FOR_BOOTSTRAP:
        from scipy.stats import t

        m = [a.mean(1) for a in arrays]
        d = float((m[2].mean() - m[3].mean()) - (m[0].mean() - m[1].mean()))
        v = [a.var(ddof=1) / a.size for a in m]
        se = math.sqrt(sum(v))
        dof = sum(v) ** 2 / sum(vi**2 / (a.size - 1) for vi, a in zip(v, m)) if se > 0 else float("inf")
        half = float(t.ppf(0.975, dof) * se)
        return d, d - half, d + half
    p, lo, hi = stratified_bootstrap({"i": arrays}, lambda a, b, c, d: (mean_of_task_means(c) - mean_of_task_means(d))
                                     - (mean_of_task_means(a) - mean_of_task_means(b)), reps, seed)["i"]
    return float(p[0]), float(lo[0]), float(hi[0])


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(a run of x scores above a run of y), averaged over environments (rliable's Mann-Whitney
    form). Its bootstrap CI is left out: rliable computes it pair by pair in Python, ~25 s per
    comparison here, which would put a report over its 30 s."""
    from rliable import metrics  # numpy and scipy only (its library module pulls arch: seconds to import)

    return float(metrics.probability_of_improvement(x, y))


def sample_efficiency(curves: dict[str, np.ndarray], reps: int = REPS, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per arm (``curves[arm]``: seeds x environments x points): the mean over runs at every point
    with a 95% stratified-bootstrap band (rliable's; it resamples the runs at each point apart)."""
    return stratified_bootstrap({a: (c,) for a, c in curves.items()}, mean_of_task_means, reps, seed)


def performance_profiles(scores: dict[str, np.ndarray], taus: np.ndarray, reps: int = REPS, seed: int = 0):
    """rliable's score distributions (``create_performance_profile``): the fraction of runs above each
    tau, with bands; ``(profiles, {arm: (low, high)})``."""
    taus = np.asarray(taus, dtype=float)
    est = stratified_bootstrap({a: (m,) for a, m in scores.items()},
                               lambda s: (s.reshape(len(s), -1)[:, None, :] > taus[None, :, None]).mean(axis=2), reps, seed)
    return {a: p for a, (p, _, _) in est.items()}, {a: np.stack([lo, hi]) for a, (_, lo, hi) in est.items()}


# ----------------------------------------------------------------------------------- verdicts
@dataclass
class Result:
    """One comparison on one metric, in one stratum of cells (a CPU type and a precision, or pooled)."""
    claim: str
    a: str
    b: str
    metric: str
    test: str
    envs: tuple[str, ...]
    n_a: int
    n_b: int
    effect: float
    low: float
    high: float
    method: str
    p_improve: float | None
    verdict: str
    resolved: bool
    seeds_for_target: int
    tost_p: float | None = None
    margin: float | None = None
    stratum: str = ""
    per_env: dict[str, tuple[float, float, float]] = field(default_factory=dict)


def direction(low: float, high: float) -> str:
    """The sign a CI resolves: ``a > b``, ``a < b``, or ``no difference resolved``."""
    if low > 0:
        return "a > b"
    if high < 0:
        return "a < b"
    return "no difference resolved"


def compare(x: np.ndarray, y: np.ndarray, *, test: str, margin: float | None, target: float,
            reps: int = REPS, improvement: bool = True) -> dict:
    """Effect of arm x over arm y (seeds x environments each): ``{effect, low, high, method,
    p_improve, verdict, resolved, seeds_for_target, tost_p}`` (``p_improve`` None with
    ``improvement=False``)."""
    sx, sy = x.mean(1), y.mean(1)  # per-seed scores pooled over environments
    small = min(len(sx), len(sy)) < MIN_SEEDS_FOR_BOOTSTRAP
    if small:
        d, lo, hi = welch_diff_ci(sx, sy)
        method = f"Welch t (n = {len(sx)}, {len(sy)})"
        p_imp = None
    else:
        d, lo, hi = difference(x, y, reps)
        method = "stratified bootstrap"
        p_imp = probability_of_improvement(x, y) if improvement else None
    sd = math.sqrt((np.var(sx, ddof=1) + np.var(sy, ddof=1)) / 2) if min(len(sx), len(sy)) > 1 else float("nan")
    out = {"effect": d, "low": lo, "high": hi, "method": method, "p_improve": p_imp,
           "resolved": bool(hi - lo <= 2 * target), "seeds_for_target": seeds_needed(sd, target), "tost_p": None}
    sign = direction(lo, hi)
    if test == "equivalence":
        p = tost(sx, sy, margin) if min(len(sx), len(sy)) > 1 else float("nan")
        out["tost_p"] = p
        if p < 0.05:  # within the margin; a resolved sign is said too (a small difference inside the margin)
            out["verdict"] = ("" if sign == "no difference resolved" else f"{sign}, and ") + f"equal within ±{margin:g} (TOST p = {p:.3f})"
        elif sign != "no difference resolved":
            out["verdict"] = f"{sign} (not equal within ±{margin:g}: TOST p = {p:.2f})"
        else:
            out["verdict"] = f"not shown equal within ±{margin:g} (TOST p = {p:.2f})"
    elif test == "noninferiority":
        p = noninferiority(sx, sy, margin) if min(len(sx), len(sy)) > 1 else float("nan")
        out["tost_p"] = p
        if p < 0.05:
            out["verdict"] = ("a > b, and " if sign == "a > b" else "") + f"a not worse than b by {margin:g} or more (one-sided p = {p:.3f})"
        else:
            out["verdict"] = ("a < b; " if sign == "a < b" else "") + f"not shown within {margin:g} of b or better (one-sided p = {p:.2f})"
    else:  # no "equal" here: equality is an equivalence test's, at the margin its study file states
        out["verdict"] = sign
    if not out["resolved"] and math.isfinite(hi - lo):
        out["verdict"] += f"; CI half-width {(hi - lo) / 2:.3f} > target {target:g}"
    return out
