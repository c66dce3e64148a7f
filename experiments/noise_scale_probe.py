"""Gradient noise scale at fixed parameters on MinAtar: is the c = 1 minibatch above it? (issue 11)

The batch-size-invariance figure (`experiments/studies/minatar_fig23_table5_100k.yaml`) found c = 4 and 16 learning faster per
frame than c = 1 (minibatch 512), while c = 4 and 16 (128, 32) agree. The paper's lr / sqrt(c) rule
assumes the minibatch is below the gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et
al. 2018). The in-run estimate (`ppo_lightning.training.noise_scale.GradientNoiseScale` during training) mixes
successive parameters and does not resolve |G|^2 at c = 1; this script measures B_simple with the
parameters held fixed:

1. train the base PPO-EWMA configuration (c = 1) for F frames (F in ``--at``), same seed as the sweep;
2. with that run's network, EWMA proximal policy and reward normalizer (no further steps), collect
   ``--probe-rollouts`` rollouts of 64 envs x 256 steps = 16,384 frames, compute advantages and
   value targets as training does, and take the gradient of each of the 512 minibatches of 32
   (b_small 32, b_big 16,384), separately for the policy terms (clipped surrogate + entropy) and
   the value term, and their sum (the training loss);
3. B_simple = tr(Sigma) / |G|^2 from the two-batch-size estimator
   (`ppo_lightning.training.noise_scale.noise_scale_terms`), the two terms averaged over the rollouts.

Writes ``results/minatar/noise_scale_fixed.csv`` and prints a table.

    python experiments/noise_scale_probe.py --games breakout,space_invaders --at 4096,50000,100000 --seeds 2
    python experiments/noise_scale_probe.py --quick --out /tmp/ns.csv   # seconds-long pipeline check
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np
from lightning.pytorch.callbacks import Callback

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, finished, write_csv  # noqa: E402

CONFIG = ROOT / "experiments" / "minatar" / "ppo.yaml"
EWMA = ["--model.decoupled", "true", "--model.proximal_com", "8"]  # PPO-EWMA, proximal COM 8 gradient steps

PROBE_STEPS, PROBE_MINIBATCH = 256, 32  # x the config's 64 envs: 16,384 frames per probe rollout


def _fit(args: list[str]):
    from ppo_lightning.run.builder import fit_main

    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    return finished(fit_main(["fit", "--config", str(CONFIG), *EWMA, "--mlflow.enabled", "false", "--video_every", "null",
                              "--trainer.enable_progress_bar", "false", *args]))


def _run_args(game: str, seed: int, frames: int, work: Path, extra: tuple[str, ...]) -> list[str]:
    return ["--seed_everything", str(seed), "--data.seed", str(seed), "--data.env_id", f"minatar:{game}",
            "--data.total_frames", str(frames), "--trainer.enable_checkpointing", "false",
            "--checkpoint_every", "1000000", "--run_dir", str(work / f"{game}-s{seed}-f{frames}"), *extra]


def probe(game: str, seed: int, frames: int, rollouts: int, work: Path, steps: int = PROBE_STEPS,
          extra: tuple[str, ...] = ()) -> list[dict]:
    cli = _fit(_run_args(game, seed, frames, work, extra))
    return probe_now(cli.model, cli.datamodule, game, seed, rollouts, steps)


class AlongProbe(Callback):
    """Lightning callback (issue 19): probe B_simple at fixed parameters at several points of ONE
    training run (after the iteration that reaches each of ``at`` frames) instead of one run per
    point. The probe's rollouts must not touch the run: the data module's frame count, episode
    statistics, reward normalizer (per-env running returns) and advantage moments are copied before
    and restored after each probe, so the run trains on as if unprobed (except the global RNG stream)."""

    def __init__(self, at: list[int], game: str, seed: int, rollouts: int, steps: int, sink) -> None:
        self.todo, self.game, self.seed, self.rollouts, self.steps, self.sink = sorted(at), game, seed, rollouts, steps, sink

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        import torch

        dm = trainer.datamodule
        if not self.todo or dm.frames < self.todo[0]:
            return
        while self.todo and dm.frames >= self.todo[0]:
            self.todo.pop(0)
        was_training = pl_module.training
        try:
            with torch.enable_grad():
                self.sink(probe_now(pl_module, dm, self.game, self.seed, self.rollouts, self.steps))
        finally:
            pl_module.train(was_training)


def probe_now(module, dm, game: str, seed: int, rollouts: int, steps: int = PROBE_STEPS) -> list[dict]:
    """B_simple of the module's current parameters from ``rollouts`` fresh rollouts of
    ``dm.num_envs x steps`` frames (new envs seeded as the run's; the run's normalizers)."""
    import time

    import torch

    from ppo_lightning.data.seed_state import RolloutProgress
    from ppo_lightning.data.source import RolloutSource
    from ppo_lightning.training.noise_scale import noise_scale_terms

    t0 = time.perf_counter()
    frames_trained = dm.frames
    # longer rollouts: the probe's own collector takes dm.num_envs x steps frames per rollout, on copies
    # of the run's states (its normalizers), so the run's own go on untouched
    config = dataclasses.replace(dm.config, rollout_steps=steps)
    envs = dm.num_envs
    source = RolloutSource(config, copy.deepcopy(dm.states), module.network, RolloutProgress(frames=dm.frames))
    named = [(n, p) for n, p in module.network.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    # Adam normalizes each coordinate by its own gradient scale: also the policy terms' B_simple per
    # parameter tensor (slices of the flat gradient), since a tensor whose gradient is resolved from
    # its noise at the minibatch (B_simple below it) gets sign-like Adam steps that do not shrink with b.
    bounds, offset = {}, 0
    for n, p in named:
        bounds[n] = (offset, offset + p.numel())
        offset += p.numel()
    groups = {"policy": ("loss_objective", "loss_entropy"), "value": ("loss_critic",)}
    sums = {g: [0.0, 0.0] for g in (*groups, "total", *(f"policy:{n}" for n in bounds))}
    module.eval()  # no dropout / batch norm here; keeps the network as the rollout saw it
    for _ in range(rollouts):
        flat = source.prepare(source.rollouts()[0])
        grads = {g: [] for g in groups}
        for mb in flat.split(PROBE_MINIBATCH):
            for g, terms in groups.items():
                loss, _ = module.loss_and_stats(mb, terms)
                gs = torch.autograd.grad(loss, params, allow_unused=True)
                grads[g].append(torch.cat([(x if x is not None else torch.zeros_like(p)).reshape(-1)
                                           for x, p in zip(gs, params)]).double())
        stacked = {g: torch.stack(v) for g, v in grads.items()}
        stacked["total"] = stacked["policy"] + stacked["value"]
        for n, (lo, hi) in bounds.items():
            stacked[f"policy:{n}"] = stacked["policy"][:, lo:hi]
        for g, v in stacked.items():
            g2, tr = noise_scale_terms(v, PROBE_MINIBATCH)
            sums[g][0] += g2
            sums[g][1] += tr
    source.env.close()
    rows = []
    for g, (g2, tr) in sums.items():
        g2, tr = g2 / rollouts, tr / rollouts
        rows.append({"game": game, "seed": seed, "frames_trained": frames_trained, "loss": g, "rollouts": rollouts,
                     "b_small": PROBE_MINIBATCH, "b_big": envs * steps, "grad_sq": g2, "trace_cov": tr,
                     "B_simple": tr / g2 if g2 > 0 else float("inf"), "lr": module.hparams.get("lr", ""),
                     "probe_s": round(time.perf_counter() - t0, 1)})
    return rows


def along(a, sizes: dict) -> list[dict]:
    """``--along``: one training run per (game, seed) to the largest of ``--at`` frames, probed after
    the iterations that reach each of them; rows are appended to ``--out`` as each run finishes, and
    a rerun skips the (game, seed, lr) already there (resumable)."""
    import csv

    from ppo_lightning.run.builder import fit_main

    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    at = sorted(int(f) for f in a.at.split(","))
    lr = "" if a.lr is None else float(a.lr)
    old = list(csv.DictReader(open(a.out))) if a.out.exists() else []
    done = {(r["game"], int(r["seed"])) for r in old if r.get("lr", "") != "" and float(r["lr"]) == float(lr or 5e-4)}
    extra = (*sizes.get("extra", ()), *(() if a.lr is None else ("--model.lr", str(a.lr))))
    rows = list(old)
    with tempfile.TemporaryDirectory() as tmp:
        for game in a.games.split(","):
            for seed in range(a.first_seed, a.first_seed + a.seeds):
                if (game, seed) in done:
                    print(f"  {game} seed {seed}: in {a.out}, skipped", flush=True)
                    continue
                got: list[dict] = []

                def sink(rs, game=game, seed=seed):
                    got.extend(rs)
                    for r in rs:
                        if ":" not in r["loss"]:
                            print(f"  {game:15s} seed {seed} after {r['frames_trained']:>7d} frames, {r['loss']:6s}: "
                                  f"B_simple {r['B_simple']:10.1f} ({r['probe_s']} s)", flush=True)

                cb = AlongProbe(at, game, seed, a.probe_rollouts, sizes.get("steps", PROBE_STEPS), sink)
                cli = finished(fit_main(["fit", "--config", str(CONFIG), *EWMA, "--mlflow.enabled", "false", "--video_every",
                                         "null", "--trainer.enable_progress_bar", "false",
                                         *_run_args(game, seed, at[-1], Path(tmp), extra)], extra_callbacks=[cb]))
                if cb.todo:  # the last point: training ended before on_train_epoch_end saw it
                    sink(probe_now(cli.model, cli.datamodule, game, seed, a.probe_rollouts, sizes.get("steps", PROBE_STEPS)))
                ret = cli.datamodule.states[0].episodes.mean_return(20)
                for r in got:
                    r["final_return_mean20"] = round(float(ret), 4)
                rows += got
                write_csv(a.out, [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()} for r in rows])
    return [r for r in rows if r.get("lr", "") != "" and float(r["lr"]) == float(lr or 5e-4)]


def plot_along(rows: list[dict], path: Path) -> None:
    """B_simple (policy, value, total) against frames trained, one panel per game, with the
    minibatch of each c (512 / c) as horizontal lines: below a line, that c's minibatch is above B_simple."""
    from common import plt
    from common import save_labelled

    games = list(dict.fromkeys(r["game"] for r in rows))
    if not games:
        return
    pyplot = plt()
    fig, axes = pyplot.subplots(1, len(games), figsize=(3.6 * len(games), 3.6), sharey=True, squeeze=False)
    for ax, game in zip(axes[0], games):
        for loss in ("policy", "value", "total"):
            for seed in sorted({r["seed"] for r in rows if r["game"] == game}):
                pts = sorted((int(r["frames_trained"]), float(r["B_simple"])) for r in rows
                             if r["game"] == game and r["loss"] == loss and r["seed"] == seed)
                x = [f for f, b in pts if np.isfinite(b)]
                y = [b for f, b in pts if np.isfinite(b)]
                ax.plot(x, y, marker="o", label=f"{loss} s{seed}")
        for c in (1, 4, 16, 64):
            ax.axhline(512 / c, color="grey", lw=0.6, ls="--")
            ax.text(0, 512 / c, f" c={c}: {512 // c}", fontsize=6, va="bottom", color="grey")
        ax.set(yscale="log", xlabel="frames trained", title=f"{game} (lr {rows[0].get('lr', '')})")
        ax.xaxis.set_major_formatter(pyplot.FuncFormatter(lambda x, _: f"{x / 1e3:.0f}k"))
    axes[0][0].set_ylabel("B_simple at fixed parameters")
    axes[0][-1].legend(fontsize=6)
    save_labelled(fig, path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--games", default="breakout,space_invaders")
    p.add_argument("--at", default="4096,50000,100000", help="frames of training before each probe")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--probe-rollouts", type=int, default=2)
    p.add_argument("--along", action="store_true",
                   help="one run per game and seed, probed at each --at point (issue 19); resumable")
    p.add_argument("--lr", type=float, default=None, help="Adam lr of the base (default: the config's 5e-4)")
    p.add_argument("--out", type=Path, default=None,
                   help="default results/minatar/noise_scale_fixed.csv (--along: noise_scale_along.csv)")
    p.add_argument("--quick", action="store_true", help="seconds-long pipeline check (tiny batches)")
    a = p.parse_args(argv)
    a.out = a.out or RESULTS / "minatar" / ("noise_scale_along.csv" if a.along else "noise_scale_fixed.csv")
    sizes: dict = {}
    if a.quick:
        a.games, a.seeds, a.probe_rollouts = a.games.split(",")[0], 1, 1
        a.at = "1024,2048" if a.along else "1024"
        sizes = {"steps": 16, "extra": ("--data.num_envs", "16", "--data.rollout_steps", "32")}
    if a.along:
        rows = along(a, sizes)
        for r in rows:
            r["frames_trained"], r["B_simple"] = int(r["frames_trained"]), float(r["B_simple"])
        # one plot per lr (the CSV keeps every lr's rows): noise_scale_along_lr0.004.png
        plot_along(rows, a.out.with_suffix(".png") if a.lr is None else a.out.with_name(f"{a.out.stem}_lr{a.lr:g}.png"))
    else:
        rows = []
        extra = tuple(sizes.pop("extra", ())) + (() if a.lr is None else ("--model.lr", str(a.lr)))
        with tempfile.TemporaryDirectory() as tmp:
            for game in a.games.split(","):
                for seed in range(a.first_seed, a.first_seed + a.seeds):
                    for frames in (int(f) for f in a.at.split(",")):
                        for r in probe(game, seed, frames, a.probe_rollouts, Path(tmp), extra=extra, **sizes):
                            rows.append(r)
                            if ":" in r["loss"]:
                                continue
                            print(f"  {game:15s} seed {seed} after {r['frames_trained']:>7d} frames, {r['loss']:6s}: "
                                  f"B_simple {r['B_simple']:8.1f} (|G|^2 {r['grad_sq']:.4g}, tr(Sigma) {r['trace_cov']:.4g})",
                                  flush=True)
        write_csv(a.out, [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()} for r in rows])
    print("\nB_simple at fixed parameters (median over games and seeds) vs the minibatches "
          "(c = 1: 512, c = 4: 128, c = 16: 32, c = 64: 8):")
    for loss in ("policy", "value", "total", *sorted({r["loss"] for r in rows if ":" in r["loss"]})):
        for frames in sorted({r["frames_trained"] for r in rows}):
            vals = [r["B_simple"] for r in rows if r["frames_trained"] == frames and r["loss"] == loss]
            if vals:
                print(f"  {loss:32s} after {frames:>7d} frames: median {np.median(vals):8.1f}  "
                      f"(runs: {', '.join(f'{v:.0f}' for v in vals)})")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
