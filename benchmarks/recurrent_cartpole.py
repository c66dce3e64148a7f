"""Memory on the partially observed CartPole (``ppo_lightning/CartPoleNoVel-v1``, issue 64): frames to a
mean return of 475 and frames per second, ours against sb3-contrib's RecurrentPPO on the same CPU.

Runs, per seed (each one torch thread, one after another; for each seed every impl in turn, so that a
change in the machine's load hits them alike):

- ``lstm``: ours, ``cartpole/ppo_lstm``;
- ``mlp``: ours, the feed-forward ``cartpole/ppo`` with ``--data.env_id ppo_lightning/CartPoleNoVel-v1``
  and the same frame budget (the baseline that has no memory);
- ``ewma_lstm``: ours, ``cartpole/ppo_ewma_lstm`` (PPO-EWMA with an LSTM);
- ``sb3``: sb3-contrib's ``RecurrentPPO`` with RL Zoo's ``CartPoleNoVel-v1`` settings
  (`benchmarks/recurrent_cartpole_sb3.py`), run by ``--sb3-python``: a Python with sb3-contrib, which is
  no dependency of the project (a separate venv: ``python3.11 -m venv sb3venv && sb3venv/bin/pip
  install torch==2.13.0 sb3-contrib==2.9.2 gymnasium==1.4.0``).

Criterion, the same for all: after each iteration (256 frames), the mean return of the last 20
finished training episodes (fewer while fewer have finished); ``frames_to_475`` is the frame count at
the end of the first iteration where it is >= 475 (None: not reached within the budget). ``--frames`` is
every run's budget, over which the schedules run (RL Zoo's length: 100k). Our configs stop at 475 (their
EarlyStopping); ``--full`` trains ours to the budget; sb3 always runs to the budget unless ``--sb3-stop``. Frames per
second = frames trained / wall seconds of training (from Lightning's on_train_start, or sb3's
``learn``); frames per CPU-second divides by this process's CPU time over the same span (the machine
may be loaded by others: CPU seconds are what the run itself used).

    python benchmarks/recurrent_cartpole.py --cpu-label EPYC-AVX2 [--seeds 1 2 3] [--impls lstm mlp ewma_lstm sb3]
        [--sb3-python /path/to/sb3venv/bin/python] [--frames 100000] [--full] [--out FILE.jsonl] [--plot FILE.png]
    python benchmarks/recurrent_cartpole.py --plot-only FILE.jsonl [--plot FILE.png]

Each run appends one JSON record to ``--out`` (default
``benchmarks/results/recurrent_cartpole_<cpu label>.jsonl``) when it ends; ``--sb3-json`` adds records
from the sb3 worker's saved output instead of running it. The machine is printed first; a table of the
runs and one JSON object of the medians last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch as pl

ROOT = Path(__file__).resolve().parents[1]
ENV_ID = "ppo_lightning/CartPoleNoVel-v1"
THRESHOLD = 475.0
OURS = {  # impl -> (config, extra arguments)
    "lstm": ("cartpole/ppo_lstm", []),
    "mlp": ("cartpole/ppo", ["--data.env_id", ENV_ID]),
    "ewma_lstm": ("cartpole/ppo_ewma_lstm", []),
}
IMPLS = (*OURS, "sb3")
LABELS = {"lstm": "ours, cartpole/ppo_lstm", "mlp": "ours, cartpole/ppo (MLP)", "ewma_lstm": "ours, cartpole/ppo_ewma_lstm",
          "sb3": "sb3-contrib RecurrentPPO (RL Zoo)"}


class Recorder(pl.Callback):
    """Frames, wall and CPU time when the criterion first holds; the mean of the last 20 episodes after
    every iteration; the training's wall and CPU time."""

    def __init__(self, name: str = "", every: int = 0) -> None:
        self.name, self.every = name, every  # print progress every `every` iterations (0: never)
        self.t0 = self.cpu0 = None
        self.crossing = None
        self.curve: list[list[float]] = []
        self.end = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.t0, self.cpu0 = time.perf_counter(), time.process_time()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        dm = trainer.datamodule
        mean20 = dm.states[0].episodes.mean_return(20)
        wall, cpu = time.perf_counter() - self.t0, time.process_time() - self.cpu0
        if mean20 == mean20:  # not NaN: an episode has finished
            self.curve.append([dm.frames, round(mean20, 2)])
        if self.crossing is None and mean20 >= THRESHOLD:
            self.crossing = {"frames_to_475": dm.frames, "wall_s_to_475": round(wall, 2), "cpu_s_to_475": round(cpu, 2)}
        if self.every and len(self.curve) % self.every == 0 and self.curve:
            print(f"  {self.name}: {dm.frames:,} frames, mean of the last 20 episodes {mean20:.1f}, {wall:.0f} s", flush=True)
        self.end = {"frames": dm.frames, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                    "episodes": len(dm.states[0].episodes.returns),
                    "final_mean20": None if mean20 != mean20 else round(mean20, 2)}


def run_ours(impl: str, seed: int, frames: int, full: bool, tmp: Path, every: int = 0, variant=()) -> dict:
    """One training run of ``impl``'s config, one torch thread; ``variant``: ``KEY=VALUE`` settings over it."""
    from ppo_lightning.run.builder import fit_main

    config, extra = OURS[impl]
    recorder = Recorder(f"{impl} seed {seed}", every)
    extra = [*extra, *fit_args(variant)]
    args = ["fit", "--config", config, "--seed_everything", str(seed), "--data.seed", str(seed),
            "--data.total_frames", str(frames), "--data.num_threads", "1", "--mlflow.enabled", "false",
            "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
            "--trainer.enable_checkpointing", "false", "--run_dir", str(tmp / f"{impl}-{seed}"), *extra]
    if full:
        args += ["--trainer.callbacks", "[]"]  # no EarlyStopping: train to the budget
    cli = fit_main(args, extra_callbacks=[recorder])
    return {"impl": impl, "config": config, "extra_args": extra + (["--trainer.callbacks", "[]"] if full else []),
            "variant": list(variant),
            "seed": seed, "frames_budget": frames, **recorder.end,
            **(recorder.crossing or {"frames_to_475": None, "wall_s_to_475": None, "cpu_s_to_475": None}),
            "grad_steps": cli.trainer.global_step, "curve": recorder.curve}


def run_sb3(python: str, seed: int, stop: bool, frames: int) -> dict:
    """One sb3-contrib run by ``python`` (`benchmarks/recurrent_cartpole_sb3.py`) of ``frames``."""
    cmd = [python, str(ROOT / "benchmarks" / "recurrent_cartpole_sb3.py"), "--seed", str(seed), "--frames", str(frames)]
    if stop:
        cmd.append("--stop-at-475")
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"error: the sb3 run failed ({' '.join(cmd)}): {done.stderr.strip().splitlines()[-1:]}")
    return sb3_record(json.loads(done.stdout.strip().splitlines()[-1]), frames)


def sb3_record(worker: dict, frames: int = 100_000) -> dict:
    """The sb3 worker's JSON as a record of this benchmark (``frames``: the run's budget)."""
    return {**worker, "impl": "sb3", "config": "RL Zoo hyperparams/ppo_lstm.yml CartPoleNoVel-v1", "frames_budget": frames}


def finish(record: dict, cpu_label: str, machine: dict) -> dict:
    """Frames per second and per CPU-second, the CPU label, the machine and the date."""
    record["fps"] = round(record["frames"] / record["wall_s"], 1) if record["wall_s"] else None
    record["fps_cpu"] = round(record["frames"] / record["cpu_s"], 1) if record["cpu_s"] else None
    record["cpu"] = cpu_label
    record["machine"] = machine
    record["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return record


def line(r: dict) -> str:
    reached = f"{r['frames_to_475']:>7,}" if r["frames_to_475"] is not None else "not reached"
    if r["frames_to_475"] is None and r["frames"] < r["frames_budget"]:
        reached += " (stopped before the budget)"  # a SIGTERM ends a run at its iteration's end
    return (f"{r['impl']:9s} seed {r['seed']}: frames to 475 {reached:>11s} (budget {r['frames_budget']:,}); "
            f"{r['frames']:,} frames in {r['wall_s']:.0f} s = {r['fps']:.0f} frames/s, {r['fps_cpu']:.0f} frames/CPU-s; "
            f"final mean of the last 20 episodes {r['final_mean20']}")


def key(record: dict) -> str:
    """The record's impl, with its ``--set`` variant if any (``lstm data.normalize_reward=true``)."""
    return " ".join([record["impl"], *record.get("variant", [])])


def frames_or_budget(r: dict) -> int:
    """Frames to 475, or the run's budget where it was not reached (a lower bound: counts against the run)."""
    return r["frames_to_475"] if r["frames_to_475"] is not None else r["frames_budget"]


def summary(records: list[dict]) -> dict:
    """Per impl (and variant): runs reaching 475 of all, median frames to 475 (over those that
    reached it), median frames per second and per CPU-second; with sb3 records beside, the difference
    of mean frames to 475 from sb3's (runs that did not reach it counted at their budget) with its
    95% Welch interval (`ppo_lightning.studies.analysis.welch_diff_ci`: few seeds per arm)."""
    from ppo_lightning.studies.analysis import welch_diff_ci

    sb3 = [frames_or_budget(r) for r in records if key(r) == "sb3"]
    out = {}
    for name in dict.fromkeys(key(r) for r in sorted(records, key=lambda r: IMPLS.index(r["impl"]))):
        rows = [r for r in records if key(r) == name]
        hits = [r["frames_to_475"] for r in rows if r["frames_to_475"] is not None]
        out[name] = {"reached": f"{len(hits)}/{len(rows)}", "seeds": sorted(r["seed"] for r in rows),
                     "frames_to_475_median": statistics.median(hits) if hits else None,
                     "frames_to_475": [r["frames_to_475"] for r in rows],
                     "fps_median": statistics.median(r["fps"] for r in rows),
                     "fps_cpu_median": statistics.median(r["fps_cpu"] for r in rows),
                     "final_mean20": [r["final_mean20"] for r in rows]}
        if name != "sb3" and len(sb3) >= 2 and len(rows) >= 2:
            d, low, high = welch_diff_ci([frames_or_budget(r) for r in rows], sb3)
            out[name]["frames_to_475_minus_sb3"] = {"mean": round(d), "ci95": [round(low), round(high)],
                                                   "sb3_runs": len(sb3)}
    return out


def plot(records: list[dict], path: Path) -> None:
    """The mean return of the last 20 episodes against frames, one line per run, 475 dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"lstm": "tab:blue", "mlp": "tab:gray", "ewma_lstm": "tab:green", "sb3": "tab:orange"}
    fig, ax = plt.subplots(figsize=(8, 4.5))
    variants = ["tab:purple", "tab:red", "tab:brown", "tab:pink"]
    seen: dict[str, str] = {}
    for r in records:
        if not r.get("curve"):
            continue
        x, y = zip(*r["curve"])
        name = key(r)
        label = None
        if name not in seen:
            seen[name] = colors[r["impl"]] if name == r["impl"] else variants[len(seen) % len(variants)]
            label = LABELS[r["impl"]] + "".join(f", {v}" for v in r.get("variant", []))
        ax.plot(x, y, color=seen[name], lw=1.2, alpha=0.85, label=label)
    ax.axhline(THRESHOLD, color="k", ls="--", lw=0.8)
    cpus = sorted({r["cpu"] for r in records})
    ax.set(xlabel="frames", ylabel="mean return of the last 20 training episodes",
           title=f"{ENV_ID}: one line per seed ({', '.join(cpus)})")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fit_args(settings: list[str]) -> list[str]:
    """``["model.lr=0.002"]`` -> ``["--model.lr", "0.002"]``."""
    out = []
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"error: --set takes KEY=VALUE, got {item!r}")
        out += [f"--{key}", value]
    return out


def read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-label", help="the CPU's label in the records and file names (EPYC-AVX2, ...)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    parser.add_argument("--frames", type=int, default=100_000, help="every run's budget (ours: data.total_frames); the schedules span it")
    parser.add_argument("--full", action="store_true", help="ours: train to the budget (no stop at 475)")
    parser.add_argument("--sb3-python", help="a Python with sb3-contrib (needed for --impls sb3)")
    parser.add_argument("--sb3-stop", action="store_true", help="sb3: stop after the rollout where 475 is first reached")
    parser.add_argument("--sb3-json", nargs="+", type=Path, default=[],
                        help="records from the sb3 worker's saved outputs (one JSON line each) instead of running it")
    parser.add_argument("--progress", type=int, default=0, help="ours: print the mean every N iterations (0: never)")
    parser.add_argument("--set", nargs="+", default=[], metavar="ARG",
                        help="ours: KEY=VALUE fit settings for every run, e.g. model.lr=0.002 (a variant of the configs; recorded)")
    parser.add_argument("--out", type=Path, help="the JSONL records are appended to")
    parser.add_argument("--plot", type=Path, help="the figure (default: --out with .png)")
    parser.add_argument("--plot-only", type=Path, help="only plot and summarize this JSONL")
    args = parser.parse_args(argv)

    if args.plot_only:
        records = read(args.plot_only)
        for r in records:
            print(line(r))
        plot(records, args.plot or args.plot_only.with_suffix(".png"))
        print(json.dumps(summary(records)))
        return 0
    if not args.cpu_label:
        parser.error("--cpu-label is required (the CPU the figures come from)")
    if "sb3" in args.impls and not (args.sb3_python or args.sb3_json):
        parser.error("--impls sb3 needs --sb3-python (a Python with sb3-contrib) or --sb3-json")
    import logging
    import tempfile

    from ppo_lightning.core.hardware import machine_info, machine_line

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    machine = machine_info()
    print(machine_line(machine), flush=True)
    stem = args.cpu_label.lower().replace("-", "_")
    out = args.out or ROOT / "benchmarks" / "results" / f"recurrent_cartpole_{stem}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    records = []

    def keep(record: dict) -> None:
        record = finish(record, args.cpu_label, machine)
        records.append(record)
        with out.open("a") as f:
            f.write(json.dumps(record) + "\n")
        print(line(record), flush=True)

    for path in args.sb3_json:
        keep(sb3_record(json.loads(path.read_text().strip().splitlines()[-1])))
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for impl in args.impls:
                if impl == "sb3":
                    if not args.sb3_json:
                        keep(run_sb3(args.sb3_python, seed, args.sb3_stop, args.frames))
                else:
                    keep(run_ours(impl, seed, args.frames, args.full, Path(tmp), args.progress, args.set))
    everything = read(out)
    plot(everything, args.plot or out.with_suffix(".png"))
    print(json.dumps({"cpu": args.cpu_label, "this_call": summary(records), "file": summary(everything)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
