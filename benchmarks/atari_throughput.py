"""Atari PPO frames per CPU-second: this project's ``atari/ppo`` against CleanRL's ``ppo_atari.py``, same machine.

    python benchmarks/atari_throughput.py --script ppo_atari.py --pythonpath DIR [--iterations 3]

Both at the PPO paper's Atari sizes (8 envs x 128 steps, 1,024 frames per iteration; ours 3 epochs x 4
minibatches as Table 5, CleanRL its default 4 epochs: ``--cleanrl-epochs 3`` gives it Table 5's), one torch
thread each, Breakout. Each runs ``--iterations`` iterations; the first is the warm-up and the rest are timed by
their CPU time (``time.process_time`` of the process: on a loaded machine CPU time is what a core gives, wall time
is not). CleanRL runs unmodified in a subprocess (`benchmarks/cleanrl_atari.py`, which says what it needs);
``DIR`` holds its gymnasium 0.29, its Atari wrappers (``cleanrl_utils``) and OpenCV.
Prints one JSON line per arm and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ours(iterations: int) -> dict:
    import lightning.pytorch as pl

    sys.path.insert(0, ROOT)
    from ppo_lightning.run.builder import fit_main

    marks = []

    class Clock(pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module) -> None:
            marks.append((trainer.datamodule.frames, time.process_time()))

    with tempfile.TemporaryDirectory() as run_dir:
        fit_main(["fit", "--config", "atari/ppo", "--mlflow.enabled", "false", "--run_dir", run_dir,
                  "--data.total_frames", str(1024 * iterations), "--checkpoint_every", "1000",
                  "--trainer.enable_checkpointing", "false"], extra_callbacks=[Clock()])
    (f0, c0), (f1, c1) = marks[0], marks[-1]
    return {"arm": "ppo-lightning atari/ppo", "frames": f1 - f0, "cpu_s": round(c1 - c0, 2),
            "frames_per_cpu_s": round((f1 - f0) / (c1 - c0), 1)}


def cleanrl(iterations: int, script: str, pythonpath: str | None, epochs: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        record = os.path.join(tmp, "record.jsonl")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "cleanrl_atari.py"), os.path.abspath(script),
                        "--threads", "1", "--record", record, "--", "--env-id", "BreakoutNoFrameskip-v4",
                        "--total-timesteps", str(1024 * iterations), "--update-epochs", str(epochs), "--cuda", "False"],
                       check=True, env=env, cwd=tmp, stdout=subprocess.DEVNULL)
        rows = [json.loads(line) for line in open(record) if '"sps"' in line]
    first, last = rows[0], rows[-1]
    frames, cpu = last["frames"] - first["frames"], last["cpu_s"] - first["cpu_s"]
    return {"arm": f"CleanRL ppo_atari.py ({epochs} epochs)", "frames": frames, "cpu_s": round(cpu, 2),
            "frames_per_cpu_s": round(frames / cpu, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--script", required=True, help="CleanRL's ppo_atari.py")
    parser.add_argument("--pythonpath", default=None)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--cleanrl-epochs", type=int, default=3)
    a = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    print(json.dumps({"load_1min": os.getloadavg()[0], "cpus": os.cpu_count()}), flush=True)
    mine = ours(a.iterations)
    print(json.dumps(mine), flush=True)
    theirs = cleanrl(a.iterations, a.script, a.pythonpath, a.cleanrl_epochs)
    print(json.dumps(theirs), flush=True)
    print(json.dumps({"ratio": round(mine["frames_per_cpu_s"] / theirs["frames_per_cpu_s"], 2), "target": 1.3}), flush=True)


if __name__ == "__main__":
    main()
