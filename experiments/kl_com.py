"""Paper Fig. 18 at CPU scale: the KL-penalized decoupled objective over a grid of KL coefficient
beta x proximal-policy center of mass (EWMA COM, gradient steps).

    python experiments/kl_com.py                # full: beta in 0.1,0.3,1,3,10 x COM in 1,4,16,64, 3 seeds, 100k frames
    python experiments/kl_com.py --quick        # pipeline smoke test

Base: CartPole-v1, 32 envs x 32 steps (the default batch of batch_size_invariance.py), 4 minibatches, 3 epochs, Adam 1e-3, objective ``kl`` (fixed
beta), decoupled, EWMA proximal policy. Writes results/kl_com.{csv,png} (a heat map of the final
normalized return); MLflow experiment ``fig18-kl-com``.
"""

from __future__ import annotations

from common import base_args, common_parser, mean_std, plt, run, save_figure, write_csv

EXPERIMENT = "fig18-kl-com"


def main() -> None:
    p = common_parser(__doc__, default_frames=100_000, default_seeds=3)
    p.add_argument("--betas", default="0.1,0.3,1,3,10")
    p.add_argument("--coms", default="1,4,16,64")
    a = p.parse_args()
    if a.quick:
        a.frames, a.seeds, a.betas, a.coms = 2048, 1, "0.3,3", "1,16"
    betas = [float(b) for b in a.betas.split(",")]
    coms = [float(c) for c in a.coms.split(",")]
    results = []
    for seed in range(a.seeds):
        for beta in betas:
            for com in coms:
                args = base_args(a.env, a.frames, seed, ewma=False) + [
                    "--model.objective", "kl", "--model.kl_beta", f"{beta:g}", "--model.decoupled", "true",
                    "--model.proximal_com", f"{com:g}"]
                r = run(args, experiment=EXPERIMENT, run_name=f"beta{beta:g}-com{com:g}-s{seed}",
                        tracking_uri=a.tracking_uri, env_id=a.env, run_root=a.run_root)
                results.append({"beta": beta, "com": com, "seed": seed, **r})
    rows = [{"kl_beta": r["beta"], "proximal_com": r["com"], "seed": r["seed"], "frames": r["frames"],
             "final_normalized_return": round(r["final"], 4), "wall_s": round(r["wall_s"], 1),
             "mlflow_run_id": r["run_id"]} for r in results]
    write_csv(a.out / "kl_com.csv", rows)
    grid = [[mean_std([r["final"] for r in results if r["beta"] == b and r["com"] == c])[0] for c in coms]
            for b in betas]
    print("\nfinal normalized return, rows beta, columns COM " + " ".join(f"{c:g}" for c in coms))
    for b, row in zip(betas, grid):
        print(f"  beta={b:<5g} " + " ".join(f"{v:.3f}" for v in row))
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(6, 4.5))
    im = ax.imshow(grid, origin="lower", vmin=0, vmax=1, cmap="viridis")
    ax.set_xticks(range(len(coms)), [f"{c:g}" for c in coms])
    ax.set_yticks(range(len(betas)), [f"{b:g}" for b in betas])
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="w" if v < 0.6 else "k")
    ax.set(xlabel="proximal COM (gradient steps)", ylabel="KL coefficient beta",
           title=f"decoupled KL objective, final normalized return ({a.frames} frames)")
    fig.colorbar(im, ax=ax)
    save_figure(fig, a.out / "kl_com.png")


if __name__ == "__main__":
    main()
