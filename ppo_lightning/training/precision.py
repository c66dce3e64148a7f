"""One precision switch, Lightning's: ``--trainer.precision`` (``Trainer(precision=...)``).

``32-true`` and ``bf16-mixed`` are Lightning's own values, applied by its precision plugin (on CPU
and GPU: ``torch.autocast`` to bf16 around every training step; weights, gradients, Adam state stay
float32). ``auto`` is ours: it resolves once per machine, before the Trainer is built, to
``bf16-mixed`` where bf16 is native and faster (AMX CPUs, CUDA sm_80+; on a CPU only for minibatches
of at least 128 samples) and ``32-true`` elsewhere (`ppo_lightning.core.hardware.resolve_trainer_precision`),
and the choice is logged once with its reason.

Besides the training step, the rollout forward (the data side, `RolloutSource.collect`) and the
EWMA proximal forward (inside the training step) run under the same plugin's precision; the
rollout's autocast keeps its weight cache on (`ppo_lightning.data.devices.rollout_precision`).
The networks return float32 distribution parameters and values, so losses, GAE and normalizers are
computed in float32 under any precision.

``model.network.precision`` and ``model.proximal_precision`` were the project's own switches; they
are deprecated aliases now (`take_precision_aliases`).
"""

from __future__ import annotations

import warnings
from typing import Any, Literal, Optional, Union

import lightning.pytorch as pl
from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT

from ppo_lightning.core.hardware import (TRAINER_PRECISIONS, accelerator_device, bf16_faster_cpu, log_choice,
                                         resolve_trainer_precision)
from ppo_lightning.training.checkpointing import save_checkpoint_on_all_ranks

_ALIAS_TO_TRAINER = {"fp32": "32-true", "bf16": "bf16-mixed", "auto": "auto"}
DEPRECATION = ("{name} is deprecated: the precision is Lightning's --trainer.precision "
               "(32-true, bf16-mixed, auto){effect}")


def resolve(precision: Any, accelerator: Any = "auto", minibatch_size: Optional[int] = None) -> Any:
    """``precision`` with ``"auto"`` resolved for the device ``accelerator`` trains on and, on a CPU,
    the minibatch size (logged once)."""
    choice, reason = resolve_trainer_precision(precision, accelerator, minibatch_size)
    if precision == "auto":
        log_choice("trainer.precision auto", choice, reason)
    elif precision == "bf16-mixed" and accelerator_device(accelerator).type == "cpu":
        # kept as set, but said once: on a CPU without fast bf16 a pinned bf16-mixed run is the slow
        # one (a c = 64 MinAtar group on AVX2: 1.9-2.6x slower, docs/benchmarks/small-batch.md)
        fast, why = bf16_faster_cpu()
        if not fast:
            log_choice("trainer.precision bf16-mixed", "kept as set", f"but {why}: 32-true (what auto picks) is faster here")
    return choice


class PPOTrainer(pl.Trainer):
    """``lightning.pytorch.Trainer`` whose ``precision`` also takes ``"auto"`` (see the module) and
    whose ranks agree on a failed checkpoint write before they wait for each other
    (`ppo_lightning.training.checkpointing.save_checkpoint_on_all_ranks`: a full disk under DDP ends
    every rank, instead of leaving rank 1 at the save's barrier); everything else is Lightning's. The
    CLI resolves ``auto`` in its config before building it."""

    def __init__(self, *args: Any, precision: Optional[Union[_PRECISION_INPUT, Literal["auto"]]] = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, precision=resolve(precision, kwargs.get("accelerator", "auto")), **kwargs)

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

