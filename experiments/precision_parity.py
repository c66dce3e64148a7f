"""Does bf16-mixed learn as 32-true does? (issue 21: ``--trainer.precision``)

MinAtar Breakout and SpaceInvaders at the experiments' base configuration
(``experiments/minatar/ppo.yaml``; PPO, 100k frames per run as the other MinAtar experiments), the
same seeds under ``--trainer.precision 32-true`` and ``bf16-mixed``. Per run: AUC (mean return over
the run's frames) and final return (last 10% of frames), normalized per game
(`ppo_lightning.envs.minatar_scores`); per seed the mean over the games; then the seed-bootstrap
95% CI of the difference bf16 - fp32 (rliable's bootstrap, `experiments/common.py`). Verdict: "same" when the CI lies
within +-0.05 (normalized return) and contains 0; "resolved" when its half-width is <= 0.05.

Resumable: every finished run is a row of ``<out>/parity_runs.csv`` (its curve in
``parity_curves.csv``); a rerun skips those. Runs are interleaved (seed by seed, game by game, both
precisions) so that load changes on a shared machine hit both arms alike; ``wall_s`` per run is the
fit's wall time (1 torch thread per run).

    python experiments/precision_parity.py                       # 2 games x 8 seeds x 2 precisions
    python experiments/precision_parity.py --seeds 2 --frames 20480 --out /tmp/parity   # quick
    python experiments/precision_parity.py --analyze              # the CIs from the CSVs only
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (ROOT, RESULTS, bootstrap_ci, bootstrap_diff_ci, cpu_label, curve_auc, final_value, read_rows,  # noqa: E402
                    record_run, run)

CONFIG = ROOT / "experiments" / "minatar" / "ppo.yaml"
OUT = RESULTS / "precision"
ARMS = {"32-true": ["--trainer.precision", "32-true"], "bf16-mixed": ["--trainer.precision", "bf16-mixed"]}
RUN_FIELDS = ["arm", "game", "seed", "frames", "final_return", "auc_return", "iterations", "wall_s", "train_s",
              "cpu", "args"]
TARGET = 0.05


def base_args(game: str, frames: int, seed: int) -> list[str]:
    return ["--config", str(CONFIG), "--seed_everything", str(seed), "--data.seed", str(seed),
            "--data.env_id", f"minatar:{game}", "--data.total_frames", str(frames), "--data.num_threads", "1",
            "--trainer.enable_checkpointing", "false", "--trainer.enable_progress_bar", "false",
            "--checkpoint_every", "1000000", "--video_every", "null"]


def sweep(games: list[str], seeds: list[int], frames: int, out: Path, tracking_uri: str, run_root: Path) -> None:
    runs_csv, curves_csv = out / "parity_runs.csv", out / "parity_curves.csv"
    done = {(r["arm"], r["game"], int(r["seed"])) for r in read_rows(runs_csv) if int(r["frames"]) >= frames}
    todo = [(s, g, a) for s in seeds for g in games for a in ARMS if (a, g, s) not in done]
    print(f"[parity] {len(todo)} runs to do, {len(done)} already in {runs_csv}", flush=True)
    label = cpu_label()
    for i, (seed, game, arm) in enumerate(todo):
        args = base_args(game, frames, seed) + ARMS[arm]
        r = run(args, experiment="precision-parity", run_name=f"{arm}-{game}-s{seed}", tracking_uri=tracking_uri,
                env_id=f"minatar:{game}", run_root=run_root, normalize=lambda x: x)
        row = {"arm": arm, "game": game, "seed": seed, "frames": r["frames"],
               "final_return": round(final_value(r["curve"], r["frames"]), 4),
               "auc_return": round(curve_auc(r["curve"], r["frames"]), 4), "iterations": r["iterations"],
               "wall_s": round(r["wall_s"], 1), "train_s": round(r["train_s"], 1), "cpu": label,
               "args": json.dumps(args)}
        record_run(runs_csv, curves_csv, row, r["curve"], RUN_FIELDS)
        print(f"[parity] {i + 1}/{len(todo)} {arm} {game} s{seed}: final {row['final_return']} auc {row['auc_return']} "
              f"({row['wall_s']} s)", flush=True)


def analyze(out: Path, games: list[str]) -> list[dict]:
    from ppo_lightning.envs.minatar_scores import normalized_return

    rows = [r for r in read_rows(out / "parity_runs.csv") if r["game"] in games]
    table: dict[str, dict[int, dict[str, tuple[float, float]]]] = {}
    for r in rows:
        g = r["game"]
        table.setdefault(r["arm"], {}).setdefault(int(r["seed"]), {})[g] = (
            normalized_return(g, float(r["auc_return"])), normalized_return(g, float(r["final_return"])))

    def pooled(arm: str, which: int) -> dict[int, float]:
        return {s: float(np.mean([v[which] for v in by.values()])) for s, by in table.get(arm, {}).items()
                if set(by) == set(games)}

    summary = []
    for which, stat in ((0, "auc"), (1, "final")):
        per_arm = {a: pooled(a, which) for a in ARMS}
        for arm, scores in per_arm.items():
            m, lo, hi = bootstrap_ci(list(scores.values()))
            summary.append({"row": arm, "stat": stat, "n_seeds": len(scores), "mean": m, "ci_low": lo, "ci_high": hi,
                            "verdict": ""})
        a, b = per_arm["bf16-mixed"], per_arm["32-true"]
        if len(a) >= 2 and len(b) >= 2:
            d, lo, hi = bootstrap_diff_ci(list(a.values()), list(b.values()))
            resolved = (hi - lo) / 2 <= TARGET
            same = -TARGET <= lo and hi <= TARGET
            verdict = ("no difference beyond +-0.05 (the CI lies inside)" if same else
                       "bf16 worse" if hi < 0 else "bf16 better" if lo > 0 else
                       "no significant difference (the CI contains 0) but the CI reaches beyond +-0.05")
            verdict += f"; half-width {(hi - lo) / 2:.3f} ({'<=' if resolved else '>'} {TARGET})"
            summary.append({"row": "bf16-mixed - 32-true", "stat": stat, "n_seeds": min(len(a), len(b)), "mean": d,
                            "ci_low": lo, "ci_high": hi, "verdict": verdict})
    walls = {arm: [float(r["wall_s"]) for r in rows if r["arm"] == arm] for arm in ARMS}
    cpus = sorted({r.get("cpu", "") for r in rows})
    print(f"[parity] {', '.join(games)}; normalized return; 95% seed-bootstrap CIs; CPU: {'; '.join(cpus)}")
    for s in summary:
        print(f"  {s['row']:22s} {s['stat']:5s} {s['mean']:+.3f} [{s['ci_low']:+.3f}, {s['ci_high']:+.3f}] "
              f"n={s['n_seeds']} {s['verdict']}")
    for arm, w in walls.items():
        if w:
            print(f"  {arm}: mean run wall {np.mean(w):.0f} s over {len(w)} runs (interleaved, 1 thread, loaded machine)")
    if summary:
        path = out / "parity_summary.csv"
        with open(path, "w") as f:
            f.write("row,stat,n_seeds,mean,ci_low,ci_high,verdict\n")
            for s in summary:
                f.write(f"{s['row']},{s['stat']},{s['n_seeds']},{s['mean']:.4f},{s['ci_low']:.4f},{s['ci_high']:.4f},"
                        f"\"{s['verdict']}\"\n")
        print(f"wrote {path}")
    return summary


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--games", default="breakout,space_invaders")
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--frames", type=int, default=100_000)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--tracking-uri", default=None, help="default: sqlite under --out")
    p.add_argument("--run-root", type=Path, default=ROOT / "runs" / "experiments")
    p.add_argument("--analyze", action="store_true", help="only the statistics from the CSVs")
    args = p.parse_args(argv)
    games = [g.strip() for g in args.games.split(",") if g.strip()]
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.analyze:
        uri = args.tracking_uri or f"sqlite:///{args.out / 'mlflow.db'}"
        t0 = time.time()
        sweep(games, list(range(args.seeds)), args.frames, args.out, uri, args.run_root)
        print(f"[parity] sweep {time.time() - t0:.0f} s", flush=True)
    analyze(args.out, games)


if __name__ == "__main__":
    main()
