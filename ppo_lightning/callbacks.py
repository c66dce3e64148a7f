"""Callbacks that read per-iteration figures: a progress bar in frames, and a return-threshold stop."""

from __future__ import annotations

import sys

from lightning.pytorch.callbacks import ProgressBar


class FramesProgressBar(ProgressBar):
    """One tqdm bar over environment frames, updated once per iteration (not per gradient step).

    Shows frames, frames/s (tqdm's rate) and the mean return of the last 20 episodes.
    """

    def __init__(self, refresh_rate: int = 1) -> None:
        super().__init__()
        self._enabled = refresh_rate > 0
        self._bar = None
        self._shown = 0

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def on_train_start(self, trainer, pl_module) -> None:
        if not self._enabled or trainer.global_rank != 0:
            return
        from tqdm.auto import tqdm

        dm = trainer.datamodule
        total = getattr(dm, "total_frames", None)
        self._shown = getattr(dm, "frames", 0)
        self._bar = tqdm(total=total, initial=self._shown, unit="frames", unit_scale=True, dynamic_ncols=True,
                         file=sys.stdout, desc="fit")

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self._bar is None:
            return
        dm = trainer.datamodule
        self._bar.update(dm.frames - self._shown)
        self._shown = dm.frames
        ret = dm.episodes.mean_return(20)
        self._bar.set_postfix(it=dm.iteration, ret20=f"{ret:.1f}", refresh=False)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
