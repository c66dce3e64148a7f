"""Paper Fig. 4 at CPU scale: PPO-EWMA vs PPO (no EWMA) at the default batch size.

    python experiments/ewma.py                 # full: 5 seeds, 100k frames
    python experiments/ewma.py --quick         # pipeline smoke test

Base as in batch_size_invariance.py (CartPole-v1, 32 envs x 32 steps, 4 minibatches, 3 epochs,
Adam 1e-3). ``ppo``: clipped objective, proximal = behavior policy. ``ppo_ewma``: decoupled
objective with the EWMA proximal policy (COM ``--com`` steps, default 4). Also reports the
training-time overhead of the EWMA (the extra proximal forward). Writes results/ewma.{csv,png};
MLflow experiment ``fig4-ewma``.
"""

from __future__ import annotations

from common import base_args, common_parser, mean_curve, mean_std, plt, run, save_figure, write_csv

EXPERIMENT = "fig4-ewma"


def main() -> None:
    p = common_parser(__doc__, default_frames=100_000, default_seeds=5)
    p.add_argument("--com", type=float, default=4.0)
    a = p.parse_args()
    if a.quick:
        a.frames, a.seeds = 4096, 1
    variants = {"ppo": ["--model.decoupled", "false"],
                "ppo_ewma": ["--model.decoupled", "true", "--model.proximal_com", f"{a.com:g}"]}
    results = []
    for seed in range(a.seeds):
        for name, extra in variants.items():
            r = run(base_args(a.env, a.frames, seed, ewma=False) + extra, experiment=EXPERIMENT,
                    run_name=f"{name}-s{seed}", tracking_uri=a.tracking_uri, env_id=a.env, run_root=a.run_root)
            results.append({"variant": name, "seed": seed, **r})
    rows = [{"variant": r["variant"], "seed": r["seed"], "frames": r["frames"],
             "final_normalized_return": round(r["final"], 4), "wall_s": round(r["wall_s"], 1), "train_s": round(r["train_s"], 1),
             "mlflow_run_id": r["run_id"]} for r in results]
    write_csv(a.out / "ewma.csv", rows)
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(6, 4.5))
    print("\nfinal normalized return (mean +- sd over seeds), wall time:")
    for name in variants:
        rs = [r for r in results if r["variant"] == name]
        m, sd = mean_std([r["final"] for r in rs])
        w = sum(r["train_s"] for r in rs) / len(rs)
        print(f"  {name:9s} {m:.3f} +- {sd:.3f}   training time {w:.1f} s/run (start-up excluded)")
        x, y = mean_curve([r["curve"] for r in rs])
        ax.plot(x, y, label=f"{name} (final {m:.2f})")
    ax.set(xlabel="environment frames", ylabel="normalized return", title="PPO vs PPO-EWMA (CartPole-v1)")
    ax.legend()
    save_figure(fig, a.out / "ewma.png")


if __name__ == "__main__":
    main()
