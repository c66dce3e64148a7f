"""``ppo-lightning tune --space SPACE.yaml [--config BASE] [--trials N] [--members S] [--frames F]``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import submitit

from ppo_lightning.core.errors import UnwritablePath
from ppo_lightning.core.safety import UnsafeInput
from ppo_lightning.run.preflight import check_run_root
from ppo_lightning.studies.runner import (SubmissionFailed, executor_cluster, job_failures, jobs_stop_with_the_launcher,
                                          submit_jobs)
from ppo_lightning.tuning import runner
from ppo_lightning.tuning.preflight import check_space
from ppo_lightning.tuning.space import SpaceError, load_space
from ppo_lightning.tuning.summary import summarize

USAGE = """ppo-lightning tune --space SPACE.yaml [--config BASE] [--trials N] [--members S] [--frames F]
                         [--no-refill] [options]

  Optuna's ask-and-tell over a search-space file: S / seeds.count trials asked at once train as one
  vectorized group whose members carry their own settings (lr, EWMA age or PPO, advantage span, Adam
  betas, clip range, entropy and value coefficients, KL beta, gamma, GAE lambda); trials that differ in
  other settings split into groups. A pruned or finished trial's slots take the next trial, so a
  group stays full (--no-refill, or refill: false in the file: they idle). Several workers
  (--workers, or this command started on several machines with the same --run-root on a shared
  filesystem) share the study through Optuna's journal file; a rerun continues the search (a killed
  worker's untold trials are asked again). Ends with the best settings, their CI over seeds, plots
  and the command that trains them."""


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ppo-lightning tune", description=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--space", type=Path, required=True, help="the search-space file (experiments/tuning/*.yaml)")
    p.add_argument("--config", action="append", default=None, help="base config(s), instead of the file's base")
    p.add_argument("--trials", type=int, default=None, help="trials in the search (all workers together)")
    p.add_argument("--members", type=int, default=None, help="members of a group: trials x seeds per trial")
    p.add_argument("--frames", type=int, default=None, help="frames per trial and seed")
    p.add_argument("--no-refill", action="store_true",
                   help="a pruned or finished trial's slots idle instead of taking the next trial "
                        "(the file's refill: false)")
    p.add_argument("--workers", type=int, default=1,
                   help="parallel workers started here (submitit: SLURM where srun exists, local processes otherwise); "
                        "1: this process")
    p.add_argument("--executor", choices=["auto", "local", "slurm"], default="auto", help="submitit executor for --workers > 1")
    p.add_argument("--run-root", type=Path, default=None, help="the search's folder: journal, leases, groups, plots "
                                                              "(default runs/tuning/<name>; shared between machines)")
    p.add_argument("--tracking-uri", default=None, help="MLflow store (default sqlite in the run root)")
    p.add_argument("--stale-after", type=float, default=None,
                   help="seconds without a heartbeat after which a worker on another host counts as gone (default 120)")
    p.add_argument("--summary-only", action="store_true", help="train nothing: print the best settings and plot the search")
    p.add_argument("--no-plots", action="store_true", help="no plots in the summary")
    p.add_argument("--trust-code", action="store_true",
                   help="allow the class paths, objective paths and module:EnvId env ids the space file (and the "
                        "config files it names) would import; only for files you trust")
    a = p.parse_args(argv)
    base = None if a.config is None else [str(Path(c).resolve()) if Path(c).exists() else c for c in a.config]
    overrides = {"base": base, "trials": a.trials, "members": a.members, "frames": a.frames,
                 "refill": False if a.no_refill else None}
    try:
        space = load_space(a.space.resolve(), overrides)
    except SpaceError as err:
        print(f"error: {err}")
        return 2
    if a.workers < 1:
        print(f"error: --workers must be >= 1, got {a.workers}")
        return 2
    run_root = (a.run_root or space.root / "runs" / "tuning" / space.name).resolve()
    stale = a.stale_after if a.stale_after is not None else runner.STALE_AFTER_S
    if not a.summary_only:
        # pre-flight: code the file would import, a trial's settings through fit's parser, the env
        # built once, the run root writable and free of links: before any worker starts
        try:
            check_space(space, a.trust_code, run_root)
            check_run_root(run_root, "search run root", "choose another with --run-root")
        except UnsafeInput as err:
            print(f"error: {err}")
            return 2
        except UnwritablePath as err:
            print(f"error: {err}")
            return err.exit_code
        code = run_workers(space, run_root, a.workers, a.executor, a.tracking_uri, stale)
        if code:
            return code
    summarize(space, runner.open_study(space, runner.journal_path(run_root)), run_root, plots=not a.no_plots)
    return 0


class _Job:
    """One submitit job: a worker of the search."""

    def __init__(self, space_path: str, overrides: dict, run_root: str, tracking_uri: str | None, stale: float) -> None:
        self.space_path, self.overrides, self.run_root, self.tracking_uri, self.stale = space_path, overrides, run_root, tracking_uri, stale

    def __call__(self) -> int:
        space = load_space(self.space_path, self.overrides)
        return runner.run_worker(space, Path(self.run_root), tracking_uri=self.tracking_uri, stale_after=self.stale)

    def checkpoint(self, *args, **kwargs):
        return submitit.helpers.DelayedSubmission(_Job(self.space_path, self.overrides, self.run_root, self.tracking_uri,
                                                       self.stale))


def run_workers(space, run_root: Path, workers: int, executor: str, tracking_uri: str | None, stale: float) -> int:
    if workers == 1:
        runner.run_worker(space, run_root, tracking_uri=tracking_uri, stale_after=stale)
        return 0
    overrides = {k: v for k, v in {"base": list(space.base), "trials": space.trials, "members": space.members,
                                   "frames": space.frames, "refill": None if space.refill else False}.items()}
    ex = submitit.AutoExecutor(folder=run_root / "submitit", cluster=executor_cluster(executor))
    ex.update_parameters(timeout_min=60 * 24 * 3, cpus_per_task=1, name=space.name)
    if ex.cluster == "slurm":
        ex.update_parameters(slurm_array_parallelism=workers, slurm_additional_parameters={"requeue": True})

    try:
        jobs = submit_jobs(ex, [_Job(str(space.path), overrides, str(run_root), tracking_uri, stale) for _ in range(workers)])
    except SubmissionFailed as err:
        print(f"[tune] error: {err}", flush=True)
        return 2

    with jobs_stop_with_the_launcher(jobs, "tune", "rerunning the command"):
        while not all(j.done() for j in jobs):
            time.sleep(1.0)
    failed = job_failures(jobs)
    if failed:
        print("[tune] failed: " + "; ".join(failed), flush=True)
        return 1
    return 0
