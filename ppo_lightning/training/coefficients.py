"""``model.schedules`` on a running module: each iteration's factor (`ppo_lightning.algos.schedules`) on
the configured coefficients, and the values every iteration trains with, as metrics.

The factor multiplies the value each coefficient was configured with: ``model.<name>``, or a seed
group's members' own values (``member_hparams``), so that members keep their ratio. The loss's
coefficients are set at the start of every iteration (`ScheduledCoefficients.apply`), the lr by the
optimizer's scheduler after every iteration (`ScheduledCoefficients.lr_scheduler`), both from the frames
trained before the iteration (`progress`). A schedule of a coefficient that is 0 (every member's, in a
group) would change nothing and is refused before training (`ScheduledCoefficients.check_loss`).

The values used are logged at every iteration (`values_in_use`): ``setting/lr`` (PPO's optimizer;
``setting/lr/<name>`` for PPG's policy, value and auxiliary ones; ``/group<i>`` for each parameter group
of an optimizer with several), and ``setting/<name>`` for every loss setting that is scheduled or that
members have their own of; a group's members each their own (``seed<k>/setting/...``).
"""

from __future__ import annotations

from typing import Any

import torch

from ppo_lightning.adapters.lightning import attached_datamodule
from ppo_lightning.algos.schedules import Progress, check_schedules, schedule_factor
from ppo_lightning.core.members import PerMember

LOSS_COEFFICIENTS = ("clip_eps", "entropy_coef", "value_coef", "kl_beta")


class ScheduledCoefficients:
    """The checked ``model.schedules`` of a module (``hparams``: its hyperparameters)."""

    def __init__(self, hparams) -> None:
        self.specs = check_schedules(hparams.get("schedules"))
        if "lr" in self.specs and hparams.get("lr_schedule", "constant") != "constant":
            raise ValueError("model.schedules.lr and model.lr_schedule both schedule the lr: keep one "
                             "(model.lr_schedule linear is model.schedules.lr linear)")
        self.factors: dict[str, float] = {}
        self.hparams = hparams

    def __bool__(self) -> bool:
        return bool(self.specs)

    def check_loss(self, loss) -> None:
        """One-line errors before training: a schedule of the adaptive beta, or of a coefficient that is 0
        (every member's in a group): the factor would scale 0 and the run would train without it."""
        if "kl_beta" in self.specs and loss.objective_spec.adaptive_beta:
            raise ValueError(f"model.schedules.kl_beta: objective {loss.objective!r} adapts beta itself; "
                             "schedule it with a fixed-beta objective (kl)")
        members: dict[str, list] = self.hparams.get("member_hparams") or {}
        for name in self.specs:
            if name in members:
                if all(float(v) == 0.0 for v in members[name]):
                    raise ValueError(f"model.schedules.{name} scales data.member_hparams.{name}, which are all 0: the "
                                     f"schedule would change nothing; give the members non-zero values or drop the schedule")
            elif float(self.hparams.get(name)) == 0.0:
                raise ValueError(f"model.schedules.{name} scales model.{name}, which is 0: the schedule would change "
                                 f"nothing; set model.{name} (its value at the start) or drop the schedule")

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


def _member_values(value, members: int) -> float | PerMember:
    """A setting's value as a metric: a number, or one per member where a group's members differ."""
    if isinstance(value, torch.Tensor):
        values = [float(v) for v in value.detach().reshape(-1).tolist()]
        if len(values) == 1:
            return values[0]
        return PerMember(values) if members > 1 else values[0]
    return float(value)


def learning_rates(optimizers: dict[str, torch.optim.Optimizer], members: int = 1) -> dict[str, float | PerMember]:
    """The lr each optimizer steps with, by its name (``main``: PPO's one, logged as ``setting/lr``; PPG's
    ``policy``, ``value``, ``aux`` as ``setting/lr/<name>``), one entry per parameter group
    (``/group<i>`` where there are several); a `ppo_lightning.training.seed_group.MemberAdam`'s members
    each their own (its ``member_lrs``)."""
    out: dict[str, float | PerMember] = {}
    for name, opt in optimizers.items():
        base = "setting/lr" if name == "main" else f"setting/lr/{name}"
        groups = opt.param_groups
        for i, group in enumerate(groups):
            key = base if len(groups) == 1 else f"{base}/group{i}"
            member_lrs = getattr(opt, "member_lrs", None)
            out[key] = PerMember(member_lrs()) if member_lrs is not None and members > 1 else float(group["lr"])
    return out


def values_in_use(module) -> dict[str, float | PerMember]:
    """This iteration's lr (every optimizer's, `learning_rates`) and the loss's value of every setting that
    is scheduled or that members have their own of (``setting/<name>``): read from the optimizers and
    the loss, after the schedules set them (`ScheduledCoefficients.apply`)."""
    trainer = module.trainer
    names: dict[int, str] = {}
    for name, i in module.updater.optimizer_index.items():
        names.setdefault(i, name)  # PPG's "joint" is its policy optimizer
    optimizers = {names.get(i, f"optimizer{i}"): opt for i, opt in enumerate(trainer.optimizers)}
    out = learning_rates(optimizers, module.members)
    h, loss = module.hparams, module.loss_module
    members = h.get("member_hparams") or {}
    scheduled = set(module.coefficients.specs)
    for name in LOSS_COEFFICIENTS + ("kl_target",):
        if name in scheduled or name in members:
            out[f"setting/{name}"] = _member_values(getattr(loss, name), module.members)
    return out
