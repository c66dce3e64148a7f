"""Shared helpers for the paper-figure scripts: one in-process ``ppo-lightning fit`` per run, its
learning curve read back from MLflow, CSV and plot writing.

Normalized return (classic control, documented in docs/experiments/cartpole.md):
    CartPole-v1: R / 500            (the maximum episode return; random play scores ~0.04)
    Acrobot-v1:  (R + 500) / 500    (-500 = never swings up, 0 = instant)
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("PYTHONWARNINGS", "ignore")
warnings.filterwarnings("ignore")
warnings.filterwarnings("default", message=r"(clip fraction|advantage-std)")  # ppo_lightning.training.diagnostics

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RETURN_RANGE = {"CartPole-v1": (0.0, 500.0), "Acrobot-v1": (-500.0, 0.0)}


def normalized(env_id: str, ret: float) -> float:
    lo, hi = RETURN_RANGE[env_id]
    return (ret - lo) / (hi - lo)


# The experiments' base configuration: PPO(-EWMA) on CartPole-v1 at the "default" batch size
# (32 envs x 32 steps = 1024 frames, 4 minibatches of 256, 3 epochs: the paper's shape, scaled down).
def base_args(env_id: str = "CartPole-v1", frames: int = 100_000, seed: int = 0, *, ewma: bool = True,
              num_envs: int = 32, rollout_steps: int = 32) -> list[str]:
    args = [
        "--seed_everything", str(seed),
        "--trainer.max_epochs", "-1",
        "--trainer.enable_progress_bar", "false",
        "--trainer.enable_checkpointing", "false",
        "--trainer.gradient_clip_val", "null",  # no grad clipping (paper); clipping is not batch-size invariant
        "--model.network", '{"name": "mlp", "hidden_sizes": [64, 64], "activation": "tanh"}',
        "--model.objective", "clip",
        "--model.clip_eps", "0.2",
        "--model.lr", "0.001",
        "--model.value_coef", "0.5",
        "--model.entropy_coef", "0.0",
        "--data.env_id", env_id,
        "--data.num_envs", str(num_envs),
        "--data.rollout_steps", str(rollout_steps),
        "--data.num_minibatches", "4",
        "--data.update_epochs", "3",
        "--data.total_frames", str(frames),
        "--data.gamma", "0.99",
        "--data.gae_lambda", "0.95",
        "--data.advantage_norm_span", "1",
        "--data.seed", str(seed),
        "--checkpoint_every", "1000000",
    ]
    if ewma:
        args += ["--model.decoupled", "true", "--model.proximal_com", "4"]
    return args


def finished(cli):
    """``cli`` of a fit that ran to its end; a fit stopped by a signal (SIGTERM, SIGINT, SLURM's requeue
    signal: it returns normally with ``exit_code`` 128 + n) stops the whole sweep with that code, so
    that the stopped run is never recorded as a finished one (a sweep rerun trains it again)."""
    code = getattr(cli, "exit_code", None)
    if code:
        raise SystemExit(code)
    return cli


def run(args: list[str], *, experiment: str, run_name: str, tracking_uri: str, env_id: str,
        run_root: Path, normalize=None, last_metrics: tuple[str, ...] = ()) -> dict:
    """One fit in this process; returns its curve (frames, normalized return) and summary.

    ``normalize``: return -> normalized return (default: `normalized` for ``env_id``).
    ``last_metrics``: MLflow metric keys whose last logged value is returned under ``"last"``."""
    normalize = normalize or (lambda r: normalized(env_id, r))
    from ppo_lightning.run.builder import fit_main

    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    t0 = time.perf_counter()
    cli = finished(fit_main(["fit", *args, "--mlflow.tracking_uri", tracking_uri, "--mlflow.experiment", experiment,
                             "--mlflow.run_name", run_name, "--run_dir", str(run_root / experiment / run_name)]))
    wall = time.perf_counter() - t0
    logger = cli.trainer.logger
    run_id = getattr(logger, "run_id", None)
    if run_id is None or getattr(logger, "failed", False):
        raise RuntimeError(f"MLflow logging failed for {run_name}; cannot read the learning curve back")
    client = logger.experiment
    frames = {m.step: m.value for m in client.get_metric_history(run_id, "frames")}
    rets = {m.step: m.value for m in client.get_metric_history(run_id, "episode/return_mean20")}
    curve = sorted((frames[s], normalize(r)) for s, r in rets.items() if s in frames)
    diag = {}
    for key, name in (("train/clip_fraction", "clip_fraction_mean"), ("diagnostics/adv_std_oscillation",
                                                                       "adv_std_oscillation_max")):
        hist = [m.value for m in client.get_metric_history(run_id, key)]
        if hist:
            diag[name] = sum(hist) / len(hist) if name.endswith("mean") else max(hist)
    elapsed = client.get_metric_history(run_id, "time/elapsed_s")
    train_s = elapsed[-1].value if elapsed else wall  # training time, without start-up
    dm = cli.datamodule
    total = dm.frames
    tail = [r for f, r in curve if f >= 0.9 * total] or [curve[-1][1]]
    final = sum(tail) / len(tail)
    client.log_metric(run_id, "final_normalized_return", final)
    print(f"[{experiment}] {run_name}: final normalized return {final:.3f} ({total} frames, {wall:.0f} s)", flush=True)
    last = {}
    for key in last_metrics:
        hist = client.get_metric_history(run_id, key)
        if hist:
            last[key] = hist[-1].value
    return {"run_name": run_name, "run_id": run_id, "curve": curve, "final": final, "frames": total, "wall_s": wall, "train_s": train_s, **diag,
            "global_step": cli.trainer.global_step, "last": last, "minibatch_size": dm.minibatch_size,
            "iterations": dm.iteration}


def common_parser(description: str, default_frames: int, default_seeds: int) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--seeds", type=int, default=default_seeds, help="number of seeds (0..n-1)")
    p.add_argument("--frames", type=int, default=default_frames, help="environment frames per run")
    p.add_argument("--quick", action="store_true", help="tiny version (smoke test of the pipeline)")
    p.add_argument("--env", default="CartPole-v1", choices=sorted(RETURN_RANGE))
    p.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--run-root", type=Path, default=ROOT / "runs" / "experiments")
    return p


def mean_std(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / max(len(xs) - 1, 1))
    return m, sd


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")


def mean_curve(curves: list[list[tuple[float, float]]], points: int = 60) -> tuple[list[float], list[float]]:
    """Average several (frames, value) curves on a common frame grid (step interpolation)."""
    end = min(c[-1][0] for c in curves)
    grid = [end * (i + 1) / points for i in range(points)]
    out = []
    for g in grid:
        vals = []
        for c in curves:
            v = c[0][1]
            for f, r in c:
                if f > g:
                    break
                v = r
            vals.append(v)
        out.append(sum(vals) / len(vals))
    return grid, out


def plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def save_figure(fig, path: Path) -> Path:
    """Lay out, write the PNG (creating its folder) and say where."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")
    return path


from ppo_lightning.core.hardware import cpu_label  # noqa: E402,F401  (re-exported: figures name their CPU)


# ----------------------------------------------------------------------------------- CSV records and intervals
# (the CSV I/O of the old MinAtar driver, kept for precision_parity.py and procgen/compare.py; studies
# record through ppo_lightning.studies)
from ppo_lightning.studies.records import curve_auc, final_value  # noqa: E402,F401  (re-exported)


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def append_row(path: Path, row: dict, fields: list[str]) -> None:
    """Append ``row``; a CSV of an older layout (other columns) is first rewritten with ``fields``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    if not new:
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
        if header != fields:
            old = read_rows(path)
            with open(path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=fields)
                w.writeheader()
                w.writerows({k: r.get(k, "") for k in fields} for r in old)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        if new:
            w.writeheader()
        w.writerow({k: row.get(k, "") for k in fields})


def record_run(runs_csv: Path, curves_csv: Path, row: dict, curve: list[tuple[float, float]], fields: list[str]) -> None:
    """A finished run: its curve to ``curves_csv``, then its row to ``runs_csv`` (a row means both are complete)."""
    for f, v in curve:
        append_row(curves_csv, {"arm": row["arm"], "game": row["game"], "seed": row["seed"], "frames": int(f),
                                "return": round(v, 4)}, ["arm", "game", "seed", "frames", "return"])
    append_row(runs_csv, row, fields)


def bootstrap_ci(x: list[float]) -> tuple[float, float, float]:
    """``(mean, low, high)`` over seeds: rliable's bootstrap (one environment); nan below 2 seeds."""
    import numpy as np

    from ppo_lightning.studies.analysis import interval_estimates

    x = np.asarray([v for v in x if math.isfinite(v)], dtype=float)
    if x.size < 2:
        return (float(x[0]) if x.size else float("nan")), float("nan"), float("nan")
    return interval_estimates({"x": x[:, None]})["x"]["mean"]


def bootstrap_diff_ci(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """``(mean(a) - mean(b), low, high)``: rliable's bootstrap of independent samples; nan below 2 seeds."""
    import numpy as np

    from ppo_lightning.studies.analysis import difference

    a = np.asarray([v for v in a if math.isfinite(v)], dtype=float)
    b = np.asarray([v for v in b if math.isfinite(v)], dtype=float)
    if a.size < 2 or b.size < 2:
        return float(a.mean() - b.mean()) if a.size and b.size else float("nan"), float("nan"), float("nan")
    return difference(a[:, None], b[:, None])


def save_labelled(fig, path: Path) -> None:
    """Write a figure with this machine's CPU in its corner (machines differ)."""
    fig.text(0.01, 0.005, cpu_label(), fontsize=6)
    save_figure(fig, path)
