"""A study's cells: one finished run each (arm, env, seed), with its CPU and precision.

Two sources, read into the same `Cell`: the study's own CSV export next to the study file
(``<study>.cells.csv``, ``<study>.curves.csv``; written by the runner from its MLflow runs) and the
committed CSVs of the experiment scripts that ran before studies existed (``records:`` in the study file; ``<figure>_runs.csv``,
``<figure>_curves.csv``, read as they are, bytes untouched). A cell the export has wins over a
committed one; among committed sources of an arm, the first that has an (env, seed) gives it.

Every record is written atomically (`atomic_write`: a temporary file beside it, fsync, rename): a
record is the previous one or the new one, never a part. A full disk (or quota) while writing one
raises `ppo_lightning.core.faults.StorageFull` (one line: what, where, the bytes it needed, the bytes
free), the temporary file removed and every record written before kept; a rerun of ``study run``
after freeing space skips the recorded cells.

Precision of a committed row: the ``--trainer.precision`` in its arguments, else what ``auto``
resolved to when it ran: bf16-mixed on a CPU with AMX (before issue 21's minibatch threshold),
32-true elsewhere and for the 100k runs (which predate ``auto`` and recorded no CPU).
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ppo_lightning.core.hardware import CpuIdentity
from ppo_lightning.core.storage import atomic_replace, free_bytes, out_of_space, space_error_text
from ppo_lightning.core.errors import StorageFull
from ppo_lightning.core.safety import load_json, read_csv
from ppo_lightning.run.harness import REFERENCE_500K, RETURN_RANGES, normalized_return
from ppo_lightning.studies.spec import Study

CELL_FIELDS = ["study", "arm", "env", "seed", "frames", "auc_return", "final_return", "cpu", "precision",
               "wall_s", "train_s", "group", "mlflow_run_id", "source", "attempts", "last100_return"]
CURVE_FIELDS = ["arm", "env", "seed", "frames", "return"]


@dataclass
class Cell:
    arm: str
    env: str
    seed: int
    frames: int
    auc_return: float   # mean raw return over the run's frames (step-interpolated curve)
    final_return: float  # mean raw return over the last 10% of the frames
    cpu: str = "not recorded"
    precision: str = "32-true"
    wall_s: float = float("nan")   # the group's wall time over its attempts, / its members
    train_s: float = float("nan")  # the group's training time (fit, without start-up) over its attempts, / its members
    group: str = ""
    mlflow_run_id: str = ""
    source: str = ""
    curve: list[tuple[float, float]] = field(default_factory=list, repr=False)
    attempts: int = 1   # processes the cell's group took (a preempted group resumes in another); times sum them
    last100_return: float = float("nan")  # mean raw return of the run's last 100 episodes (NaN: not recorded)

    @property
    def key(self) -> tuple[str, str, int]:
        return self.arm, self.env, self.seed


def legacy_precision(args: list[str], cpu: str) -> str:
    if "--trainer.precision" in args:
        return args[args.index("--trainer.precision") + 1]
    identity = CpuIdentity.from_label(cpu)
    return "bf16-mixed" if identity and "amx_bf16" in identity.isa else "32-true"


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return read_csv(path)  # bounded: records may come with a shared study file


def _float(x: str) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def env_game(env: str) -> str:
    return env.split(":", 1)[1] if env.startswith("minatar:") else env


def legacy_cells(study: Study, curves: bool = False) -> dict[tuple[str, str, int], Cell]:
    """The committed cells of the experiment scripts' CSVs that the study file maps to its arms."""
    rec = study.records
    if rec is None:
        return {}
    games = {env_game(e): e for e in study.envs}
    out: dict[tuple[str, str, int], Cell] = {}
    cache: dict[str, list[dict]] = {}
    for arm in study.arms:
        for figure, src in rec.arms.get(arm, ((rec.figure, arm),)):
            rows = cache.setdefault(figure, _read(rec.dir / f"{figure}_runs.csv"))
            have = {k for k in out if k[0] == arm}
            new: dict[tuple[str, str, int], Cell] = {}
            for r in rows:  # the last row of a run wins (a rerun of it)
                if r["arm"] != src or r["game"] not in games:
                    continue
                key = (arm, games[r["game"]], int(r["seed"]))
                if key in have:
                    continue
                args = json.loads(r.get("args") or "[]")
                cpu = r.get("cpu") or "not recorded"
                new[key] = Cell(arm, key[1], key[2], int(r["frames"]), float(r["auc_return"]), float(r["final_return"]),
                                cpu, legacy_precision(args, r.get("cpu", "")), _float(r.get("wall_s")), _float(r.get("train_s")),
                                "", r.get("mlflow_run_id", ""), f"{figure}/{src}")
            out.update(new)
    if curves:
        by_src: dict[tuple[str, str, str, int], Cell] = {}
        for c in out.values():
            figure, src = c.source.split("/")
            by_src[(figure, src, env_game(c.env), c.seed)] = c
        for figure in {k[0] for k in by_src}:
            points: dict[tuple, dict[float, float]] = {}
            for r in _read(rec.dir / f"{figure}_curves.csv"):
                k = (figure, r["arm"], r["game"], int(r["seed"]))
                if k in by_src:
                    points.setdefault(k, {})[float(r["frames"])] = float(r["return"])
            for k, pts in points.items():
                by_src[k].curve = sorted(pts.items())
    return out


def export_cells(study: Study, curves: bool = False) -> dict[tuple[str, str, int], Cell]:
    """The cells of the study's own CSV export (``<study>.cells.csv``)."""
    out = {}
    for r in _read(study.cells_csv):
        c = Cell(r["arm"], r["env"], int(r["seed"]), int(r["frames"]), float(r["auc_return"]), float(r["final_return"]),
                 r["cpu"], r["precision"], _float(r["wall_s"]), _float(r["train_s"]), r["group"], r["mlflow_run_id"], "run",
                 attempts=int(r.get("attempts") or 1), last100_return=_float(r.get("last100_return")))
        if c.arm in study.arms and c.env in study.envs:
            out[c.key] = c
    if curves:
        for r in _read(study.curves_csv):
            k = (r["arm"], r["env"], int(r["seed"]))
            if k in out:
                out[k].curve.append((float(r["frames"]), float(r["return"])))
    return out


def cell_files(run_root: Path, study: Study | None = None) -> dict[tuple[str, str, int], Cell]:
    """The cells ``study run`` has recorded so far in ``run_root`` (``cells/<arm>__<env>__<seed>.json``,
    one per finished cell, written atomically), of the study's arms, envs and seeds where one is given."""
    out = {}
    for p in sorted((Path(run_root) / "cells").glob("*.json")):
        d = load_json(p)
        d["curve"] = [tuple(x) for x in d.get("curve", [])]
        c = Cell(**{k: v for k, v in d.items() if k in Cell.__dataclass_fields__})
        if study is None or (c.arm in study.arms and c.env in study.envs and c.seed in study.seeds):
            out[c.key] = c
    return out


def load_cells(study: Study, curves: bool = False, run_root: Path | None = None) -> dict[tuple[str, str, int], Cell]:
    """Every recorded cell of the study: committed records, then its own export over them, then (with
    ``run_root``: a run in progress) the cell files there over both."""
    cells = legacy_cells(study, curves)
    cells.update(export_cells(study, curves))
    if run_root is not None:
        files = cell_files(run_root, study)
        if not curves:
            for c in files.values():
                c.curve = []
        cells.update(files)
    return cells


def cell_value(c: Cell, metric: str) -> float:
    """A cell's raw statistic: ``auc`` (mean return over the run's frames), ``final`` (over its last
    10%), ``last100`` (mean return of its last 100 episodes; NaN where not recorded)."""
    return {"auc": c.auc_return, "final": c.final_return, "last100": c.last100_return}[metric]


def atomic_write(path: Path, data: str | bytes, what: str = "study record") -> None:
    """Write ``data`` to ``path`` atomically: a temporary file in the same folder, fsync, ``os.replace``
    (atomic on POSIX), then fsync of the folder. A full disk or quota removes the temporary file and
    raises `StorageFull` naming ``what``, the path, the bytes needed and free."""
    path = Path(path)
    data = data.encode() if isinstance(data, str) else data
    try:
        atomic_replace(path, lambda f: f.write(data))
    except OSError as err:
        if out_of_space(err):
            raise StorageFull(what, path, len(data), free_bytes(path.parent), space_error_text(err)) from None
        raise


def write_export(study: Study, cells: list[Cell]) -> None:
    """Rewrite the study's CSV export (cells sorted by arm, env, seed; curves likewise), each file
    atomically: a failed write leaves the previous export whole."""
    cells = sorted(cells, key=lambda c: (list(study.arms).index(c.arm), c.env, c.seed))
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, fieldnames=CELL_FIELDS)
    w.writeheader()
    for c in cells:
        d = asdict(c)
        d["study"] = study.name
        w.writerow({k: (round(d[k], 4) if isinstance(d[k], float) and math.isfinite(d[k]) else d[k]) for k in CELL_FIELDS})
    curves = io.StringIO(newline="")
    w = csv.writer(curves)
    w.writerow(CURVE_FIELDS)
    for c in cells:
        for fr, v in c.curve:
            w.writerow([c.arm, c.env, c.seed, int(fr), round(v, 4)])
    atomic_write(study.curves_csv, curves.getvalue(), "the study's curve export")
    atomic_write(study.cells_csv, text.getvalue(), "the study's cell export")


# ----------------------------------------------------------------------------------- scores
def curve_auc(curve, total: float) -> float:
    """Mean of a step-interpolated learning curve ``[(frames, value), ...]`` over ``[0, total]``
    (each value holds from its frame count to the next point; before the first, the first value)."""
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


def final_value(curve, total: float, tail: float = 0.1) -> float:
    """Mean of the curve points in the last ``tail`` fraction of ``total`` frames (else the last point)."""
    pts = [(f, v) for f, v in curve if math.isfinite(v)]
    if not pts:
        return float("nan")
    last = [v for f, v in pts if f >= (1 - tail) * total]
    return sum(last) / len(last) if last else float(pts[-1][1])


def reference_returns(root: Path) -> dict[str, float]:
    """R_ref of the 500k base per game: the mean final return of its longest reference runs (arm
    ``ppo_ewma_lr8x`` of ``experiments/results/minatar/reference_runs.csv``, >= 1M frames)."""
    rows = [r for r in _read(root / "experiments" / "results" / "minatar" / "reference_runs.csv")
            if r["arm"] == "ppo_ewma_lr8x" and int(r["frames"]) >= 1_000_000]
    out = {}
    for game in {r["game"] for r in rows}:
        mine = [r for r in rows if r["game"] == game]
        longest = max(int(r["frames"]) for r in mine)
        finals = [float(r["final_return"]) for r in mine if int(r["frames"]) == longest]
        out[game] = sum(finals) / len(finals)
    return out


def best_returns(study: Study, cells) -> dict[str, tuple[float, str]]:
    """``score: random-best``'s 1 per env: ``(the best mean raw score_ref.metric among
    score_ref.best_of's arms, that arm)``, means over each arm's recorded seeds; envs without a
    recorded cell of those arms are left out."""
    ref = study.score_ref
    means: dict[str, dict[str, list[float]]] = {}
    for c in cells:
        v = cell_value(c, ref.metric)
        if c.arm in ref.best_of and math.isfinite(v):
            means.setdefault(c.env, {}).setdefault(c.arm, []).append(v)
    out = {}
    for env, by_arm in means.items():
        arm = max(by_arm, key=lambda a: (sum(by_arm[a]) / len(by_arm[a]), -ref.best_of.index(a)))
        out[env] = (sum(by_arm[arm]) / len(by_arm[arm]), arm)
    return out


def normalizer(study: Study, cells=None):
    """``(env, raw return) -> score`` by the study's ``score``: raw; minatar (the R_random and R_ref
    constants of `ppo_lightning.envs.minatar_scores`); minatar-500k (R_random the same, R_ref the 500k
    base run 2-4x as long: `REFERENCE_500K`, which `reference_returns` recomputes from the records);
    random-best (the PPO paper's Table 1: per env ``(R - R_random) / (R_best - R_random)``, R_best
    from ``cells``, `best_returns`)."""
    if study.score == "raw":
        return lambda env, r: r
    if study.score == "random-best":
        best = best_returns(study, list(cells.values()) if isinstance(cells, dict) else list(cells or []))
        lo = study.score_ref.random

        def norm_rb(env: str, r: float) -> float:
            if env not in best or best[env][0] == lo[env]:
                return float("nan")  # no best recorded yet: pending
            return (r - lo[env]) / (best[env][0] - lo[env])
        return norm_rb
    if study.score == "minatar":
        return lambda env, r: normalized_return(env_game(env), r)
    ref = REFERENCE_500K

    def norm(env: str, r: float) -> float:
        game = env_game(env)
        if game not in ref:
            raise ValueError(f"score minatar-500k: no R_ref for {game} (experiments/studies/minatar_reference_500k.yaml)")
        lo = RETURN_RANGES[game][0]
        return (r - lo) / (ref[game] - lo)
    return norm
