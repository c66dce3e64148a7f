"""What studies and tuning (the harness) need of the library besides `ppo_lightning.run.spec`'s
`RunSpec` and `train`: the MinAtar score tables, the ``--scale`` rules as a run applies them to one
member's settings, the lr schedules' factor, and the one-line checks of a checkpoint file and of a
tracking store. The harness reaches the library through `ppo_lightning.run`, `ppo_lightning.core`
and the module's documented member methods only (`tests/test_layout.py`).

Light to import (no torch): the checks and the lr factor load the training stack when called.
"""

from __future__ import annotations

import os
from typing import Any

from ppo_lightning.algos.scaling import parse_rules, scale_member
from ppo_lightning.envs.minatar_scores import REFERENCE_500K, RETURN_RANGES, normalized_return

__all__ = ["REFERENCE_500K", "RETURN_RANGES", "check_checkpoint_file", "lr_factor", "normalized_return",
           "objective_settings_unused", "probe_tracking_store", "scale_member_settings"]


def scale_member_settings(c: float, values: dict[str, Any], rules: str = "all", adam_betas: bool = False) -> dict[str, Any]:
    """A member's settings (``lr``, ``proximal_com``, ``advantage_norm_span``, ``adam_betas``, ...) after
    ``--scale c`` with ``--scale_rules rules`` (and ``--scale_adam_betas``), as a single run with them
    scales its own (`ppo_lightning.algos.scaling`)."""
    return scale_member(c, values, parse_rules(rules, adam_betas))


def lr_factor(name: str, iteration: int, total_frames: int, frames_per_iteration: int) -> float:
    """The factor on a run's lr at its iteration ``iteration`` (0-based) under ``model.lr_schedule``
    ``name`` (`ppo_lightning.algos.schedules.lr_factor`)."""
    from ppo_lightning.algos.schedules import lr_factor as factor  # start-up cost: torch, where a group trains

    return factor(name, iteration, total_frames, frames_per_iteration)


def objective_settings_unused(name: str) -> tuple[str, ...] | None:
    """The loss settings an objective may ignore (`ppo_lightning.algos.registry.OBJECTIVE_SETTINGS`) that
    objective ``name`` does ignore; None where no objective of that name is registered (an import path
    not imported yet is left to its runs)."""
    from ppo_lightning.algos import registry  # start-up cost: torch, where a study's arms are checked

    if name not in registry.objective_names():
        return None
    uses = registry.get_objective(name).uses
    return tuple(s for s in registry.OBJECTIVE_SETTINGS if s not in uses)


def check_checkpoint_file(path: str | os.PathLike) -> None:
    """Raise `ppo_lightning.core.errors.CheckpointError` (one line) if ``path`` is not a complete
    checkpoint (`ppo_lightning.interop.checkpoint_io.check_checkpoint_file`)."""
    from ppo_lightning.interop.checkpoint_io import check_checkpoint_file as check  # start-up cost: only in a worker

    check(path)


def probe_tracking_store(tracking_uri: str, experiment_name: str, artifact_location: str | None = None) -> str | None:
    """Create or find the MLflow experiment as a run does; an error message if the store cannot be
    written (`ppo_lightning.training.tracking.probe_tracking_store`)."""
    from ppo_lightning.training.tracking import probe_tracking_store as probe  # start-up cost: MLflow

    return probe(tracking_uri, experiment_name, artifact_location=artifact_location)
