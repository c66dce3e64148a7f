"""Checkpoint files that survive a kill: atomic writes, and a clear error for a file that does not load.

Why a `CheckpointIO` plugin (and not a `ModelCheckpoint` subclass): every checkpoint Lightning
writes or reads goes through the strategy's ``checkpoint_io`` (the periodic and the ``last.ckpt``
saves of `ModelCheckpoint`, ``trainer.save_checkpoint``, the resume of ``fit(ckpt_path=...)``), so one
plugin makes all writes atomic and all reads explain themselves, whatever callback asked.

Lightning's own ``TorchCheckpointIO`` writes through an fsspec transaction, which on a local disk
writes a temporary file in the system temp folder and ``shutil.move``s it: a copy, not a rename,
when /tmp is another file system, and never an ``fsync``. `AtomicCheckpointIO` writes a temporary
file next to the target, fsyncs it, ``os.replace``s it over the target (atomic on POSIX) and fsyncs
the folder, so the target is always either the previous complete checkpoint or the new one.

FSDP2's sharded checkpoints (folders written by ``torch.distributed.checkpoint``) do not go through
this plugin: `ppo_lightning.training.sharded` writes them atomically. Reading is
`ppo_lightning.interop.checkpoint_io`'s (`check_checkpoint_file` refuses incomplete files and folders).

Under data parallelism a save is collective: Lightning's ``Trainer.save_checkpoint`` has rank 0 write
(DDP) and then every rank wait at a barrier, so a rank 0 that fails (a full disk) leaves the others
waiting for a peer that is gone (a hang, or a gloo traceback when its socket closes).
`save_checkpoint_on_all_ranks` (the ``ppo-lightning fit`` trainer's ``save_checkpoint``) has the ranks
agree on the outcome first: a write that failed on one rank raises on every rank (`StorageFull` for a
full disk, printed once per node, exit code 5).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ppo_lightning.core.errors import StorageFull, TrainingFault
from ppo_lightning.interop.checkpoint_io import check_checkpoint_file, last_good_checkpoint, load_file
from ppo_lightning.core.storage import atomic_replace, counted_bytes, free_bytes, out_of_space, space_error_text

TMP_SUFFIX = ".tmp"


def _is_local(path) -> bool:
    return "://" not in str(path) or str(path).startswith("file://")


def atomic_torch_save(obj: Any, path: str | os.PathLike, what: str = "checkpoint") -> None:
    """``torch.save`` to ``path`` atomically: temp file in the same folder, fsync, ``os.replace``.

    Temporary files left by a killed writer of the same target (``.<name>.*.tmp``) are removed first.
    A full disk (or quota) removes the temp file and raises `StorageFull` naming the bytes the
    checkpoint needed and the newest complete checkpoint of the folder (`last_good_checkpoint`).
    """
    path = Path(path)
    try:
        for stale in path.parent.glob(f".{path.name}.*{TMP_SUFFIX}"):
            stale.unlink(missing_ok=True)
        atomic_replace(path, lambda f: torch.save(obj, f), TMP_SUFFIX)
    except BaseException as err:
        if isinstance(err, Exception) and out_of_space(err):
            raise StorageFull(what, path, counted_bytes(lambda f: torch.save(obj, f)), free_bytes(path.parent),
                              space_error_text(err), last_good_checkpoint(path.parent)) from None
        raise


def save_checkpoint_on_all_ranks(trainer, filepath, weights_only: bool | None = None,
                                 storage_options: Any | None = None) -> None:
    """``Trainer.save_checkpoint`` whose ranks agree on a failed write before its closing barrier.

    The strategy's write (``strategy.save_checkpoint``, which ``Trainer.save_checkpoint`` calls
    between dumping the checkpoint and the barrier) is wrapped for this call: every rank takes part
    in one all-reduce (did a rank fail?) and, only after a failure, a second (was it a full disk?);
    then each rank raises before the barrier: the rank that failed its own error, the others a
    `StorageFull` for the same checkpoint (or a `TrainingFault` saying that another rank could not
    write it). Both marked ``all_ranks``: one line per node. One process: Lightning's own method."""
    import lightning.pytorch as pl

    strategy = trainer.strategy
    if trainer.world_size == 1 or trainer.model is None:
        return pl.Trainer.save_checkpoint(trainer, filepath, weights_only, storage_options)
    own = "save_checkpoint" in vars(strategy)
    write = strategy.save_checkpoint

    def agreed_write(checkpoint, path, storage_options=None) -> None:
        _write_on_all_ranks(strategy, write, checkpoint, path, storage_options)

    strategy.save_checkpoint = agreed_write
    try:
        pl.Trainer.save_checkpoint(trainer, filepath, weights_only, storage_options)
    finally:
        if own:
            strategy.save_checkpoint = write
        else:
            del strategy.save_checkpoint  # the strategy's class method again


def _write_on_all_ranks(strategy, write, checkpoint, filepath, storage_options) -> None:
    """``write(checkpoint, filepath)`` on every rank, then each rank raises if any failed (see
    `save_checkpoint_on_all_ranks`)."""
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: not caught as Exception

    failure: BaseException | None = None
    try:
        write(checkpoint, filepath, storage_options=storage_options)
    except (Exception, CheckpointException) as err:  # noqa: BLE001 - every rank learns of it below
        failure = err
    if not strategy.reduce_boolean_decision(failure is not None, all=False):
        return
    full = strategy.reduce_boolean_decision(failure is not None and out_of_space(failure), all=False)
    if isinstance(failure, TrainingFault):
        failure.all_ranks = True
        raise failure
    path = Path(str(filepath))
    if full:
        if failure is not None:  # a write that is not ours (storage_options, a remote path): same line
            raise StorageFull("checkpoint", path, None, free_bytes(path.parent), space_error_text(failure),
                              last_good_checkpoint(path.parent), all_ranks=True) from None
        raise StorageFull("checkpoint", path, None, free_bytes(path.parent), "no space left on device",
                          last_good_checkpoint(path.parent), all_ranks=True)
    if failure is not None:
        raise failure
    fault = TrainingFault(f"another rank could not write checkpoint {path} (that rank printed why)")
    fault.all_ranks = True
    raise fault


def _atomic_checkpoint_io_class():
    from lightning.fabric.plugins import TorchCheckpointIO

    class AtomicCheckpointIO(TorchCheckpointIO):
        """`TorchCheckpointIO` with atomic local writes and one-line errors for unreadable files."""

        def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
            if storage_options is not None or not _is_local(path):
                return super().save_checkpoint(checkpoint, path, storage_options)
            atomic_torch_save(checkpoint, str(path).removeprefix("file://"))

        def load_checkpoint(self, path, map_location: Any | None = None, weights_only: bool | None = None) -> dict[str, Any]:
            if not _is_local(path):
                return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
            local = str(path).removeprefix("file://")
            check_checkpoint_file(local)
            return load_file(local, map_location=map_location, weights_only=weights_only is not False)

    AtomicCheckpointIO.__module__ = __name__
    return AtomicCheckpointIO


def __getattr__(name: str):
    # Built on first use, so that `atomic_torch_save` imports without Lightning (killed-writer tests).
    if name == "AtomicCheckpointIO":
        cls = globals()["AtomicCheckpointIO"] = _atomic_checkpoint_io_class()
        return cls
    raise AttributeError(name)
