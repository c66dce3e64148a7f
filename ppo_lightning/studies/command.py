"""``ppo-lightning study run|status|report FILE``."""

from __future__ import annotations

import argparse
from pathlib import Path

from ppo_lightning.studies.spec import StudyError, load_study

USAGE = """ppo-lightning study {run,status,report} FILE [FILE ...] [options]

  run     train the study's pending cells: arms x seeds that differ only in per-member settings train as
          one vectorized group; groups are split over --workers (submitit: SLURM where srun exists,
          local processes otherwise); finished cells are skipped on a rerun
  status  done / running / pending cells, with an estimate of the time left
  report  verdicts, tables and plots from the recorded cells (experiments/results/studies/); several
          files in one command share its start-up"""


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ppo-lightning study", description=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["run", "status", "report"])
    p.add_argument("files", type=Path, nargs="+", metavar="FILE", help="study file(s): one for run and status")
    p.add_argument("--workers", type=int, default=None,
                   help="run: parallel workers; status: the workers its time left assumes (default: the CPU count, or SLURM's)")
    p.add_argument("--executor", choices=["auto", "local", "slurm"], default="auto", help="run: submitit executor")
    p.add_argument("--run-root", type=Path, default=None, help="run, status: the folder of the runs (default runs/studies/<study> beside the repository "
                   "holding the study file, else beside the file)")
    p.add_argument("--tracking-uri", default=None, help="run: MLflow store (default sqlite in the run root)")
    p.add_argument("--checkpoint-frames", type=int, default=None,
                   help="run: a group checkpoints every this many frames per member (default 65536)")
    p.add_argument("--into", type=Path, default=None, help="report: also replace the study's block in this docs page")
    p.add_argument("--out", type=Path, default=None, help="report: folder (default experiments/results/studies)")
    p.add_argument("--no-plots", action="store_true", help="report: tables only")
    p.add_argument("--runs", type=Path, default=None,
                   help="report: a folder of run roots (e.g. runs/studies): also read the cell files of runs in progress "
                        "there (<runs>/<study name>/cells), for the study and its confirming study")
    a = p.parse_args(argv)
    if a.action != "report" and len(a.files) > 1:
        print(f"error: study {a.action} takes one study file, got {len(a.files)}")
        return 2
    if a.into is not None and len(a.files) > 1:
        print("error: --into replaces one study's block: give one study file with it")
        return 2
    try:
        studies = [load_study(f.resolve()) for f in a.files]
    except StudyError as err:
        print(f"error: {err}")
        return 2
    if a.action == "report":  # start-up cost: the report needs rliable and matplotlib, not the runner
        from ppo_lightning.studies.report import report

        for study in studies:
            report(study, a.out, a.into, plots=not a.no_plots, runs=a.runs)
        return 0
    study = studies[0]
    # start-up cost: the runner imports submitit and, in its workers, the training stack
    from ppo_lightning.studies import runner

    if a.action == "status":
        print(runner.status_text(study, a.run_root, a.workers))
        return 0
    try:
        return runner.run_study(study, workers=a.workers, executor=a.executor, run_root=a.run_root,
                                tracking_uri=a.tracking_uri, checkpoint_frames=a.checkpoint_frames)
    except RuntimeError as err:
        from ppo_lightning.core.faults import StorageFull  # start-up cost: torch; only on this failure path

        if not isinstance(err, StorageFull):
            raise
        print(f"error: {err}; the cells recorded before it are kept: free space and rerun `ppo-lightning study run "
              f"{study.path}` (recorded cells are skipped)")
        return err.exit_code
