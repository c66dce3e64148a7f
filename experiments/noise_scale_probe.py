"""Gradient noise scale at fixed parameters on MinAtar: is the c = 1 minibatch above it? (issue 11)

The batch-size-invariance figure (`minatar_figures.py bsi`) found c = 4 and 16 learning faster per
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
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, write_csv  # noqa: E402
from minatar_figures import CONFIG, EWMA  # noqa: E402

PROBE_STEPS, PROBE_MINIBATCH = 256, 32  # x the config's 64 envs: 16,384 frames per probe rollout


def _fit(args: list[str]):
    from ppo_lightning.cli.fit import fit_main

    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    return fit_main(["fit", "--config", str(CONFIG), *EWMA, "--mlflow.enabled", "false", "--video_every", "null",
                     "--trainer.enable_progress_bar", "false", *args])


def probe(game: str, seed: int, frames: int, rollouts: int, work: Path, steps: int = PROBE_STEPS,
          extra: tuple[str, ...] = ()) -> list[dict]:
    import torch

    from ppo_lightning.data.datamodule import RolloutSource
    from ppo_lightning.training.noise_scale import noise_scale_terms

    cli = _fit(["--seed_everything", str(seed), "--data.seed", str(seed), "--data.env_id", f"minatar:{game}",
                "--data.total_frames", str(frames), "--trainer.enable_checkpointing", "false",
                "--checkpoint_every", "1000000", "--run_dir", str(work / f"{game}-s{seed}-f{frames}"), *extra])
    module, dm = cli.model, cli.datamodule
    frames_trained = dm.frames
    # longer rollouts from the same envs (the reward normalizer keeps a running return per env)
    dm.rollout_steps = steps
    envs = dm.num_envs
    source = RolloutSource(dm, module.network)
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
        flat = source.prepare(source.collect())
        grads = {g: [] for g in groups}
        for mb in flat.split(PROBE_MINIBATCH):
            for g, terms in groups.items():
                loss, _ = module._loss_and_stats(mb, terms)
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
                     "B_simple": tr / g2 if g2 > 0 else float("inf")})
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--games", default="breakout,space_invaders")
    p.add_argument("--at", default="4096,50000,100000", help="frames of training before each probe")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--probe-rollouts", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS / "minatar" / "noise_scale_fixed.csv")
    p.add_argument("--quick", action="store_true", help="seconds-long pipeline check (tiny batches)")
    a = p.parse_args(argv)
    sizes: dict = {}
    if a.quick:
        a.games, a.at, a.seeds, a.probe_rollouts = a.games.split(",")[0], "1024", 1, 1
        sizes = {"steps": 16, "extra": ("--data.num_envs", "16", "--data.rollout_steps", "32")}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for game in a.games.split(","):
            for seed in range(a.seeds):
                for frames in (int(f) for f in a.at.split(",")):
                    for r in probe(game, seed, frames, a.probe_rollouts, Path(tmp), **sizes):
                        rows.append(r)
                        if ":" in r["loss"]:
                            continue
                        print(f"  {game:15s} seed {seed} after {r['frames_trained']:>7d} frames, {r['loss']:6s}: "
                              f"B_simple {r['B_simple']:8.1f} (|G|^2 {r['grad_sq']:.4g}, tr(Sigma) {r['trace_cov']:.4g})",
                              flush=True)
    write_csv(a.out, [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()} for r in rows])
    print("\nB_simple at fixed parameters (median over games and seeds) vs the sweep's minibatches "
          "(c = 1: 512, c = 4: 128, c = 16: 32):")
    for loss in ("policy", "value", "total", *sorted({r["loss"] for r in rows if ":" in r["loss"]})):
        for frames in sorted({r["frames_trained"] for r in rows}):
            vals = [r["B_simple"] for r in rows if r["frames_trained"] == frames and r["loss"] == loss]
            print(f"  {loss:32s} after {frames:>7d} frames: median {np.median(vals):8.1f}  "
                  f"(runs: {', '.join(f'{v:.0f}' for v in vals)})")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
