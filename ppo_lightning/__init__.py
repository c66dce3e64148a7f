"""ppo-lightning: PPO, decoupled PPO and PPO-EWMA on PyTorch Lightning and TorchRL.

Python API (see the README):
    from ppo_lightning import RunSpec, Members, train  # a run from Python (ppo_lightning.run)
    from ppo_lightning import RolloutDataModule, PPOLightningModule, load_pretrained, evaluate_policy
"""

import sys as _sys
import types as _types

# procgen needs the legacy `gym` package, whose import prints a multi-line deprecation banner to
# stderr (from `gym_notices`) in every process; we know, and use gymnasium everywhere else.
_sys.modules.setdefault("gym_notices.notices", _types.SimpleNamespace(notices={}))


def __getattr__(name):
    # Lazy: `import ppo_lightning` stays light (export-hf needs no TorchRL collector; a study report
    # or `study status` needs no torch).
    if name in ("RunSpec", "Members", "train", "Run"):
        from ppo_lightning.run import spec  # no torch: a spec is plain data; train loads Lightning

        return getattr(spec, name)
    if name == "ExportError":
        from ppo_lightning.interop.checkpoint_io import ExportError

        return ExportError
    if name == "load_pretrained":
        from ppo_lightning.interop.hf.loader import load_pretrained

        return load_pretrained
    if name == "PPOLightningModule":
        from ppo_lightning.training.module import PPOLightningModule

        return PPOLightningModule
    if name == "evaluate_policy":
        from ppo_lightning.interop.evaluation import evaluate_policy

        return evaluate_policy
    if name == "RolloutDataModule":
        from ppo_lightning.data.datamodule import RolloutDataModule

        return RolloutDataModule
    raise AttributeError(name)
