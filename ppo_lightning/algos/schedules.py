"""Learning-rate schedules over PPO iterations.

``linear``: the PPO paper's MuJoCo setting and CleanRL's ``--anneal-lr``: at iteration ``i``
(0-based) the rate is ``lr * (1 - i / N)``, ``N = ceil(total_frames / frames_per_iteration)``, so the
last iteration trains with ``lr / N`` and the rate would reach 0 just after ``total_frames``.
"""

from __future__ import annotations

import math

import torch

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
