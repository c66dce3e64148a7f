"""Summarize a Procgen run logged with Lightning's CSVLogger: a frames-vs-return table (markdown) and,
optionally, a PNG of training-episode return and held-out evaluation returns.

    python experiments/procgen/summarize_run.py RUN_DIR/lightning_logs/version_0/metrics.csv --png curve.png
"""

from __future__ import annotations

import argparse
import csv
import math


def load(path: str) -> list[dict[str, float]]:
    rows = []
    for raw in csv.DictReader(open(path)):
        row = {k: float(v) for k, v in raw.items() if v not in ("", None)}
        if "frames" in row:
            rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("metrics_csv")
    p.add_argument("--png", default=None)
    p.add_argument("--every", type=int, default=10, help="table row every n iterations")
    args = p.parse_args()
    rows = load(args.metrics_csv)
    keys = [("frames", "frames"), ("time/elapsed_s", "minutes"), ("episode/return_mean20", "train return (last 20 ep.)"),
            ("episode/normalized_return_mean20", "normalized"), ("eval/train/return_mean", "eval train levels"),
            ("eval/test/return_mean", "eval held-out levels"), ("time/fps", "frames/s")]
    print("| " + " | ".join(h for _, h in keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        it = int(row.get("iteration", 0))
        if it != 1 and it % args.every and row is not rows[-1]:
            continue
        cells = []
        for k, _ in keys:
            v = row.get(k, math.nan)
            cells.append("" if math.isnan(v) else f"{v / 60:.1f}" if k == "time/elapsed_s" else f"{v:,.0f}" if k == "frames" else f"{v:.2f}")
        print("| " + " | ".join(cells) + " |")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        f = [r["frames"] for r in rows if "episode/return_mean20" in r]
        ax.plot(f, [r["episode/return_mean20"] for r in rows if "episode/return_mean20" in r], label="training episodes (last 20)")
        for split, style in (("train", "o-"), ("test", "s--")):
            pts = [(r["frames"], r[f"eval/{split}/return_mean"]) for r in rows if f"eval/{split}/return_mean" in r]
            if pts:
                ax.plot(*zip(*pts), style, label=f"evaluation, {split} levels")
        ax.set_xlabel("frames")
        ax.set_ylabel("episode return")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.png, dpi=100)


if __name__ == "__main__":
    main()
