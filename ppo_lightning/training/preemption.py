"""Preemption: SIGTERM, SIGINT and SLURM's requeue signal end a run at a safe point, resumably.

A cluster stops jobs with a signal (SIGTERM at a time limit or a preemption, SIGUSR1 -- or the
signal given to ``sbatch --signal`` -- shortly before, for jobs that requeue themselves), a user with
Ctrl+C (SIGINT). `Preemption` turns any of them into:

1. a note on stderr from the process that got it; training goes on to the end of the current
   iteration (the safe point: every piece of the resume state is consistent there, the same point
   the periodic checkpoints use, so the resumed run is *bitwise* the uninterrupted one);
2. at that iteration's end, all data-parallel ranks agree (one small all-reduce per iteration: the
   signal may reach only one of them) and save ``<run>/checkpoints/last.ckpt`` with the whole resume
   state, atomically (`ppo_lightning.training.checkpointing`, `ppo_lightning.training.sharded`);
3. fit ends; the command prints one line (``preempted: ...``) and exits with ``128 + signal`` (143
   for SIGTERM, 130 for SIGINT, 138 for SIGUSR1), never 0, as a shell reports a process killed by
   that signal; the MLflow run is marked KILLED (a resume continues it).

A second signal of the same kind stops at once, without a new checkpoint (the last one stays).

Under SLURM (`slurm_job_id`), the requeue signal of Lightning's ``SLURMEnvironment`` (SIGUSR1 unless
configured otherwise; ``auto_requeue`` on by default) also requeues the job (``scontrol requeue``)
after the checkpoint is written -- Lightning's own handler would save a checkpoint inside the
signal handler, in the middle of an optimizer step, which does not resume exactly. The requeued
job runs the same command: its default run folder is named after the job (``slurm-<id>``), so it
finds ``last.ckpt`` (or a Lightning ``hpc_ckpt_N.ckpt``) there by itself
(`ppo_lightning.interop.run_folder.find_resume_checkpoint`)
and continues the same MLflow run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import Callback, Checkpoint, ModelCheckpoint

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def exit_code(signum: int) -> int:
    """The exit code of a run stopped by ``signum`` (as a shell reports a process killed by it)."""
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


# ---------------------------------------------------------------------------- SLURM


def slurm_job_id() -> str | None:
    """The SLURM job id (``ARRAYID_TASKID`` for array jobs) of a batch job; None outside SLURM or in
    an interactive allocation (as Lightning's ``SLURMEnvironment.detect``)."""
    if not SLURMEnvironment.detect():
        return None
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array is not None:
        return f"{array}_{os.environ.get('SLURM_ARRAY_TASK_ID', '0')}"
    return os.environ.get("SLURM_JOB_ID")


def slurm_run_name() -> str | None:
    """The default run name under SLURM: stable across requeues of the same job."""
    job = slurm_job_id()
    return None if job is None else f"slurm-{job}"


def run_name(name: str | None = None) -> str:
    """A run's name (MLflow's and its folder's): ``--mlflow.run_name``, else the SLURM job's (a requeued
    job finds its folder again), else the time."""
    return name or slurm_run_name() or time.strftime("%Y%m%d-%H%M%S")


def requeue_signal(trainer) -> int:
    """The signal Lightning's ``SLURMEnvironment`` requeues on (SIGUSR1 by default)."""
    env = getattr(trainer.strategy, "cluster_environment", None)
    if isinstance(env, SLURMEnvironment) and env.requeue_signal is not None:
        return int(env.requeue_signal)
    return int(signal.SIGUSR1)


def auto_requeue(trainer) -> bool:
    env = getattr(trainer.strategy, "cluster_environment", None)
    if isinstance(env, SLURMEnvironment):
        return bool(env.auto_requeue)
    return slurm_job_id() is not None  # one task: Lightning's default (auto_requeue=True)


def requeue_job(job_id: str) -> str:
    """``scontrol requeue JOB``; returns a short report for the closing line."""
    try:
        out = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"requeue of SLURM job {job_id} failed ({type(err).__name__}: {err})"
    if out.returncode != 0:
        return f"requeue of SLURM job {job_id} failed (scontrol: {(out.stderr or out.stdout).strip()[:200]})"
    return f"SLURM job {job_id} requeued"


# ---------------------------------------------------------------------------- the callback


class _SignalStop:
    """Stops fit at the end of the iteration in which a handled signal arrived (see the module
    docstring); `Preemption` saves ``last.ckpt`` first, `SignalStop` (checkpointing disabled) not."""

    save = True

    def __init__(self, dirpath: str) -> None:
        self.dirpath = os.path.realpath(dirpath)  # as ModelCheckpoint keeps its own (compared below)
        self.requested: int | None = None  # the signal this process received
        self.stopped_by: int | None = None  # the signal (of any rank) that stopped fit
        self.iteration: int | None = None
        self.checkpoint_path: str | None = None
        self.requeue_signal = int(signal.SIGUSR1)
        self.requeue = False
        self._previous: dict[int, object] = {}
        self._saved_step = -1

    # -- handlers
    def _install(self, trainer) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self.requeue_signal = requeue_signal(trainer)
        signums = {int(s) for s in HANDLED} | {self.requeue_signal}
        for signum in signums:
            previous = signal.signal(signum, self._on_signal)
            self._previous.setdefault(signum, previous)

    def _restore(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def _on_signal(self, signum, frame) -> None:
        name = signal_name(signum)
        if self.requested is not None:  # a second one: stop now, as the signal's default action
            os.write(2, f"[ppo-lightning] second {name}: stopping now, without a new checkpoint\n".encode())
            self._restore()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.requested = int(signum)
        os.write(2, f"[ppo-lightning] received {name}: saving a checkpoint at the end of this iteration, "
                    f"then exiting with code {exit_code(signum)} (another {name} exits now)\n".encode())

    # -- Lightning hooks
    def setup(self, trainer, pl_module, stage: str) -> None:
        self._install(trainer)  # covers env construction and checkpoint restore

    def on_train_start(self, trainer, pl_module) -> None:
        # Lightning registers its own SIGTERM (and, under SLURM, requeue-signal) handlers after
        # setup; ours replace them for the training loop (its handler saves mid-step).
        self._install(trainer)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self._restore()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._saved_step = trainer.global_step

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        signum = self._agreed_signal(trainer)
        if not signum:
            return
        dm = trainer.datamodule
        self.stopped_by = signum
        self.iteration = getattr(dm, "iteration", trainer.current_epoch + 1)
        if not self.save:  # trainer.enable_checkpointing false: nothing to save, still not exit 0
            self.checkpoint_path = None
            self.requeue = False
            trainer.should_stop = True
            return
        path = str(Path(self.dirpath) / "last.ckpt")
        if not (self._saved_step == trainer.global_step and self._last_written_by_checkpointing(trainer, path)):
            # The periodic checkpoint's `last.ckpt` from now on (recorded in this checkpoint): else,
            # on resume, `ModelCheckpoint` takes it for a stranger's file and writes last-v1.ckpt.
            for cb in trainer.checkpoint_callbacks:
                if isinstance(cb, ModelCheckpoint) and cb.save_last and cb.dirpath is not None \
                        and os.path.realpath(cb.dirpath) == self.dirpath:
                    cb.last_model_path = path
            trainer.save_checkpoint(path, weights_only=False)
        self.checkpoint_path = path
        self.requeue = signum == self.requeue_signal and auto_requeue(trainer) and slurm_job_id() is not None
        trainer.should_stop = True

    def _last_written_by_checkpointing(self, trainer, path: str) -> bool:
        for cb in trainer.checkpoint_callbacks:
            if cb is not self and getattr(cb, "last_model_path", None) and Path(cb.last_model_path) == Path(path):
                return True
        return False

    def _agreed_signal(self, trainer) -> int:
        """The largest signal number any rank received (0: none); a collective on several ranks."""
        local = self.requested or 0
        if trainer.world_size == 1 or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return local
        device = trainer.strategy.root_device if torch.distributed.get_backend() == "nccl" else torch.device("cpu")
        t = torch.tensor([local], dtype=torch.int64, device=device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return int(t.item())

    # -- after fit
    def report(self, trainer) -> str:
        """The closing line (rank 0 prints it)."""
        dm = trainer.datamodule
        frames = getattr(dm, "frames", None)
        line = (f"preempted: {signal_name(self.stopped_by)} received; stopped at the end of iteration {self.iteration}"
                + (f" ({frames} frames)" if frames is not None else "")
                + (f", checkpoint {self.checkpoint_path}" if self.checkpoint_path else
                   ", no checkpoint (trainer.enable_checkpointing is false)")
                + f"; exit code {exit_code(self.stopped_by)}")
        return line


class Preemption(_SignalStop, Checkpoint):
    """`_SignalStop` that saves ``<dirpath>/last.ckpt`` first. A `Checkpoint` so that Lightning calls
    it after the module's ``on_train_epoch_end`` (the iteration's last state change) and after the
    periodic checkpoint, whose ``last.ckpt`` it then does not write again."""


class SignalStop(_SignalStop, Callback):
    """`_SignalStop` for runs with ``trainer.enable_checkpointing: false`` (Lightning refuses any
    `Checkpoint` callback there): the same line and exit code 128 + n, no checkpoint."""

    save = False


def preempted(trainer) -> _SignalStop | None:
    """The trainer's `Preemption` / `SignalStop` callback if a signal stopped its fit, else None."""
    for cb in getattr(trainer, "callbacks", []):
        if isinstance(cb, _SignalStop) and cb.stopped_by is not None:
            return cb
    return None


def finish(trainer, logger=None) -> int | None:
    """After fit: print the closing line (rank 0), mark the MLflow run KILLED, requeue under SLURM
    (rank 0, when the requeue signal stopped the run); returns the exit code, None if not preempted."""
    cb = preempted(trainer)
    if cb is None:
        return None
    if trainer.is_global_zero:
        extra = ""
        if logger is not None and getattr(logger, "failed", True) is False and hasattr(logger, "set_status"):
            try:  # through the logger's sender: never waits on a tracking server that is away
                logger.set_run_tag("preempted_by", f"{signal_name(cb.stopped_by)} at iteration {cb.iteration}")
                logger.set_status("KILLED")
            except Exception as err:  # noqa: BLE001 - the checkpoint is what matters
                extra += f"; MLflow status not updated ({type(err).__name__})"
        job = slurm_job_id() if cb.requeue else None
        if job is not None:
            extra += f"; requeueing SLURM job {job}"
        print(cb.report(trainer) + extra, file=sys.stderr, flush=True)
        if job is not None:  # last: SLURM ends the job's processes when it requeues it
            result = requeue_job(job)
            if "failed" in result:
                print(f"error: {result}", file=sys.stderr, flush=True)
    return exit_code(cb.stopped_by)
