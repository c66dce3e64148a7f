"""``ppo-lightning study run|status|report FILE``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ppo_lightning.core.errors import StorageFull, UnwritablePath
from ppo_lightning.core.hardware import core_count
from ppo_lightning.core.safety import UnsafeInput
from ppo_lightning.run.preflight import check_run_root
from ppo_lightning.studies import runner
from ppo_lightning.studies.preflight import check_groups, check_study
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
    p.add_argument("--executor", choices=["auto", "local", "slurm"], default="auto", help="run: submitit executor (auto: SLURM where its controller answers, else local processes)")
    p.add_argument("--run-root", type=Path, default=None, help="run, status: the folder of the runs (default runs/studies/<study> beside the repository "
                   "holding the study file, else beside the file)")
    p.add_argument("--tracking-uri", default=None, help="run: MLflow store (default sqlite in the run root)")
    p.add_argument("--checkpoint-frames", type=int, default=None,
                   help="run: a group checkpoints every this many frames per member (default 65536)")
    p.add_argument("--envs", default=None,
                   help="run, status, report: only the cells of these envs of the file (comma-separated, as the file spells "
                        "them), in that order, e.g. the cheap tasks first; the others stay pending, the records stay "
                        "the whole study's; report: an interim report pooled over these envs alone, written beside the "
                        "whole study's (<stem>_over_<k>_envs.md), not with --into")
    p.add_argument("--arms", default=None,
                   help="run, status: only the cells of these arms of the file (comma-separated, by name), e.g. one "
                        "group of a task at a time; with --envs, those arms on those envs; the others stay pending")
    p.add_argument("--into", type=Path, default=None, help="report: also replace the study's block in this docs page")
    p.add_argument("--out", type=Path, default=None, help="report: folder (default experiments/results/studies)")
    p.add_argument("--no-plots", action="store_true", help="report: tables only")
    p.add_argument("--trust-code", action="store_true",
                   help="run: allow the class paths, objective paths and module:EnvId env ids the study file (and "
                        "the config files it names) would import; only for files you trust")
    p.add_argument("--runs", type=Path, default=None,
                   help="report: a folder of run roots (e.g. runs/studies): also read the cell files of runs in progress "
                        "there (<runs>/<study name>/cells), for the study and its confirming study")
    a = p.parse_args(argv)
    if a.workers is not None and a.workers < 1:
        print(f"error: --workers must be >= 1, got {a.workers}")
        return 2
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

        if a.arms is not None:
            print("error: --arms is for study run and status (a report compares the arms its comparisons name)")
            return 2
        if a.envs is not None and len(studies) > 1:
            print("error: --envs names one study's envs: give one study file with it")
            return 2
        try:
            envs = None if a.envs is None else runner.only_envs(studies[0], a.envs)
        except ValueError as err:
            print(f"error: {studies[0].path}: {err}")
            return 2
        try:
            for study in studies:
                report(study, a.out, a.into, plots=not a.no_plots, runs=a.runs, envs=envs)
        except (ValueError, OSError) as err:  # a page without the study's block, an unreadable page: one line
            print(f"error: {str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}")
            return 2
        return 0
    study = studies[0]
    try:
        envs = runner.only_envs(study, a.envs)
        arms = runner.only_arms(study, a.arms)
    except ValueError as err:
        print(f"error: {study.path}: {err}")
        return 2
    if a.action == "status":
        try:
            print(runner.status_text(study, a.run_root, a.workers, envs, arms))
        except (ValueError, TypeError) as err:  # an arm's settings the planner cannot read ("fast" for an lr)
            print(f"error: {study.path}: {err}")
            return 2
        return 0
    # pre-flight: code the file would import, every cell's settings through fit's parser, the
    # envs built once, the run root writable and free of links: before any worker starts
    try:
        check_study(study, a.trust_code)
        a.run_root = check_run_root((a.run_root or runner.default_run_root(study)).resolve(), "study run root",
                                    "choose another with --run-root")
        check_groups(study, a.run_root, a.workers or int(os.environ.get("SLURM_NTASKS", core_count())), envs, arms)
    except UnsafeInput as err:
        print(f"error: {err}")
        return 2
    except UnwritablePath as err:
        print(f"error: {err}")
        return err.exit_code
    try:
        return runner.run_study(study, workers=a.workers, executor=a.executor, run_root=a.run_root,
                                tracking_uri=a.tracking_uri, checkpoint_frames=a.checkpoint_frames, envs=envs, arms=arms)
    except RuntimeError as err:
        if not isinstance(err, StorageFull):
            raise
        print(f"error: {err}; the cells recorded before it are kept: free space and rerun `ppo-lightning study run "
              f"{study.path}` (recorded cells are skipped)")
        return err.exit_code
