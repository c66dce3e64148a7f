"""Old module paths of ppo_lightning 0.1 (a flat package) -> their subpackages (issue 22).

A user's YAML (``class_path: ppo_lightning.module.PPOLightningModule``), script or old checkpoint
config may still name the flat paths. They keep working until 0.2: each old name is a placeholder
module in ``sys.modules`` that, on first attribute access, prints one FutureWarning naming the new
path and forwards to the real module (imported only then, so ``import ppo_lightning`` stays light).
``ppo_lightning.data`` and ``ppo_lightning.cli`` are packages now; their ``__getattr__`` forwards
the names the old modules had (`forward_attribute`).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
import warnings

REMOVED_IN = "0.2"
MOVED = {  # old dotted path -> new dotted path
    "ppo_lightning.faults": "ppo_lightning.core.faults",
    "ppo_lightning.hardware": "ppo_lightning.core.hardware",
    "ppo_lightning.threads": "ppo_lightning.core.threads",
    "ppo_lightning.models": "ppo_lightning.nets.models",
    "ppo_lightning.impala": "ppo_lightning.nets.impala",
    "ppo_lightning.impala_phasic": "ppo_lightning.nets.impala_phasic",
    "ppo_lightning.minatar_cnn": "ppo_lightning.nets.minatar_cnn",
    "ppo_lightning.obs_norm": "ppo_lightning.nets.obs_norm",
    "ppo_lightning.objectives": "ppo_lightning.algos.objectives",
    "ppo_lightning.loss": "ppo_lightning.algos.loss",
    "ppo_lightning.proximal": "ppo_lightning.algos.proximal",
    "ppo_lightning.ppg": "ppo_lightning.algos.ppg",
    "ppo_lightning.advantages": "ppo_lightning.algos.advantages",
    "ppo_lightning.scaling": "ppo_lightning.algos.scaling",
    "ppo_lightning.staleness": "ppo_lightning.algos.staleness",
    "ppo_lightning.schedules": "ppo_lightning.algos.schedules",
    "ppo_lightning.devices": "ppo_lightning.data.devices",
    "ppo_lightning.parallel": "ppo_lightning.data.parallel",
    "ppo_lightning.resume_state": "ppo_lightning.data.resume_state",
    "ppo_lightning.checkpoint_io": "ppo_lightning.interop.checkpoint_io",
    "ppo_lightning.export": "ppo_lightning.interop.export",
    "ppo_lightning.evaluation": "ppo_lightning.interop.evaluation",
    "ppo_lightning.video": "ppo_lightning.interop.video",
    "ppo_lightning.hf": "ppo_lightning.interop.hf",
    "ppo_lightning.hf.loader": "ppo_lightning.interop.hf.loader",
    "ppo_lightning.hf.writer": "ppo_lightning.interop.hf.writer",
    "ppo_lightning.hf.card": "ppo_lightning.interop.hf.card",
    "ppo_lightning.hf.bundle": "ppo_lightning.interop.hf.bundle",
    "ppo_lightning.module": "ppo_lightning.training.module",
    "ppo_lightning.callbacks": "ppo_lightning.training.callbacks",
    "ppo_lightning.checkpointing": "ppo_lightning.training.checkpointing",
    "ppo_lightning.diagnostics": "ppo_lightning.training.diagnostics",
    "ppo_lightning.noise_scale": "ppo_lightning.training.noise_scale",
    "ppo_lightning.tracking": "ppo_lightning.training.tracking",
    "ppo_lightning.main": "ppo_lightning.cli.main",
    "ppo_lightning.evaluate_cmd": "ppo_lightning.cli.evaluate",
}
# names of the old flat modules that are packages now: old attribute -> the module that has it
PACKAGE_FORWARDS = {"ppo_lightning.data": "ppo_lightning.data.datamodule", "ppo_lightning.cli": "ppo_lightning.run.builder"}


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old path is removed in ppo_lightning {REMOVED_IN}",
                  FutureWarning, stacklevel=3)


class _MovedModule(types.ModuleType):
    """Placeholder for an old path: forwards attribute access to the new module, warning once."""

    def __init__(self, old: str, new: str):
        super().__init__(old, f"Moved to {new}.")
        self.__dict__["_new"] = new

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # importlib / pickle probing; no warning, no import
        new = self.__dict__["_new"]
        if not self.__dict__.get("_warned"):
            self.__dict__["_warned"] = True
            _warn(self.__name__, new)
        return getattr(importlib.import_module(new), name)


def install() -> None:
    for old, new in MOVED.items():
        sys.modules.setdefault(old, _MovedModule(old, new))


def forward_attribute(package: str, name: str):
    """``ppo_lightning.data.RolloutDataModule`` (0.1's flat module) -> its new home, with a warning."""
    if name.startswith("_") or importlib.util.find_spec(f"{package}.{name}") is not None:
        # a submodule of the package (`from ppo_lightning.data import parallel`): the import system
        # loads it once this says no; never forward it to the old module's namesake
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    if sys._getframe(1).f_back is not None and sys._getframe(2).f_globals.get("__name__", "").startswith("jsonargparse"):
        # jsonargparse probes each parent package for the shortest path of a class (`fit --help`):
        # the old path is not an answer to give it (nor a warning to print)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    target = PACKAGE_FORWARDS[package]
    module = importlib.import_module(target)
    if not hasattr(module, name):
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    _warn(f"{package}.{name}", f"{target}.{name}")
    return getattr(module, name)
