"""`TrialReporter`: the Lightning callback through which a search's group reports each member's
learning curve, applies queued refills and anneals each member's lr on its own clock. Its own module
because it imports Lightning: `ppo_lightning.tuning.runner` (asking, telling, leases) stays light, and
only a worker that trains a group loads the training stack."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback

from ppo_lightning.run.harness import lr_factor


class TrialReporter(Callback):
    """Every member's learning curve ``(frames of its own run, mean return of the last 20 episodes)``
    after each iteration, and ``on_iteration(frames)`` after it (True: stop the group). Refills queued
    with `refill` are applied before the next iteration's rollout (the module's `refill_member`; in a PPG group,
    before the next iteration that starts a phase, the slot idling in between): the slot's curve starts
    again, counting its frames from there. With ``lr_schedule`` ``(name, frames)`` (the
    group itself at a constant lr), each member's lr before each iteration is its own lr times the
    schedule's factor at its own iteration of a ``frames`` run (`ppo_lightning.run.harness.lr_factor`):
    a refilled member anneals from its start as its trial's single run does."""

    def __init__(self, members: int, on_iteration=None, lr_schedule: tuple[str, int] | None = None) -> None:
        self.curves: list[list[tuple[float, float]]] = [[] for _ in range(members)]
        self.starts = [0.0] * members  # the group's frames when each slot's current run started
        self.on_iteration = on_iteration
        self.pending: list[tuple[int, int, dict[str, Any]]] = []
        self.frames = 0.0
        self.lr_schedule = lr_schedule

    def refill(self, slot: int, seed: int, values: dict[str, Any]) -> None:
        self.pending.append((slot, seed, values))

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if pl_module.at_refill_point:
            for slot, seed, values in self.pending:
                pl_module.refill_member(slot, seed, values)
                self.curves[slot], self.starts[slot] = [], float(trainer.datamodule.frames)
            self.pending = []
        if self.lr_schedule is not None:
            name, frames = self.lr_schedule
            dm = trainer.datamodule
            fpi = dm.frames_per_iteration
            own = [round((float(dm.frames) - start) / fpi) for start in self.starts]  # each member's iterations so far
            pl_module.set_member_lrs([lr * lr_factor(name, i, frames, fpi)
                                      for lr, i in zip(pl_module.hparams.member_hparams["lr"], own)])

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.frames = float(trainer.datamodule.frames)
        waiting = {slot for slot, _, _ in self.pending}  # queued for a refill: the new trial has no frames yet
        for slot, (curve, ret) in enumerate(zip(self.curves, pl_module.member_returns(20))):
            if slot in waiting:
                self.starts[slot] = self.frames
            else:
                curve.append((self.frames - self.starts[slot], ret))
        if self.on_iteration is not None and self.on_iteration(self.frames):
            trainer.should_stop = True
