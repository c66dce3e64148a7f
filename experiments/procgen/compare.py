"""Learning curves of named variants of the short-budget Procgen config, several seeds each.

Each variant is the base config (``experiments/procgen/ppo_easy_short.yaml`` unless ``--config``)
plus CLI overrides; every run is an in-process ``ppo-lightning fit`` logged to MLflow. Writes
``<out>/<name>.csv`` (per run: final normalized return, the mean over the last 10% of frames of the
training-episode return, normalized with the game's constants; ``final_return`` is the same in raw
return; ``auc_normalized_return``, the curve's mean over the run's frames), ``<out>/<name>_curves.csv``
(every run's curve) and ``<out>/<name>.png`` (mean curves). Runs go seed by seed, every variant of a
seed before the next seed (a load change hits the variants alike), and each finished run is written
at once: a rerun of the same command skips the runs already in the CSVs (resumable). With two
variants it prints the seed-bootstrap 95% CI of their difference (first - second) in final and AUC.

    # PPO-EWMA in fp32 against bf16-mixed (--trainer.precision)
    python experiments/procgen/compare.py --name precision --seeds 2 --frames 100000 \\
        --common "--model.decoupled true --model.proximal_com 8" \\
        --variant "fp32=--trainer.precision 32-true" --variant "bf16=--trainer.precision bf16-mixed"
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import ROOT, mean_curve, mean_std, plt, run, save_figure  # noqa: E402
from common import append_row, bootstrap_diff_ci, curve_auc, read_rows  # noqa: E402  (CSV I/O: a file of an older layout is rewritten)

RUN_FIELDS = ["variant", "seed", "frames", "final_normalized_return", "final_return", "auc_normalized_return",
              "clip_fraction_mean", "wall_s", "mlflow_run_id"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "experiments/procgen/ppo_easy_short.yaml")
    p.add_argument("--variant", action="append", required=True, help='"label=--overrides ..." (repeatable)')
    p.add_argument("--common", default="", help="overrides applied to every variant")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--frames", type=int, default=100_000)
    p.add_argument("--name", default="procgen_compare")
    p.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    p.add_argument("--out", type=Path, default=ROOT / "experiments/procgen")
    p.add_argument("--run-root", type=Path, default=ROOT / "runs" / "experiments")
    a = p.parse_args(argv)

    import yaml

    from ppo_lightning.envs.procgen_scores import normalized_return, return_range

    cfg = yaml.safe_load(a.config.read_text())["data"]
    game, mode = cfg["env_id"].split(":", 1)[1], cfg["env_kwargs"]["distribution_mode"]
    r_min, r_max = return_range(game, mode)
    raw = lambda n: r_min + n * (r_max - r_min)  # noqa: E731  (back from normalized)
    variants = [v.split("=", 1) for v in a.variant]
    runs_csv, curves_csv = a.out / f"{a.name}.csv", a.out / f"{a.name}_curves.csv"
    done = {(r["variant"], int(r["seed"])): r for r in read_rows(runs_csv)}
    stored = {}  # a run killed between its curve and its row wrote its curve twice: the last point per frame count
    for r in read_rows(curves_csv):
        stored.setdefault((r["variant"], int(r["seed"])), {})[float(r["frames"])] = float(r["normalized_return"])
    results = []
    for seed in range(a.seeds):
        for label, overrides in variants:
            if (label, seed) in done:  # resumed: this run finished before
                row = done[(label, seed)]
                curve = sorted(stored.get((label, seed), {}).items())
                auc = row.get("auc_normalized_return") or curve_auc(curve, float(row["frames"]))  # older CSVs: no AUC
                results.append({"variant": label, "seed": seed, "final": float(row["final_normalized_return"]),
                                "auc": float(auc), "wall_s": float(row["wall_s"]), "curve": curve})
                continue
            args = ["--config", str(a.config), *shlex.split(a.common), *shlex.split(overrides),
                    "--seed_everything", str(seed), "--data.seed", str(seed), "--data.total_frames", str(a.frames),
                    "--trainer.enable_progress_bar", "false", "--checkpoint_every", "1000000"]
            r = run(args, experiment=f"procgen-{a.name}", run_name=f"{label.replace(' ', '_')}-s{seed}",
                    tracking_uri=a.tracking_uri, env_id=cfg["env_id"], run_root=a.run_root,
                    normalize=lambda ret: normalized_return(game, mode, ret))
            auc = curve_auc(r["curve"], r["frames"])
            results.append({"variant": label, "seed": seed, "auc": auc, **r})
            for f, v in r["curve"]:  # the curve first, the row last: a row means the run is complete
                append_row(curves_csv, {"variant": label, "seed": seed, "frames": f, "normalized_return": round(v, 6)},
                           ["variant", "seed", "frames", "normalized_return"])
            append_row(runs_csv, {
                "variant": label, "seed": seed, "frames": r["frames"], "final_normalized_return": round(r["final"], 4),
                "final_return": round(raw(r["final"]), 3), "auc_normalized_return": round(auc, 4),
                "clip_fraction_mean": round(r.get("clip_fraction_mean", float("nan")), 4),
                "wall_s": round(r["wall_s"], 1), "mlflow_run_id": r["run_id"]}, RUN_FIELDS)
    print(f"wrote {runs_csv} and {curves_csv}")

    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(6.5, 4.5))
    print(f"\nfinal normalized return ({game} {mode}; mean +- sd over {a.seeds} seeds):")
    for label, _ in variants:
        rs = [r for r in results if r["variant"] == label]
        m, sd = mean_std([r["final"] for r in rs])
        print(f"  {label:20s} {m:.4f} +- {sd:.4f} (raw return {raw(m):.2f})   "
              f"wall {mean_std([r['wall_s'] for r in rs])[0]:.0f} s")
        curves = [r["curve"] for r in rs if r["curve"]]  # runs of a CSV written before curves were kept have none
        if curves:
            xs, ys = mean_curve(curves)
            ax.plot(xs, ys, label=f"{label} (final {m:.3f})")
    if len(variants) == 2:  # the difference, seeds resampled per variant
        (la, _), (lb, _) = variants
        for key, name in (("final", "final"), ("auc", "AUC")):
            d, lo, hi = bootstrap_diff_ci([r[key] for r in results if r["variant"] == la],
                                          [r[key] for r in results if r["variant"] == lb])
            print(f"  {la} - {lb}, {name}: {d:+.4f} [{lo:+.4f}, {hi:+.4f}] (95% seed-bootstrap CI, normalized)")
    ax.set_xlabel("environment frames")
    ax.set_ylabel(f"normalized return ({game} {mode}, last 20 episodes)")
    ax.set_title(f"{a.name}: mean of {a.seeds} seeds")
    ax.legend()
    save_figure(fig, a.out / f"{a.name}.png")


if __name__ == "__main__":
    main()
