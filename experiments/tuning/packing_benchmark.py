"""Trials per core-hour: Optuna trials packed as members of one group against one trial per process.

    python experiments/tuning/packing_benchmark.py                    # c = 16, 8 trials, 16384 frames
    python experiments/tuning/packing_benchmark.py --scale 1 --frames 65536

The trials are those `ppo-lightning tune` asks for from experiments/tuning/minatar_breakout_500k.yaml
(random sampler, one seed each), at ``--scale c`` (the shipped config minatar/ppo: 64/c envs x 64
steps, 8 minibatches, 3 epochs). Packed: the trials as one group (the tuner's own fit arguments,
`ppo_lightning.tuning.runner.group_spec`). One per process: ``--singles`` of the same trials as
single runs (the arguments a trial of its own gets, `single_args`), plus the start-up of a Python
process that imports the training stack, measured once in a child process. Clock: CPU seconds
(one thread per run), so the figures are per core; the machine's other jobs do not count.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> None:
    import optuna

    from ppo_lightning.run import train
    from ppo_lightning.core.hardware import cpu_label
    from ppo_lightning.tuning import runner
    from ppo_lightning.tuning.space import load_space

    p = argparse.ArgumentParser()
    p.add_argument("--scale", type=float, default=16.0)
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--singles", type=int, default=2)
    p.add_argument("--frames", type=int, default=16384)
    a = p.parse_args()
    space = load_space(ROOT / "experiments" / "tuning" / "minatar_breakout_500k.yaml",
                       {"frames": a.frames, "members": a.trials, "trials": a.trials, "pruner": {"name": "none"}})
    space.fit["scale"] = a.scale
    space.fit["trainer.precision"] = "32-true"
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0), direction="maximize")
    trials = []
    for _ in range(a.trials):
        t = study.ask()
        trials.append({n: prm.suggest(t) for n, prm in space.params.items()})
    off = {"trainer.enable_checkpointing": False, "video_every": None, "mlflow.enabled": False,
           "trainer.enable_progress_bar": False}
    c0 = child_cpu()
    subprocess.run([sys.executable, "-c", "import ppo_lightning.run.builder, ppo_lightning.tuning.runner"], check=True,
                   cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    startup = child_cpu() - c0
    t0 = time.process_time()
    train(runner.group_spec(space, [(params, 0) for params in trials]).with_settings({**off, "run_dir": "/tmp/packing-group"}))
    packed = time.process_time() - t0
    singles = []
    for params in trials[:a.singles]:
        t0 = time.process_time()
        train(runner.single_spec(space, params, 0).with_settings({**off, "run_dir": "/tmp/packing-single"}))
        singles.append(time.process_time() - t0)
    single = sum(singles) / len(singles)
    per_packed, per_single = packed / a.trials, single
    out = {"scale": a.scale, "trials": a.trials, "frames": a.frames, "packed_cpu_s": round(packed, 1),
           "single_cpu_s": [round(s, 1) for s in singles], "startup_cpu_s": round(startup, 1),
           "trials_per_core_hour_packed": round(3600 / per_packed, 1),
           "trials_per_core_hour_single": round(3600 / per_single, 1),
           "speedup_training": round(per_single / per_packed, 2),
           "speedup_with_startup": round((per_single + startup) / (per_packed + startup / a.trials), 2),
           "machine": cpu_label(), "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
