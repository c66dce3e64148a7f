"""A run's folder, as read from outside the run: where it is, which checkpoint resumes it, whose it is.

Beside the checkpoint reader (`ppo_lightning.interop.checkpoint_io`):

- `run_folder`: ``--run_dir``, else the folder of the run a checkpoint resumes, else ``runs/<experiment>/<name>``.
- `find_resume_checkpoint`: the newest ``last.ckpt`` or Lightning ``hpc_ckpt_N.ckpt`` of a folder
  (a requeued SLURM job resumes from it by itself).
- `read_tracking_state`, `own_tracking_state`: the run folder and MLflow run a checkpoint records,
  continued only when the checkpoint lies in that folder (resuming in place); a checkpoint that
  records a foreign run folder never chooses where this run writes.
- `check_run_folder`: the files a run writes in its folder are not symbolic links.
- `resume_command`: the command line that resumes a run from a checkpoint.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from ppo_lightning.core.errors import CheckpointError
from ppo_lightning.core.safety import refuse_symlink
from ppo_lightning.interop.checkpoint_io import read_meta

TRACKING_STATE_KEY = "TrackingState"  # `ppo_lightning.training.callbacks.TrackingState`'s entry in a checkpoint
RUN_FOLDER_ENTRIES = ("config.yaml", "checkpoints", "videos", "checkpoints/last.ckpt", "checkpoints/mlflow-spool.jsonl")


def run_folder(run_dir: str | Path | None, experiment: str, name: str, resumed_dir: str | Path | None = None) -> Path:
    """A run's folder: ``--run_dir``; else the folder of the run a checkpoint resumes (``resumed_dir``:
    its checkpoints are this run's); else ``runs/<experiment>/<name>``."""
    return Path(run_dir or resumed_dir or Path("runs") / experiment / name)


def find_resume_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest of ``<run_dir>/checkpoints/last.ckpt`` and Lightning's ``<run_dir>/hpc_ckpt_N.ckpt``
    (by modification time), or None."""
    run_dir = Path(run_dir)
    candidates = [run_dir / "checkpoints" / "last.ckpt", *run_dir.glob("hpc_ckpt_*.ckpt")]
    found = [p for p in candidates if p.exists()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def checkpoint_run_dir(ckpt_path: str | os.PathLike) -> Path:
    """The run folder a checkpoint belongs to: ``<run>/checkpoints/X.ckpt`` -> ``<run>``; a file
    elsewhere (Lightning's ``<run>/hpc_ckpt_N.ckpt``) -> its folder."""
    path = Path(os.path.abspath(ckpt_path))
    return path.parent.parent if path.parent.name == "checkpoints" else path.parent


def read_tracking_state(ckpt_path: str | os.PathLike) -> dict:
    """`TrackingState`'s entry of a checkpoint (``.ckpt`` file or sharded folder): its MLflow run id
    and run folder; {} if none (a checkpoint that does not load is refused later, in one line)."""
    try:
        checkpoint = read_meta(ckpt_path, mmap=True)
    except CheckpointError:
        return {}
    state = (checkpoint.get("callbacks") or {}).get(TRACKING_STATE_KEY)
    return dict(state) if isinstance(state, dict) else {}


def own_tracking_state(ckpt_path, state: dict) -> dict:
    """``state`` (`read_tracking_state`) when the run folder it names is the checkpoint's own (resuming
    in place), else ``{}`` with one line: a foreign run folder and its MLflow run are neither written
    nor continued."""
    recorded = state.get("run_dir")
    if not recorded:
        return {} if state.get("mlflow_run_id") else state
    own = checkpoint_run_dir(ckpt_path)
    if Path(os.path.abspath(recorded)) == own or Path(recorded).resolve() == own.resolve():
        return state
    if not Path(recorded).is_absolute() and own.as_posix().endswith("/" + Path(recorded).as_posix()):
        return {**state, "run_dir": str(own)}  # a relative folder recorded from another working directory
    print(f"[ppo-lightning] --ckpt_path {ckpt_path} records another run folder ({recorded}) and its MLflow run: "
          f"ignored, this run writes only where its command line says (a new MLflow run)", file=sys.stderr, flush=True)
    return {}


def check_run_folder(run_dir: str | os.PathLike) -> None:
    """`UnsafeInput` if a file or folder the run writes in ``run_dir`` is a symbolic link."""
    for name in RUN_FOLDER_ENTRIES:
        refuse_symlink(Path(run_dir) / name, "run folder entry")


def resume_command(argv: list[str], checkpoint: str | os.PathLike, program: str = "ppo-lightning") -> str:
    """The command line ``argv`` (a ``fit`` command's arguments) resuming from ``checkpoint``:
    any ``--ckpt_path`` given is replaced."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--ckpt_path":
            skip = True
            continue
        if a.startswith("--ckpt_path="):
            continue
        out.append(a)
    return shlex.join([program, *out, "--ckpt_path", str(checkpoint)])
