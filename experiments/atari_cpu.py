"""Atari at a CPU budget: this project's PPO (``atari/ppo``) and CleanRL's ``ppo_atari.py`` on the same
game, seeds and frames, each finished game's unclipped return recorded as it ends; resumable.

    python experiments/atari_cpu.py ours --seed 1 --frames 200000            # ALE/Breakout-v5
    python experiments/atari_cpu.py ours_cleanrl_settings --seed 1 --frames 200000   # with CleanRL's 4 epochs, constant clip, value coef 0.5
    python experiments/atari_cpu.py cleanrl --seed 1 --frames 200000 --script ppo_atari.py --pythonpath DIR
    python experiments/atari_cpu.py plot                                     # the page's figure and table

Records: ``experiments/results/atari_cpu/<arm>_seed<k>.jsonl``, one line per finished game
``{"frames": agent steps so far, "return": the game's score}``, plus ``{"done": frames}`` at the end.

Ours resumes from its run folder's ``last.ckpt`` (written every 10 iterations) with the records kept up to it;
run the same command again after a stop. CleanRL's script has no checkpoints: a stopped CleanRL run starts
again from frame 0 (its record is rewritten).

CleanRL (vwxyzjn/cleanrl, MIT) is third-party and not in this repository: fetch ``cleanrl/ppo_atari.py`` and
``cleanrl_utils/atari_wrappers.py`` from the public repository. The script was written for gymnasium 0.29 and
needs OpenCV: ``pip install --no-deps --target DIR gymnasium==0.29.1 opencv-python-headless==4.10.0.84``, the
wrappers as ``DIR/cleanrl_utils/``, and ``--pythonpath DIR`` (only the CleanRL process sees DIR). From outside
the script (`benchmarks/cleanrl_atari.py`): ``tyro`` and TensorBoard are replaced by stand-ins (the settings given here; the
scalars it writes go to the record), torch's threads are set, and ale-py's ids are registered with that gymnasium.
Its env id is ``BreakoutNoFrameskip-v4`` (no sticky actions, frame skip by its wrappers), the game ours plays as
``ALE/Breakout-v5`` with ``repeat_action_probability: 0``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "experiments" / "results" / "atari_cpu"
RUNS = ROOT / "runs" / "atari_cpu"
GAME = "Breakout"


def record_path(arm: str, seed: int) -> Path:
    return RECORDS / f"{arm}_seed{seed}.jsonl"


def read_record(path: Path) -> tuple[list[dict], int | None]:
    """(finished games, the frames at which the run ended or None)."""
    games, done = [], None
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if "done" in row:
                done = int(row["done"])
            elif "return" in row:
                games.append(row)
    return games, done


# ours with CleanRL's ppo_atari.py defaults where Table 5 differs: 4 epochs, the clip range constant, value coefficient 0.5
CLEANRL_SETTINGS = ["--data.update_epochs", "4", "--model.schedules", "{}", "--model.value_coef", "0.5"]
ARMS = ("ours", "ours_cleanrl_settings", "cleanrl")


def run_ours(seed: int, frames: int, threads: int, arm: str = "ours") -> None:
    """``arm``: ``ours`` (``atari/ppo`` as shipped) or ``ours_cleanrl_settings`` (`CLEANRL_SETTINGS` over it)."""
    import lightning.pytorch as pl

    sys.path.insert(0, str(ROOT))
    from ppo_lightning.run.builder import fit_main

    path = record_path(arm, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    run_dir = RUNS / f"{arm}_seed{seed}"
    last = run_dir / "checkpoints" / "last.ckpt"

    class Record(pl.Callback):
        """Appends every game that ended in the iteration; at a checkpoint, notes the frames it covers."""

        def __init__(self) -> None:
            self.seen = None

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            dm = trainer.datamodule
            count = dm.states[0].episodes.count
            if self.seen is None:
                self.seen = count if last.exists() else 0
            new = count - self.seen
            self.seen = count
            returns = list(dm.states[0].episodes.returns)[-new:] if new > 0 else []
            with open(path, "a") as f:
                for r in returns:
                    f.write(json.dumps({"frames": int(dm.frames), "return": float(r)}) + "\n")

    if last.exists():  # keep the games up to the checkpoint's frames (later ones are played again)
        import torch

        ckpt_frames = torch.load(last, map_location="cpu", weights_only=False).get("RolloutDataModule", {}).get("frames")
        games, _ = read_record(path)
        if ckpt_frames is not None:
            games = [g for g in games if g["frames"] <= ckpt_frames]
        path.write_text("".join(json.dumps(g) + "\n" for g in games))
    elif path.exists():
        path.unlink()
    args = ["fit", "--config", "atari/ppo", "--data.env_id", f"ALE/{GAME}-v5", "--seed_everything", str(seed),
            "--data.seed", str(seed), "--data.total_frames", str(frames), "--data.num_threads", str(threads),
            "--mlflow.enabled", "false", "--run_dir", str(run_dir), "--checkpoint_every", "10"]
    if arm == "ours_cleanrl_settings":
        args += CLEANRL_SETTINGS
    if last.exists():
        args += ["--ckpt_path", str(last)]
    cli = fit_main(args, extra_callbacks=[Record()])
    with open(path, "a") as f:
        f.write(json.dumps({"done": int(cli.datamodule.frames)}) + "\n")


def run_cleanrl(seed: int, frames: int, threads: int, script: str, pythonpath: str | None) -> None:
    path = record_path("cleanrl", seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    cmd = [sys.executable, str(ROOT / "benchmarks" / "cleanrl_atari.py"), script, "--threads", str(threads),
           "--record", str(path), "--", "--env-id", f"{GAME}NoFrameskip-v4", "--seed", str(seed),
           "--total-timesteps", str(frames), "--cuda", "False"]
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.abspath(pythonpath), env.get("PYTHONPATH")) if p)
    subprocess.run(cmd, check=True, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("arm", choices=(*ARMS, "plot"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--frames", type=int, default=200_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--script", default="ppo_atari.py", help="CleanRL's ppo_atari.py")
    parser.add_argument("--pythonpath", default=None, help="a folder only the CleanRL process sees")
    a = parser.parse_args()
    if a.arm in ("ours", "ours_cleanrl_settings"):
        run_ours(a.seed, a.frames, a.threads, a.arm)
    elif a.arm == "cleanrl":
        run_cleanrl(a.seed, a.frames, a.threads, a.script, a.pythonpath)
    else:
        plot()


def plot(out: Path = RECORDS / "atari_cpu_curves.png", window: int = 20, step: int = 50_000) -> None:
    """Each run's return (mean of its last ``window`` games) against frames, the two arms side by side;
    prints a markdown table of the last value of each run, then `windows` (stretches of ``step``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True, sharey=True)
    rows = []
    panels = ((axes[0], "ours", "seed", "-"), (axes[0], "ours_cleanrl_settings", "CleanRL's settings, seed", "--"),
              (axes[1], "cleanrl", "seed", "-"))
    for ax, arm, label, style in panels:
        for path in sorted(RECORDS.glob(f"{arm}_seed*.jsonl")):
            games, done = read_record(path)
            if not games:
                continue
            xs = [g["frames"] for g in games]
            rs = [g["return"] for g in games]
            ys = [sum(rs[max(0, i - window + 1): i + 1]) / len(rs[max(0, i - window + 1): i + 1]) for i in range(len(rs))]
            seed = path.stem.split("seed")[-1]
            ax.plot(xs, ys, style, label=f"{label} {seed}")
            rows.append((arm, seed, xs[-1], done, len(rs), ys[-1]))
    for ax, title in zip(axes, ("ppo-lightning atari/ppo", "CleanRL ppo_atari.py")):
        ax.set_title(title)
        ax.set_xlabel("agent steps (x4 emulator frames)")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylabel(f"{GAME} return, mean of last {window} games")
    fig.suptitle(f"{GAME}, PPO paper settings, 1 thread each (AMD EPYC, AVX2 only: EPYC-AVX2)", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print("| arm | seed | frames of the last game | finished at | games | mean of last 20 |")
    print("|---|---|---|---|---|---|")
    for arm, seed, x, done, n, y in rows:
        print(f"| {arm} | {seed} | {x:,} | {'not finished' if done is None else f'{done:,}'} | {n} | {y:.1f} |")
    windows(step)


def windows(step: int = 50_000) -> None:
    """A markdown table: each run's mean game return over stretches of ``step`` agent steps (a game
    counts in the stretch where it ended), then each arm's mean over its seeds (stretches every seed
    reached), with Welch's 95% interval of the arms' difference where both have 2 or more seeds."""
    from ppo_lightning.studies.analysis import welch_diff_ci

    runs, reach = {}, {}
    for arm in ARMS:
        for path in sorted(RECORDS.glob(f"{arm}_seed*.jsonl")):
            games, done = read_record(path)
            if games:
                key = (arm, path.stem.split("seed")[-1])
                runs[key], reach[key] = games, done if done is not None else games[-1]["frames"]
    if not runs:
        return
    edges = list(range(0, max(reach.values()) + 1, step))
    spans = list(zip(edges[:-1], edges[1:]))
    means = {}
    for key, games in runs.items():
        for lo, hi in spans:
            rs = [g["return"] for g in games if lo < g["frames"] <= hi]
            # only stretches the run went through (CleanRL's last iteration ends 320 steps short of 200k)
            if rs and reach[key] >= hi - step // 20:
                means[key, lo] = sum(rs) / len(rs)
    heads = [f"{lo // 1000}k-{hi // 1000}k" for lo, hi in spans]
    print(f"\n| run | {' | '.join(heads)} |")
    print("|---|" + "---|" * len(spans))
    for key in runs:
        print(f"| {key[0]} seed {key[1]} | " + " | ".join(f"{means[key, lo]:.2f}" if (key, lo) in means else ""
                                                         for lo, _ in spans) + " |")
    for arm in [a for a in ARMS if any(k[0] == a for k in runs)]:
        cells = []
        for lo, _ in spans:
            vals = [means[k, lo] for k in runs if k[0] == arm and (k, lo) in means]
            full = len(vals) == sum(1 for k in runs if k[0] == arm)
            cells.append(f"{sum(vals) / len(vals):.2f}" if vals and full else "")
        print(f"| {arm}, mean of seeds | " + " | ".join(cells) + " |")
    diffs = []
    for lo, _ in spans:
        a = [means[k, lo] for k in runs if k[0] == "ours" and (k, lo) in means]
        b = [means[k, lo] for k in runs if k[0] == "cleanrl" and (k, lo) in means]
        if len(a) >= 2 and len(b) >= 2:
            d, low, high = welch_diff_ci(a, b)
            diffs.append(f"{d:+.2f} [{low:+.2f}, {high:+.2f}]")
        else:
            diffs.append("")
    print("| ours - cleanrl, 95% Welch CI | " + " | ".join(diffs) + " |")


if __name__ == "__main__":
    main()
