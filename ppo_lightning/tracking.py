"""MLflow tracking that never stops training.

Lightning's `MLFlowLogger` does the logging (parameters, per-iteration metrics, the final checkpoint
as an artifact with ``log_model=True``). We wrap it only to survive an unwritable tracking store:
the store is probed before training, and any later MLflow error is reported once, after which the
run goes on with console logging.
"""

from __future__ import annotations

import sys
from typing import Any

from lightning.pytorch.loggers import Logger, MLFlowLogger
from lightning.pytorch.utilities import rank_zero_only

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


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


class SafeMLFlowLogger(MLFlowLogger):
    """`MLFlowLogger` whose failures after start-up are reported once and then ignored."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.failed = False
        self.console = ConsoleLogger()

    def _guard(self, what: str, fn, *args, **kwargs):
        if self.failed:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - any store error must not stop training
            self.failed = True
            _warn(f"MLflow {what} failed ({type(err).__name__}: {err}); training on with console logging")
            return None

    @rank_zero_only
    def log_hyperparams(self, params) -> None:
        self._guard("log_hyperparams", super().log_hyperparams, params)

    @rank_zero_only
    def log_metrics(self, metrics, step=None) -> None:
        if self.failed:
            self.console.log_metrics(metrics, step)
        else:
            self._guard("log_metrics", super().log_metrics, metrics, step)

    def after_save_checkpoint(self, checkpoint_callback) -> None:
        self._guard("after_save_checkpoint", super().after_save_checkpoint, checkpoint_callback)

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        self._guard("finalize", super().finalize, status)


def probe_tracking_store(tracking_uri: str, experiment_name: str) -> str | None:
    """Create or find the experiment; returns an error message if the store cannot be written."""
    try:
        import mlflow

        client = mlflow.MlflowClient(tracking_uri=tracking_uri)
        if client.get_experiment_by_name(experiment_name) is None:
            client.create_experiment(experiment_name)
    except Exception as err:  # noqa: BLE001
        return f"{type(err).__name__}: {err}".splitlines()[0][:300]
    return None


def make_logger(tracking_uri: str = DEFAULT_TRACKING_URI, experiment_name: str = "ppo-lightning",
                run_name: str | None = None, log_model: bool = True) -> Logger:
    """An MLflow logger if the store can be written, otherwise a console logger (with a message)."""
    error = probe_tracking_store(tracking_uri, experiment_name)
    if error is not None:
        _warn(f"MLflow tracking store {tracking_uri} cannot be written ({error}); training on with console logging")
        return ConsoleLogger()
    return SafeMLFlowLogger(
        experiment_name=experiment_name, tracking_uri=tracking_uri, run_name=run_name, log_model=log_model
    )
