"""Paper Fig. 1 at CPU scale: final return vs artificial staleness k for the three choices of the old
policy (``data.staleness_mode``: behavior, proximal, decoupled; see ppo_lightning/algos/staleness.py).

    python experiments/staleness.py                 # full: k in 0,1,2,4,8, 3 seeds, 60k frames
    python experiments/staleness.py --quick         # pipeline smoke test

Base: CartPole-v1, 8 envs x 32 steps (256 frames per iteration, so 60k frames = 234 iterations),
4 minibatches, 3 epochs, Adam 1e-3, clipped objective, no EWMA. ``behavior`` and ``proximal`` use
the standard objective; ``decoupled`` uses the decoupled objective; every arm caps the importance
ratio pi / pi_behav at 100 (reference code, issue 11). At k = 0 the three are the same algorithm, so k = 0 is run once per seed and
shared. Writes results/staleness.{csv,png}; MLflow experiment ``fig1-staleness``.
"""

from __future__ import annotations

from common import base_args, common_parser, mean_std, plt, run, save_figure, write_csv

EXPERIMENT = "fig1-staleness"
MODES = {  # the importance-ratio cap 100 in every arm, as the reference code's imp_samp_max (issue 11)
    "behavior": ["--model.decoupled", "false", "--model.max_importance_ratio", "100"],
    "proximal": ["--model.decoupled", "false", "--model.max_importance_ratio", "100"],
    "decoupled": ["--model.decoupled", "true", "--model.max_importance_ratio", "100"],
}


def main() -> None:
    p = common_parser(__doc__, default_frames=60_000, default_seeds=3)
    p.add_argument("--ks", default="0,1,2,4,8")
    a = p.parse_args()
    if a.quick:
        a.frames, a.seeds, a.ks = 2048, 1, "0,2"
    ks = [int(k) for k in a.ks.split(",")]
    results = []
    for seed in range(a.seeds):
        for k in ks:
            for mode, extra in MODES.items():
                if k == 0 and mode != "behavior":
                    continue  # identical algorithm at k = 0
                args = base_args(a.env, a.frames, seed, ewma=False, num_envs=8) + extra
                args += ["--data.staleness", str(k), "--data.staleness_mode", mode]
                r = run(args, experiment=EXPERIMENT, run_name=f"k{k}-{mode}-s{seed}", tracking_uri=a.tracking_uri,
                        env_id=a.env, run_root=a.run_root)
                for m in (MODES if k == 0 else [mode]):
                    results.append({"mode": m, "k": k, "seed": seed, **r})
    rows = [{"mode": r["mode"], "staleness": r["k"], "seed": r["seed"], "frames": r["frames"],
             "final_normalized_return": round(r["final"], 4), "wall_s": round(r["wall_s"], 1),
             "mlflow_run_id": r["run_id"]} for r in results]
    write_csv(a.out / "staleness.csv", rows)

    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(6, 4.5))
    print("\nfinal normalized return (mean +- sd over seeds):")
    for mode in MODES:
        xs, ms, sds = [], [], []
        for k in ks:
            vals = [r["final"] for r in results if r["mode"] == mode and r["k"] == k]
            m, sd = mean_std(vals)
            xs.append(k), ms.append(m), sds.append(sd)
            print(f"  {mode:9s} k={k}: {m:.3f} +- {sd:.3f}")
        ax.errorbar(xs, ms, yerr=sds if a.seeds > 1 else None, marker="o", capsize=3, label=mode)
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set(xlabel="staleness k (iterations)", ylabel=f"final normalized return ({a.frames} frames)",
           title="artificial staleness (CartPole-v1)")
    ax.legend()
    save_figure(fig, a.out / "staleness.png")


if __name__ == "__main__":
    main()
