"""One precision switch, Lightning's: ``--trainer.precision`` (``Trainer(precision=...)``).

``32-true`` and ``bf16-mixed`` are Lightning's own values, applied by its precision plugin (on CPU
and GPU: ``torch.autocast`` to bf16 around every training step; weights, gradients, Adam state stay
float32); they are never overridden. ``auto`` is ours, resolved before the Trainer is built:

- on a CPU, by measurement (`resolve_auto`): the run's own training step timed in both precisions
  on its network and minibatch, bf16-mixed only when at least 3% faster, cached per machine and
  workload (`ppo_lightning.training.precision_probe`);
- by the ISA-flag rule (`ppo_lightning.core.hardware.resolve_trainer_precision`: bf16-mixed on AMX
  CPUs from minibatches of 128 samples and on CUDA sm_80+, 32-true elsewhere) where no measurement
  runs: on a GPU (bf16 support is known there); in a run of several processes (DDP, FSDP2, several
  nodes: each rank would measure its own answer, under the others' load; a cached measurement of
  this machine and workload is used when there is one, the same file for every rank of a node);
  where the probe is off (``PPO_LIGHTNING_PRECISION_PROBE_S=0``) or gives no answer within its
  time bound. A `PPOTrainer` built in Python with ``precision="auto"`` measures at ``fit(model,
  datamodule=...)`` (without a datamodule: the rule).

The choice is logged once with its reason, and a CLI run records both (MLflow params
``precision`` and ``precision_reason``; the saved ``config.yaml`` has the resolved value).

Besides the training step, the rollout forward (the data side, `RolloutSource.collect`) and the
EWMA proximal forward (inside the training step) run under the same plugin's precision; the
rollout's autocast keeps its weight cache on (`ppo_lightning.data.devices.rollout_precision`).
The networks return float32 distribution parameters and values, so losses, GAE and normalizers are
computed in float32 under any precision.

``model.network.precision`` and ``model.proximal_precision`` were the project's own switches; they
are deprecated aliases now (`take_precision_aliases`).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Literal, Optional, Union

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info

from ppo_lightning.core.hardware import (TRAINER_PRECISIONS, accelerator_device, bf16_native_cpu,
                                         resolve_trainer_precision)
from ppo_lightning.training.checkpointing import save_checkpoint_on_all_ranks

# The values ``Trainer(precision=...)`` takes (Lightning's own type of them is private); the
# command line checks ``--trainer.precision`` against them. tests/test_adapters.py keeps them Lightning's.
PRECISION_INPUT = Union[Literal[64, 32, 16],
                        Literal["transformer-engine", "transformer-engine-float16", "16-true", "16-mixed", "bf16-true",
                                "bf16-mixed", "32-true", "64-true"],
                        Literal["64", "32", "16", "bf16"]]

_logged: set[tuple[str, str | None, str]] = set()


def log_choice(what: str, choice: str | None, reason: str) -> None:
    """Log a hardware-dependent choice once per process (same what, choice and reason)."""
    key = (what, choice, reason)
    if key not in _logged:
        _logged.add(key)
        _emit(f"{what}: {choice} ({reason})")


def _emit(message: str) -> None:
    # Lightning's rank-zero logger: shown at INFO on the console where Lightning logs, rank 0 only.
    rank_zero_info(message)


_ALIAS_TO_TRAINER = {"fp32": "32-true", "bf16": "bf16-mixed", "auto": "auto"}
DEPRECATION = ("{name} is deprecated: the precision is Lightning's --trainer.precision "
               "(32-true, bf16-mixed, auto){effect}")


def resolve(precision: Any, accelerator: Any = "auto", minibatch_size: Optional[int] = None) -> Any:
    """``precision`` with ``"auto"`` resolved by the ISA-flag rule for the device ``accelerator``
    trains on and, on a CPU, the minibatch size (logged once); see `resolve_auto` for the measured
    choice of a run whose network is built."""
    choice, reason = resolve_trainer_precision(precision, accelerator, minibatch_size)
    if precision == "auto":
        log_choice("trainer.precision auto", choice, f"{reason}; ISA-flag rule, no network to measure")
    else:
        _say_emulated(precision, accelerator)
    return choice


def _say_emulated(precision: Any, accelerator: Any) -> None:
    if precision == "bf16-mixed" and accelerator_device(accelerator).type == "cpu":
        # kept as set, but said once: where bf16 is emulated a pinned bf16-mixed run is the slow one
        # (a c = 64 MinAtar group on AVX2: 1.9-2.6x slower, docs/benchmarks/small-batch.md)
        native, why = bf16_native_cpu()
        if not native:
            log_choice("trainer.precision bf16-mixed", "kept as set", f"but {why}: 32-true is faster here")


PROBE_ENV = "PPO_LIGHTNING_PRECISION_PROBE_S"


def probe_budget() -> float:
    """The probe's time bound in seconds: ``$PPO_LIGHTNING_PRECISION_PROBE_S`` (0: no measurement,
    the ISA-flag rule), else `precision_probe.BUDGET_S`."""
    from ppo_lightning.training.precision_probe import BUDGET_S

    value = os.environ.get(PROBE_ENV, "")
    try:
        return max(0.0, float(value)) if value.strip() else BUDGET_S
    except ValueError:
        raise ValueError(f"{PROBE_ENV} must be a number of seconds (0: no measurement), got {value!r}") from None


def planned_processes(devices: Any = "auto", num_nodes: Any = 1) -> int:
    """How many training processes a run will have, known before the Trainer is built (``devices`` x
    ``num_nodes``, or the launcher's ``WORLD_SIZE``); ``-1`` / ``"-1"`` (all devices) counts as several."""
    try:
        world = int(os.environ.get("WORLD_SIZE") or 1)
    except ValueError:
        world = 1
    if isinstance(devices, (list, tuple)):
        n = len(devices)
    elif isinstance(devices, int) or (isinstance(devices, str) and devices.lstrip("-").isdigit()):
        n = int(devices) if int(devices) != -1 else 2
    else:  # "auto": one process on a CPU
        n = 1
    try:
        nodes = int(num_nodes or 1)
    except (TypeError, ValueError):
        nodes = 1
    return max(world, n * nodes)


def resolve_auto(precision: Any, accelerator: Any, model: Any, datamodule: Any, processes: int = 1) -> tuple[Any, str]:
    """``(precision, reason)`` for a run whose ``model`` (a `PPOLightningModule`) and ``datamodule``
    are built: a value other than ``"auto"`` is kept as set; ``"auto"`` on a CPU is measured (see the
    module; cached per machine and workload), elsewhere and where no measurement runs it follows
    the ISA-flag rule. Logged once."""
    if precision != "auto":
        _say_emulated(precision, accelerator)
        return precision, "set in the config" if precision is not None else "not set: Lightning's default, 32-true"
    minibatch = getattr(datamodule, "minibatch_size", None)
    flags, flags_why = resolve_trainer_precision("auto", accelerator, minibatch)
    choice, reason = flags, None
    if accelerator_device(accelerator).type != "cpu":
        reason = f"{flags_why}; ISA-flag rule: bf16 support on this device is known, not measured"
    elif probe_budget() == 0:
        reason = f"{flags_why}; ISA-flag rule: {PROBE_ENV}=0"
    elif minibatch is None or getattr(model, "network", None) is None:
        reason = f"{flags_why}; ISA-flag rule: no network and minibatch to measure"
    elif getattr(model.network, "recurrent", False):  # the probe times one feed-forward step of a minibatch
        reason = f"{flags_why}; ISA-flag rule: the probe does not time a recurrent network's sequences"
    else:
        # start-up cost: the probe (and torch's thread settings) only where auto measures
        from ppo_lightning.core.threads import configure_threads
        from ppo_lightning.training.precision_probe import measured_choice

        configure_threads(datamodule.num_threads, datamodule.env_id)  # the run's threads (its setup sets them too)
        try:
            measured, why, _ = measured_choice(model.network, datamodule.observation_space, minibatch,
                                               model.hparams.get("micro_batch_size"),
                                               getattr(model, "proximal_source", None) is not None,
                                               measure=processes <= 1, budget_s=probe_budget())
        except Exception as err:  # noqa: BLE001 - a network the probe cannot drive: the rule, said why
            measured, why = None, f"probe failed: {type(err).__name__}: {str(err)[:80]}"
        if measured is not None:
            choice, reason = measured, why
        elif processes > 1:
            reason = f"{flags_why}; ISA-flag rule: {processes} processes ({why})"
        else:
            reason = f"{flags_why}; ISA-flag rule: {why}"
    log_choice("trainer.precision auto", choice, reason)
    return choice, reason


class PPOTrainer(pl.Trainer):
    """``lightning.pytorch.Trainer`` whose ``precision`` also takes ``"auto"`` (see the module) and
    whose ranks agree on a failed checkpoint write before they wait for each other
    (`ppo_lightning.training.checkpointing.save_checkpoint_on_all_ranks`: a full disk under DDP ends
    every rank, instead of leaving rank 1 at the save's barrier); everything else is Lightning's. The
    CLI resolves ``auto`` before building it (`resolve_auto`, once the network and data exist); built
    in Python with ``precision="auto"`` on a CPU, it measures at ``fit(model, datamodule=...)``
    (``precision_reason`` says how the precision was chosen)."""

    def __init__(self, *args: Any, precision: Optional[Union[PRECISION_INPUT, Literal["auto"]]] = None,
                 **kwargs: Any) -> None:
        accelerator = kwargs.get("accelerator", "auto")
        # "auto" on a CPU in one process: measured at fit(), when the network and data exist (the
        # ISA-flag rule's value until then)
        self._measure_at_fit = (precision == "auto" and accelerator_device(accelerator).type == "cpu"
                                and planned_processes(kwargs.get("devices", "auto"), kwargs.get("num_nodes", 1)) == 1)
        flags = resolve_trainer_precision(precision, accelerator)[0] if self._measure_at_fit else resolve(precision, accelerator)
        super().__init__(*args, precision=flags, **kwargs)
        self.precision_reason = "set in the config" if precision != "auto" else "ISA-flag rule"

    def fit(self, model, train_dataloaders=None, val_dataloaders=None, datamodule=None, ckpt_path=None, **kwargs):
        data = datamodule if datamodule is not None else train_dataloaders  # fit(model, dm) passes it there
        if self._measure_at_fit and isinstance(data, pl.LightningDataModule):
            from lightning.pytorch.plugins.precision import MixedPrecision, Precision

            self._measure_at_fit = False
            choice, self.precision_reason = resolve_auto("auto", "cpu", model, data)
            if choice != self.precision:
                self.strategy.precision_plugin = MixedPrecision("bf16-mixed", "cpu") if choice == "bf16-mixed" else Precision()
        return super().fit(model, train_dataloaders, val_dataloaders, datamodule, ckpt_path, **kwargs)

    def save_checkpoint(self, filepath, weights_only: Optional[bool] = None, storage_options: Any = None) -> None:
        save_checkpoint_on_all_ranks(self, filepath, weights_only, storage_options)


def take_precision_aliases(model: Any, trainer_precision: Any = "module", warn: bool = True) -> Optional[str]:
    """Remove the deprecated ``network.precision`` and ``proximal_precision`` from a model config
    (a dict or a jsonargparse namespace) and return the trainer precision they ask for: "bf16"
    anywhere -> "bf16-mixed", else "auto" anywhere -> "auto", else "fp32" -> "32-true"; None if
    neither was set. Warns once per alias, one line naming ``--trainer.precision`` and what happens:
    ``trainer_precision`` None (the CLI, not set): the alias sets it; a value (the CLI, set): the
    alias is ignored; "module" (a module built in Python): ignored, the Trainer's applies."""
    values = {}
    network = model.get("network") if hasattr(model, "get") else None
    if isinstance(network, dict) and "precision" in network:
        values["model.network.precision"] = network.pop("precision")
    if model.get("proximal_precision") is not None:
        values["model.proximal_precision"] = model["proximal_precision"]
    if "proximal_precision" in model:
        model["proximal_precision"] = None
    values = {k: v for k, v in values.items() if v is not None}
    for name, value in values.items():
        if value not in _ALIAS_TO_TRAINER:
            raise ValueError(f"{name} must be one of {tuple(_ALIAS_TO_TRAINER)} (deprecated: use --trainer.precision "
                             f"{'/'.join(TRAINER_PRECISIONS)}), got {value!r}")
    if not values:
        return None
    asked = set(values.values())
    mapped = _ALIAS_TO_TRAINER["bf16" if "bf16" in asked else "auto" if "auto" in asked else "fp32"]
    if warn:
        for name, value in values.items():
            if trainer_precision is None:
                effect = f"; {name}={value} sets --trainer.precision {mapped}"
            elif trainer_precision == "module":
                effect = f"; {name}={value} is ignored here, Trainer(precision=...) applies"
            else:
                effect = f"; {name}={value} is ignored, --trainer.precision {trainer_precision} is set"
            _warn_once(DEPRECATION.format(name=name, effect=effect))
    return mapped


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, FutureWarning, stacklevel=3)

