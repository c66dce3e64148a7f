"""A run's storage faults, as the ``fit`` command reports them (`ppo_lightning.core.storage` has the
mechanics).

- `preflight`: before anything is built, the run folder, its checkpoint folder and a local MLflow
  store's folder are written to once; one that cannot be written ends the command with one line and
  exit code 4 (the store's artifact folder is checked once the experiment is known, by
  `ppo_lightning.training.tracking.make_logger`).
- `storage_hint`: the end of the one-line message of a `StorageFull` (exit code 5): the last good
  checkpoint and the command that resumes from it, once space is freed.
"""

from __future__ import annotations

from pathlib import Path

from ppo_lightning.core.errors import StorageFull
from ppo_lightning.core.storage import check_writable
from ppo_lightning.interop.run_folder import resume_command
from ppo_lightning.interop.checkpoint_io import last_good_checkpoint

# The checkpoint folder of the run in this process (set by `preflight`): where `storage_hint` looks for
# the last good checkpoint when the fault came from elsewhere (the MLflow store).
_RUN: dict[str, Path | None] = {"checkpoints": None}


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI (None for other stores)."""
    return Path(tracking_uri[len("sqlite:///"):]) if tracking_uri.startswith("sqlite:///") else None


def preflight(run_dir: str | Path, checkpoints: str | Path | None, tracking_uri: str | None) -> None:
    """Refuse (`UnwritablePath`, exit code 4) a run folder, checkpoint folder or local MLflow store
    folder that cannot be written."""
    run_dir = Path(run_dir)
    check_writable(run_dir, "run folder", "choose another with --run_dir")
    if checkpoints is not None:
        check_writable(checkpoints, "checkpoint folder", "choose another run folder with --run_dir")
    _RUN["checkpoints"] = Path(checkpoints) if checkpoints is not None else None
    db = sqlite_path(tracking_uri) if tracking_uri else None
    if db is not None:
        check_writable(db.parent, "MLflow tracking store folder",
                       "choose another with --mlflow.tracking_uri sqlite:///PATH, or --mlflow.enabled false")


def storage_hint(err: BaseException, argv: list[str]) -> str:
    """For a `StorageFull` of a ``fit``: ``; free space, then resume with: ppo-lightning fit ...``."""
    if not isinstance(err, StorageFull) or not argv or argv[0] != "fit":
        return ""
    if err.last_good is None and _RUN["checkpoints"] is not None:
        err.last_good = last_good_checkpoint(_RUN["checkpoints"])
        if err.last_good is not None:
            return f"; the last good checkpoint is {err.last_good}; free space, then resume with: " \
                   f"{resume_command(argv, err.last_good)}"
    if err.last_good is None:
        return "; no checkpoint was written yet: free space and run the command again"
    return f"; free space, then resume with: {resume_command(argv, err.last_good)}"
