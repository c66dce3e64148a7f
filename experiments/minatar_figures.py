"""The paper's four findings on MinAtar (issue 11): resumable sweeps with seed-bootstrap CIs.

    python experiments/minatar_figures.py random                 # R_random per game (uniform random policy)
    python experiments/minatar_figures.py reference              # R_ref: the project's longer PPO run per game
    python experiments/minatar_figures.py ewma       [opts]      # Fig. 4: PPO vs PPO-EWMA
    python experiments/minatar_figures.py bsi        [opts]      # Fig. 2/3 + Table 5: batch-size invariance, ablations
    python experiments/minatar_figures.py staleness  [opts]      # Fig. 1: staleness k x {behavior, proximal, decoupled}
    python experiments/minatar_figures.py klcom      [opts]      # Fig. 18: KL beta x proximal COM
    python experiments/minatar_figures.py lr500k     [opts]      # issue 19: lr sweep at c = 1 for 500k-frame runs
    python experiments/minatar_figures.py ewma500k   [opts]      # issue 19: Fig. 4 at the 500k base
    python experiments/minatar_figures.py bsi500k    [opts]      # issue 19: Fig. 2/3 at the 500k base, c = 1..64
    python experiments/minatar_figures.py <figure> --analyze     # tables and plots from the CSVs only
    options: --games breakout,space_invaders --seeds 4 [--first-seed 0] --frames 250000 --arms a,b --quick --mix

Base configuration: ppo_lightning/configs/minatar/ppo.yaml (MinAtar CNN, 64 envs x 64 steps, 8 minibatches,
3 epochs, Adam 5e-4, reward normalization on, per-batch advantage normalization), with the
importance-ratio cap 100 (``model.max_importance_ratio``) in every arm, as the reference code's
``imp_samp_max`` default. PPO-EWMA: decoupled objective, proximal COM 8 gradient steps.

Resumable: every finished run appends one row to ``<out>/<figure>_runs.csv`` (with its exact CLI
arguments as JSON) and its learning curve to ``<out>/<figure>_curves.csv``; a rerun skips the runs
already there, so the sweep can be stopped at any time and continued by running it again. By
default an arm's consecutive seeds train as one vectorized group (``fit --seeds S``, issue 18;
`sweep_grouped`: one row per seed all the same, from each seed's own MLflow run); arms that cannot be
grouped (PPG, staleness) and ``--one-by-one`` go seed by seed (all games and arms of seed 0, then
seed 1, ...), so a stopped sweep is balanced. A group (a c = 64 group of 8 seeds trains for ~2 hours)
also resumes *within* its run: it checkpoints every `CHECKPOINT_FRAMES` frames per seed into its run
folder, and a rerun of the sweep continues a killed or stopped group from its last checkpoint
(bitwise, in the same MLflow runs) when the group's arguments are the ones that wrote it; the
checkpoints are deleted once the group's rows are written. ``--mix``: the arms that differ only in the
lr, the EWMA's center of mass (or PPO), the advantage span and Adam's betas - Table 5's ablations at one c - train as
one group per game whose members carry their own settings (`sweep_mixed`; 1.2-1.6x the frames per core
of the groups of 8 they replace at c = 64); the rows are the same.

Analysis (``--analyze``, also run at the end of a sweep): normalized return per game
``(R - R_random) / (R_ref - R_random)`` (`ppo_lightning.envs.minatar_scores`); per run the
normalized AUC and the final normalized return; per seed the mean over games; the mean over seeds
with a 95% percentile-bootstrap CI; the figure's headline comparison as a difference with its CI;
and the seeds per arm that the measured sd says a CI half-width of 0.05 needs
(`experiments/stats.py`). Writes ``<figure>_summary.csv`` and ``<figure>.png`` (mean curves with
95% bootstrap bands).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, RESULTS, cpu_label, finished, plt, run, save_figure, write_csv  # noqa: E402
from stats import bootstrap_ci, bootstrap_diff_ci, curve_auc, final_value, seeds_needed, t_ci, welch_diff_ci  # noqa: E402

CONFIG = ROOT / "ppo_lightning" / "configs" / "minatar" / "ppo.yaml"
OUT = RESULTS / "minatar"
GAMES = ("asterix", "breakout", "freeway", "seaquest", "space_invaders")
EWMA = ["--model.decoupled", "true", "--model.proximal_com", "8"]
# PPG and PPG-EWMA (ppo_lightning/configs/minatar/ppg.yaml, ppg_ewma.yaml: E_pi = 1, n_pi 4, proximal COM 4)
PPG = ["--config", str(ROOT / "ppo_lightning" / "configs" / "minatar" / "ppg.yaml")]
PPG_EWMA = PPG + ["--config", str(ROOT / "ppo_lightning" / "configs" / "minatar" / "ppg_ewma.yaml")]
BASE_LR = 5e-4
BF16 = ["--trainer.precision", "bf16-mixed"]  # pinned where `auto` would now pick 32-true (minibatch < 128)
FP32 = ["--trainer.precision", "32-true"]  # pinned: the same numbers on a CPU with or without bf16
LR500K = 8 * BASE_LR  # the c = 1 lr picked by the lr500k sweep for 500k-frame runs (issue 19; docs/experiments/minatar-500k.md)
MIN_SEEDS_FOR_CI = 5
# issue 19: the 500k figures' R_ref is the 500k base (PPO-EWMA, c = 1, LR500K) run 4x as long
LR = f"lr{LR500K / BASE_LR:g}x"  # the 500k arms' name suffix
REF500K_ARM = f"ppo_ewma_{LR}"
REF500K_FRAMES, REF500K_MIN_FRAMES = 2_000_000, 1_000_000

# ----------------------------------------------------------------------------------- figures
# figure -> {arm: extra CLI args}; "reference" arm names the comparison's baseline.


# Table 5's ablations: the --scale rules each one keeps (the one left out is the ablated rule)
RULES_WITHOUT = {"no_lr": "com,adv_span", "no_com": "lr,adv_span", "no_adv_span": "lr,com"}
ABLATIONS = (*RULES_WITHOUT, "ppo")


def _scaled_arms(c: int, lr: float | None = None, kinds: tuple[str, ...] = ("all", *ABLATIONS)) -> dict[str, list[str]]:
    """PPO-EWMA at scale c with all rules ("all") and Table 5's ablations: each rule removed, and PPO
    (no EWMA; lr and span scaled). ``lr``: the c = 1 base's lr when it is not the config's (the arm
    names then end in ``_lr{lr / BASE_LR}x``)."""
    base = [] if lr is None else ["--model.lr", str(lr)]
    suffix = "" if lr is None else f"_lr{lr / BASE_LR:g}x"
    scale = ["--scale", str(c)]
    args = {"all": EWMA + base + scale, "ppo": base + scale + ["--scale_rules", "lr,adv_span"],
            **{k: EWMA + base + scale + ["--scale_rules", rules] for k, rules in RULES_WITHOUT.items()}}
    return {f"c{c}_{k}{suffix}": args[k] for k in kinds}


def _bsi_arms() -> dict[str, list[str]]:
    arms = {f"c{c}_all": EWMA + ["--scale", str(c)] for c in (1, 4, 16)}
    for c in (4, 16):  # each rule's ablation at c = 4 and 16 (issue 11, item 3)
        arms |= _scaled_arms(c, kinds=ABLATIONS)
    # Diagnostic for c = 1 vs 4: above the noise scale Adam's step does not shrink with the minibatch,
    # so c times the steps at lr / sqrt(c) move the policy sqrt(c) times further per frame. If that is
    # why c = 4 learns faster, c = 1 with twice the lr should match c = 4.
    for k in (2, 4, 8):  # and the lr sweep at c = 1 for this budget: where does a larger step stop helping?
        arms[f"c1_lr{k}x"] = EWMA + ["--model.lr", str(k * BASE_LR)]
    # Diagnostic (a hypothesis, refuted in docs/experiments/minatar.md): Adam's second-moment horizon
    # 1 / (1 - beta2) = 1000 steps is longer than a c = 1 run (600 steps), so its v keeps the large
    # early gradients all run long; at c = 4, 16 (2352, 9384 steps) it forgets them. The optional rule
    # betas ** (1/c) keeps the horizon in frames: with it c = 4 and 16 remember as c = 1 does; and
    # c = 1 with beta2 0.99 forgets as c >= 4 do.
    for c in (4, 16):
        arms[f"c{c}_all_betas"] = EWMA + ["--scale", str(c), "--scale_adam_betas", "true"]
    arms["c1_beta2_0.99"] = EWMA + ["--model.adam_betas", "[0.9, 0.99]"]
    # The same figure from larger base lrs (the c = 1 arms are c1_lr2x, c1_lr8x): from 1e-3 all rules at
    # c = 4, 16 and Table 5's ablations at c = 4; from 4e-3 all rules and no lr rule at c = 4.
    arms |= _scaled_arms(4, 2 * BASE_LR) | _scaled_arms(16, 2 * BASE_LR, kinds=("all",))
    arms |= _scaled_arms(4, 8 * BASE_LR, kinds=("all", "no_lr"))
    for c in (1, 4, 16):  # PPG-EWMA with all rules (n_pi * c as well)
        arms[f"c{c}_ppg_ewma"] = PPG_EWMA + ["--scale", str(c)]
    return arms


def _bsi500k_arms() -> dict[str, list[str]]:
    """Fig. 2/3 at the 500k base (all rules, c = 1..64), Table 5 at c = 16 and 64 (issue 19, item 3),
    and c = 4, 16 from half the base lr (`LR500K` / 2): at the full lr the clip fraction rose with c
    (0.11-0.13 at c = 1, 0.18-0.20 at c = 16), so does a smaller step close the gap to c = 1?
    c >= 16 pin bf16-mixed: the first runs there (and every arm here) ran with ``auto`` when it meant
    bf16-mixed on this AMX CPU at any minibatch; ``auto`` is 32-true below 128 samples since."""
    arms = {}
    for c in (1, 4, 16, 64):
        kinds = ("all", *ABLATIONS) if c >= 16 else ("all",)
        arms |= {name: args + (BF16 if c >= 16 else []) for name, args in _scaled_arms(c, LR500K, kinds=kinds).items()}
    for c in (4, 16):
        arms |= {name: args + (BF16 if c >= 16 else []) for name, args in _scaled_arms(c, LR500K / 2, kinds=("all",)).items()}
    # Why c = 64 falls behind c = 16 (same clip fraction): Adam's horizons count steps, and c = 64 takes 64x
    # c = 1's steps per frame; the optional rule betas ** (1/c) keeps them in frames (at 100k frames it
    # closed ~40% of the c = 4 - c = 1 gap)
    for c in (16, 64):
        arms[f"c{c}_all_betas_{LR}"] = EWMA + ["--model.lr", str(LR500K), "--scale", str(c), "--scale_adam_betas", "true"] + BF16
    # Table 5 at c = 64 in 32-true, the all-rules arm included (session 14: on an AVX2 host bf16-mixed ran this
    # group 1.9-2.6x slower): each ablation is compared with all rules in its own precision, and c64_all_{LR}_fp32
    # against the bf16-mixed c64_all_{LR} measures precision's effect at minibatch 8
    arms |= {f"{name}_fp32": args + FP32 for name, args in _scaled_arms(64, LR500K).items()}
    # and at c = 16 (minibatch 32) all rules in 32-true against the bf16-mixed arm: may an AVX2 host run the
    # remaining c >= 16 arms in 32-true and compare them with the bf16-mixed ones?
    arms |= {f"{name}_fp32": args + FP32 for name, args in _scaled_arms(16, LR500K, kinds=("all",)).items()}
    # PPG-EWMA with all rules (n_pi x c too; vectorized groups since session 11); c = 1 is ewma500k's ppg_ewma arm
    for c in (4, 16, 64):
        arms[f"c{c}_ppg_ewma_{LR}"] = PPG_EWMA + ["--model.lr", str(LR500K), "--scale", str(c)] + (BF16 if c >= 16 else [])
    # and c = 4 from half the base lr: PPG-EWMA's c = 4 led c = 1 too, with a higher clip fraction; does the
    # half-lr test that closed PPO-EWMA's gap close it here as well?
    arms[f"c4_ppg_ewma_lr{LR500K / 2 / BASE_LR:g}x"] = PPG_EWMA + ["--model.lr", str(LR500K / 2), "--scale", "4"]
    return arms


def _staleness_arms() -> dict[str, list[str]]:
    arms = {"k0": []}
    for k in (1, 2, 4, 8):
        for mode in ("behavior", "proximal", "decoupled"):
            extra = ["--model.decoupled", "true"] if mode == "decoupled" else []
            arms[f"k{k}_{mode}"] = extra + ["--data.staleness", str(k), "--data.staleness_mode", mode]
    return arms


def _klcom_arms() -> dict[str, list[str]]:
    arms = {}
    for beta in (0.1, 1.0, 10.0):
        for com in (1, 8, 64):
            # the reference code's KL form, 0.5 (log pi - log pi_prox)^2 on the taken action
            arms[f"beta{beta:g}_com{com}"] = ["--model.objective", "kl", "--model.kl_beta", f"{beta:g}",
                                              "--model.kl_form", "sq_logratio",
                                              "--model.decoupled", "true", "--model.proximal_com", str(com)]
    return arms


FIGURES = {
    "ewma": {"arms": {"ppo": [], "ppo_ewma": EWMA, "ppg": PPG, "ppg_ewma": PPG_EWMA},
             "compare": [("ppo_ewma", "ppo"), ("ppg_ewma", "ppg")]},
    # c1_all / c1_ppg_ewma are the ewma figure's ppo_ewma / ppg_ewma runs (same CLI but "--scale 1", a
    # no-op): their runs are borrowed
    "bsi": {"arms": _bsi_arms(), "borrow": {"c1_all": ("ewma", "ppo_ewma"), "c1_ppg_ewma": ("ewma", "ppg_ewma")},
            "compare": [("c4_all", "c1_all"), ("c16_all", "c1_all"), ("c16_all", "c4_all"),
                        *[(f"c{c}_{a}", f"c{c}_all") for c in (4, 16) for a in ABLATIONS],
                        ("c4_all", "c1_lr2x"), ("c1_lr2x", "c1_all"),
                        ("c4_all_betas", "c1_all"), ("c16_all_betas", "c1_all"), ("c16_all_betas", "c4_all_betas"),
                        ("c4_all", "c1_beta2_0.99"), ("c1_beta2_0.99", "c1_all"),
                        ("c1_lr4x", "c1_lr2x"), ("c1_lr8x", "c1_lr4x"),
                        ("c4_all_lr8x", "c1_lr8x"), ("c4_no_lr_lr8x", "c4_all_lr8x"),
                        ("c4_all_lr2x", "c1_lr2x"), ("c16_all_lr2x", "c1_lr2x"), ("c16_all_lr2x", "c4_all_lr2x"),
                        *[(f"c4_{a}_lr2x", "c4_all_lr2x") for a in ABLATIONS],
                        ("c4_ppg_ewma", "c1_ppg_ewma"), ("c16_ppg_ewma", "c1_ppg_ewma"), ("c16_ppg_ewma", "c4_ppg_ewma")]},
    # k0 is the ewma figure's ppo run (same CLI): borrowed
    "staleness": {"arms": _staleness_arms(), "borrow": {"k0": ("ewma", "ppo")},
                  "compare": [(f"k{k}_{m}", "k0") for k in (1, 2, 4, 8) for m in ("behavior", "proximal", "decoupled")]
                  + [(f"k{k}_decoupled", f"k{k}_{m}") for k in (1, 2, 4, 8) for m in ("behavior", "proximal")]},
    # Fig. 18: the effect of the anchor's age at each beta, and of beta at each age
    "klcom": {"arms": _klcom_arms(),
              "compare": [(f"beta{b:g}_com64", f"beta{b:g}_com1") for b in (0.1, 1.0, 10.0)]
              + [(f"beta10_com{c}", f"beta0.1_com{c}") for c in (1, 8, 64)]},
    # R_ref: "ppo" is the 303k-frame PPO reference of issue 11 (used by minatar_scores); issue 19 adds
    # longer runs of the 500k base (PPO-EWMA at LR500K) for the games PPO barely learned in 300k frames
    "reference": {"arms": {"ppo": [], f"ppo_ewma_lr{LR500K / BASE_LR:g}x": EWMA + ["--model.lr", str(LR500K)]},
                  "compare": []},
    # issue 19, item 4: the c = 1 base (PPO-EWMA, all rules = bsi's c1_all) tuned for 500k-frame runs:
    # lr 1e-3 .. 8e-3 (the 100k sweep, bsi's c1_lr{2,4,8}x, found no optimum up to 4e-3)
    "lr500k": {"arms": {f"c1_lr{k}x": EWMA + ["--model.lr", str(k * BASE_LR)] for k in (2, 4, 8, 16)},
               "compare": [("c1_lr4x", "c1_lr2x"), ("c1_lr8x", "c1_lr4x"), ("c1_lr16x", "c1_lr8x"),
                           ("c1_lr16x", "c1_lr4x")]},
    # issue 19, items 2 and 4: Fig. 2/3 at 500k frames from the tuned base (LR500K at c = 1; c = 1 is the
    # lr500k figure's arm, borrowed): PPO-EWMA, all rules, c = 4, 16 (and 64: 1 env, minibatch 8)
    # issue 19, item 4: Fig. 4 at the 500k base (c = 1, LR500K): PPO vs PPO-EWMA (borrowed from lr500k's
    # arm of LR500K, the same CLI) and PPG vs PPG-EWMA at the same lr
    "ewma500k": {"arms": {f"ppo_{LR}": ["--model.lr", str(LR500K)], f"ppo_ewma_{LR}": EWMA + ["--model.lr", str(LR500K)],
                          f"ppg_{LR}": PPG + ["--model.lr", str(LR500K)],
                          f"ppg_ewma_{LR}": PPG_EWMA + ["--model.lr", str(LR500K)]},
                 "borrow": {f"ppo_ewma_{LR}": ("lr500k", f"c1_{LR}")}, "normalize": "500k",
                 "compare": [(f"ppo_ewma_{LR}", f"ppo_{LR}"), (f"ppg_ewma_{LR}", f"ppg_{LR}")]},
    "bsi500k": {"normalize": "500k", "arms": _bsi500k_arms(),
                # c = 1 of Breakout/SpaceInvaders from lr500k, of Asterix/Seaquest from ewma500k (same CLI)
                "borrow": {f"c1_all_lr{LR500K / BASE_LR:g}x": [("lr500k", f"c1_lr{LR500K / BASE_LR:g}x"),
                                                                ("ewma500k", f"ppo_ewma_{LR}")],
                           f"c1_ppg_ewma_{LR}": ("ewma500k", f"ppg_ewma_{LR}")},
                "compare": [(f"c{a}_all_{LR}", f"c{b}_all_{LR}") for a, b in ((4, 1), (16, 1), (16, 4), (64, 16), (64, 1))]
                # Table 5 at small batch: each rule removed, and PPO without EWMA, against all rules
                + [(f"c{c}_{k}_{LR}", f"c{c}_all_{LR}") for c in (16, 64) for k in ABLATIONS]
                + [(f"c64_{k}_{LR}_fp32", f"c64_all_{LR}_fp32") for k in ABLATIONS] + [(f"c{c}_all_{LR}_fp32", f"c{c}_all_{LR}") for c in (16, 64)]
                # half the base lr at c = 4, 16 against c = 1 (the clip fraction rose with c at the full lr)
                + [(f"c{c}_all_lr{LR500K / 2 / BASE_LR:g}x", f"c1_all_{LR}") for c in (4, 16)]
                + [(f"c{c}_all_betas_{LR}", f"c{c}_all_{LR}") for c in (16, 64)] + [(f"c64_all_betas_{LR}", f"c16_all_betas_{LR}")]
                # Fig. 2/3 for PPG-EWMA
                + [(f"c{a}_ppg_ewma_{LR}", f"c{b}_ppg_ewma_{LR}") for a, b in ((4, 1), (16, 1), (16, 4), (64, 16), (64, 1))]
                + [(f"c4_ppg_ewma_lr{LR500K / 2 / BASE_LR:g}x", f"c{c}_ppg_ewma_{LR}") for c in (1, 4)]},
}
QUICK_ARMS = {"ewma": "ppo,ppo_ewma", "bsi": "c1_all,c4_all,c4_no_lr", "staleness": "k0,k2_behavior,k2_decoupled",
              "klcom": "beta1_com8", "reference": "ppo", "lr500k": "c1_lr4x",
              "bsi500k": f"c4_all_lr{LR500K / BASE_LR:g}x", "ewma500k": f"ppo_{LR}"}


def base_args(game: str, frames: int, seed: int) -> list[str]:
    return ["--config", str(CONFIG), "--seed_everything", str(seed), "--data.seed", str(seed),
            "--data.env_id", f"minatar:{game}", "--data.total_frames", str(frames),
            "--trainer.enable_checkpointing", "false", "--trainer.enable_progress_bar", "false",
            "--model.max_importance_ratio", "100",
            "--trainer.callbacks+=ppo_lightning.training.noise_scale.GradientNoiseScale",
            "--checkpoint_every", "1000000", "--video_every", "null",
            # curves on the c = 1 iteration's grid at every c: at c = 64 logging each 64-frame iteration to
            # MLflow took a third of its CPU time (issue 18); at c = 1 this is every iteration
            "--log_every_frames", "4096"]


# ----------------------------------------------------------------------------------- CSV I/O
RUN_FIELDS = ["figure", "arm", "game", "seed", "frames", "final_return", "auc_return", "iterations",
              "gradient_steps", "wall_s", "train_s", "B_simple", "grad_sq_mean", "trace_cov_mean", "minibatch_size",
              "clip_fraction", "cpu",
              "mlflow_run_id", "args"]


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def append_row(path: Path, row: dict, fields: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    if not new:
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
        if header != fields:  # a CSV from an older version of this script: rewrite with the new columns
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


def record_run(runs_csv: Path, curves_csv: Path, row: dict, curve: list[tuple[float, float]],
               fields: list[str] | None = None) -> None:
    """Append a finished run: its learning curve to ``curves_csv``, then its row to ``runs_csv``.
    The row goes last, so a row means the run and its curve are complete: a sweep stopped between
    the two reruns the run and appends its curve again; `plot` reads only curves of runs that have a
    row, one point per frame count (the last written)."""
    for f, v in curve:
        append_row(curves_csv, {"arm": row["arm"], "game": row["game"], "seed": row["seed"], "frames": int(f),
                                "return": round(v, 4)}, ["arm", "game", "seed", "frames", "return"])
    append_row(runs_csv, row, fields or RUN_FIELDS)


def run_key(arm: str, game: str, seed: int | str) -> tuple[str, str, int]:
    return arm, game, int(seed)


def sweep(figure: str, arms: dict[str, list[str]], games: list[str], seeds: list[int], frames: int, out: Path,
          tracking_uri: str, run_root: Path) -> None:
    runs_csv, curves_csv = out / f"{figure}_runs.csv", out / f"{figure}_curves.csv"
    done = {run_key(r["arm"], r["game"], r["seed"]) for r in read_rows(runs_csv) if int(r["frames"]) >= frames}
    todo = [(s, g, a) for s in seeds for g in games for a in arms if run_key(a, g, s) not in done]
    print(f"[{figure}] {len(todo)} runs to do, {len(done)} already in {runs_csv}", flush=True)
    for i, (seed, game, arm) in enumerate(todo):
        args = base_args(game, frames, seed) + arms[arm]
        t0 = time.time()
        r = run(args, experiment=f"minatar-{figure}", run_name=f"{arm}-{game}-s{seed}", tracking_uri=tracking_uri,
                env_id=f"minatar:{game}", run_root=run_root, normalize=lambda x: x, last_metrics=("noise/grad_sq_mean", "noise/trace_cov_mean"))
        g2, tr = r["last"].get("noise/grad_sq_mean"), r["last"].get("noise/trace_cov_mean")
        # B_simple = tr(Sigma) / |G|^2 from the run's averages; "inf" when |G|^2 is not resolved (<= 0)
        noise = None if g2 is None else (tr / g2 if g2 > 0 else float("inf"))
        row = {"figure": figure, "arm": arm, "game": game, "seed": seed, "frames": r["frames"],
               "final_return": round(final_value(r["curve"], r["frames"]), 4),
               "auc_return": round(curve_auc(r["curve"], r["frames"]), 4),
               "iterations": r["iterations"], "gradient_steps": r["global_step"],
               "wall_s": round(r["wall_s"], 1), "train_s": round(r["train_s"], 1),
               "B_simple": round(noise, 1) if noise is not None else "",
               "grad_sq_mean": "" if g2 is None else f"{g2:.4g}", "trace_cov_mean": "" if tr is None else f"{tr:.4g}",
               "minibatch_size": r["minibatch_size"],
               "cpu": cpu_label(),
               "clip_fraction": round(r.get("clip_fraction_mean", float("nan")), 4),
               "mlflow_run_id": r["run_id"], "args": json.dumps(args)}
        record_run(runs_csv, curves_csv, row, r["curve"])
        print(f"[{figure}] {i + 1}/{len(todo)} {arm} {game} s{seed}: final {row['final_return']} "
              f"auc {row['auc_return']} ({time.time() - t0:.0f} s)", flush=True)


# ----------------------------------------------------------------------------------- vectorized seeds
# A vectorized group checkpoints every this many frames per seed (64 iterations at c = 64, 16 at c = 1):
# a killed group loses at most this much of its run when the sweep is rerun (`group_resume_args`).
CHECKPOINT_FRAMES = 65_536
BASE_FRAMES_PER_ITERATION = 64 * 64  # ppo_lightning/configs/minatar/ppo.yaml: 64 envs x 64 steps at c = 1


def group_resume_args(args: list[str], run_dir: Path) -> list[str]:
    """Extra ``fit`` arguments of a group: periodic checkpoints in ``run_dir``, and ``--ckpt_path`` to
    its ``last.ckpt`` when an earlier attempt with the same arguments left a complete one (an attempt
    with other arguments, or a damaged file, is set aside with a message and the group starts over)."""
    from ppo_lightning.training.checkpointing import check_checkpoint_file

    c = float(args[args.index("--scale") + 1]) if "--scale" in args else 1.0
    every = max(1, round(CHECKPOINT_FRAMES * c / BASE_FRAMES_PER_ITERATION))
    extra = ["--trainer.enable_checkpointing", "true", "--checkpoint_every", str(every)]
    ckpts, stamp = run_dir / "checkpoints", run_dir / "group_args.json"
    last = ckpts / "last.ckpt"
    if last.exists():
        try:
            if json.loads(stamp.read_text()) != args:
                raise ValueError("it was written by a run with other arguments")
            check_checkpoint_file(last)
        except Exception as err:  # noqa: BLE001 - any reason not to resume: start over, keep the old files
            aside = run_dir.with_name(f"{run_dir.name}.set-aside-{time.strftime('%Y%m%d-%H%M%S')}")
            print(f"[resume] not resuming {run_dir.name} from {last} ({str(err).splitlines()[0]}): "
                  f"starting it over; the old folder is {aside}", flush=True)
            run_dir.rename(aside)
        else:
            print(f"[resume] {run_dir.name}: continuing from {last}", flush=True)
            return extra + ["--ckpt_path", str(last)]
    run_dir.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(args))
    return extra


def groupable(args: list[str]) -> bool:
    """Arms whose seeds can train as one vectorized group (issue 18): all but artificial staleness."""
    return "--data.staleness" not in " ".join(args)


def sweep_grouped(figure: str, arms: dict[str, list[str]], games: list[str], seeds: list[int], frames: int, out: Path,
                  tracking_uri: str, run_root: Path) -> None:
    """`sweep`, but each (game, arm)'s runs of consecutive seeds train as one vectorized group
    (``fit --seeds S``; seed k of the group is the run of seed ``first + k``, tested equal to it alone).
    Writes the same rows, one per seed, from each seed's own MLflow run (``wall_s``/``train_s``: the
    group's time / S). Arms that cannot be grouped, and single seeds, are left to `sweep` after."""
    done = {run_key(r["arm"], r["game"], r["seed"]) for r in read_rows(out / f"{figure}_runs.csv")
            if int(r["frames"]) >= frames}
    for game in games:
        for arm, extra in arms.items():
            todo = [s for s in seeds if run_key(arm, game, s) not in done]
            runs = []  # consecutive seeds (data.seed + k)
            for s in todo:
                if runs and runs[-1][-1] == s - 1:
                    runs[-1].append(s)
                else:
                    runs.append([s])
            for group in runs:
                if len(group) < 2 or not groupable(extra):
                    continue
                args = base_args(game, frames, group[0]) + extra + ["--seeds", str(len(group))]
                train_group(figure, game, frames, f"{arm}-{game}-s{group[0]}-{group[-1]}", args,
                            [(arm, s) for s in group], arms, out, tracking_uri, run_root)
    sweep(figure, arms, games, seeds, frames, out, tracking_uri, run_root)  # the rest, one run per seed


def earlier_attempts_s(client, experiment_id: str, name: str, current_run_id: str, since_s: float) -> float:
    """Seconds trained by the earlier attempts of a group that was stopped and continued: each attempt
    logs to a new MLflow run of the group's name (its members' runs carry on), whose last
    ``time/elapsed_s`` is what it trained, lost work after its last checkpoint included. Attempts of
    before ``since_s`` (the group's start: its ``group_args.json``) belong to a set-aside group."""
    runs = client.search_runs([experiment_id], filter_string=f"tags.mlflow.runName = '{name}' "
                              f"and attributes.start_time >= {int(since_s * 1000)}")
    return sum(max((m.value for m in client.get_metric_history(r.info.run_id, "time/elapsed_s")), default=0.0)
               for r in runs if r.info.run_id != current_run_id)


def train_group(figure: str, game: str, frames: int, name: str, args: list[str], members: list[tuple[str, int]],
                arms: dict[str, list[str]], out: Path, tracking_uri: str, run_root: Path) -> None:
    """Train one vectorized group (``fit`` with ``args``; continuing a killed attempt with the same
    arguments from its checkpoints, `group_resume_args`), write one row per member ``(arm, seed)`` from
    the member's own MLflow run (``wall_s``/``train_s``: the group's time over all its attempts,
    `earlier_attempts_s`, / the number of members), then drop its checkpoints (recorded: nothing left
    to resume)."""
    from ppo_lightning.cli.fit import fit_main

    run_dir = run_root / f"minatar-{figure}" / name
    resume = group_resume_args(args, run_dir)
    t0 = time.perf_counter()
    cli = finished(fit_main(["fit", *args, *resume, "--mlflow.tracking_uri", tracking_uri,
                             "--mlflow.experiment", f"minatar-{figure}", "--mlflow.run_name", name, "--run_dir", str(run_dir)]))
    wall = time.perf_counter() - t0
    runs_csv, curves_csv = out / f"{figure}_runs.csv", out / f"{figure}_curves.csv"
    client, dm = cli.trainer.logger.experiment, cli.datamodule
    elapsed = client.get_metric_history(cli.trainer.logger.run_id, "time/elapsed_s")
    earlier = earlier_attempts_s(client, cli.trainer.logger.experiment_id, name, cli.trainer.logger.run_id,
                                 (run_dir / "group_args.json").stat().st_mtime)
    wall, train_s = wall + earlier, (elapsed[-1].value if elapsed else wall) + earlier
    for (arm, seed), run_id in zip(members, cli.model.seed_group.runs.run_ids):
        def history(key):
            return {m.step: m.value for m in client.get_metric_history(run_id, key)}
        fr, rets = history("frames"), history("episode/return_mean20")
        curve = sorted((fr[k], r) for k, r in rets.items() if k in fr)
        g2 = list(history("noise/grad_sq_mean").values())[-1:] or [None]
        tr = list(history("noise/trace_cov_mean").values())[-1:] or [None]
        g2, tr = g2[0], tr[0]
        noise = None if g2 is None else (tr / g2 if g2 > 0 else float("inf"))
        clip = list(history("train/clip_fraction").values())
        row = {"figure": figure, "arm": arm, "game": game, "seed": seed, "frames": dm.frames,
               "final_return": round(final_value(curve, dm.frames), 4),
               "auc_return": round(curve_auc(curve, dm.frames), 4),
               "iterations": dm.iteration, "gradient_steps": cli.trainer.global_step,
               "wall_s": round(wall / len(members), 1), "train_s": round(train_s / len(members), 1),
               "B_simple": round(noise, 1) if noise is not None else "",
               "grad_sq_mean": "" if g2 is None else f"{g2:.4g}", "trace_cov_mean": "" if tr is None else f"{tr:.4g}",
               "minibatch_size": dm.minibatch_size,
               "cpu": cpu_label(),
               "clip_fraction": round(sum(clip) / len(clip), 4) if clip else "",
               "mlflow_run_id": run_id,
               "args": json.dumps(base_args(game, frames, seed) + arms[arm])}  # the member's single-run equivalent
        record_run(runs_csv, curves_csv, row, curve)
        print(f"[{figure}] {arm} {game} s{seed} (group of {len(members)}): final {row['final_return']} "
              f"auc {row['auc_return']}", flush=True)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)


# Flags in which arms may differ and still train as one group: each member's values of the model's
# per-member hyperparameters (ppo_lightning.data.seed_group.MEMBER_HPARAMS) say them.
MEMBER_FLAGS = ("--model.lr", "--model.proximal_com", "--model.decoupled", "--scale_rules", "--scale_adam_betas",
                "--model.adam_betas")
ADAM_BETAS = (0.9, 0.999)  # the module's default (ppo_lightning/configs/minatar/ppo.yaml keeps it)


def member_spec(args: list[str]) -> tuple[list[str], dict[str, float | None]] | None:
    """An arm's CLI split into the arguments a mixed group shares and the member's own values
    ``{"lr", "proximal_com" (None: PPO), "advantage_norm_span", "adam_betas"}`` after its ``--scale``
    rules (the CLI's own arithmetic, `ppo_lightning.algos.scaling.scale_member`); None for an arm
    that cannot be a member (PPG, staleness, a --config besides the base)."""
    from ppo_lightning.algos import scaling

    if not groupable(args) or "--config" in args:
        return None
    opts, shared, i = {}, [], 0
    while i < len(args):
        if args[i] in MEMBER_FLAGS:
            opts[args[i]] = args[i + 1]
            i += 2
        else:
            shared.append(args[i])
            i += 1
    cfg = yaml.safe_load(CONFIG.read_text())
    decoupled = str(opts.get("--model.decoupled", cfg["model"].get("decoupled", False))).lower() == "true"
    com = opts.get("--model.proximal_com", cfg["model"].get("proximal_com"))
    values = {"lr": float(opts.get("--model.lr", cfg["model"]["lr"])),
              "proximal_com": float(com) if decoupled and com is not None else None,
              "advantage_norm_span": float(cfg["data"].get("advantage_norm_span", 1.0)),
              "adam_betas": tuple(float(b) for b in yaml.safe_load(str(opts.get("--model.adam_betas",
                                                                                cfg["model"].get("adam_betas", list(ADAM_BETAS))))))}
    if decoupled and com is None:
        return None  # decoupled with the behavior policy as anchor: not a member kind (PPO is decoupled false)
    c = float(shared[shared.index("--scale") + 1]) if "--scale" in shared else 1.0
    rules = scaling.parse_rules(opts.get("--scale_rules", "all"), str(opts.get("--scale_adam_betas")).lower() == "true")
    return shared, scaling.scale_member(c, values, rules)


def sweep_mixed(figure: str, arms: dict[str, list[str]], games: list[str], seeds: list[int], frames: int, out: Path,
                tracking_uri: str, run_root: Path) -> None:
    """`sweep_grouped`, but the arms that differ only in per-member hyperparameters (`member_spec`: the
    lr, the EWMA's center of mass or none, the advantage span, Adam's betas; e.g. Table 5's ablations at one c) train
    together, per game, as one group of all their (arm, seed) runs not yet recorded (``data.member_seeds``,
    ``data.member_hparams``; member k tested equal to its single run). The same rows; a group's time
    per row is the group's / members. What cannot be mixed goes on to `sweep_grouped`."""
    done = {run_key(r["arm"], r["game"], r["seed"]) for r in read_rows(out / f"{figure}_runs.csv")
            if int(r["frames"]) >= frames}
    specs = {arm: member_spec(extra) for arm, extra in arms.items()}
    kinds: dict[str, list[str]] = {}  # shared arguments -> the arms that share them
    for arm, spec in specs.items():
        if spec is not None:
            kinds.setdefault(json.dumps(spec[0]), []).append(arm)
    for game in games:
        for shared_key, mix in kinds.items():
            members = [(arm, s) for arm in mix for s in seeds if run_key(arm, game, s) not in done]
            if len({arm for arm, _ in members}) < 2:
                continue  # one arm: sweep_grouped's plain group
            # every member's values in full (the group's --scale_rules none leaves them as given)
            values = {name: [specs[arm][1][name] for arm, _ in members]
                      for name in ("lr", "proximal_com", "advantage_norm_span", "adam_betas")}
            if all(v is None for v in values["proximal_com"]):
                del values["proximal_com"]  # PPO members only: no EWMA
            if all(tuple(v) == ADAM_BETAS for v in values["adam_betas"]):
                del values["adam_betas"]  # Adam's defaults for all
            else:
                values["adam_betas"] = [list(v) for v in values["adam_betas"]]
            shared = json.loads(shared_key)
            ewma = ["--model.decoupled", "true", "--model.proximal_com", "8"] if "proximal_com" in values else []
            args = (base_args(game, frames, members[0][1]) + shared + ewma + ["--scale_rules", "none",
                    "--data.member_seeds", json.dumps([s for _, s in members]), "--data.member_hparams", json.dumps(values)])
            name = f"mix{len(members)}-{game}-{hashlib.sha1(json.dumps(members).encode()).hexdigest()[:8]}"
            print(f"[{figure}] {name}: {len(members)} members, arms {', '.join(dict.fromkeys(a for a, _ in members))}",
                  flush=True)
            train_group(figure, game, frames, name, args, members, arms, out, tracking_uri, run_root)
    sweep_grouped(figure, arms, games, seeds, frames, out, tracking_uri, run_root)


# ----------------------------------------------------------------------------------- analysis
def reference_return(game: str, out: Path) -> tuple[float, int, int]:
    """R_ref of the 500k base for ``game``: the final return of its reference runs (arm `REF500K_ARM`,
    at least `REF500K_MIN_FRAMES` frames; the longest such runs, mean over their seeds), with the frame
    count and the number of seeds. A missing reference stops the analysis with the command that makes it."""
    rows = [r for r in read_rows(out / "reference_runs.csv")
            if r["arm"] == REF500K_ARM and r["game"] == game and int(r["frames"]) >= REF500K_MIN_FRAMES]
    if not rows:
        raise SystemExit(f"no R_ref of the 500k base for {game} (arm {REF500K_ARM}, >= {REF500K_MIN_FRAMES} frames) in "
                         f"{out / 'reference_runs.csv'}: python experiments/minatar_figures.py reference --arms "
                         f"{REF500K_ARM} --games {game} --seeds 2 --frames {REF500K_FRAMES}")
    longest = max(int(r["frames"]) for r in rows)
    finals = [float(r["final_return"]) for r in rows if int(r["frames"]) == longest]
    return float(np.mean(finals)), longest, len(finals)


def normalizer(game: str, figure: str | None = None, out: Path = OUT):
    """``R -> (R - R_random) / (R_ref - R_random)``: issue 11's constants (`minatar_scores`, R_ref = PPO
    at lr 5e-4 after 303k frames), or for the 500k figures (``FIGURES[figure]["normalize"] == "500k"``)
    R_ref of the tuned 500k base's own reference runs (`reference_return`), so that 1 is what the
    figures' base reaches in a run 2-4x as long, and the issue's +-0.05 is in those units."""
    from ppo_lightning.envs.minatar_scores import RETURN_RANGES, normalized_return

    if FIGURES.get(figure, {}).get("normalize") != "500k":
        return lambda r: normalized_return(game, r)
    r_random = RETURN_RANGES[game][0]
    r_ref = reference_return(game, out)[0]
    return lambda r: (r - r_random) / (r_ref - r_random)


def figure_rows(figure: str, out: Path, kind: str = "runs") -> list[dict]:
    """The figure's CSV rows plus borrowed runs: an arm whose configuration is another figure's arm
    (``FIGURES[figure]["borrow"]``) takes that figure's runs for the seeds it has not run itself."""
    rows = read_rows(out / f"{figure}_{kind}.csv")
    for arm, sources in FIGURES.get(figure, {}).get("borrow", {}).items():
        have = {(r["game"], r["seed"]) for r in read_rows(out / f"{figure}_runs.csv") if r["arm"] == arm}
        # one source (figure, arm) or a list of them, tried in order: a later source fills only the
        # (game, seed) pairs the earlier ones lack
        for other, other_arm in [sources] if isinstance(sources[0], str) else sources:
            their_runs = read_rows(out / f"{other}_runs.csv")
            take = {(r["game"], r["seed"]) for r in their_runs
                    if r["arm"] == other_arm and (r["game"], r["seed"]) not in have}
            theirs = their_runs if kind == "runs" else read_rows(out / f"{other}_{kind}.csv")
            rows += [{**r, "arm": arm} for r in theirs if r["arm"] == other_arm and (r["game"], r["seed"]) in take]
            have |= take
    return rows


def analyze(figure: str, out: Path, compare: list[tuple[str, str]], target: float = 0.05,
            games: list[str] | None = None) -> list[dict]:
    rows = [r for r in figure_rows(figure, out) if games is None or r["game"] in games]
    if not rows:
        print(f"[{figure}] no runs in {out}")
        return []
    games = sorted({r["game"] for r in rows})
    arms = sorted(dict.fromkeys(r["arm"] for r in rows), key=lambda a: list(FIGURES.get(figure, {}).get("arms", {a: 0})).index(a)
                  if a in FIGURES.get(figure, {}).get("arms", {}) else 0)
    # per (arm, seed): {game: (auc, final)} normalized
    table: dict[str, dict[int, dict[str, tuple[float, float]]]] = {}
    for r in rows:
        norm = normalizer(r["game"], figure, out)
        table.setdefault(r["arm"], {}).setdefault(int(r["seed"]), {})[r["game"]] = (
            norm(float(r["auc_return"])), norm(float(r["final_return"])))

    def pooled(arm: str, which: int) -> dict[int, float]:
        """Per seed: mean over games, only seeds that have every game of the figure."""
        return {s: float(np.mean([g[which] for g in by_game.values()]))
                for s, by_game in table.get(arm, {}).items() if set(by_game) == set(games)}

    summary = []
    frames = max(int(r["frames"]) for r in rows)
    print(f"\n[{figure}] games pooled: {', '.join(games)}; {frames} frames per run; 95% bootstrap CIs over seeds")
    if FIGURES.get(figure, {}).get("normalize") == "500k":
        for g in games:
            r_ref, n_frames, n = reference_return(g, out)
            print(f"[{figure}] {g}: R_ref {r_ref:.3f} ({REF500K_ARM}, {n_frames} frames, {n} seed(s))")
    own = [r for r in read_rows(out / f"{figure}_runs.csv") if r["game"] in games]  # budget: not borrowed runs
    print(f"[{figure}] budget: {len(own)} runs of this figure ({len(rows) - len(own)} borrowed), "
          f"{sum(float(r['wall_s']) for r in own) / 3600:.2f} h summed run wall time (1 thread per run)")
    for arm in arms:
        for which, stat in ((0, "auc"), (1, "final")):
            scores = list(pooled(arm, which).values())
            # below MIN_SEEDS_FOR_CI seeds a percentile bootstrap understates the spread: a t interval
            m, lo, hi = bootstrap_ci(scores) if len(scores) >= MIN_SEEDS_FOR_CI else t_ci(scores)
            sd = float(np.std(scores, ddof=1)) if len(scores) > 1 else float("nan")
            noise = [float(r["B_simple"]) for r in rows if r["arm"] == arm and r.get("B_simple")]
            summary.append({"figure": figure, "row": arm, "stat": stat, "n_seeds": len(scores), "mean": m, "ci_low": lo,
                            "ci_high": hi, "sd": sd, "seeds_for_0.05": seeds_needed(sd, target) if math.isfinite(sd) else "",
                            "B_simple_median": float(np.median(noise)) if noise else "",
                            "minibatch_size": next((r["minibatch_size"] for r in rows if r["arm"] == arm), ""),
                            "verdict": "" if len(scores) >= MIN_SEEDS_FOR_CI else f"n={len(scores)} < {MIN_SEEDS_FOR_CI}: t interval"})
            print(f"  {arm:18s} {stat:5s} {m:7.3f} [{lo:7.3f}, {hi:7.3f}] sd {sd:.3f} n={len(scores)}")
    for a, b in compare:
        for which, stat in ((0, "auc"), (1, "final")):
            pa, pb = pooled(a, which), pooled(b, which)
            if len(pa) < 2 or len(pb) < 2:
                continue
            sd = float(np.sqrt((np.var(list(pa.values()), ddof=1) + np.var(list(pb.values()), ddof=1)) / 2))
            n = min(len(pa), len(pb))
            # a percentile bootstrap over fewer than 5 seeds understates the uncertainty (it can only
            # resample the few values seen): below that, Welch's t interval, named in the verdict
            small = n < MIN_SEEDS_FOR_CI
            d, lo, hi = (welch_diff_ci if small else bootstrap_diff_ci)(list(pa.values()), list(pb.values()))
            verdict = ("resolved" if hi - lo <= 2 * target else "not resolved") + (f" (Welch t, n={n})" if small else "")
            summary.append({"figure": figure, "row": f"{a} - {b}", "stat": stat, "n_seeds": min(len(pa), len(pb)),
                            "mean": d, "ci_low": lo, "ci_high": hi, "sd": sd,
                            "seeds_for_0.05": seeds_needed(sd, target, arms=2), "B_simple_median": "",
                            "minibatch_size": "", "verdict": verdict})
            print(f"  {a} - {b}: {stat} {d:+.3f} [{lo:+.3f}, {hi:+.3f}] ({verdict} at half-width {target}; "
                  f"{seeds_needed(sd, target, arms=2)} seeds/arm needed at sd {sd:.3f})")
    path = out / f"{figure}_summary.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(summary[0].keys()))
        w.writeheader()
        for s in summary:
            w.writerow({k: (round(v, 4) if isinstance(v, float) else v) for k, v in s.items()})
    print(f"wrote {path}")
    curve_arms = {"bsi": [a for a in arms if re.fullmatch(r"c\d+_all(_lr\dx)?|c1_lr\dx", a)],  # ablations: bar chart
                  "staleness": [a for a in arms if a == "k0" or a.startswith("k8_")],  # all k: staleness_vs_k.png
                  "bsi500k": [a for a in arms if re.fullmatch(rf"c\d+_all_{LR}", a)],  # PPO-EWMA; PPG-EWMA below
                  "ewma": arms}.get(figure, arms)
    plot(figure, out, games, curve_arms, frames)
    if figure == "bsi500k" and any("_ppg_ewma_" in a for a in arms):
        plot(figure, out, games, [a for a in arms if "_ppg_ewma_" in a], frames, name="bsi500k_ppg_ewma")
    if figure == "bsi500k":  # Table 5 at small batch (written once an ablation has runs)
        plot_differences(summary, out / "bsi500k_ablations.png", "Table 5 at 500k frames: each rule removed, and PPO "
                         f"without EWMA (arm - all rules at that c; {' + '.join(games)} pooled)", lambda row: re.match(r"c\d+_(no_\w+|ppo)_lr", row), rows)
    if figure == "bsi":
        if any(a.endswith("_ppg_ewma") for a in arms):
            plot(figure, out, games, [a for a in arms if a.endswith("_ppg_ewma")], frames, name="bsi_ppg_ewma")
        plot_differences(summary, out / "bsi_ablations.png", "Table 5: each rule removed (arm - all rules at that c)",
                         lambda row: "_no_" in row or "_ppo -" in row or "_betas -" in row, rows)
    if figure == "staleness":
        plot_staleness(summary, out / "staleness_vs_k.png")
    if figure == "klcom":
        plot_grid(summary, out / "klcom.png")
    return summary


def save_labelled(fig, path: Path, rows: list[dict] | None = None) -> None:
    """Write a figure with the CPU it was measured on in its corner (machines differ): the CPUs of
    ``rows`` (the runs it shows; their ``cpu`` column) when given, else this machine's."""
    label = cpu_label() if rows is None else "runs on " + " + ".join(
        sorted({r.get("cpu") or "CPU not recorded" for r in rows}))
    fig.text(0.01, 0.005, label, fontsize=6)
    save_figure(fig, path)


def _summary_lookup(summary: list[dict]) -> dict[tuple[str, str], dict]:
    return {(r["row"], r["stat"]): r for r in summary}


def plot_differences(summary: list[dict], path: Path, title: str, keep, runs: list[dict] | None = None) -> None:
    """Horizontal bars: each selected comparison's AUC and final differences with 95% CIs."""
    rows = [r for r in summary if " - " in r["row"] and keep(r["row"])]
    if not rows:
        return
    names = list(dict.fromkeys(r["row"] for r in rows))
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 2, figsize=(10, 0.35 * len(names) + 1.5), sharey=True)
    look = _summary_lookup(summary)
    for ax, stat in zip(axes, ("auc", "final")):
        for i, n in enumerate(names):
            r = look.get((n, stat))
            if r is None:
                continue
            ax.errorbar(r["mean"], i, xerr=[[r["mean"] - r["ci_low"]], [r["ci_high"] - r["mean"]]], fmt="o", capsize=3)
        ax.axvline(0, color="grey", lw=0.8)
        ax.set(xlabel=f"difference in normalized {stat} (95% CI)", yticks=range(len(names)), yticklabels=names)
    axes[0].set_title(title, fontsize=9, loc="left")
    shown = {arm for n in names for arm in n.split(" - ")}
    save_labelled(fig, path, None if runs is None else [r for r in runs if r["arm"] in shown])


def plot_staleness(summary: list[dict], path: Path) -> None:
    """Fig. 1's view: final and AUC normalized return against the staleness k, one line per mode."""
    look = _summary_lookup(summary)
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 2, figsize=(10, 4))
    for ax, stat in zip(axes, ("final", "auc")):
        for mode in ("behavior", "proximal", "decoupled"):
            pts = [(0, look.get(("k0", stat)))] + [(k, look.get((f"k{k}_{mode}", stat))) for k in (1, 2, 4, 8)]
            pts = [(k, r) for k, r in pts if r is not None]
            if len(pts) < 2:
                continue
            ks = [k for k, _ in pts]
            m = np.array([r["mean"] for _, r in pts])
            lo, hi = np.array([r["ci_low"] for _, r in pts]), np.array([r["ci_high"] for _, r in pts])
            ax.errorbar(ks, m, yerr=[m - lo, hi - m], marker="o", capsize=3, label=mode)
        ax.set(xlabel="staleness k (iterations)", ylabel=f"normalized {stat} (95% CI)", xscale="symlog", xticks=[0, 1, 2, 4, 8],
               xticklabels=["0", "1", "2", "4", "8"])
        ax.legend()
    axes[0].set_title("MinAtar Fig. 1: artificial staleness", fontsize=9, loc="left")
    save_labelled(fig, path)


def plot_grid(summary: list[dict], path: Path) -> None:
    """Fig. 18's view: a beta x COM heat map of the final normalized return (mean [95% CI])."""
    look = _summary_lookup(summary)
    betas, coms = (0.1, 1.0, 10.0), (1, 8, 64)
    grid = np.full((len(betas), len(coms)), np.nan)
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(6, 4.5))
    for i, b in enumerate(betas):
        for j, c in enumerate(coms):
            r = look.get((f"beta{b:g}_com{c}", "final"))
            if r is not None:
                grid[i, j] = r["mean"]
                ax.text(j, i, f"{r['mean']:.3f}\n[{r['ci_low']:.3f}, {r['ci_high']:.3f}]\nn={r['n_seeds']}",
                        ha="center", va="center", fontsize=8, color="white" if r["mean"] < 0.3 else "black")
    im = ax.imshow(grid, cmap="viridis", aspect="auto")
    fig.colorbar(im, ax=ax, label="final normalized return")
    ax.set(xticks=range(len(coms)), xticklabels=[str(c) for c in coms], yticks=range(len(betas)),
           yticklabels=[f"{b:g}" for b in betas], xlabel="proximal COM (gradient steps)", ylabel="KL beta",
           title="MinAtar Fig. 18: decoupled KL penalty, beta x COM")
    save_labelled(fig, path)


def plot(figure: str, out: Path, games: list[str], arms: list[str], frames: int, points: int = 40,
         name: str | None = None) -> None:
    runs = figure_rows(figure, out)
    finished = {run_key(r["arm"], r["game"], r["seed"]) for r in runs}
    points_of: dict[tuple[str, str, int], dict[float, float]] = {}
    for c in figure_rows(figure, out, "curves"):
        key = run_key(c["arm"], c["game"], c["seed"])
        if key in finished:  # a curve without a run row is an interrupted run's (see record_run)
            points_of.setdefault(key, {})[float(c["frames"])] = float(c["return"])
    by = {k: list(v.items()) for k, v in points_of.items()}
    grid = np.linspace(frames / points, frames, points)
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(7, 4.8))
    rng = np.random.default_rng(0)
    for arm in arms:
        seeds = sorted({s for (a, g, s) in by if a == arm})
        per_seed = []
        for s in seeds:
            if not all((arm, g, s) in by for g in games):
                continue
            vals = []
            for g in games:
                pts = sorted(by[(arm, g, s)])
                norm = normalizer(g, figure, out)
                vals.append([norm(_step_value(pts, x)) for x in grid])
            per_seed.append(np.mean(vals, axis=0))
        if not per_seed:
            continue
        y = np.array(per_seed)
        mean = y.mean(0)
        line, = ax.plot(grid, mean, label=f"{arm} (n={len(y)})")
        if len(y) > 1:
            boots = y[rng.integers(0, len(y), size=(2000, len(y)))].mean(1)
            lo, hi = np.quantile(boots, [0.025, 0.975], axis=0)
            ax.fill_between(grid, lo, hi, color=line.get_color(), alpha=0.2)
    ax.set(xlabel="environment frames", ylabel=f"normalized return (mean of {len(games)} games)",
           title=f"MinAtar {figure}: mean and 95% bootstrap CI over seeds")
    ax.legend(fontsize=7, ncol=2)
    save_labelled(fig, out / f"{name or figure}.png", [r for r in runs if r["arm"] in arms and r["game"] in games])


def _step_value(pts: list[tuple[float, float]], x: float) -> float:
    v = pts[0][1]
    for f, r in pts:
        if f > x:
            break
        v = r
    return v


# ----------------------------------------------------------------------------------- R_random
def measure_random(games: list[str], episodes: int, out: Path, seed: int = 12345) -> None:
    """Mean return of a uniform random policy (MinAtar defaults: sticky actions 0.1, ramping)."""
    import torch

    from ppo_lightning.envs.minatar_env import NUM_ACTIONS, make_minatar_env

    rows = []
    for game in games:
        env = make_minatar_env(game, num_envs=32, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        td = env.reset()
        rets: list[float] = []
        steps = 0
        while len(rets) < episodes:
            td["action"] = torch.randint(0, NUM_ACTIONS, (32,), generator=gen)
            td = env.step(td)
            steps += 32
            done = td["next", "done"].squeeze(-1)
            rets += td["next", "episode_reward"].squeeze(-1)[done].tolist()
            td = env.step_mdp(td)
            if done.any():
                td["_reset"] = done.unsqueeze(-1)
                td = env.reset(td)
        rets = rets[:episodes]
        m, sd = float(np.mean(rets)), float(np.std(rets, ddof=1))
        rows.append({"game": game, "episodes": len(rets), "mean_return": round(m, 4), "sd": round(sd, 4),
                     "sem": round(sd / math.sqrt(len(rets)), 4), "frames": steps, "seed": seed})
        print(f"  {game:15s} R_random {m:.3f} +- {sd / math.sqrt(len(rets)):.3f} (sem, {len(rets)} episodes)", flush=True)
    write_csv(out / "random_returns.csv", rows)


# ----------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("figure", choices=["random", *FIGURES])
    p.add_argument("--games", default=",".join(GAMES))
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--frames", type=int, default=250_000)
    p.add_argument("--arms", default=None, help="comma list of the figure's arms (default: all)")
    p.add_argument("--episodes", type=int, default=300, help="random: episodes per game")
    p.add_argument("--analyze", action="store_true", help="only analyze the CSVs (of the --games given)")
    p.add_argument("--target", type=float, default=0.05, help="target CI half-width for the seed count")
    p.add_argument("--quick", action="store_true", help="seconds-long pipeline check (tiny runs, its own folder)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--tracking-uri", default=None, help="MLflow store (default: sqlite in --out)")
    p.add_argument("--run-root", type=Path, default=ROOT / "runs" / "minatar")
    p.add_argument("--mix", action="store_true",
                   help="train the arms that differ only in the lr, the EWMA's center of mass (or none), the "
                        "advantage span and Adam's betas as one group per game (Table 5's ablations at one c)")
    p.add_argument("--one-by-one", action="store_true",
                   help="train each seed as its own run (default: an arm's seeds as one vectorized group)")
    a = p.parse_args(argv)
    games = a.games.split(",")
    for g in games:
        if g not in GAMES:
            p.error(f"--games: unknown MinAtar game {g!r}; games: {', '.join(GAMES)}")
    if a.quick:
        a.frames, a.seeds, a.episodes = 4096, 1, 4
        a.arms = a.arms or QUICK_ARMS.get(a.figure)
    a.out.mkdir(parents=True, exist_ok=True)
    tracking_uri = a.tracking_uri or f"sqlite:///{(a.out / 'mlflow.db').resolve()}"
    if a.figure == "random":
        measure_random(games, a.episodes, a.out)
        return
    fig = FIGURES[a.figure]
    arms = fig["arms"]
    if a.arms:
        unknown = [x for x in a.arms.split(",") if x not in arms]
        if unknown:
            p.error(f"--arms: unknown arm(s) {unknown} for {a.figure}; arms: {', '.join(arms)}")
        arms = {k: arms[k] for k in a.arms.split(",")}
    if a.quick:  # tiny batches so that a run is a couple of iterations
        arms = {k: v + ["--data.num_envs", "16", "--data.rollout_steps", "32", "--data.update_epochs", "1"]
                for k, v in arms.items()}
    if not a.analyze:
        seeds = list(range(a.first_seed, a.first_seed + a.seeds))
        if a.figure == "reference":
            seeds = [1000 + s for s in seeds]  # reference seeds never coincide with experiment seeds
        (sweep if a.one_by_one else sweep_mixed if a.mix else sweep_grouped)(a.figure, arms, games, seeds, a.frames, a.out, tracking_uri, a.run_root)
    if a.figure == "reference":
        summarize_reference(a.out)
    else:
        names = set(arms) | set(fig.get("borrow", {}))  # a borrowed arm (another figure's runs) compares too
        analyze(a.figure, a.out, [c for c in fig["compare"] if c[0] in names and c[1] in names], games=games,
                target=a.target)


def summarize_reference(out: Path) -> None:
    rows = read_rows(out / "reference_runs.csv")
    for arm, frames, game in sorted({(r["arm"], int(r["frames"]), r["game"]) for r in rows}):
        fin = [float(r["final_return"]) for r in rows if (r["arm"], int(r["frames"]), r["game"]) == (arm, frames, game)]
        print(f"  {arm:16s} {game:15s} R_ref {np.mean(fin):.3f} ({len(fin)} seeds: {', '.join(f'{x:.2f}' for x in fin)}; "
              f"{frames} frames)")


if __name__ == "__main__":
    main()
