"""Callbacks of a run: a progress bar in frames, checkpoints named by iteration, the MLflow run id
kept in checkpoints."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar

from ppo_lightning.core.errors import TrainingFault, human_bytes
from ppo_lightning.core.storage import atomic_path, atomic_replace, free_bytes, out_of_space, space_error_text
from ppo_lightning.interop.evaluation import evaluate_policy
from ppo_lightning.nets.models import is_sharded
from ppo_lightning.training.tracking import quiet_mlflow
from ppo_lightning.training.preemption import preempted


class FramesProgressBar(ProgressBar):
    """One tqdm bar over environment frames, updated once per iteration (not per gradient step).

    Shows frames, frames/s (tqdm's rate) and the mean return of the last 20 episodes.
    """

    def __init__(self, refresh_rate: int = 1) -> None:
        super().__init__()
        self._enabled = refresh_rate > 0
        self._bar = None
        self._shown = 0

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def on_train_start(self, trainer, pl_module) -> None:
        if not self._enabled or trainer.global_rank != 0:
            return
        from tqdm.auto import tqdm

        dm = trainer.datamodule
        total = getattr(dm, "total_frames", None)
        self._shown = getattr(dm, "frames", 0)
        self._bar = tqdm(total=total, initial=self._shown, unit="frames", unit_scale=True, dynamic_ncols=True,
                         file=sys.stdout, desc="fit")
        # Warnings during training (diagnostics) print above the bar instead of breaking its line.
        import warnings

        self._showwarning = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            text = warnings.formatwarning(message, category, filename, lineno, line).rstrip()
            tqdm.write(text, file=sys.stderr)

        warnings.showwarning = show

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self._bar is None:
            return
        dm = trainer.datamodule
        self._bar.update(dm.frames - self._shown)
        self._shown = dm.frames
        ret = dm.states[0].episodes.mean_return(20)
        self._bar.set_postfix(it=dm.iteration, ret20=f"{ret:.1f}", refresh=False)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._bar is not None:
            import warnings

            self._bar.close()
            self._bar = None
            warnings.showwarning = self._showwarning


class IterationCheckpoint(ModelCheckpoint):
    """`ModelCheckpoint` whose file names can use ``{iteration}``: the PPO iteration just finished,
    1-based as the progress bar shows it (``epoch + 1``; Lightning's ``{epoch}`` counts from 0)."""

    def __init__(self, **kwargs) -> None:
        self.init_args = dict(kwargs)  # recorded in the run's config.yaml (record_run_setup)
        self._final_step_saved = -1
        super().__init__(**kwargs)

    def format_checkpoint_name(self, metrics, filename=None, ver=None, prefix=None) -> str:
        metrics = dict(metrics)
        if "epoch" in metrics:
            metrics["iteration"] = int(metrics["epoch"]) + 1
        return super().format_checkpoint_name(metrics, filename, ver, prefix)

    def on_train_end(self, trainer, pl_module) -> None:
        """``last.ckpt`` is the end of training: Lightning writes it only with a periodic checkpoint,
        so a run stopped between two (a return threshold, ``total_frames``) would leave it behind."""
        super().on_train_end(trainer, pl_module)
        if self.save_last and self.dirpath is not None and trainer.global_step != self._final_step_saved:
            path = str(Path(self.dirpath) / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}")
            trainer.save_checkpoint(path, weights_only=False)  # a full checkpoint (and no "not set" notice)
            self.last_model_path = path

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._final_step_saved = trainer.global_step
        return super().on_save_checkpoint(trainer, pl_module, checkpoint)


class TrackingState(Callback):
    """Keeps the MLflow run id (and the run folder) in every checkpoint, so that resuming with
    ``--ckpt_path`` continues the same MLflow run (`ppo_lightning.interop.run_folder.read_tracking_state`,
    which reads this entry by its class name)."""

    def __init__(self, run_dir: str | None = None) -> None:
        self.run_dir = run_dir
        self.run_id: str | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        logger = trainer.logger
        self._logger = logger if getattr(logger, "failed", True) is False else None  # our SafeMLFlowLogger
        self.run_id = self._logger.run_id if self._logger is not None else None

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """A fault that stops the run is written on the MLflow run (tag ``stopped_by``) before Lightning
        marks it FAILED."""
        note = getattr(trainer.logger, "note_stop", None)
        if note is not None and isinstance(exception, TrainingFault):
            note(f"{type(exception).__name__} (exit code {exception.exit_code}): {exception}")

    def state_dict(self) -> dict:
        logger = getattr(self, "_logger", None)
        if logger is not None and logger.run_id is not None:  # created late when the server was away at start
            self.run_id = logger.run_id
        return {"mlflow_run_id": self.run_id, "run_dir": self.run_dir}

    def load_state_dict(self, state_dict: dict) -> None:
        pass  # read before the logger exists (read_tracking_state); the new values stand


EPISODE_METRIC_PREFIXES = ("episode/", "eval/")


def wait_for_episodes(callbacks) -> list[str]:
    """Let monitors on episode statistics wait for the first finished episode instead of crashing.

    Before an episode ends (an env whose episodes outlast the first rollouts) ``episode/...`` and
    ``eval/...`` metrics do not exist yet; an `EarlyStopping` with ``strict=True`` (its default)
    would stop the run with "metric ... not available". For those monitors only, a missing value
    is skipped silently until it exists (``strict=False``, ``verbose=False``); a missing metric of
    any other name still fails, and a `ModelCheckpoint` on such a monitor skips those iterations
    by itself. Returns the monitors relaxed.
    """
    from lightning.pytorch.callbacks import EarlyStopping

    relaxed = []
    for cb in callbacks:
        if isinstance(cb, EarlyStopping) and str(cb.monitor).startswith(EPISODE_METRIC_PREFIXES):
            cb.strict = False
            cb.verbose = False
            relaxed.append(cb.monitor)
    return relaxed


def quiet_library_notices() -> None:
    """Silence notices a user of this command cannot act on: Lightning's litlogger tip, its pytree
    deprecation warning (raised inside Lightning, fixed upstream) and its `srun` hint on machines with
    SLURM installed, MLflow's table-creation lines."""
    import logging
    import warnings

    class _NoTip(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return "litlogger" not in record.getMessage()

    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_NoTip())
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")
    # Lightning's hint to prepend `srun` whenever the machine has SLURM installed: a run started
    # outside a job step is a local run; jobs are launched as docs/guides/clusters.md shows.
    warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system but is not used")
    quiet_mlflow()


class TrainingVideo(Callback):
    """Records one episode of the current policy as an MP4 every ``every`` iterations and at the end
    of fit (``every=0``: only at the end), into ``<run_dir>/videos/iteration-NNNNN.mp4``, and
    uploads it to the MLflow run (artifact folder ``videos``).

    The episode is played in an env of its own (one env, seed ``seed``, sampled actions), so the
    training envs, their episodes and every random generator of the run are untouched. Rank 0 only;
    skipped for FSDP-sharded networks (a forward on one rank alone would wait for the others).
    """

    def __init__(self, run_dir: str, every: int = 0, seed: int = 12_345) -> None:
        if every < 0:
            raise ValueError(f"video_every must be >= 0 (0: one video at the end of fit), got {every}")
        self.run_dir, self.every, self.seed = Path(run_dir), every, seed
        self.paths: list[Path] = []
        self._last_iteration = -1
        self.disk_full = False  # set by the first out-of-space write: no more videos in this run

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        dm = trainer.datamodule
        if self.every and dm is not None and dm.iteration % self.every == 0:
            self.record(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        if preempted(trainer) is None:  # a preempted job has no time for a video
            self.record(trainer, pl_module)

    def record(self, trainer, pl_module) -> Path | None:
        dm = trainer.datamodule
        if trainer.global_rank != 0 or dm is None or dm.iteration == self._last_iteration or is_sharded(pl_module.network):
            return None
        if self.disk_full:
            return None
        self._last_iteration = dm.iteration
        path = self.run_dir / "videos" / f"iteration-{dm.iteration:05d}.mp4"
        written = 0
        try:
            with atomic_path(path, tmp_suffix=".tmp.mp4") as tmp:  # renamed when complete: never a partial video
                try:
                    evaluate_policy(pl_module.network, dm.env_id, episodes=1, num_envs=1, env_kwargs=dm.env_kwargs,
                                    seed=self.seed, video=str(tmp))
                finally:
                    written = tmp.stat().st_size if tmp.exists() else 0
        except Exception as err:  # noqa: BLE001 - a video must never stop training
            if out_of_space(err):  # once: videos stop, training goes on
                self.disk_full = True
                print(f"[ppo-lightning] {space_error_text(err)} while writing video {path} (needs more than "
                      f"{human_bytes(written)}, {human_bytes(free_bytes(path.parent))} free): no more videos in this "
                      f"run; training goes on", file=sys.stderr, flush=True)
                return None
            print(f"[ppo-lightning] no video at iteration {dm.iteration} ({type(err).__name__}: {err})",
                  file=sys.stderr, flush=True)
            return None
        self.paths.append(path)
        log_file = getattr(trainer.logger, "log_file", None)
        if log_file is not None:
            log_file(path, "videos")
        return path


# Built by the CLI from its options (checkpoint_every, video_every, run_dir, mlflow.*) on every run.
MANAGED_CALLBACKS = (FramesProgressBar, IterationCheckpoint, TrackingState, TrainingVideo)


def _class_entry(obj, init_args: dict) -> dict:
    from jsonargparse import Namespace

    cls = type(obj)
    return Namespace(class_path=f"{cls.__module__}.{cls.__qualname__}", init_args=Namespace(**init_args))


def record_run_setup(cfg, callbacks, mlflow_logger: dict | None, metrics_csv: str | None = None) -> None:
    """Write the callbacks and loggers a run really uses into its config (``trainer.callbacks``,
    ``trainer.logger``), so that the saved ``config.yaml`` and ``--print_config`` show them. The
    CLI rebuilds the ones it manages from its options when that config is loaded again.
    ``mlflow_logger``: the init arguments of the run's `SafeMLFlowLogger`, if it has one;
    ``metrics_csv``: the folder of its `ppo_lightning.training.tracking.RunCSVLogger`, if it has one;
    the loggers of ``--trainer.logger`` follow them."""
    from jsonargparse import Namespace

    managed = {f"{c.__module__}.{c.__qualname__}" for c in MANAGED_CALLBACKS}
    entries = [c for c in (cfg.trainer.get("callbacks") or []) if str(getattr(c, "class_path", "")) not in managed]
    for cb in callbacks:
        if isinstance(cb, IterationCheckpoint):
            args = cb.init_args
        elif isinstance(cb, TrackingState):
            args = {"run_dir": cb.run_dir}
        elif isinstance(cb, TrainingVideo):
            args = {"run_dir": str(cb.run_dir), "every": cb.every, "seed": cb.seed}
        elif isinstance(cb, FramesProgressBar):
            args = {}
        else:
            continue
        entries.append(_class_entry(cb, args))
    cfg.trainer.callbacks = entries
    ours = [Namespace(class_path=f"ppo_lightning.training.tracking.{name}", init_args=Namespace(**args))
            for name, args in (("SafeMLFlowLogger", mlflow_logger), ("RunCSVLogger", {"save_dir": metrics_csv}))
            if args is not None and args != {"save_dir": None}]
    if ours:
        given = cfg.trainer.get("logger")
        given = [] if given in (None, True) else given if isinstance(given, list) else [given]
        user = [g for g in given if not str(getattr(g, "class_path", "")).startswith("ppo_lightning.training.tracking.")]
        cfg.trainer.logger = ours[0] if len(ours) + len(user) == 1 else ours + user


class ProgressFile(Callback):
    """Writes ``<run folder>/progress.json`` after every iteration (atomically): the frames each member
    has seen, the run's total, the members, and this process's frames and training seconds. A study's
    launcher reads it for its progress line (`ppo_lightning.studies.runner.progress_lines`)."""

    FILENAME = "progress.json"

    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s = every_s  # at most one write per this many seconds (and one at the end)
        self._last = -float("inf")

    def on_train_start(self, trainer, pl_module) -> None:
        dm = trainer.datamodule
        self._start = (time.perf_counter(), int(getattr(dm, "frames", 0)))

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if time.perf_counter() - self._last >= self.every_s:
            self.write(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        self.write(trainer)

    def write(self, trainer) -> None:
        if trainer.global_rank != 0 or not hasattr(self, "_start"):
            return
        self._last = time.perf_counter()
        dm = trainer.datamodule
        t0, f0 = self._start
        data = {"frames": int(dm.frames), "total_frames": int(dm.total_frames), "members": int(getattr(dm, "members", 1)),
                "attempt_frames": int(dm.frames) - f0, "attempt_s": round(time.perf_counter() - t0, 3)}
        atomic_replace(Path(trainer.default_root_dir) / self.FILENAME, lambda f: f.write(json.dumps(data).encode()))
