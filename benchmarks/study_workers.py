"""A study on 1 and on 2 local workers (issue 36): the wall-time ratio, and the runner's own overhead.

    python benchmarks/study_workers.py                         # 2 envs x 2 arms x 4 seeds x 100k frames
    python benchmarks/study_workers.py --frames 8192 --seeds 1 # a quick check that it runs
    python benchmarks/study_workers.py --plan                  # the two plans and their estimates only

One small real study (MinAtar Breakout and SpaceInvaders, PPO and PPO-EWMA at the base
configuration, `ppo_lightning/configs/minatar/ppo.yaml`, one thread per run) runs through
``ppo-lightning study run`` on submitit's local executor with ``--workers 1``, then again, in a fresh
run folder with fresh records, with ``--workers 2``. The runner packs each env's arms x seeds into
one vectorized group; on 1 worker they train one after the other, on 2 the planner splits the
groups where that balances the workers (`ppo_lightning.studies.runner.balance`, at its default rates:
no cell is recorded), and the plans and their estimated times are printed first. At the default size
the first run takes ~3-5 minutes on 2 idle cores.

Printed per run:
- wall: the ``study run`` call, from planning to the CSV export;
- compute: the training time its cells record (the groups' fit time, summed: core-seconds at one
  thread per run);
- outside training: workers x wall - compute, in core-seconds (each worker's process start, imports,
  MLflow runs, checkpoints, and a worker left idle when the other still trains);
- runner: the CPU time of the runner's own process (planning, submitting, polling, records) plus
  the report (analysis and plots), as a fraction of compute (target < 2%).
Then the ratio wall(1 worker) / wall(2 workers) (target >= 1.7 on 2 cores), and the cells compared:
a cell whose group has the same members in both plans must be bitwise the same (a group trains the
same in a process of its own or after another group); a cell the two plans group differently is
listed apart (a MinAtar member trained alone, a group of one, rounds otherwise than in a group: see
docs/experiments/index.md). The
wall clock measures other jobs too: run it on a quiet machine. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402


def study_file(folder: Path, frames: int, seeds: int) -> Path:
    d = {"study": "bench-workers", "title": "benchmark: 1 vs 2 local workers", "base": "minatar/ppo",
         "fit": {"trainer.precision": "32-true", "video_every": None, "log_every_frames": 8192},
         "envs": ["minatar:breakout", "minatar:space_invaders"], "seeds": {"count": seeds, "first": 0},
         "frames": frames, "score": "raw",
         "arms": [{"name": "ppo", "label": "PPO", "fit": {}},
                  {"name": "ppo_ewma", "label": "PPO-EWMA (COM 8)", "fit": {"model.decoupled": True, "model.proximal_com": 8}}],
         "comparisons": [{"claim": "PPO-EWMA differs from PPO", "a": "ppo_ewma", "b": "ppo"}]}
    path = folder / "bench_workers.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def one_run(path: Path, workers: int, root: Path) -> dict:
    from ppo_lightning.studies import runner
    from ppo_lightning.studies.report import report
    from ppo_lightning.studies.spec import load_study

    study = load_study(path)
    for p in (study.cells_csv, study.curves_csv):  # fresh records
        p.unlink(missing_ok=True)
    cpu0, t0 = time.process_time(), time.perf_counter()
    code = runner.run_study(study, workers=workers, executor="local", run_root=root,
                            tracking_uri=f"sqlite:///{root / 'mlflow.db'}", poll_s=1.0)
    wall, runner_cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if code:
        raise SystemExit(f"study run --workers {workers} failed (exit {code}); see {root / 'submitit'}")
    t1 = time.perf_counter()
    report(study, out_dir=root / "report")
    report_s = time.perf_counter() - t1
    cells = runner.recorded(root)
    compute = sum(c.train_s for c in cells.values() if math.isfinite(c.train_s))
    return {"workers": workers, "wall_s": wall, "compute_s": compute, "outside_s": workers * wall - compute, "runner_cpu_s": runner_cpu,
            "report_s": report_s, "overhead_fraction": (runner_cpu + report_s) / compute if compute else float("nan"),
            "cells": {f"{a}|{e}|{s}": (c.auc_return, c.final_return) for (a, e, s), c in cells.items()},
            "groups": {f"{a}|{e}|{s}": c.group for (a, e, s), c in cells.items()}}


def show_plans(path: Path) -> dict:
    """The groups of the 1- and 2-worker plans (fresh records: the default rates), dealt, with their estimates."""
    from ppo_lightning.studies import runner
    from ppo_lightning.studies.spec import load_study

    study = load_study(path)
    spans = {}
    for workers in (1, 2):
        groups = runner.plan(study, set(), workers)
        bins = runner.deal(groups, workers)
        spans[workers] = runner.makespan([g.cost for g in groups], workers)
        print(f"plan for {workers} worker(s): " + " | ".join(
            "worker %d: %s" % (k, ", ".join(f"{g.env} x {len(g.members)} (~{g.cost:.0f} s)" for g in b)) for k, b in enumerate(bins))
            + f"; estimated makespan {spans[workers]:.0f} s", flush=True)
    print(f"estimated ratio 1 worker / 2 workers: {spans[1] / spans[2]:.2f}x (training only)", flush=True)
    return spans


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frames", type=int, default=100_000, help="frames per run (default 100,000)")
    p.add_argument("--seeds", type=int, default=4, help="seeds per arm and env (default 4)")
    p.add_argument("--keep", type=Path, default=None, help="keep the run folders here (default: a temporary folder)")
    p.add_argument("--plan", action="store_true", help="print the two plans and their estimates only, train nothing")
    a = p.parse_args(argv)
    from ppo_lightning.core.hardware import cpu_label

    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")  # the workers import this tree
    print(cpu_label(), f"| load {os.getloadavg()[0]:.1f} at start | {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    folder = Path(tempfile.mkdtemp(prefix="study-workers-")) if a.keep is None else a.keep
    folder.mkdir(parents=True, exist_ok=True)
    path = study_file(folder, a.frames, a.seeds)
    spans = show_plans(path)
    if a.plan:
        if a.keep is None:
            shutil.rmtree(folder, ignore_errors=True)
        return {"estimated_makespan_s": spans}
    runs = []
    for workers in (1, 2):
        root = folder / f"workers{workers}"
        shutil.rmtree(root, ignore_errors=True)
        r = one_run(path, workers, root)
        runs.append(r)
        print(f"workers {workers}: wall {r['wall_s']:.1f} s, compute {r['compute_s']:.1f} s, outside training {r['outside_s']:.1f} core-s, "
              f"runner {r['runner_cpu_s']:.2f} s CPU + report {r['report_s']:.1f} s = "
              f"{100 * r['overhead_fraction']:.2f}% of compute", flush=True)
    ratio = runs[0]["wall_s"] / runs[1]["wall_s"]

    # NaN-aware: a cell without a finished episode has a NaN return in both runs
    def differ(a, b):
        return any(not (x == y or (math.isnan(x) and math.isnan(y))) for x, y in zip(a, b))

    one, two = runs
    keys = sorted(set(one["cells"]) | set(two["cells"]))
    missing = [k for k in keys if k not in one["cells"] or k not in two["cells"]]
    same_group = [k for k in keys if k not in missing and one["groups"][k] == two["groups"][k]]
    regrouped = [k for k in keys if k not in missing and k not in same_group]
    diff = [k for k in same_group if differ(one["cells"][k], two["cells"][k])]
    for k in missing:
        print(f"cell {k} recorded in one run only", flush=True)
    for k in diff:
        print(f"cell {k} differs in the same group: (auc, final) {one['cells'][k]} on 1 worker, {two['cells'][k]} on 2", flush=True)
    for k in regrouped:
        print(f"cell {k} grouped differently ({one['groups'][k]} / {two['groups'][k]}): (auc, final) {one['cells'][k]} "
              f"on 1 worker, {two['cells'][k]} on 2{'' if differ(one['cells'][k], two['cells'][k]) else ' (equal)'}", flush=True)
    same = not diff and not missing
    print(f"wall ratio 1 worker / 2 workers: {ratio:.2f}x (target >= 1.7 on 2 cores; estimated {spans[1] / spans[2]:.2f}x); "
          f"runner overhead {100 * max(r['overhead_fraction'] for r in runs):.2f}% of compute (target < 2%); "
          f"{len(same_group)} cells in the same group in both runs, bitwise the same: {same}; {len(regrouped)} grouped differently", flush=True)
    out = {"machine": cpu_label(), "frames": a.frames, "seeds": a.seeds, "ratio": ratio, "estimated_ratio": spans[1] / spans[2],
           "same_cells": same, "regrouped_cells": len(regrouped),
           "runs": [{k: v for k, v in r.items() if k not in ("cells", "groups")} for r in runs]}
    if a.keep is None:
        shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
