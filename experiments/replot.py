"""Plot mean learning curves of runs already in MLflow, grouped by run-name prefix (the part before
``-s<seed>``), e.g. to compare groups that were run by separate invocations:

    python experiments/replot.py --experiment fig2-batch-size-invariance \
        --groups c1-all,c16-all,c16-lr_over_c --out experiments/results/batch_size_invariance_lr_over_c.png
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

from common import mean_curve, normalized, plt, save_figure


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--experiment", required=True)
    p.add_argument("--groups", required=True, help="comma list of run-name prefixes")
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--title", default=None)
    a = p.parse_args()
    import mlflow

    client = mlflow.MlflowClient(a.tracking_uri)
    exp = client.get_experiment_by_name(a.experiment)
    groups = a.groups.split(",")
    curves = collections.defaultdict(list)
    for r in client.search_runs([exp.experiment_id], max_results=10_000):
        g = r.info.run_name.rsplit("-s", 1)[0]
        if g not in groups:
            continue
        frames = {m.step: m.value for m in client.get_metric_history(r.info.run_id, "frames")}
        rets = client.get_metric_history(r.info.run_id, "episode/return_mean20")
        curves[g].append(sorted((frames[m.step], normalized(a.env, m.value)) for m in rets if m.step in frames))
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(6.5, 4.5))
    for g in groups:
        if curves[g]:
            x, y = mean_curve(curves[g])
            ax.plot(x, y, label=f"{g} (n={len(curves[g])})")
            print(f"{g}: n={len(curves[g])}, " + ", ".join(f"{x[i]:.0f}:{y[i]:.2f}" for i in range(9, len(x), 10)))
    ax.set(xlabel="environment frames", ylabel="normalized return", title=a.title or a.experiment)
    ax.legend()
    save_figure(fig, a.out)


if __name__ == "__main__":
    main()
