"""The study statistics from scipy and statsmodels (issue 63) are the numbers the hand-written
formulas gave, on every test the committed study records make.

The oracles below are the formulas as written from their definitions (Welch 1947, Schuirmann 1987,
Holm 1979): Welch-Satterthwaite degrees of freedom, the t distribution's quantile and tail, the
step-down adjustment made monotone and capped at 1."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import t

from ppo_lightning.studies import analysis as A
from ppo_lightning.studies import report
from ppo_lightning.studies.spec import load_study

ROOT = Path(__file__).resolve().parents[1]
STUDIES = sorted((ROOT / "experiments" / "studies").glob("*.yaml"))


def _welch(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    d = float(a.mean() - b.mean())
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1)) if se > 0 else float("inf")
    return d, se, dof


def welch_diff_ci(a, b, alpha=0.05):
    a, b = np.asarray(a, float), np.asarray(b, float)
    d = float(a.mean() - b.mean())
    if a.size < 2 or b.size < 2:
        return d, float("nan"), float("nan")
    _, se, dof = _welch(a, b)
    if se == 0:
        return d, d, d
    half = t.ppf(1 - alpha / 2, dof) * se
    return d, d - half, d + half


def noninferiority(a, b, margin):
    d, se, dof = _welch(a, b)
    if se == 0:
        return 0.0 if d > -margin else 1.0
    return float(t.sf((d + margin) / se, dof))


def tost(a, b, margin):
    return max(noninferiority(a, b, margin), noninferiority(b, a, margin))


def welch_p(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.size < 2 or b.size < 2:
        return float("nan")
    d, se, dof = _welch(a, b)
    if se == 0:
        return 0.0 if d != 0 else 1.0
    return float(2 * t.sf(abs(d) / se, dof))


def holm(pvalues):
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    idx = [i for i in np.argsort(p, kind="stable") if np.isfinite(p[i])]
    m, running = len(idx), 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


ORACLES = {"welch_diff_ci": welch_diff_ci, "welch_p": welch_p, "tost": tost, "noninferiority": noninferiority, "holm": holm}


def _close(new, old) -> bool:
    new, old = np.atleast_1d(np.asarray(new, float)), np.atleast_1d(np.asarray(old, float))
    return new.shape == old.shape and bool(np.all((np.isnan(new) & np.isnan(old)) | np.isclose(new, old, rtol=1e-9, atol=1e-12)))


def test_the_library_statistics_equal_the_formulas_on_every_committed_study(monkeypatch):
    calls: dict[str, list] = {name: [] for name in ORACLES}
    for name in ORACLES:
        library = getattr(A, name)

        def recorded(*args, _name=name, _library=library, **kwargs):
            out = _library(*args, **kwargs)
            calls[_name].append((args, kwargs, out))
            return out

        monkeypatch.setattr(A, name, recorded)
    # the bootstrap and rliable's probability of improvement are not under test here (and take minutes)
    monkeypatch.setattr(A, "stratified_bootstrap", lambda data, stat, reps, seed=0: {
        k: (np.atleast_1d(np.asarray(stat(*(a[None] for a in arrays)), float)[0]),) * 3 for k, arrays in data.items()})
    monkeypatch.setattr(A, "probability_of_improvement", lambda x, y: 0.5)
    for path in STUDIES:
        report.analyse(load_study(path))
    assert all(calls.values()), {k: len(v) for k, v in calls.items()}  # the records make every kind of test
    for name, made in calls.items():
        for args, kwargs, out in made:
            assert _close(out, ORACLES[name](*args, **kwargs)), (name, args, kwargs, out)


@pytest.mark.parametrize("a,b", [([1.0, 1.0, 1.0], [1.0, 1.0]), ([1.0, 1.0], [0.5, 0.5]), ([0.3], [0.2, 0.4])])
def test_arms_without_spread_or_runs_give_the_formulas_edge_values(a, b):
    assert _close(A.welch_diff_ci(a, b), welch_diff_ci(a, b)) and _close(A.welch_p(a, b), welch_p(a, b))
    if min(len(a), len(b)) > 1:
        for margin in (0.1, 1.0):
            assert A.tost(a, b, margin) == tost(a, b, margin)
            assert A.noninferiority(a, b, margin) == noninferiority(a, b, margin)


def test_holm_keeps_untested_entries_out_of_the_family():
    p = [0.01, float("nan"), 0.04, 0.03, 0.04]
    assert _close(A.holm(p), holm(p)) and math.isnan(A.holm(p)[1]) and A.holm([float("nan")])[0] != A.holm([float("nan")])[0]
