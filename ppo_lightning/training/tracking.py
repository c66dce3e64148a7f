"""MLflow tracking that reads like a Lightning run and never stops training.

Lightning's `MLFlowLogger` does the logging (parameters, per-iteration metrics). Our subclass:

- steps every metric by **environment frames** (the ``frames`` entry of the iteration's metrics),
  the x-axis RL runs are compared on, instead of Lightning's gradient-step counter;
- uploads at the end of fit only ``last.ckpt`` and, for a checkpoint callback with a ``monitor``,
  its best checkpoint, not every periodic one (``log_model`` stays off), plus files given to
  `SafeMLFlowLogger.log_file` (the run's config.yaml, videos);
- can continue an existing run (``run_id``: resuming with ``--ckpt_path``; the id is kept in the
  checkpoint by `ppo_lightning.training.callbacks.TrackingState`);
- survives an unwritable store: it is probed before training, and any later MLflow error is
  reported once, after which the run goes on with console logging.

Without MLflow (``--mlflow.enabled false``), or when its store cannot be written, a run's metrics go to
``metrics.csv`` in its run folder (`RunCSVLogger`, Lightning's ``CSVLogger``); loggers named with
``--trainer.logger`` are added to MLflow's (`run_loggers`). Every logger gets the same metrics, stepped
by frames.

The tracking store is ``sqlite:///mlflow.db`` by default; artifacts go to MLflow's default
artifact root for it, ``./mlruns/<experiment id>/<run id>/artifacts`` (``make clean`` removes both); a
study's or a search's experiment keeps them in its run root (``<run root>/mlruns``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from argparse import Namespace
from collections.abc import MutableMapping
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger
from lightning.pytorch.utilities import rank_zero_only
from lightning.fabric.loggers.logger import rank_zero_experiment

from ppo_lightning.core.errors import UnwritablePath
from ppo_lightning.core.storage import atomic_path, check_writable, out_of_space, space_error_text, user_cache_folder
from ppo_lightning.training.storage_faults import sqlite_path
from ppo_lightning.training.mlflow_sender import (EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, MlflowSender, configure_http,
                                                  create_run, is_unreachable, load_spool, local_artifact_folder,
                                                  short_reason)

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"

# MLflow 3.x's UI keeps its GenAI / model-training toggle in the browser's local storage and does not
# reconcile it with the experiment's kind (mlflow/mlflow#24498); this query in the page URL wins.
TRAINING_VIEW_QUERY = "workflowType=machine_learning"
# where `mlflow ui` serves by default
MLFLOW_UI_URL = "http://127.0.0.1:5000"


def run_url(ui_url: str, experiment_id: str, run_id: str) -> str:
    """The page of one run in the MLflow UI served at ``ui_url``, in its model-training view."""
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{TRAINING_VIEW_QUERY}"


def view_hints(tracking_uri: str, experiment_id: str | None, run_id: str | None) -> list[str]:
    """How to look at a finished run, for its tracking URI: a tracking server (``http(s)://``) is
    opened in a browser at the run's URL; a local store (``sqlite:///...``, a folder) is served by
    ``mlflow ui`` first, then the run's URL under ``mlflow ui``'s default address."""
    known = experiment_id is not None and run_id is not None  # not yet when the server was away to the end
    if tracking_uri.startswith(("http://", "https://")):
        return [f"  open: {run_url(tracking_uri, experiment_id, run_id)}" if known else f"  open: {tracking_uri}"]
    if tracking_uri.startswith("databricks"):
        return []
    return [f"  view with: mlflow ui --backend-store-uri {tracking_uri}",
            *([f"  then open: {run_url(MLFLOW_UI_URL, experiment_id, run_id)}"] if known else [])]


def _warn(message: str) -> None:
    print(f"[ppo-lightning] {message}", file=sys.stderr, flush=True)


class ConsoleLogger(Logger):
    """Prints a few per-iteration figures every ``every`` iterations; the fallback of MLflow."""

    KEYS = ("frames", "episode/return_mean20", "time/fps", "train/clip_fraction", "train/approx_kl_behavior")

    def __init__(self, every: int = 10) -> None:
        super().__init__()
        self.every = every
        self._calls = 0

    @property
    def name(self) -> str:
        return "console"

    @property
    def version(self) -> str:
        return "0"

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args, **kwargs) -> None:
        pass

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if "frames" not in metrics:
            return
        self._calls += 1
        if self._calls % self.every:
            return
        shown = ", ".join(f"{k}={metrics[k]:.4g}" for k in self.KEYS if k in metrics)
        print(f"[iteration {self._calls}] {shown}", flush=True)


def _flatten(params: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``a/b`` keys (Lightning's MLflow parameter names)."""
    out: dict[str, Any] = {}
    for k, v in params.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{key}/"))
        else:
            out[key] = v
    return out


def flat_params(params: Any, prefix: str = "") -> dict[str, Any]:
    """Hyperparameters as one level of ``a/b`` names, as Lightning's loggers flatten them for MLflow:
    a Namespace or a dataclass as its fields, a nested mapping as its entries under ``name/``, None
    as nothing."""
    if params is None:
        return {}
    if isinstance(params, Namespace):
        params = vars(params)
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if is_dataclass(value) and not isinstance(value, type):
            value = asdict(value)
        elif isinstance(value, Namespace):
            value = vars(value)
        if isinstance(value, MutableMapping):
            out.update(flat_params(value, f"{name}/"))
        else:
            out[name] = value
    return out


def frames_step(metrics: dict[str, float], step: int | None) -> int | None:
    """The x-axis value of one iteration's metrics: its environment frames when reported."""
    frames = metrics.get("frames")
    return int(frames) if frames is not None else step


class RunCSVLogger(CSVLogger):
    """Lightning's ``CSVLogger`` writing into the run folder itself: ``metrics.csv`` (one row per
    iteration, every metric a column, ``step`` = frames) and ``hparams.yaml``. A run resumed into the
    same folder appends its rows to the file (Lightning's writer would delete it)."""

    FILENAME = "metrics.csv"

    def __init__(self, save_dir: str | os.PathLike) -> None:
        super().__init__(save_dir, name="", version="")
        self._opened = False
        self.write_failed = False  # a write failed: nothing more is written

    @property
    def log_dir(self) -> str:
        return self.save_dir

    @property
    def metrics_file(self) -> Path:
        return Path(self.save_dir) / self.FILENAME

    @property
    @rank_zero_experiment
    def experiment(self):
        """Lightning's writer; the rows of an existing ``metrics.csv`` (a resumed run's folder), which
        it deletes when it opens the folder, are written back first."""
        if self._opened:
            return super().experiment
        import csv
        import warnings

        rows = []
        if self.metrics_file.is_file():
            with open(self.metrics_file, newline="") as f:
                rows = list(csv.DictReader(f))
        with warnings.catch_warnings():  # "Previous log files in this directory will be deleted": not ours
            warnings.filterwarnings("ignore", message=".*exists and is not empty")
            writer = super().experiment
        for row in rows:
            step = row.pop("step", "")
            writer.log_metrics({k: float(v) for k, v in row.items() if v != ""}, int(float(step)) if step else None)
        writer.save()
        self._opened = True
        return writer

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if not self.write_failed:
            super().log_metrics(metrics, frames_step(metrics, step))

    @rank_zero_only
    def save(self) -> None:
        """Write the rows logged since the last save; a write that fails (a full disk) is said once and
        the run goes on without the file, as it goes on without MLflow."""
        if self.write_failed:
            return
        try:
            super().save()
        except OSError as err:
            self.write_failed = True
            what = space_error_text(err) if out_of_space(err) else f"{type(err).__name__}: {err}"
            _warn(f"{what} while writing metrics {self.metrics_file}: no more metrics in this file; training goes on")


def run_loggers(mlflow_logger: Logger | None, given: Any, run_dir: str | os.PathLike) -> list[Logger]:
    """A run's loggers: its MLflow logger (``mlflow_logger``, None when MLflow is off), then the loggers
    ``--trainer.logger`` names (``given``: a logger, a list of them, or None / True for none); without
    a working MLflow logger and without loggers of the user's, `RunCSVLogger` in ``run_dir``. The
    loggers this function makes (a saved config.yaml lists them) are dropped from ``given``."""
    user = [] if given in (None, True) else list(given) if isinstance(given, (list, tuple)) else [given]
    user = [lg for lg in user if not isinstance(lg, (SafeMLFlowLogger, RunCSVLogger))]
    loggers = [mlflow_logger] if mlflow_logger is not None else []
    if not user and not isinstance(mlflow_logger, SafeMLFlowLogger):  # MLflow off, or its store refused
        loggers.append(RunCSVLogger(run_dir))
    return loggers + user


class SafeMLFlowLogger(MLFlowLogger):
    """`MLFlowLogger` stepped by frames, uploading only the last/best checkpoints, whose records are
    sent by a background thread that the training loop never waits for
    (`ppo_lightning.training.mlflow_sender`: a tracking server that is away is retried, what it has
    not received is kept in ``spool`` and sent when it is back, or by a resumed run).

    ``run_id``: continue that run; None: `make_logger` creates the run before training, or, when the
    server was away at start, the sender creates it when the server is back."""

    FINAL_FLUSH_S = 30.0  # the end of fit waits at most this long for a reachable server

    def __init__(self, experiment_name: str, tracking_uri: str, run_name: str | None = None,
                 run_id: str | None = None, spool: str | None = None, **kwargs) -> None:
        kwargs.pop("log_model", None)  # we upload the checkpoints we want at the end (finalize)

        configure_http()  # short requests, no client-side retries: the sender retries
        super().__init__(experiment_name=experiment_name, tracking_uri=tracking_uri, run_name=run_name,
                         run_id=run_id, log_model=False, **kwargs)
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.resumed = run_id is not None
        self.failed = False
        self.spool = spool
        self.console = ConsoleLogger()
        self._checkpoint_callbacks: dict[int, Any] = {}
        self.sender = None  # MlflowSender, started on rank 0 at the first record
        self.away_at_start = False  # set by make_logger: the server did not answer (said once, then)

    # -- no network on these: the run exists already or the sender creates it
    @property
    def experiment(self):
        self._initialized = True
        return self._mlflow_client

    @property
    def run_id(self) -> str | None:
        return self._run_id

    @property
    def experiment_id(self) -> str | None:
        """The run's experiment id, asked of the store once (for the end-of-run hints); None while the
        server is away or the run does not exist yet."""
        if self._experiment_id is None and self._run_id is not None and not (self.sender is not None and self.sender.down):
            try:
                self._experiment_id = self._mlflow_client.get_run(self._run_id).info.experiment_id
            except Exception:  # noqa: BLE001 - only a hint depends on it
                return None
        return self._experiment_id

    @property
    def name(self) -> str:
        return self.experiment_name

    @property
    def version(self) -> str:
        return self._run_id or "pending"

    def _set_run_id(self, run_id: str) -> None:
        self._run_id = run_id

    def _submit(self, record: dict) -> None:
        if self.failed:
            return
        if self.sender is None:

            self.sender = MlflowSender(self._mlflow_client, self.tracking_uri, self._run_id, self.spool,
                                       local=is_local_store(self.tracking_uri), resumed=self.resumed,
                                       on_run_id=self._set_run_id, away=self.away_at_start)
            if self._run_id is None and self.sender.run_id is None and not self.sender.creates_run():
                tags = {**(self.tags or {}), **({"mlflow.runName": self._run_name} if self._run_name else {})}
                self.sender.submit({"kind": "create_run", "experiment": self.experiment_name, "tags": tags})
            if self._run_id is None and self.sender.run_id is not None:  # the spool's run
                self._run_id = self.sender.run_id
        self.sender.submit(record)  # raises the sender's fatal StorageFull (a full disk under the store)

    @rank_zero_only
    def log_hyperparams(self, params) -> None:
        flat = flat_params(params)
        self._submit({"kind": "params", "params": {k: str(v)[:250] for k, v in flat.items()}})

    @rank_zero_only
    def log_metrics(self, metrics, step=None) -> None:
        import re
        import time

        step = frames_step(metrics, step)
        if self.failed:
            self.console.log_metrics(metrics, step)
            return
        clean = {}
        for k, v in metrics.items():
            if isinstance(v, str):
                continue
            clean[re.sub("[^a-zA-Z0-9_/. -]+", "", k)] = float(v)
        self._submit({"kind": "metrics", "metrics": clean, "step": int(step or 0), "timestamp": int(time.time() * 1000)})

    @rank_zero_only
    def log_file(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file as an artifact of the run (in the background; a failure never stops training)."""
        self._submit({"kind": "artifact", "path": str(Path(path).resolve()), "artifact_path": artifact_path})

    @rank_zero_only
    def note_stop(self, reason: str) -> None:
        """Why the run stopped (a fault), as the tag ``stopped_by``; Lightning then marks it FAILED."""
        if self.sender is not None and self.sender.fatal is not None:
            return  # the store itself is full: the fault is its own
        self._submit({"kind": "tag", "key": "stopped_by", "value": reason[:5000]})

    @rank_zero_only
    def set_run_tag(self, key: str, value: str) -> None:
        self._submit({"kind": "tag", "key": key, "value": value[:5000]})

    def after_save_checkpoint(self, checkpoint_callback) -> None:
        self._checkpoint_callbacks[id(checkpoint_callback)] = checkpoint_callback

    def checkpoints_to_upload(self) -> list[str]:
        """``last.ckpt`` of every checkpoint callback, and its best one when it has a monitor."""
        paths: list[str] = []
        for cb in self._checkpoint_callbacks.values():
            candidates = [getattr(cb, "last_model_path", "")]
            if getattr(cb, "monitor", None) is not None:
                candidates.append(getattr(cb, "best_model_path", ""))
            for path in candidates:
                if path and Path(path).is_file() and path not in paths:
                    paths.append(path)
        return paths

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        if self.failed or self.sender is None or self.sender.fatal is not None:
            return
        if status == "success" and self._checkpoint_callbacks:
            for path in self.checkpoints_to_upload():
                self.log_file(path, "checkpoints")
        self.set_status({"success": "FINISHED", "finished": "FINISHED", "failed": "FAILED"}.get(status, status))

    @rank_zero_only
    def set_status(self, status: str) -> None:
        """The run's final status; waits for the sender at most `FINAL_FLUSH_S` (1 s when the server is
        away), then keeps what is unsent in the spool with one line saying how to send it."""
        self._submit({"kind": "terminated", "status": status})
        flushed = self.sender.flush(5.0 if self.sender.down else self.FINAL_FLUSH_S)
        self.sender.stop()  # first: a send finishing later would be in the spool and sent twice
        left = 0 if flushed else self.sender.persist()
        if flushed:
            return
        if left and self.sender.fatal is None:
            why = "is away" if self.sender.down else f"did not take them within {self.FINAL_FLUSH_S:g} s"
            _warn(f"MLflow tracking server {self.tracking_uri} {why}: {left} records kept in {self.spool}; a run "
                  f"resumed from this folder sends them, or now: python -m ppo_lightning.training.mlflow_sender "
                  f"{self.spool}")


def quiet_mlflow() -> None:
    """MLflow's sqlite store logs its schema migrations ("Updating database tables") at INFO on the
    first use of a database: nothing a user can act on."""
    for name in ("mlflow.store.db.utils", "alembic", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # its SQLAlchemy errors (a full disk under the store) come with a traceback; the sender reports them in one line
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


@contextlib.contextmanager
def _sqlite_store_lock(tracking_uri: str):
    """Hold an exclusive lock on the folder of a ``sqlite:///`` store (nothing for other stores).

    Two runs started together on a new database both create its tables, and two runs of a new
    experiment both create it: the loser fails ("table runs already exists") and would train without
    tracking. The lock serializes only this first open; logging itself is left to sqlite's locking.
    Yields the database file (None for other stores)."""
    db = sqlite_path(tracking_uri)
    if db is None:
        yield None
        return
    import fcntl

    folder = db.parent
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield db
    finally:
        os.close(fd)  # releases the lock


def new_sqlite_store(db: Path) -> bool:
    """Start a new ``sqlite:///`` store as a copy of an empty one (True), instead of MLflow building its
    schema again (about 50 alembic migrations: 4.6 s on a 2-core EPYC, for every new run folder,
    study and test). The empty store is made by MLflow itself, once per MLflow version, in the
    user's cache folder, with its Default experiment removed: MLflow recreates that on the copy's
    first open with this process's artifact root, so the copy opens as a new store would. An
    existing database is never touched (the copy is linked into place, which fails if another process
    made the store meanwhile); any failure leaves the store to MLflow (False). Called under
    `_sqlite_store_lock`."""
    if db.exists():
        return False
    import sqlite3

    import mlflow

    try:
        template = user_cache_folder() / f"mlflow-{mlflow.__version__}-empty.db"
        if not template.exists():
            with atomic_path(template) as made:
                mlflow.MlflowClient(tracking_uri=f"sqlite:///{made}").search_experiments()  # MLflow's own schema
                with contextlib.closing(sqlite3.connect(made)) as con, con:
                    con.execute("DELETE FROM experiments WHERE experiment_id = 0")  # recreated where it is opened
        with atomic_path(db, exclusive=True) as tmp:  # never over a store another process made meanwhile
            with contextlib.closing(sqlite3.connect(template)) as src, contextlib.closing(sqlite3.connect(tmp)) as dst:
                src.backup(dst)  # a consistent copy, whatever else reads the template
        return True
    except (OSError, sqlite3.Error, mlflow.exceptions.MlflowException):
        return False


def probe_tracking_store(tracking_uri: str, experiment_name: str, limit: int = 300,
                         artifact_location: str | None = None) -> str | None:
    """Create or find the experiment, tagged as model training (`EXPERIMENT_KIND_TAG`: a kind the
    user set is kept); returns an error message if the store cannot be written. ``artifact_location``:
    where a new experiment keeps its artifacts (a study's or search's: inside its run root)."""
    quiet_mlflow()
    try:
        import mlflow

        with _sqlite_store_lock(tracking_uri) as db:
            if db is not None:
                new_sqlite_store(db)
            client = mlflow.MlflowClient(tracking_uri=tracking_uri)
            experiment = client.get_experiment_by_name(experiment_name)
            if experiment is None:
                client.create_experiment(experiment_name, artifact_location=artifact_location,
                                         tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
            elif EXPERIMENT_KIND_TAG not in experiment.tags:  # made by an older version, or by hand
                client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    except Exception as err:  # noqa: BLE001
        return f"{type(err).__name__}: {err}".splitlines()[0][:limit]
    return None


def is_local_store(tracking_uri: str) -> bool:
    """A store in a file of this machine (``sqlite:///``, ``file:``, a plain path), not a server."""
    return tracking_uri.startswith(("sqlite:", "file:")) or "://" not in tracking_uri


def check_artifact_location(tracking_uri: str, experiment_name: str) -> None:
    """The experiment's artifact folder, if local, must be writable (`UnwritablePath`, exit code 4)."""
    if not is_local_store(tracking_uri):
        return
    import mlflow

    try:
        experiment = mlflow.MlflowClient(tracking_uri=tracking_uri).get_experiment_by_name(experiment_name)
    except Exception:  # noqa: BLE001 - the probe just read it; nothing to add
        return
    folder = local_artifact_folder(getattr(experiment, "artifact_location", None))
    if folder is not None:
        check_writable(folder, f"MLflow artifact folder of experiment {experiment_name!r},",
                       "it is fixed when the experiment is created: choose another --mlflow.experiment")


def run_exists(tracking_uri: str, run_id: str) -> bool:
    try:
        import mlflow

        mlflow.MlflowClient(tracking_uri=tracking_uri).get_run(run_id)
    except Exception:  # noqa: BLE001 - another store, a deleted run: start a new one
        return False
    return True


def make_logger(tracking_uri: str = DEFAULT_TRACKING_URI, experiment_name: str = "ppo-lightning",
                run_name: str | None = None, run_id: str | None = None, spool: str | os.PathLike | None = None) -> Logger:
    """An MLflow logger; a local store that cannot be written is refused (`UnwritablePath`).

    ``run_id``: continue that run (if the store has it; otherwise a new run is started, with a message).
    ``spool``: where records the tracking server has not received are kept (beside the checkpoints).
    A server that cannot be reached at start does not stop or hold the run: its run is created, and
    everything sent, when the server is back (`ppo_lightning.training.mlflow_sender`).
    """
    # mlflow_sender imports this module: imported here, no cycle at load

    configure_http()  # short requests without client retries: the sender retries, the loop never waits
    error = probe_tracking_store(tracking_uri, experiment_name, limit=2000)
    if error is not None and is_local_store(tracking_uri):  # a folder of this machine: refused, exit code 4
        raise UnwritablePath(f"MLflow tracking store {tracking_uri} cannot be written ({error}); nothing was trained "
                             f"or written; choose another with --mlflow.tracking_uri, or --mlflow.enabled false")
    away = error is not None and is_unreachable(RuntimeError(error))
    if error is not None and not away:
        _warn(f"MLflow tracking store {tracking_uri} cannot be written ({error}); training on with console logging")
        return ConsoleLogger()
    header, spooled = load_spool(spool) if spool is not None else ({}, [])  # the records not sent yet
    if away:
        _warn(f"MLflow tracking server {tracking_uri} is unreachable at start ({short_reason(error)}); training goes on, the run's "
              f"records are kept in {spool} and sent when it is back")
    else:
        check_artifact_location(tracking_uri, experiment_name)
        if run_id is not None and not run_exists(tracking_uri, run_id):
            _warn(f"MLflow run {run_id} of the checkpoint is not in {tracking_uri}; starting a new run")
            run_id = None
    run_id = run_id or header.get("run_id")
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    if (run_id is None and not away and rank_zero_only.rank == 0  # other ranks log nothing: no run of their own
            and not any(r.get("kind") == "create_run" for r in spooled)):
        import mlflow

        try:  # created now (the server answered the probe): its id goes into the first checkpoint
            run_id = create_run(mlflow.MlflowClient(tracking_uri=tracking_uri), experiment_name,
                                {"mlflow.runName": run_name} if run_name else {})
        except Exception as err:  # noqa: BLE001 - gone since the probe: the sender creates it later
            _warn(f"MLflow run not created ({type(err).__name__}); the sender tries again in the background")
        else:
            logger = SafeMLFlowLogger(experiment_name=experiment_name, tracking_uri=tracking_uri, run_name=run_name,
                                      run_id=run_id, spool=None if spool is None else str(spool))
            logger.resumed = False  # a new run: nothing logged yet
            return logger
    logger = SafeMLFlowLogger(experiment_name=experiment_name, tracking_uri=tracking_uri, run_name=run_name,
                              run_id=run_id, spool=None if spool is None else str(spool))
    logger.away_at_start = away
    return logger
