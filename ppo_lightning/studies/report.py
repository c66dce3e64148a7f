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

import csv
import math
import re
import time
from collections import Counter
from pathlib import Path

import numpy as np

from ppo_lightning.studies import analysis
from ppo_lightning.studies.records import Cell, atomic_write, cpu_short, env_game, load_cells, normalizer
from ppo_lightning.studies.spec import Study

METRIC_NAME = {"auc": "AUC", "final": "final return"}


def _matrix(cells: list[Cell], envs: tuple[str, ...], metric: str, norm) -> tuple[np.ndarray, list[int]]:
    """Seeds x envs of the normalized metric, for the seeds that have every env."""
    by: dict[int, dict[str, float]] = {}
    for c in cells:
        by.setdefault(c.seed, {})[c.env] = norm(c.env, c.auc_return if metric == "auc" else c.final_return)
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
    with open(study.records.committed, newline="") as f:
        return {(r["row"], r["stat"]): r for r in csv.DictReader(f) if " - " in r["row"]}


def analyse(study: Study, cells: dict | None = None) -> list[analysis.Result]:
    """Every comparison of the study, per metric and per stratum of the factors it does not pool."""
    cells = load_cells(study) if cells is None else cells
    norm = normalizer(study)
    results = []
    for comp in study.comparisons:
        envs = comp.envs or study.envs
        ca = [c for c in cells.values() if c.arm == comp.a and c.env in envs]
        cb = [c for c in cells.values() if c.arm == comp.b and c.env in envs]
        strata: dict[tuple, tuple[list, list]] = {}
        for side, group in ((0, ca), (1, cb)):
            for c in group:
                strata.setdefault(_factor(c, comp.pool), ([], []))[side].append(c)
        for key, (sa, sb) in sorted(strata.items()):
            for metric in comp.metrics:
                x, _ = _matrix(sa, envs, metric, norm)
                y, _ = _matrix(sb, envs, metric, norm)
                if len(x) < 2 or len(y) < 2:
                    continue
                out = analysis.compare(x, y, test=comp.test, margin=comp.margin, target=study.target_half_width)
                per_env = {}
                if len(envs) > 1:
                    for j, e in enumerate(envs):
                        per_env[e] = analysis.compare(x[:, [j]], y[:, [j]], test="difference", margin=None,
                                                      target=study.target_half_width, reps=300, improvement=False)
                        per_env[e] = (per_env[e]["effect"], per_env[e]["low"], per_env[e]["high"])
                used = [c for c in sa + sb if c.env in envs]
                results.append(analysis.Result(
                    comp.claim, comp.a, comp.b, metric, comp.test, tuple(envs), len(x), len(y), out["effect"], out["low"],
                    out["high"], out["method"], out["p_improve"], out["verdict"], out["resolved"], out["seeds_for_target"],
                    out["tost_p"], comp.margin, ", ".join(key) if key else holds_under(used), per_env))
                results[-1].cells = holds_under(used)  # type: ignore[attr-defined]
    return results


def _ci(v: float, lo: float, hi: float, bold: bool = False) -> str:
    s = f"{v:+.3f} [{lo:+.3f}, {hi:+.3f}]"
    return f"**{s}**" if bold else s


def _envs(envs) -> str:
    return " + ".join(env_game(e) for e in envs)


def markdown(study: Study, results: list[analysis.Result], cells: dict, plots: dict[str, str]) -> str:
    """The report's tables (links to plots relative to the docs page of experiments/)."""
    labels = {a: arm.label for a, arm in study.arms.items()}
    committed = committed_rows(study)
    planned = len(study.cells())
    own = [c for c in cells.values()]
    hours = sum(c.wall_s for c in own if math.isfinite(c.wall_s)) / 3600
    lines = [f"**{study.title}** (`{study.path.relative_to(study.root) if study.path.is_absolute() else study.path}`): "
             f"{len(own)} of {planned} planned cells recorded, {study.frames:,} frames per run, "
             f"{hours:.1f} h of one core summed over runs; cells: {holds_under(own)}. Scores: {study.score}; "
             f"95% CIs; a verdict is resolved at a CI half-width <= {study.target_half_width:g}.", ""]
    lines += [] if not results else [f"| claim | metric | pooled over | effect (a - b) [95% CI] | P(a > b) | verdict | committed (old driver) | cells | seeds/arm for ±{study.target_half_width:g} |",
              "|---|---|---|---|---|---|---|---|---|"]
    changed = []
    for r in results:
        c = committed.get((f"{r.a} - {r.b}", r.metric))
        old = ""
        if c is not None:
            lo, hi = float(c["ci_low"]), float(c["ci_high"])
            old = f"{_ci(float(c['mean']), lo, hi)}: {analysis.direction(lo, hi)}"
            if analysis.direction(lo, hi) != analysis.direction(r.low, r.high):
                old += " (**changed**)"
                changed.append((r, c))
        bold = r.low > 0 or r.high < 0
        pi = "" if r.p_improve is None else f"{r.p_improve:.2f}"
        lines.append(f"| {labels[r.a]} vs {labels[r.b]} | {METRIC_NAME[r.metric]} | {_envs(r.envs)} | "
                     f"{_ci(r.effect, r.low, r.high, bold)} ({r.n_a} vs {r.n_b} seeds; {r.method}) | {pi} | {r.verdict} | "
                     f"{old} | {getattr(r, 'cells', '')} | {r.seeds_for_target} |")
    if changed:
        lines += ["", "Where these intervals change a committed verdict: " + "; ".join(
            f"{labels[r.a]} vs {labels[r.b]} ({METRIC_NAME[r.metric]}): committed [{float(c['ci_low']):+.3f}, "
            f"{float(c['ci_high']):+.3f}], now [{r.low:+.3f}, {r.high:+.3f}]" for r, c in changed)
            + ". Why: below 5 seeds an arm's interval is Welch's t here, where the committed one was a percentile "
              "bootstrap (too narrow: it resamples only the few values seen); at 5 or more seeds the committed CIs "
              "resampled a seed's games together, so chance correlations between games across the few seeds entered "
              "them, while rliable's stratified bootstrap resamples each game's runs independently (runs of one seed "
              "on two games share only the seed number)."]
    lines += arm_table(study, cells)
    missing = missing_envs(study, cells)
    if missing:
        lines += ["", "Not in this table, the pooled curves or the profiles (no run on some environments; in the "
                  "per-environment curves and the comparisons of the envs they have): " + "; ".join(
                      f"{labels[a]} (no {', '.join(env_game(e) for e in m)})" for a, m in missing.items()) + "."]
    if len(study.seeds) == 1:  # one run per env (a reference): its numbers per env
        lines += ["", f"Per run (score: {study.score}):", "", "| arm | env | seed | frames | AUC | final | cell |", "|---|---|---|---|---|---|---|"]
        norm = normalizer(study)
        for c in sorted(cells.values(), key=lambda c: (c.arm, c.env)):
            lines.append(f"| {labels[c.arm]} | {env_game(c.env)} | {c.seed} | {c.frames:,} | {norm(c.env, c.auc_return):.3f} | "
                         f"{norm(c.env, c.final_return):.3f} | {c.precision} on {cpu_short(c.cpu)} |")
    multi = [r for r in results if r.per_env]
    if multi:
        lines += ["", "Per environment (effect a - b [95% CI]; 300 bootstrap replicates):", "",
                  "| comparison | metric | " + " | ".join(env_game(e) for e in study.envs) + " |",
                  "|---|---|" + "---|" * len(study.envs)]
        for r in multi:
            row = [(_ci(*r.per_env[e], bold=r.per_env[e][1] > 0 or r.per_env[e][2] < 0) if e in r.per_env else "-") for e in study.envs]
            lines.append(f"| {labels[r.a]} vs {labels[r.b]} | {METRIC_NAME[r.metric]} | " + " | ".join(row) + " |")
    for name, path in plots.items():
        lines += ["", f"![{study.name} {name}]({path})"]
    return "\n".join(lines) + "\n"


def arm_table(study: Study, cells: dict, reps: int = 500) -> list[str]:
    """Per arm, over the seeds with every env of the study: mean and IQM of the normalized AUC and final
    return with 95% stratified-bootstrap CIs (rliable); with one seed, its score."""
    norm = normalizer(study)
    rows = ["", f"Arms (all {len(study.envs)} envs; mean and interquartile mean over runs, 95% stratified bootstrap, "
            f"{reps} replicates):", "", "| arm | seeds | AUC mean | AUC IQM | final mean | final IQM | cells |", "|---|---|---|---|---|---|---|"]
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
            if arm in est[metric]:
                v, lo, hi = est[metric][arm][stat]
                return f"{v:.3f} [{lo:.3f}, {hi:.3f}]"
            return f"{scores[metric][arm].mean():.3f}" if stat == "mean" else ""
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
    norm = normalizer(study)
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


def plot(study: Study, cells: dict, results: list[analysis.Result], out: Path, points: int = 40) -> dict[str, Path]:
    """Sample-efficiency curves of the compared arms (pooled over the envs, and per env: an arm missing
    an env is in the panels of the envs it has, and named under the pooled one), performance profiles
    and a forest plot of the effects."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    norm = normalizer(study)
    labels = {a: arm.label for a, arm in study.arms.items()}
    made = {}
    arms = (list(dict.fromkeys(x for comp in study.comparisons for x in (comp.a, comp.b))) or list(study.arms))[:10]
    color = {a: f"C{i}" for i, a in enumerate(arms)}
    grid = np.linspace(study.frames / points, study.frames, points)
    panels = curve_panels(study, cells, arms, grid)
    cpus = holds_under(list(cells.values()))
    if any(panels.values()):
        n = len(panels)
        cols = min(n, 3)
        rows = math.ceil(n / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(7.5 if n == 1 else 4.2 * cols, 4.8 if n == 1 else 3.4 * rows), squeeze=False,
                                 layout="constrained")
        for ax in axes.flat[n:]:
            ax.set_visible(False)
        missing = {a: m for a, m in missing_envs(study, cells).items() if a in arms}
        handles = {}
        for ax, (name, curves) in zip(axes.flat, panels.items()):
            bands = analysis.sample_efficiency(curves, reps=200) if curves else {}
            for arm, (m, lo, hi) in bands.items():
                handles.setdefault(arm, ax.plot(grid, m, color=color[arm], label=f"{labels[arm]} (n={len(curves[arm])})")[0])
                ax.fill_between(grid, lo, hi, color=color[arm], alpha=0.2)
            pooled = name == "pooled"
            what = "return" if study.score == "raw" else "normalized return"
            ax.set(xlabel="environment frames", ylabel=f"{what}, mean of {len(study.envs)} envs" if pooled else what,
                   title=(f"{study.title}"[:90] if n == 1 else f"mean of the {len(study.envs)} envs" if pooled else env_game(name)))
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
            fig.suptitle(f"{study.title}"[:120], fontsize=9)
            keys = [a for a in arms if a in handles]
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
        made["sample efficiency"] = out.with_name(out.stem + "_curves.png")
        fig.savefig(made["sample efficiency"], dpi=110, bbox_inches="tight")
        plt.close(fig)
    scores = {}
    for arm in arms[:10]:  # performance profiles: the fraction of runs above each normalized AUC (rliable)
        m, _ = _matrix([c for c in cells.values() if c.arm == arm], study.envs, "auc", norm)
        if len(m) >= 2:
            scores[arm] = m
    if scores:
        allv = np.concatenate([m.ravel() for m in scores.values()])
        taus = np.linspace(allv.min(), allv.max(), 60)
        prof, bands = analysis.performance_profiles(scores, taus, reps=200)
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        for arm in scores:
            line, = ax.plot(taus, prof[arm], label=f"{labels[arm]} (n={len(scores[arm])})")
            ax.fill_between(taus, bands[arm][0], bands[arm][1], color=line.get_color(), alpha=0.2)
        ax.set(xlabel="normalized AUC (tau)", ylabel="fraction of runs with AUC > tau", title="performance profiles"[:90])
        ax.legend(fontsize=6)
        fig.text(0.01, 0.005, f"cells: {cpus}; 95% stratified bootstrap bands (rliable)", fontsize=5)
        made["performance profiles"] = out.with_name(out.stem + "_profiles.png")
        fig.savefig(made["performance profiles"], dpi=110, bbox_inches="tight")
        plt.close(fig)
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


def report(study: Study, out_dir: Path | None = None, into: Path | None = None, plots: bool = True) -> str:
    """Write the study's report (markdown and plots); returns the markdown."""
    t0 = time.perf_counter()
    out_dir = out_dir or study.root / "experiments" / "results" / "studies"
    out_dir.mkdir(parents=True, exist_ok=True)
    cells = load_cells(study, curves=plots)
    results = analyse(study, cells)
    out = out_dir / f"{study.path.stem}.md"
    made = plot(study, cells, results, out) if plots else {}
    # beside the report, the figures by name; a docs page of experiments/ links them as results/studies/...
    rel = {k: (f"results/studies/{v.name}" if into is not None else v.name) for k, v in made.items()}
    text = markdown(study, results, cells, rel)
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
