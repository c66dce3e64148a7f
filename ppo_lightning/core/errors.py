"""The faults that stop a command with one line and an exit code: training faults, bad checkpoints,
unwritable paths, a full disk, a broken environment. No torch here, so a command can name (and catch)
them before it imports the training stack; `ppo_lightning.core.faults` holds the guards that raise them.
"""

from __future__ import annotations


class TrainingFault(RuntimeError):
    """A fault that stops training with one line on stderr (``error: ...``) and ``exit_code``."""

    exit_code = 3
    all_ranks = False  # raised on every data-parallel rank alike: printed by one process per node


class CheckpointError(TrainingFault, ValueError):
    """A checkpoint file that does not exist, is truncated or does not load (bad input: exit code 2)."""

    exit_code = 2


class NumericalFault(TrainingFault):
    """Too many consecutive non-finite steps, or parameters that became non-finite."""


class UnwritablePath(TrainingFault):
    """A run folder, tracking store or export target that cannot be written, found before training
    (or exporting) starts (`ppo_lightning.core.storage.check_writable`): nothing was trained or written."""

    exit_code = 4


def human_bytes(n: int | None) -> str:
    """A size as the messages write it: ``1.5 GB``, ``12.0 kB``, ``512 bytes``, ``?`` when unknown."""
    if n is None:
        return "?"
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


class StorageFull(TrainingFault):
    """The disk (or a quota) filled while the run wrote something it cannot go on without (a
    checkpoint, the MLflow store, an export): one line naming what, how much it needed, the last good
    checkpoint and the command that resumes from it (`ppo_lightning.core.storage`)."""

    exit_code = 5

    def __init__(self, what: str, path, needed: int | None, free: int | None, error: str,
                 last_good=None, all_ranks: bool = False) -> None:
        self.what, self.path, self.needed, self.free, self.error = what, path, needed, free, error
        self.last_good = last_good  # the newest complete checkpoint, or None
        self.all_ranks = all_ranks
        super().__init__()

    def __str__(self) -> str:
        need = f"needs {human_bytes(self.needed)}" if self.needed is not None else "size unknown"
        free = f", {human_bytes(self.free)} free" if self.free is not None else ""
        text = f"{self.error} while writing {self.what} {self.path} ({need}{free}); nothing partial was left"
        if self.last_good is not None:
            text += f"; the last good checkpoint is {self.last_good}"
        return text


class EnvFault(TrainingFault):
    """An environment raised, hung or returned malformed data."""

    def __init__(self, env_id: str, index: int | None, what: str, iteration: int | None = None) -> None:
        self.env_id, self.index, self.what, self.iteration = env_id, index, what, iteration
        super().__init__()

    def __str__(self) -> str:
        where = [f"env index {self.index}" if self.index is not None else None,
                 f"iteration {self.iteration}" if self.iteration is not None else None]
        where = ", ".join(w for w in where if w)
        return f"environment {self.env_id!r} ({where}) {self.what}"
