"""``model.schedules`` on a running module: each iteration's factor (`ppo_lightning.algos.schedules`) on
the configured coefficients.

The factor multiplies the value each coefficient was configured with: ``model.<name>``, or a seed
group's members' own values (``member_hparams``), so that members keep their ratio. The loss's
coefficients are set at the start of every iteration (`ScheduledCoefficients.apply`), the lr by the
optimizer's scheduler after every iteration (`ScheduledCoefficients.lr_scheduler`), both from the frames
trained before the iteration (`progress`).
"""

from __future__ import annotations

from typing import Any

import torch

from ppo_lightning.adapters.lightning import attached_datamodule
from ppo_lightning.algos.schedules import Progress, check_schedules, schedule_factor

LOSS_COEFFICIENTS = ("clip_eps", "entropy_coef", "value_coef", "kl_beta")


class ScheduledCoefficients:
    """The checked ``model.schedules`` of a module (``hparams``: its hyperparameters)."""

    def __init__(self, hparams) -> None:
        self.specs = check_schedules(hparams.get("schedules"))
        if "lr" in self.specs and hparams.get("lr_schedule", "constant") != "constant":
            raise ValueError("model.schedules.lr and model.lr_schedule both schedule the lr: keep one "
                             "(model.lr_schedule linear is model.schedules.lr linear)")
        self.factors: dict[str, float] = {}

    def __bool__(self) -> bool:
        return bool(self.specs)

    def check_loss(self, loss) -> None:
        if "kl_beta" in self.specs and loss.objective_spec.adaptive_beta:
            raise ValueError(f"model.schedules.kl_beta: objective {loss.objective!r} adapts beta itself; "
                             "schedule it with a fixed-beta objective (kl)")

    @staticmethod
    def progress(dm) -> Progress:
        """The frames trained so far (``data.frames``: per seed, all ranks) and ``data.total_frames``."""
        return Progress(int(dm.frames), int(dm.total_frames), int(dm.iteration))

    def factor(self, name: str, dm) -> float:
        if dm is None or name not in self.specs:
            return 1.0
        return schedule_factor(self.specs[name], self.progress(dm))

    def apply(self, module) -> dict[str, float]:
        """Set the loss's scheduled coefficients for this iteration: the configured value (a group's
        members' own, when they have them) times the factor. Returns the factors as metrics."""
        dm = attached_datamodule(module)
        loss, h = module.loss_module, module.hparams
        members: dict[str, list] = h.get("member_hparams") or {}
        metrics = {}
        for name in LOSS_COEFFICIENTS:
            if name not in self.specs or dm is None:
                continue
            f = self.factor(name, dm)
            if name in members:
                loss.set_member_settings({name: [float(v) * f for v in members[name]]})  # scaled, never replaced
            elif name == "kl_beta":
                loss.kl_beta.fill_(float(h[name]) * f)
            else:
                setattr(loss, name, float(h[name]) * f)
            metrics[f"schedule/{name}_factor"] = f
        self.factors = metrics
        return metrics

    def lr_scheduler(self, module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """The lr's schedule as a Lightning ``lr_scheduler`` config stepped after every iteration: the
        optimizer's initial lr (a group's members' own lrs scale with it, `MemberAdam`) times the factor."""
        if "lr" not in self.specs:
            return None

        def lr_lambda(_epoch: int) -> float:
            return self.factor("lr", attached_datamodule(module))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
        return {"scheduler": scheduler, "interval": "epoch", "frequency": 1}
