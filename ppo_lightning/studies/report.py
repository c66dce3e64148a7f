"""``ppo-lightning study report FILE``: a study's verdicts, tables and plots from its recorded cells,
in the reader's terms (the arms' labels, the claims of the file), each with its CPU, precision and
budget.

Writes ``experiments/results/studies/<study file stem>.md`` (the tables) and ``..._curves.png``
(sample efficiency: mean normalized return against frames, 95% stratified-bootstrap bands) and
``..._effects.png`` (every comparison's effect with its CI); ``--into PAGE`` also replaces the
block between ``<!-- study-report: FILE -->`` and ``<!-- end study-report -->`` of a docs page
with the tables.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from ppo_lightning.core.safety import read_csv
from ppo_lightning.studies import analysis
from ppo_lightning.core.hardware import cpu_short
from ppo_lightning.studies.records import (Cell, atomic_write, best_returns, cell_value, env_game, load_cells,
                                           normalizer)
from ppo_lightning.studies.spec import Study

METRIC_NAME = {"auc": "AUC", "final": "final return", "last100": "last 100 episodes"}
PLOT_REPS = 2000  # bootstrap replicates of the plots' bands (the tables: analysis.REPS)


def _matrix(cells: list[Cell], envs: tuple[str, ...], metric: str, norm) -> tuple[np.ndarray, list[int]]:
    """Seeds x envs of the normalized metric, for the seeds that have every env (a value not recorded,
    NaN, counts as absent)."""
    by: dict[int, dict[str, float]] = {}
    for c in cells:
        v = norm(c.env, cell_value(c, metric))
        if math.isfinite(v):
            by.setdefault(c.seed, {})[c.env] = v
    seeds = sorted(s for s, e in by.items() if all(x in e for x in envs))
    return np.array([[by[s][e] for e in envs] for s in seeds], dtype=float).reshape(len(seeds), len(envs)), seeds


def _factor(c: Cell, pool: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(v for f, v in (("cpu", cpu_short(c.cpu)), ("precision", c.precision)) if f not in pool)


def holds_under(cells: list[Cell]) -> str:
    """The CPUs and precisions of ``cells``, with their counts: '32-true on EPYC-AVX2 (24)'."""
    n = Counter((c.precision, cpu_short(c.cpu)) for c in cells)
    return " + ".join(f"{p} on {cpu} ({k})" for (p, cpu), k in sorted(n.items()))


def committed_rows(study: Study) -> dict[tuple[str, str], dict]:
    if study.records is None or study.records.committed is None:
        return {}
    return {(r["row"], r["stat"]): r for r in read_csv(study.records.committed) if " - " in r["row"]}


def _pending(comp, metric: str, envs, n_a: int, n_b: int, used: list[Cell], planned: int, stratum: str = "") -> analysis.Result:
    """A comparison without 2 seeds an arm on every env of it: in the report as pending, never dropped."""
    nan = float("nan")
    r = analysis.Result(comp.claim, comp.a, comp.b, metric, comp.test, tuple(envs), n_a, n_b, nan, nan, nan, "", None,
                        f"pending: {n_a} and {n_b} seeds with every env of the comparison ({len(used)} of {planned} cells recorded)",
                        False, 0, None, comp.margin, stratum)
    r.cells = holds_under(used)  # type: ignore[attr-defined]
    r.pending = True  # type: ignore[attr-defined]
    return r


def per_env_effects(x: np.ndarray, y: np.ndarray, envs, target: float, reps: int = analysis.REPS) -> dict[str, tuple]:
    """Per env of a comparison: ``(effect, low, high, Holm-adjusted p)``, the 95% CI as the pooled one's
    (stratified bootstrap, Welch's t below 5 seeds), the p-value Welch's two-sided t test adjusted by
    Holm over the family of the comparison's envs on this metric (`analysis.holm`)."""
    return _per_env({e: (x[:, j], y[:, j]) for j, e in enumerate(envs)}, envs, target, reps)


def _per_env(columns: dict[str, tuple[np.ndarray, np.ndarray]], envs, target: float, reps: int = analysis.REPS) -> dict[str, tuple]:
    """`per_env_effects` over the envs in ``columns`` (each: arm a's and arm b's seeds); an env of the
    family without 2 seeds an arm gets no row and counts in Holm's family with p = 1, so the correction
    is the whole family's while some games are still running."""
    raw, out = [], {}
    for e in envs:
        if e not in columns:
            raw.append(1.0)
            continue
        xe, ye = columns[e]
        d = analysis.compare(xe[:, None], ye[:, None], test="difference", margin=None, target=target, reps=reps, improvement=False)
        out[e] = (d["effect"], d["low"], d["high"])
        raw.append(analysis.welch_p(xe, ye))
    return {e: (*out[e], p) for e, p in zip(envs, analysis.holm(raw)) if e in out}


def partial_per_env(sa: list[Cell], sb: list[Cell], envs, metric: str, norm, target: float) -> dict[str, tuple]:
    """Per-env effects of a comparison that has no pooled verdict yet: each env with 2 or more seeds an
    arm (each arm's seeds on that env alone), Holm over the whole family (`_per_env`)."""
    columns = {}
    for e in envs:
        xe, _ = _matrix([c for c in sa if c.env == e], (e,), metric, norm)
        ye, _ = _matrix([c for c in sb if c.env == e], (e,), metric, norm)
        if len(xe) >= 2 and len(ye) >= 2:
            columns[e] = (xe[:, 0], ye[:, 0])
    return _per_env(columns, envs, target) if len(envs) > 1 and columns else {}


def analyse(study: Study, cells: dict | None = None, pool_all: bool = False) -> list[analysis.Result]:
    """Every comparison of the study, per metric and per stratum of the factors it does not pool
    (``pool_all``: one stratum, every factor pooled); a comparison without the cells for a verdict is
    a pending row, never left out (`covered`)."""
    cells = load_cells(study) if cells is None else cells
    norm = normalizer(study, cells)
    results = []
    for comp in study.comparisons:
        envs = comp.envs or study.envs
        planned = 2 * len(envs) * len(study.seeds)
        ca = [c for c in cells.values() if c.arm == comp.a and c.env in envs]
        cb = [c for c in cells.values() if c.arm == comp.b and c.env in envs]
        strata: dict[tuple, tuple[list, list]] = {}
        for side, group in ((0, ca), (1, cb)):
            for c in group:
                strata.setdefault(() if pool_all else _factor(c, comp.pool), ([], []))[side].append(c)
        made = set()
        for key, (sa, sb) in sorted(strata.items()):
            for metric in comp.metrics:
                x, _ = _matrix(sa, envs, metric, norm)
                y, _ = _matrix(sb, envs, metric, norm)
                used = [c for c in sa + sb if c.env in envs]
                if len(x) < 2 or len(y) < 2:
                    if len(strata) == 1:
                        results.append(_pending(comp, metric, envs, len(x), len(y), used, planned, ", ".join(key)))
                        results[-1].per_env = partial_per_env(sa, sb, envs, metric, norm, study.target_half_width)
                        made.add(metric)
                    continue
                out = analysis.compare(x, y, test=comp.test, margin=comp.margin, target=study.target_half_width)
                per_env = per_env_effects(x, y, envs, study.target_half_width) if len(envs) > 1 else {}
                results.append(analysis.Result(
                    comp.claim, comp.a, comp.b, metric, comp.test, tuple(envs), len(x), len(y), out["effect"], out["low"],
                    out["high"], out["method"], out["p_improve"], out["verdict"], out["resolved"], out["seeds_for_target"],
                    out["tost_p"], comp.margin, ", ".join(key) if key else holds_under(used), per_env))
                results[-1].cells = holds_under(used)  # type: ignore[attr-defined]
                made.add(metric)
        for metric in comp.metrics:  # no stratum with the cells for a verdict: one pending row over all of them
            if metric not in made:
                results.append(_pending(comp, metric, envs, 0, 0, ca + cb, planned))
    return results


def covered(study: Study, text: str) -> list[str]:
    """The comparisons (claim, metric) of the study file that have no row in the report ``text``:
    none may be missing (`report` refuses to write a report that drops one)."""
    labels = {a: arm.label for a, arm in study.arms.items()}
    return [f"{c.claim} ({METRIC_NAME[m]})" for c in study.comparisons for m in c.metrics
            if f"| {c.claim} ({labels[c.a]} vs {labels[c.b]}) | {METRIC_NAME[m]} |" not in text]


def _ci(v: float, lo: float, hi: float, bold: bool = False) -> str:
    s = f"{v:+.3f} [{lo:+.3f}, {hi:+.3f}]"
    return f"**{s}**" if bold else s


def _claim(r: analysis.Result, labels: dict[str, str]) -> str:
    """A comparison's row name: the claim as its study file states it, then its arms."""
    return f"{r.claim} ({labels[r.a]} vs {labels[r.b]})"


def _envs(envs) -> str:
    return " + ".join(env_game(e) for e in envs)


def rules(study: Study) -> str:
    """The rules every row of the report uses, stated once in its header."""
    tests = {c.test for c in study.comparisons}
    units = study.units + (" (each environment's own returns, not normalized)" if study.score == "raw" else "")
    parts = [f"Effects: difference of means (a - b) of the {units}, 95% CIs: rliable's stratified bootstrap "
             f"({analysis.REPS:,} replicates) at 5 or more seeds an arm, else Welch's t."]
    if "difference" in tests:
        parts.append("Difference: `a > b` / `a < b` where the 95% CI excludes 0 (bold), else `no difference resolved`.")
    if "equivalence" in tests:
        parts.append("Equivalence: `equal within ±m` where both one-sided Welch tests (TOST) reject a difference of the "
                     "margin m the study file states at p < 0.05; no other row says equal.")
    if "noninferiority" in tests:
        parts.append("Non-inferiority: `a not worse than b by m` where the one-sided Welch test at the file's margin m gives p < 0.05.")
    if study.target_half_width is not None:
        parts.append(f"A row whose CI half-width exceeds the study's target {study.target_half_width:g} ({study.units}) "
                     "says so; the last column is the seeds per arm that target would need.")
    if study.records is not None and study.records.committed is not None:
        parts.append("The committed verdict is the one the records' own summary CSV "
                     f"(`{study.records.committed.name}`, written by the scripts that ran them) states, beside this report's.")
    return " ".join(parts)


def holds_on_fresh(sel: analysis.Result, fresh: analysis.Result | None) -> str:
    """Whether a claim made on the selection seeds holds on the fresh ones: ``holds``, ``does not
    hold (...)``, ``pending (...)``, or that the selection seeds resolved nothing to confirm."""
    if fresh is None:
        return "not run on fresh seeds"
    if getattr(sel, "pending", False):
        return "pending (selection seeds)"
    ok = lambda r: r.tost_p is not None and math.isfinite(r.tost_p) and r.tost_p < analysis.ALPHA  # noqa: E731
    # what the selection seeds claimed comes first: where they claimed nothing, no fresh result makes a claim
    if sel.test == "difference" and analysis.direction(sel.low, sel.high) == "no difference resolved":
        return "nothing to confirm (no difference resolved on the selection seeds)"
    if sel.test != "difference" and not ok(sel):
        return f"nothing to confirm (not shown {'equal' if sel.test == 'equivalence' else 'non-inferior'} on the selection seeds)"
    if getattr(fresh, "pending", False):
        return "pending"
    if sel.test == "difference":
        was, now = analysis.direction(sel.low, sel.high), analysis.direction(fresh.low, fresh.high)
        return "holds" if now == was else f"does not hold ({now} on fresh seeds)"
    return "holds" if ok(fresh) else "does not hold (test not passed on fresh seeds)"


def _effect_cell(r: analysis.Result) -> str:
    if getattr(r, "pending", False):
        return f"pending ({r.n_a} vs {r.n_b} seeds)"
    return f"{_ci(r.effect, r.low, r.high, r.low > 0 or r.high < 0)} ({r.n_a} vs {r.n_b} seeds)"


def _seed_set(conf: Study, cells: dict) -> str:
    """A confirming study's seeds and precision, as the tables name it: '2000-2007, 32-true'."""
    precisions = sorted({c.precision for c in cells.values()}) or [str(conf.fit.get("trainer.precision", "auto"))]
    return f"{conf.seed_range}, {' + '.join(precisions)}"


def fit_diff(study: Study, conf: Study, arms: set[str]) -> str:
    """The fit options of ``conf`` (study-wide and its compared arms') that differ from ``study``'s,
    as '`trainer.precision` 32-true (here: not set)'; empty where none does."""
    out = []
    def show(v):
        return "not set" if v is _UNSET else str(v)
    for where, mine, theirs in [("", study.fit, conf.fit)] + [
            (f"{a}: ", study.arms[a].fit, conf.arms[a].fit) for a in sorted(arms) if a in study.arms and a in conf.arms]:
        for k in sorted(set(mine) | set(theirs)):
            a, b = mine.get(k, _UNSET), theirs.get(k, _UNSET)
            if a != b:
                out.append(f"{where}`{k}` {show(b)} (here: {show(a)})")
    if conf.base != study.base:
        out.append(f"base {', '.join(conf.base)} (here: {', '.join(study.base)})")
    return ", ".join(out)


_UNSET = object()


def overall(verdicts: list[str]) -> str:
    """A claim on every confirming study: ``holds`` where it holds on each, ``does not hold`` where it
    fails on one, ``pending`` while one has no verdict (and none fails)."""
    if any(v.startswith("does not hold") for v in verdicts):
        return "does not hold"
    if any(v.startswith("pending") for v in verdicts):
        return "pending"
    if verdicts and all(v == "holds" for v in verdicts):
        return "holds"
    return verdicts[0] if verdicts else "not run on fresh seeds"


def confirmation_table(study: Study, sel: list[analysis.Result],
                       confirms: list[tuple[Study, list[analysis.Result], dict]]) -> list[str]:
    """Per claim and metric: the effect on the selection seeds and on each confirming study's fresh
    seeds, and whether it holds there; then per environment; then, for confirming studies on the same
    seeds in different precisions, the precision's effect."""
    labels = {a: arm.label for a, arm in study.arms.items()}
    compared = {x for comp in study.comparisons for x in (comp.a, comp.b)}
    diffs = [f"`{_rel(conf)}` sets {d}" for conf, _, _ in confirms if (d := fit_diff(study, conf, compared))]
    lines = ["**Confirmation on fresh seeds.** " + (f"Selection: {study.selection} " if study.selection else "")
             + "Fresh seeds: " + "; ".join(
                 f"{conf.seed_range} (`{_rel(conf)}`: {len(cc)} of {len([c for c in conf.cells() if c[0] in compared])} "
                 f"cells recorded; {holds_under(list(cc.values())) or 'none yet'})" for conf, _, cc in confirms)
             + ". A claim is a headline only where it holds on the fresh seeds: the same resolved sign (difference), "
               "the test passed (equivalence, non-inferiority). Every factor is pooled in these tables (the cells "
               "column names them: where seed sets differ in precision or CPU, a gap between them mixes selection "
               "with those)." + (" Settings besides the seeds that differ from this study's: " + "; ".join(diffs) + "."
                                  if diffs else ""), "",
             f"| claim (a vs b) | metric | seeds | effect (a - b) [95% CI], {study.units} | verdict | cells | on fresh seeds |",
             "|---|---|---|---|---|---|---|"]
    by = [{(r.claim, r.a, r.b, r.metric): r for r in fresh} for _, fresh, _ in confirms]
    for r in sel:
        key = (r.claim, r.a, r.b, r.metric)
        each = [holds_on_fresh(r, b.get(key)) for b in by]
        h = overall([v for v in each if v != "not run on fresh seeds"] or each)
        name = f"| {_claim(r, labels)} | {METRIC_NAME[r.metric]} |"
        lines.append(f"{name} selection ({study.seed_range}) | {_effect_cell(r)} | {r.verdict} | {getattr(r, 'cells', '')} | "
                     f"{'**holds**' if h == 'holds' else h} |")
        for (conf, _, cc), b, v in zip(confirms, by, each):
            f = b.get(key)
            lines.append(f"{name} fresh ({_seed_set(conf, cc)}) | {_effect_cell(f) if f else '-'} | {f.verdict if f else '-'} | "
                         f"{getattr(f, 'cells', '') if f else '-'} | {'**holds**' if v == 'holds' else v} |")
    envs = list(dict.fromkeys(e for r in sel for e in r.per_env))
    if envs:
        lines += ["", f"Per environment on every seed set (effect a - b [95% CI], {study.units}, Holm-adjusted Welch p over the family of "
                  "one comparison's environments on one metric; a per-game claim holds where the adjusted p < 0.05 on the "
                  "selection seeds and on the fresh ones, with the same sign):", "",
                  "| comparison | metric | env | selection (" + study.seed_range + ") | "
                  + " | ".join(f"fresh ({_seed_set(conf, cc)})" for conf, _, cc in confirms) + " | on fresh seeds |",
                  "|---|---|---|---|" + "---|" * len(confirms) + "---|"]
        fmt = lambda v: f"{_ci(*v[:3], v[3] < analysis.ALPHA)} (p {v[3]:.3f})" if math.isfinite(v[3]) else _ci(*v[:3])  # noqa: E731
        sig = lambda x: math.isfinite(x[3]) and x[3] < analysis.ALPHA  # noqa: E731
        for r in sel:
            key = (r.claim, r.a, r.b, r.metric)
            for e in envs:
                if e not in r.per_env:
                    continue
                v, cols, each = r.per_env[e], [], []
                for b in by:
                    f = b.get(key)
                    w = f.per_env.get(e) if f is not None else None
                    cols.append(fmt(w) if w is not None else "-")
                    if not sig(v):  # whatever the fresh seeds show, the selection seeds claimed nothing here
                        each.append("nothing to confirm (not resolved on the selection seeds)")
                    elif w is None:
                        each.append("pending" if f is not None else "not run on fresh seeds")
                    else:
                        each.append("holds" if sig(w) and np.sign(w[0]) == np.sign(v[0]) else "does not hold")
                h = overall([x for x in each if x != "not run on fresh seeds"] or each)
                lines.append(f"| {labels[r.a]} vs {labels[r.b]} | {METRIC_NAME[r.metric]} | {env_game(e)} | {fmt(v)} | "
                             + " | ".join(cols) + f" | {'**holds**' if h == 'holds' else h} |")
    lines += precision_factor(study, confirms)
    return lines


def precision_factor(study: Study, confirms: list[tuple[Study, list[analysis.Result], dict]]) -> list[str]:
    """For two confirming studies on the same seeds whose cells differ in precision only: each compared
    arm's score in one minus the other, and each claim's effect in one minus the other (`analysis.interaction`),
    with 95% CIs: precision's effect, measured apart from the seeds' selection."""
    labels = {a: arm.label for a, arm in study.arms.items()}
    rows = []
    for i in range(len(confirms)):
        for j in range(i + 1, len(confirms)):
            (c1, _, k1), (c2, _, k2) = confirms[i], confirms[j]
            p1 = {c.precision for c in k1.values()} or {str(c1.fit.get("trainer.precision", "auto"))}
            p2 = {c.precision for c in k2.values()} or {str(c2.fit.get("trainer.precision", "auto"))}
            if c1.seeds != c2.seeds or c1.envs != c2.envs or len(p1) != 1 or len(p2) != 1 or p1 == p2:
                continue
            n1, n2 = next(iter(p1)), next(iter(p2))
            norm = normalizer(study, {**k1, **k2})
            m = lambda cells, arm, envs, metric: _matrix([c for c in cells.values() if c.arm == arm], envs, metric, norm)[0]  # noqa: E731
            for comp in study.comparisons:
                if comp.a not in c1.arms or comp.b not in c1.arms or comp.a not in c2.arms or comp.b not in c2.arms:
                    continue
                envs = comp.envs or study.envs
                for metric in comp.metrics:
                    arrays = [m(k1, comp.a, envs, metric), m(k1, comp.b, envs, metric), m(k2, comp.a, envs, metric),
                              m(k2, comp.b, envs, metric)]
                    name = f"| {labels[comp.a]} vs {labels[comp.b]} | {METRIC_NAME[metric]} |"
                    if min(len(a) for a in arrays) < 2:
                        rows.append(f"{name} pending | pending | pending |")
                        continue
                    arm_a = analysis.compare(arrays[2], arrays[0], test="difference", margin=None, target=study.target_half_width)
                    arm_b = analysis.compare(arrays[3], arrays[1], test="difference", margin=None, target=study.target_half_width)
                    d, lo, hi = analysis.interaction(*arrays)
                    rows.append(f"{name} {_ci(arm_a['effect'], arm_a['low'], arm_a['high'], arm_a['low'] > 0 or arm_a['high'] < 0)} | "
                                f"{_ci(arm_b['effect'], arm_b['low'], arm_b['high'], arm_b['low'] > 0 or arm_b['high'] < 0)} | "
                                f"{_ci(d, lo, hi, lo > 0 or hi < 0)} |")
            if rows:
                rows = ["", f"Precision on the fresh seeds ({c1.seed_range}): {n2} minus {n1}, the same seeds and arms "
                        f"(`{_rel(c2)}` against `{_rel(c1)}`; 95% CIs, bold where they exclude 0; a difference, not an "
                        "equivalence test):", "",
                        "| claim | metric | arm a: " + n2 + " - " + n1 + " | arm b: " + n2 + " - " + n1 + " | the claim's effect (a - b): "
                        + n2 + " - " + n1 + " |", "|---|---|---|---|---|"] + rows
    return rows


def _rel(study: Study) -> str:
    return str(study.path.relative_to(study.root)) if study.path.is_absolute() and study.path.is_relative_to(study.root) else str(study.path)


def paper_table(study: Study, cells: dict, reps: int = analysis.REPS) -> list[str]:
    """Arms with a published value (``paper:``) beside the measured one on the study's score: mean over
    every env and seed with its 95% stratified-bootstrap CI (rliable), as the paper averages its runs."""
    if not any(a.paper is not None for a in study.arms.values()):
        return []
    metric = study.score_ref.metric if study.score_ref else "final"
    norm = normalizer(study, cells)
    scores = {}
    for arm in study.arms:
        m, _ = _matrix([c for c in cells.values() if c.arm == arm], study.envs, metric, norm)
        if len(m):
            scores[arm] = m
    est = analysis.interval_estimates({a: m for a, m in scores.items() if len(m) >= 2}, reps=reps) if scores else {}
    rows = ["", f"Beside the paper ({METRIC_NAME[metric]}, {'raw return' if study.score == 'raw' else 'normalized per env'}; "
            f"the mean over the {len(study.envs)} envs and the seeds with every env, 95% stratified bootstrap, {reps:,} "
            f"replicates, at {analysis.MIN_SEEDS_FOR_BOOTSTRAP} or more seeds an arm; below that the mean, n and each "
            "run's score):", "",
            "| arm | paper | here: mean [95% CI] (or n and the runs) | IQM [95% CI] | seeds | cells |", "|---|---|---|---|---|---|"]
    for arm, a in study.arms.items():
        paper = "" if a.paper is None else f"{a.paper:.2f}"
        used = [c for c in cells.values() if c.arm == arm]
        if arm in scores:
            here, iqm = (arm_summary(scores[arm], est.get(arm), stat, 2) for stat in ("mean", "iqm"))
        else:
            here, iqm = "pending", ""
        rows.append(f"| {a.label} | {paper} | {here} | {iqm} | {len(scores.get(arm, []))} | {holds_under(used) or 'none yet'} |")
    if study.score == "random-best":
        best = best_returns(study, list(cells.values()))
        rows += ["", f"Per env: 0 is the random policy's return (`{study.score_ref.random_source.relative_to(study.root) if study.score_ref.random_source.is_relative_to(study.root) else study.score_ref.random_source}`), "
                 f"1 the best of the paper's settings here (mean raw {METRIC_NAME[study.score_ref.metric]} over its seeds):", "",
                 "| env | random policy | best setting | its mean |", "|---|---|---|---|"]
        for e in study.envs:
            b = best.get(e)
            rows.append(f"| {e} | {study.score_ref.random[e]:.2f} | {study.arms[b[1]].label if b else 'pending'} | "
                        f"{f'{b[0]:.2f}' if b else ''} |")
    return rows


def markdown(study: Study, results: list[analysis.Result], cells: dict, plots: dict[str, str],
             confirmation: tuple[list[analysis.Result], list[tuple[Study, list[analysis.Result], dict]]] | None = None) -> str:
    """The report's tables (links to plots relative to the docs page of experiments/); with
    ``confirmation`` (the selection results with every factor pooled, and per confirming study its
    results and cells) the claims on every seed set first."""
    labels = {a: arm.label for a, arm in study.arms.items()}
    committed = committed_rows(study)
    planned = len(study.cells())
    own = [c for c in cells.values()]
    hours = sum(c.wall_s for c in own if math.isfinite(c.wall_s)) / 3600
    plan = set(study.cells())
    extra = [k for k in cells if k not in plan]  # records beyond the plan (more seeds of some arms): the tables use them
    beyond = "" if not extra else (f", and {len(extra)} more cells of the records beyond the plan (seeds "
                                   f"{', '.join(map(str, sorted({k[2] for k in extra})))} of {len({k[0] for k in extra})} "
                                   f"arm(s)), which the tables use")
    lines = [f"**{study.title}** (`{_rel(study)}`): "
             f"{len(own) - len(extra)} of {planned} planned cells recorded (seeds {study.seed_range}){beyond}, "
             f"{study.frames:,} frames per run, "
             f"{hours:.1f} h of one core summed over runs; cells: {holds_under(own) or 'none yet'}. Scores: {study.score}. "
             + rules(study), ""]
    confirmed: dict[tuple, str] = {}
    if confirmation is not None:
        sel_pooled, confirms = confirmation
        lines += confirmation_table(study, sel_pooled, confirms) + [""]
        by = [{(r.claim, r.a, r.b, r.metric): r for r in fresh} for _, fresh, _ in confirms]
        for r in sel_pooled:
            key = (r.claim, r.a, r.b, r.metric)
            each = [holds_on_fresh(r, b.get(key)) for b in by]
            confirmed[key] = overall([v for v in each if v != "not run on fresh seeds"] or each)
        lines += [f"On the selection seeds ({study.seed_range}), per stratum:", ""]
    lines += [] if not results else [f"| claim (a vs b) | metric | pooled over | effect (a - b) [95% CI], {study.units} | P(a > b) | verdict | committed verdict (records' summary) | cells | seeds/arm for ±{study.target_half_width:g} |",
                                     "|---|---|---|---|---|---|---|---|---|"]
    changed = []
    for r in results:
        c = committed.get((f"{r.a} - {r.b}", r.metric))
        old = ""
        if c is not None:
            lo, hi = float(c["ci_low"]), float(c["ci_high"])
            old = f"{_ci(float(c['mean']), lo, hi)}: {analysis.direction(lo, hi)}"
            if not getattr(r, "pending", False) and analysis.direction(lo, hi) != analysis.direction(r.low, r.high):
                old += " (**changed**)"
                changed.append((r, c))
        pi = "" if r.p_improve is None else f"{r.p_improve:.2f}"
        verdict = r.verdict
        key = (r.claim, r.a, r.b, r.metric)
        if key in confirmed and confirmed[key] != "holds" and not getattr(r, "pending", False):
            verdict += f"; fresh seeds: {confirmed[key]}"
        effect = ("pending" if getattr(r, "pending", False) else
                  f"{_ci(r.effect, r.low, r.high, (r.low > 0 or r.high < 0) and confirmed.get(key, 'holds') in ('holds', 'not run on fresh seeds'))} "
                  f"({r.n_a} vs {r.n_b} seeds; {r.method})")
        lines.append(f"| {_claim(r, labels)} | {METRIC_NAME[r.metric]} | {_envs(r.envs)} | "
                     f"{effect} | {pi} | {verdict} | {old} | {getattr(r, 'cells', '')} | {r.seeds_for_target or ''} |")
    if changed:
        lines += ["", "Where these intervals change a committed verdict: " + "; ".join(
            f"{labels[r.a]} vs {labels[r.b]} ({METRIC_NAME[r.metric]}): committed [{float(c['ci_low']):+.3f}, "
            f"{float(c['ci_high']):+.3f}], now [{r.low:+.3f}, {r.high:+.3f}]" for r, c in changed)
            + ". Why: below 5 seeds an arm's interval is Welch's t here, where the committed one was a percentile "
              "bootstrap (too narrow: it resamples only the few values seen); at 5 or more seeds the committed CIs "
              "resampled a seed's games together, so chance correlations between games across the few seeds entered "
              "them, while rliable's stratified bootstrap resamples each game's runs independently (runs of one seed "
              "on two games share only the seed number)."]
    lines += paper_table(study, cells)
    lines += arm_table(study, cells)
    missing = missing_envs(study, cells)
    if missing:
        lines += ["", "Not in this table, the pooled curves or the profiles (no run on some environments; in the "
                  "per-environment curves and the comparisons of the envs they have): " + "; ".join(
                      f"{labels[a]} (no {', '.join(env_game(e) for e in m)})" for a, m in missing.items()) + "."]
    if len(study.seeds) == 1:  # one run per env (a reference): its numbers per env
        lines += ["", f"Per run (score: {study.score}):", "", "| arm | env | seed | frames | AUC | final | cell |", "|---|---|---|---|---|---|---|"]
        norm = normalizer(study, cells)
        for c in sorted(cells.values(), key=lambda c: (c.arm, c.env)):
            lines.append(f"| {labels[c.arm]} | {env_game(c.env)} | {c.seed} | {c.frames:,} | {norm(c.env, c.auc_return):.3f} | "
                         f"{norm(c.env, c.final_return):.3f} | {c.precision} on {cpu_short(c.cpu)} |")
    multi = [r for r in results if r.per_env]
    if multi:
        lines += ["", f"Per environment (effect a - b [95% CI], {study.units}, {analysis.REPS:,} bootstrap replicates; p: Welch's two-sided "
                  "t test, Holm-adjusted over the family of one comparison's environments on one metric; bold where "
                  "the adjusted p < 0.05):", "",
                  "| comparison | metric | " + " | ".join(env_game(e) for e in study.envs) + " |",
                  "|---|---|" + "---|" * len(study.envs)]
        for r in multi:
            row = []
            for e in study.envs:
                if e not in r.per_env:
                    row.append("-")
                    continue
                d, lo, hi, p = r.per_env[e]
                row.append(f"{_ci(d, lo, hi, p < analysis.ALPHA)} (p {p:.3f})" if math.isfinite(p) else _ci(d, lo, hi))
            lines.append(f"| {labels[r.a]} vs {labels[r.b]} | {METRIC_NAME[r.metric]} | " + " | ".join(row) + " |")
    for name, path in plots.items():
        lines += ["", f"![{study.name} {name}]({path})"]
    return "\n".join(lines) + "\n"


def arm_summary(m: np.ndarray, est: dict | None, stat: str, digits: int) -> str:
    """One arm's ``stat`` ("mean" or "iqm") of its seeds x envs scores ``m``: with its 95% CI where
    the arm has `analysis.MIN_SEEDS_FOR_BOOTSTRAP` seeds or more (``est``: `analysis.interval_estimates`'
    entry); below that the mean, ``n = k`` and each run's score (a percentile bootstrap of 2 runs is
    their min and max: no interval), and no IQM; one run: its score."""
    if est is not None and len(m) >= analysis.MIN_SEEDS_FOR_BOOTSTRAP:
        v, lo, hi = est[stat]
        return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"
    if stat != "mean":
        return ""
    runs = m.mean(axis=1)
    return f"{runs.mean():.{digits}f}" + (f" (n = {len(runs)}: {', '.join(f'{v:.{digits}f}' for v in runs)})" if len(runs) > 1 else "")


def arm_table(study: Study, cells: dict, reps: int = analysis.REPS) -> list[str]:
    """Per arm, over the seeds with every env of the study: mean and IQM of the AUC and final return
    (in the study's score) with 95% stratified-bootstrap CIs (rliable) where the arm has the seeds for
    one (`arm_summary`); else the mean, ``n = k`` and the runs; with one seed, its score."""
    norm = normalizer(study, cells)
    rows = ["", f"Arms (all {len(study.envs)} envs; {study.units}; mean and interquartile mean over runs, 95% stratified "
            f"bootstrap, {reps:,} replicates, at {analysis.MIN_SEEDS_FOR_BOOTSTRAP} or more seeds an arm; below that "
            "the mean, n and each run's score):", "",
            "| arm | seeds | AUC mean | AUC IQM | final mean | final IQM | cells |", "|---|---|---|---|---|---|---|"]
    scores: dict[str, dict[str, np.ndarray]] = {"auc": {}, "final": {}}
    for arm in study.arms:
        mine = [c for c in cells.values() if c.arm == arm]
        for metric in scores:
            m, _ = _matrix(mine, study.envs, metric, norm)
            if len(m):
                scores[metric][arm] = m
    est = {metric: analysis.interval_estimates({a: m for a, m in d.items() if len(m) >= 2}, reps=reps) for metric, d in scores.items()}
    for arm, label in ((a, x.label) for a, x in study.arms.items()):
        if arm not in scores["auc"]:
            continue
        n = len(scores["auc"][arm])
        def fmt(metric, stat):
            return arm_summary(scores[metric][arm], est[metric].get(arm), stat, 3)
        used = [c for c in cells.values() if c.arm == arm]
        rows.append(f"| {label} | {n} | {fmt('auc', 'mean')} | {fmt('auc', 'iqm')} | {fmt('final', 'mean')} | "
                    f"{fmt('final', 'iqm')} | {holds_under(used)} |")
    return rows


def missing_envs(study: Study, cells: dict) -> dict[str, list[str]]:
    """Per arm with recorded cells: the study's environments it has no run on (left out of what pools
    all environments: the pooled curves, the arm table, the profiles)."""
    have: dict[str, set[str]] = {}
    for c in cells.values():
        have.setdefault(c.arm, set()).add(c.env)
    return {a: [e for e in study.envs if e not in have[a]] for a in study.arms if a in have and set(study.envs) - have[a]}


def curve_panels(study: Study, cells: dict, arms: list[str], grid: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """The sample-efficiency curves on ``grid`` (normalized, step-interpolated), as panels: ``"pooled"``
    (per arm, seeds x envs x points over the seeds that have every env: arms missing an env are not in
    it; left out when no arm is) and, with more than one env, one panel per env (seeds x 1 x points:
    every arm with a run there). A run shorter than the budget is NaN past its end."""
    norm = normalizer(study, cells)
    by: dict[str, dict[str, dict[int, np.ndarray]]] = {}
    for c in cells.values():
        if c.arm in arms and c.env in study.envs and c.curve:
            pts = sorted(c.curve)
            fr = np.array([p[0] for p in pts])
            val = np.array([norm(c.env, p[1]) for p in pts])
            on_grid = val[np.clip(np.searchsorted(fr, grid, side="right") - 1, 0, len(fr) - 1)]
            # a run shorter than the study's budget (a reference cut short) ends where it ended
            on_grid[grid > max(c.frames, fr[-1]) + (grid[1] - grid[0] if len(grid) > 1 else 0)] = np.nan
            by.setdefault(c.arm, {}).setdefault(c.env, {})[c.seed] = on_grid
    panels: dict[str, dict[str, np.ndarray]] = {"pooled": {}}
    for arm in arms:
        envs = by.get(arm, {})
        seeds = sorted(set.intersection(*(set(envs.get(e, {})) for e in study.envs)))
        if len(seeds) >= 2:
            panels["pooled"][arm] = np.stack([np.stack([envs[e][s] for e in study.envs]) for s in seeds])
    if not panels["pooled"] and len(study.envs) > 1:
        del panels["pooled"]  # no arm has runs on every env (references of one seed): per env only
    if len(study.envs) > 1:
        for e in study.envs:
            panels[e] = {arm: np.stack([by[arm][e][s] for s in sorted(by[arm][e])])[:, None, :]
                         for arm in arms if e in by.get(arm, {})}
    return panels


def plotted_arms(study: Study) -> list[str]:
    """The arms the curves and profiles draw: every arm of a comparison, in the file's order (every arm
    where the file compares none)."""
    return list(dict.fromkeys(x for comp in study.comparisons for x in (comp.a, comp.b))) or list(study.arms)


# arms in one image of curves or profiles: beyond this they are split over several images (tab20's
# colors stay distinct up to 20; a legend of more than ~15 entries covers a panel)
ARMS_PER_IMAGE = 14


def arm_chunks(arms: list[str], most: int = ARMS_PER_IMAGE) -> list[list[str]]:
    """``arms`` in order, split into the fewest images of at most ``most`` arms, of sizes as equal as can be."""
    k = max(1, math.ceil(len(arms) / most))
    size, extra = divmod(len(arms), k)
    out, i = [], 0
    for j in range(k):
        n = size + (j < extra)
        out.append(arms[i:i + n])
        i += n
    return [c for c in out if c]


def arm_colors(arms: list[str]) -> dict[str, object]:
    """A distinct color per arm: matplotlib's default cycle (10 colors) up to 10 arms, tab20 up to 20,
    then a continuous colormap."""
    import matplotlib

    if len(arms) <= 10:
        return {a: f"C{i}" for i, a in enumerate(arms)}
    cmap = matplotlib.colormaps["tab20" if len(arms) <= 20 else "turbo"]
    return {a: cmap(i if len(arms) <= 20 else i / (len(arms) - 1)) for i, a in enumerate(arms)}


def plot(study: Study, cells: dict, results: list[analysis.Result], out: Path, points: int = 40) -> dict[str, Path]:
    """Sample-efficiency curves of the compared arms (pooled over the envs, and per env: an arm missing
    an env is in the panels of the envs it has, and named under the pooled one), performance profiles
    and a forest plot of the effects. More arms than `ARMS_PER_IMAGE` are split over several images
    (``_curves.png``, ``_curves_2.png``, ...; the same for the profiles) rather than crowded into one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    norm = normalizer(study, cells)
    labels = {a: arm.label for a, arm in study.arms.items()}
    made = {}
    arms = plotted_arms(study)
    chunks = arm_chunks(arms)
    grid = np.linspace(study.frames / points, study.frames, points)
    cpus = holds_under(list(cells.values()))
    missing_all = missing_envs(study, cells)

    def part_of(i: int, chunk: list[str]) -> str:
        first = sum(len(c) for c in chunks[:i])
        return f" (arms {first + 1}-{first + len(chunk)} of {len(arms)})" if len(chunks) > 1 else ""

    def target(kind: str, suffix: str, i: int) -> tuple[str, Path]:
        return (kind if i == 0 else f"{kind} ({i + 1})",
                out.with_name(out.stem + (f"_{suffix}.png" if i == 0 else f"_{suffix}_{i + 1}.png")))

    for part, chunk in enumerate(chunks):
        color = arm_colors(chunk)
        panels = curve_panels(study, cells, chunk, grid)
        if not any(panels.values()):
            continue
        n = len(panels)
        cols = min(n, 3)
        rows = math.ceil(n / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(7.5 if n == 1 else 4.2 * cols, 4.8 if n == 1 else 3.4 * rows), squeeze=False,
                                 layout="constrained")
        for ax in axes.flat[n:]:
            ax.set_visible(False)
        missing = {a: m for a, m in missing_all.items() if a in chunk}
        handles = {}
        for ax, (name, curves) in zip(axes.flat, panels.items()):
            bands = analysis.sample_efficiency(curves, reps=PLOT_REPS) if curves else {}
            for arm, (m, lo, hi) in bands.items():
                handles.setdefault(arm, ax.plot(grid, m, color=color[arm], label=f"{labels[arm]} (n={len(curves[arm])})")[0])
                ax.fill_between(grid, lo, hi, color=color[arm], alpha=0.2)
            pooled = name == "pooled"
            what = "return" if study.score == "raw" else "normalized return"
            ax.set(xlabel="environment frames", ylabel=f"{what}, mean of {len(study.envs)} envs" if pooled else what,
                   title=(f"{study.title}"[:90] + part_of(part, chunk) if n == 1 else f"mean of the {len(study.envs)} envs" if pooled
                          else env_game(name)))
            ax.title.set_fontsize(8)
            ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1e3:g}k")
            if pooled and missing:
                ax.text(0.01, 0.99, "not pooled (no run on): " + "; ".join(f"{labels[a]} ({', '.join(env_game(e) for e in m)})"
                                                                          for a, m in missing.items()),
                        transform=ax.transAxes, fontsize=5, va="top", wrap=True)
            if bands and n == 1:
                ax.legend(fontsize=6)
        note = f"cells: {cpus}; 95% stratified bootstrap bands (rliable)"
        if n > 1:  # one legend for the panels (n: the runs in the first panel that has the arm), with the note
            fig.suptitle(f"{study.title}"[:120] + part_of(part, chunk), fontsize=9)
            keys = [a for a in chunk if a in handles]
            entries = ([handles[a] for a in keys], [handles[a].get_label() for a in keys])
            if n < rows * cols:  # in the first empty slot
                slot = axes.flat[n]
                slot.set_visible(True)
                slot.axis("off")
                slot.legend(*entries, loc="center", fontsize=6, title=note.replace(" + ", "\n+ ").replace("; ", "\n"), title_fontsize=5)
            else:
                fig.legend(*entries, loc="outside lower center", ncols=2, fontsize=6, title=note, title_fontsize=5)
        else:
            fig.text(0.01, 0.0, note, fontsize=5, va="top")
        key, path = target("sample efficiency", "curves", part)
        made[key] = path
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
    for part, chunk in enumerate(chunks):  # performance profiles: the fraction of runs above each AUC (rliable)
        color = arm_colors(chunk)
        scores = {}
        for arm in chunk:
            m, _ = _matrix([c for c in cells.values() if c.arm == arm], study.envs, "auc", norm)
            if len(m) >= 2:
                scores[arm] = m
        if not scores:
            continue
        allv = np.concatenate([m.ravel() for m in scores.values()])
        taus = np.linspace(allv.min(), allv.max(), 60)
        prof, bands = analysis.performance_profiles(scores, taus, reps=PLOT_REPS)
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        for arm in scores:
            ax.plot(taus, prof[arm], color=color[arm], label=f"{labels[arm]} (n={len(scores[arm])})")
            ax.fill_between(taus, bands[arm][0], bands[arm][1], color=color[arm], alpha=0.2)
        ax.set(xlabel=("AUC, raw return" if study.score == "raw" else "normalized AUC") + " (tau)", ylabel="fraction of runs with AUC > tau", title="performance profiles" + part_of(part, chunk))
        # beside the axes where many arms would cover the curves
        ax.legend(fontsize=6, **({"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)} if len(scores) > 6 else {}))
        fig.text(0.01, 0.005, f"cells: {cpus}; 95% stratified bootstrap bands (rliable)", fontsize=5)
        key, path = target("performance profiles", "profiles", part)
        made[key] = path
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
    results = [r for r in results if not getattr(r, "pending", False)]
    if results:
        for i, path in enumerate(effects_plot(study, results, out.with_name(out.stem + "_effects.png"), cpus)):
            made["effects" if i == 0 else f"effects ({i + 1})"] = path
    return made


def effects_plot(study: Study, results: list[analysis.Result], path: Path, cpus: str) -> list[Path]:
    """A forest plot of the effects: a panel per metric side by side, a row per comparison (its claim's arms,
    and its environments where they differ from the study's), labels wrapped to stay readable at a page's
    width; the rows of a long study file are split over several images (``_effects.png``,
    ``_effects_2.png``, ...) rather than shrunk."""
    import textwrap

    import matplotlib.pyplot as plt

    labels = {a: arm.label for a, arm in study.arms.items()}
    metrics = list(dict.fromkeys(r.metric for r in results))
    rows = list(dict.fromkeys((r.a, r.b, tuple(r.envs), r.stratum) for r in results))
    strata = len({r.stratum for r in results}) > 1  # named only where the rows differ in it
    name = lambda a, b, envs, stratum: textwrap.fill(  # noqa: E731
        f"{labels[a]} vs {labels[b]}" + (f" ({', '.join(env_game(e) for e in envs)})" if set(envs) != set(study.envs) else "")
        + (f" [{stratum}]" if strata and stratum else ""), 46)
    per_image = 24
    made = []
    for part in range(math.ceil(len(rows) / per_image)):
        mine = rows[part * per_image:(part + 1) * per_image]
        heights = [0.22 + 0.14 * name(*k).count("\n") for k in mine]
        fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 + 3.2 * len(metrics), 1.4 + sum(heights) * 1.6), sharey=True,
                                 squeeze=False, layout="constrained")
        for ax, metric in zip(axes[0], metrics):
            for i, k in enumerate(mine):
                r = next((r for r in results if (r.a, r.b, tuple(r.envs), r.stratum) == k and r.metric == metric), None)
                if r is None:
                    continue
                resolved = r.low > 0 or r.high < 0
                ax.errorbar(r.effect, i, xerr=[[r.effect - r.low], [r.high - r.effect]], fmt="o", capsize=3,
                            color="C3" if resolved else "C0", ms=4)
            ax.axvline(0, color="grey", lw=0.8)
            ax.set_title(f"{METRIC_NAME[metric]}: effect a - b (95% CI)", fontsize=9)
            ax.set_xlabel("normalized" if study.score != "raw" else "return", fontsize=8)
            ax.tick_params(labelsize=8)
        axes[0][0].set_yticks(range(len(mine)))
        axes[0][0].set_yticklabels([name(*k) for k in mine], fontsize=8)
        axes[0][0].invert_yaxis()
        more = f" (part {part + 1} of {math.ceil(len(rows) / per_image)})" if len(rows) > per_image else ""
        fig.suptitle(textwrap.fill(f"{study.title}{more}", 110), fontsize=9)
        fig.text(0.0, 0.0, f"red: CI excludes 0; cells: {cpus}", fontsize=6, va="top")
        target = path if part == 0 else path.with_name(f"{path.stem}_{part + 1}{path.suffix}")
        fig.savefig(target, dpi=110, bbox_inches="tight")
        plt.close(fig)
        made.append(target)
    return made


def report(study: Study, out_dir: Path | None = None, into: Path | None = None, plots: bool = True,
           runs: Path | None = None, envs: tuple[str, ...] | None = None) -> str:
    """Write the study's report (markdown and plots); returns the markdown. ``runs``: a folder of run
    roots (``runs/studies``): the cell files of runs in progress there, ``<runs>/<study name>/cells``,
    count too, for this study and its confirming one (pending cells are reported as pending).
    ``envs``: an interim report over these of the study's envs alone (`Study.over_envs`), written
    beside the whole study's as ``<stem>_over_<k>_envs.md`` and opened by a line naming the envs it
    leaves out; not with ``into`` (a page's block reports the whole study)."""
    t0 = time.perf_counter()
    whole = study
    if envs is not None:
        if into is not None:
            raise ValueError("--envs makes an interim report over some envs: a page's block (--into) reports the whole study")
        study = study.over_envs(tuple(envs))
    out_dir = out_dir or study.root / "experiments" / "results" / "studies"
    out_dir.mkdir(parents=True, exist_ok=True)
    root_of = lambda s: None if runs is None else Path(runs) / s.name  # noqa: E731
    cells = load_cells(study, curves=plots, run_root=root_of(study))
    if envs is not None:
        cells = {k: c for k, c in cells.items() if c.env in study.envs}
    results = analyse(study, cells)
    confirmation = None
    confirms = []
    for conf in study.confirmation():
        conf_cells = load_cells(conf, run_root=root_of(conf))
        compared = {x for comp in study.comparisons for x in (comp.a, comp.b)}
        conf_cells = {k: c for k, c in conf_cells.items() if c.arm in compared}
        confirmable = tuple(c for c in study.comparisons if c.a in conf.arms and c.b in conf.arms)
        # the claims as the selecting study states them (its envs, margins, target), on the fresh cells
        conf_view = replace(conf, comparisons=confirmable, target_half_width=study.target_half_width)
        confirms.append((conf, analyse(conf_view, conf_cells, pool_all=True), conf_cells))
    if confirms:
        confirmation = (analyse(study, cells, pool_all=True), confirms)
    stem = study.path.stem if envs is None else f"{study.path.stem}_over_{len(study.envs)}_envs"
    out = out_dir / f"{stem}.md"
    made = plot(study, cells, results, out) if plots else {}
    # beside the report, the figures by name; a docs page of experiments/ links them as results/studies/...
    rel = {k: (f"results/studies/{v.name}" if into is not None else v.name) for k, v in made.items()}
    text = markdown(study, results, cells, rel, confirmation)
    if envs is not None:
        left = [e for e in whole.envs if e not in study.envs]
        gone = [c.claim for c in whole.comparisons if not set(c.envs or whole.envs) & set(study.envs)]
        text = (f"**Interim: over {len(study.envs)} of the study's {len(whole.envs)} envs** ({', '.join(study.envs)}); "
                f"left out: {', '.join(left) or 'none'}"
                + (f"; comparisons on none of these envs, left out: {'; '.join(gone)}" if gone else "")
                + ". The study's claims are over all its envs (`study report` without `--envs`).\n\n" + text)
    dropped = covered(study, text)
    if dropped:
        raise ValueError(f"{study.path.name}: the report drops comparisons of the study file: {'; '.join(dropped)}")
    atomic_write(out, text, "the study report")
    if into is not None:
        page = into.read_text()
        tag = f"<!-- study-report: {study.path.relative_to(study.root).as_posix()} -->"
        pattern = re.compile(re.escape(tag) + r"\n.*?<!-- end study-report -->", re.S)
        if not pattern.search(page):
            raise ValueError(f"--into {into}: no block '{tag}' ... '<!-- end study-report -->' in the page")
        atomic_write(into, pattern.sub(lambda _: f"{tag}\n{text}<!-- end study-report -->", page), "the docs page")
    print(f"{study.name}: {len(results)} verdicts from {len(cells)} cells in {time.perf_counter() - t0:.1f} s -> {out}")
    return text
