"""Paper Fig. 2/3 and Table 5 at CPU scale: PPO-EWMA learning curves vs environment frames for batch
sizes divided by c (``fit --scale c``, all rules on), and each rule's ablation at every c >= 4.

    python experiments/batch_size_invariance.py                    # full: c in 1,4,16, 3 seeds, 60k frames (~1 h)
    python experiments/batch_size_invariance.py --quick            # pipeline smoke test (minutes)

Base (c = 1): CartPole-v1, 32 envs x 32 steps, 4 minibatches, 3 epochs, Adam 1e-3, PPO-EWMA with
proximal COM 4 steps, per-batch advantage normalization (span 1). Ablations at every c >= 4 of the sweep:
``no_lr`` (lr not scaled), ``no_com`` (COM not scaled), ``no_adv_span`` (span not scaled), and
``ppo`` (no EWMA: the proximal policy is the behavior policy, lr and span scaled), and, not a paper
ablation, ``lr_over_c`` (all rules but Adam lr / c, the SGD rule). Ablations use 2 seeds by default.
Writes results/batch_size_invariance.{csv,png}; every run goes to MLflow experiment
``fig2-batch-size-invariance``.
"""

from __future__ import annotations

from common import base_args, common_parser, mean_curve, mean_std, plt, run, save_figure, write_csv

EXPERIMENT = "fig2-batch-size-invariance"
ABLATIONS = {  # name: (extra args, scale rules)
    "no_lr": ([], "com,adv_span"),
    "no_com": ([], "lr,adv_span"),
    "no_adv_span": ([], "lr,com"),
    "ppo": (["--model.decoupled", "false", "--model.proximal_com", "null"], "lr,adv_span"),
    # not a paper ablation: all rules, but Adam lr / c (the SGD rule) instead of lr / sqrt(c)
    "lr_over_c": (["--model.lr", "LR_OVER_C"], "all"),
}
BASE_LR = 1e-3


def main() -> None:
    p = common_parser(__doc__, default_frames=60_000, default_seeds=3)
    p.add_argument("--scales", default="1,4,16")
    p.add_argument("--ablation-seeds", type=int, default=2, help="seeds for the ablations")
    p.add_argument("--no-ablations", action="store_true")
    p.add_argument("--ablations", default="no_lr,no_com,no_adv_span,ppo,lr_over_c", help=f"subset of {list(ABLATIONS)}")
    p.add_argument("--no-main", action="store_true", help="skip the all-rules runs (ablations only)")
    p.add_argument("--name", default="batch_size_invariance", help="results file stem")
    a = p.parse_args()
    if a.quick:
        a.frames, a.seeds, a.scales, a.ablation_seeds = 4096, 1, "1,4", 1
    scales = [float(s) for s in a.scales.split(",")]
    abl_seeds = a.ablation_seeds
    results = []  # dicts: variant, c, seed, final, curve
    for seed in range(0 if a.no_main else a.seeds):
        for c in scales:
            r = run(base_args(a.env, a.frames, seed) + ["--scale", f"{c:g}"], experiment=EXPERIMENT,
                    run_name=f"c{c:g}-all-s{seed}", tracking_uri=a.tracking_uri, env_id=a.env, run_root=a.run_root)
            results.append({"variant": "all_rules", "c": c, "seed": seed, **r})
    if not a.no_ablations:
        # each rule's ablation at every c >= 4 of the sweep (c = 4 and 16 by default; issue 11)
        for seed in range(abl_seeds):
            for cab in [c for c in scales if c >= 4] or [max(scales)]:
                for name in a.ablations.split(","):
                    extra, rules = ABLATIONS[name]
                    # --scale divides model.lr by sqrt(c) afterwards, so lr / sqrt(c) here gives lr / c
                    extra = [f"{BASE_LR / cab ** 0.5:g}" if x == "LR_OVER_C" else x for x in extra]
                    args = base_args(a.env, a.frames, seed) + extra + ["--scale", f"{cab:g}", "--scale_rules", rules]
                    r = run(args, experiment=EXPERIMENT, run_name=f"c{cab:g}-{name}-s{seed}",
                            tracking_uri=a.tracking_uri, env_id=a.env, run_root=a.run_root)
                    results.append({"variant": name, "c": cab, "seed": seed, **r})

    rows = [{"variant": r["variant"], "c": r["c"], "seed": r["seed"], "frames": r["frames"],
             "final_normalized_return": round(r["final"], 4), "gradient_steps": r["global_step"],
             "wall_s": round(r["wall_s"], 1),
             "clip_fraction_mean": round(r.get("clip_fraction_mean", float("nan")), 4),
             "adv_std_oscillation_max": round(r.get("adv_std_oscillation_max", float("nan")), 2),
             "mlflow_run_id": r["run_id"]} for r in results]
    write_csv(a.out / f"{a.name}.csv", rows)

    groups: dict[tuple[str, float], list[dict]] = {}
    for r in results:
        groups.setdefault((r["variant"], r["c"]), []).append(r)
    summary = {k: mean_std([r["final"] for r in v]) for k, v in groups.items()}
    finals = [summary[("all_rules", c)][0] for c in scales if ("all_rules", c) in summary]
    print("\nfinal normalized return (mean over seeds):")
    for (variant, c), (m, sd) in sorted(summary.items()):
        print(f"  {variant:12s} c={c:<4g} {m:.3f} +- {sd:.3f} (n={len(groups[(variant, c)])})")
    if finals:
        print(f"largest difference across c (all rules): {max(finals) - min(finals):.3f}")

    pyplot = plt()
    fig, axes = pyplot.subplots(1, 2, figsize=(12, 4.5))
    for c in [c for c in scales if ("all_rules", c) in groups]:
        x, y = mean_curve([r["curve"] for r in groups[("all_rules", c)]])
        axes[0].plot(x, y, label=f"c={c:g} (batch {1024 / c:g})")
    axes[0].set(title="PPO-EWMA, all scaling rules", xlabel="environment frames", ylabel="normalized return")
    axes[0].legend()
    cmax = max(scales)
    for variant in ["all_rules", *a.ablations.split(",")]:
        if (variant, cmax) in groups:
            x, y = mean_curve([r["curve"] for r in groups[(variant, cmax)]])
            axes[1].plot(x, y, label=variant)
    if ("all_rules", 1.0) in groups:
        x, y = mean_curve([r["curve"] for r in groups[("all_rules", 1.0)]])
        axes[1].plot(x, y, "k--", label="c=1 reference")
    axes[1].set(title=f"ablations at c={cmax:g}", xlabel="environment frames", ylabel="normalized return")
    axes[1].legend()
    save_figure(fig, a.out / f"{a.name}.png")


if __name__ == "__main__":
    main()
