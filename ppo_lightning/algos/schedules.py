"""Schedules: the learning rate over PPO iterations (``model.lr_schedule``), and any coefficient by frames
(``model.schedules``).

``model.lr_schedule`` ``linear``: the PPO paper's MuJoCo setting and CleanRL's ``--anneal-lr``: at iteration ``i``
(0-based) the rate is ``lr * (1 - i / N)``, ``N = ceil(total_frames / frames_per_iteration)``, so the
last iteration trains with ``lr / N`` and the rate would reach 0 just after ``total_frames``.

``model.schedules`` maps a coefficient of `SCHEDULABLE` to a schedule: a registered name (``linear``)
or ``{name: linear, <settings>}``, e.g. ``{entropy_coef: {name: linear, end: 0.0}, lr: cosine}``. A
schedule is a pure function ``fn(p: Progress, **settings) -> float``: the FACTOR on the coefficient's
configured value at that point of the run. The factor scales the value and never replaces it: a seed
group's members with their own values (``data.member_hparams``, e.g. entropy_coef ``[0.01, 0.05]``) keep
their ratio. Applied at the start of every iteration from the frames trained so far (restored with the
run on resume, as ``data.total_frames`` is).
"""

from __future__ import annotations

import math
from dataclasses import dataclass as _dataclass

import torch

from ppo_lightning.algos.hooks import HookRegistry
from ppo_lightning.algos.settings import setting

LR_SCHEDULES = ("constant", "linear")


def linear_annealing_factor(iteration: int, total_iterations: int) -> float:
    """``1 - iteration / total_iterations``, floored at 0 (a resumed run past its budget)."""
    return max(0.0, 1.0 - iteration / total_iterations)


def schedule_iterations(total_frames: int, frames_per_iteration: int) -> int:
    """``N = ceil(total_frames / frames_per_iteration)`` (at least 1): the iterations a schedule spans."""
    return max(1, math.ceil(total_frames / frames_per_iteration))


def lr_factor(name: str, iteration: int, total_frames: int, frames_per_iteration: int) -> float:
    """The factor on a run's lr at its iteration ``iteration`` (0-based) under schedule ``name``: what
    `make_lr_scheduler`'s scheduler gives that iteration (a tuning group's refilled member runs its own)."""
    if name == "constant":
        return 1.0
    if name != "linear":
        raise ValueError(f"model.lr_schedule must be one of {LR_SCHEDULES}, got {name!r}")
    return linear_annealing_factor(iteration, schedule_iterations(total_frames, frames_per_iteration))


def make_lr_scheduler(name: str, optimizer: torch.optim.Optimizer, total_frames: int, frames_per_iteration: int):
    """A Lightning ``lr_scheduler`` config stepped once per iteration (Lightning epoch); None for constant."""
    if name == "constant":
        return None
    if name != "linear":
        raise ValueError(f"model.lr_schedule must be one of {LR_SCHEDULES}, got {name!r}")
    total = schedule_iterations(total_frames, frames_per_iteration)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: linear_annealing_factor(i, total))
    return {"scheduler": scheduler, "interval": "epoch", "frequency": 1}


# ---------------------------------------------------------------------- coefficient schedules by frames

# The coefficients a schedule may scale: the optimizer's lr and the loss's settings.
SCHEDULABLE = ("lr", "clip_eps", "entropy_coef", "value_coef", "kl_beta")


@_dataclass(frozen=True)
class Progress:
    """Where a run is when a schedule is read (the start of an iteration).

    Attributes:
        frames: frames trained so far (per seed in a group; all ranks').
        total_frames: ``data.total_frames``.
        iteration: iterations done so far (0 at the first).
    """

    frames: int
    total_frames: int
    iteration: int

    @property
    def fraction(self) -> float:
        """``frames / total_frames`` in [0, 1]."""
        return min(1.0, max(0.0, self.frames / self.total_frames))


SCHEDULES = HookRegistry("schedule", "model.schedules", "(p: Progress, **settings) -> float")
register_schedule = SCHEDULES.register


@_dataclass
class LinearSettings:
    end: float = setting(0.0, check=">= 0", doc="the factor at the end of the span")
    start: float = setting(0.0, check=">= 0, <= 1", doc="fraction of total_frames where it starts moving")
    stop: float = setting(1.0, check="> 0, <= 1", doc="fraction of total_frames where it reaches end")


@register_schedule("constant")
def constant(p: Progress) -> float:
    """1: the configured value throughout."""
    return 1.0


@register_schedule("linear", settings=LinearSettings)
def linear(p: Progress, end: float = 0.0, start: float = 0.0, stop: float = 1.0) -> float:
    """From 1 to ``end`` linearly over the fraction ``[start, stop]`` of ``total_frames``."""
    t = min(1.0, max(0.0, (p.fraction - start) / max(stop - start, 1e-12)))
    return 1.0 + (end - 1.0) * t


@_dataclass
class CosineSettings:
    end: float = setting(0.0, check=">= 0", doc="the factor at total_frames")


@register_schedule("cosine", settings=CosineSettings)
def cosine(p: Progress, end: float = 0.0) -> float:
    """From 1 to ``end`` along half a cosine over ``total_frames``."""
    return end + (1.0 - end) * 0.5 * (1.0 + math.cos(math.pi * p.fraction))


@_dataclass
class ExponentialSettings:
    half_life: float = setting(0.25, check="> 0", doc="fraction of total_frames over which the factor halves")


@register_schedule("exponential", settings=ExponentialSettings)
def exponential(p: Progress, half_life: float = 0.25) -> float:
    """``0.5 ** (fraction / half_life)``."""
    return 0.5 ** (p.fraction / half_life)


def check_schedules(schedules: dict | None) -> dict[str, tuple]:
    """``model.schedules`` checked: ``{coefficient: (hook, settings)}``; one-line errors before training."""
    if schedules is None:
        return {}
    if not isinstance(schedules, dict):
        raise ValueError(f"model.schedules must be {{coefficient: schedule}} or null, got {schedules!r}")
    out = {}
    for coef, spec in schedules.items():
        if coef not in SCHEDULABLE:
            raise ValueError(f"model.schedules: {coef!r} is not a schedulable coefficient ({', '.join(SCHEDULABLE)})")
        spec = {"name": spec} if isinstance(spec, str) else dict(spec or {})
        name = spec.pop("name", None)
        if name is None:
            raise ValueError(f"model.schedules.{coef}: name the schedule ({', '.join(SCHEDULES.names())} or an import path)")
        out[coef] = SCHEDULES.check(name, spec, f"model.schedules.{coef}")
    return out


def schedule_factor(spec: tuple, progress: Progress) -> float:
    """The factor of a checked schedule (`check_schedules`) at ``progress``; one-line error if it is not
    a finite number >= 0."""
    hook, settings = spec
    factor = float(hook.fn(progress, **settings))
    if not (math.isfinite(factor) and factor >= 0):
        raise ValueError(f"model.schedules: schedule {hook.name!r} gave factor {factor} at {progress.frames} frames "
                         "(must be a finite number >= 0)")
    return factor
