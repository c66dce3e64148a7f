"""FSDP2 sharded checkpoints that are never half-written.

Lightning's ``ModelParallelStrategy.save_checkpoint`` writes a sharded checkpoint (a folder:
``*.distcp`` shards and ``.metadata`` from ``torch.distributed.checkpoint``, ``meta.pt`` with the rest)
*into* the target folder, over the previous checkpoint of the same name: a kill during the write
leaves ``last.ckpt`` a mix of two checkpoints, or without its ``meta.pt``. `AtomicModelParallelStrategy`
writes the folder next to the target (``.<name>.tmp``), fsyncs it, and swaps it in
(`ppo_lightning.core.storage.replace_folder`: one ``renameat2(RENAME_EXCHANGE)`` on Linux, both paths
existing throughout, then the old folder removed; where the exchange is not supported, two renames,
the window between them the only moment without a ``last.ckpt``). The ``ppo-lightning fit`` CLI uses it in place of
``lightning.pytorch.strategies.ModelParallelStrategy``.

A truncated or incomplete sharded checkpoint is refused in one line before anything loads
(`ppo_lightning.interop.checkpoint_io.check_checkpoint_file`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.checkpoint.api import CheckpointException

from ppo_lightning.core.errors import StorageFull
from ppo_lightning.core.storage import (free_bytes, fsync_tree, out_of_space, replace_folder, space_error_text,
                                        tree_bytes)
from ppo_lightning.interop.checkpoint_io import last_good_checkpoint
from ppo_lightning.training.checkpointing import TMP_SUFFIX

def _checkpoint_bytes(obj) -> int:
    """Bytes of the tensors in a checkpoint (a sharded tensor counts whole: what all ranks write)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_checkpoint_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_checkpoint_bytes(v) for v in obj)
    return 0


class AtomicModelParallelStrategy(ModelParallelStrategy):
    """`ModelParallelStrategy` (FSDP2 / tensor parallelism) whose sharded checkpoints are written to a
    temporary folder and swapped in complete (see the module docstring)."""

    def __init__(self, *args, save_distributed_checkpoint: bool = True, **kwargs) -> None:
        super().__init__(*args, save_distributed_checkpoint=save_distributed_checkpoint, **kwargs)
        self.sharded_checkpoints = save_distributed_checkpoint

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Any | None = None) -> None:
        if not self.sharded_checkpoints or storage_options is not None:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        path = Path(self.broadcast(filepath))
        tmp = path.parent / f".{path.name}{TMP_SUFFIX}"  # the same on every rank
        if self.global_rank == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            if tmp.exists():  # left by a writer that was killed
                shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
        self.barrier("sharded_checkpoint_start")
        failure = None
        try:
            super().save_checkpoint(checkpoint, tmp)  # shards (every rank), .metadata, meta.pt (rank 0)
            fsync_tree(tmp)  # each rank its own files (rank 0 also .metadata and meta.pt)
        except (Exception, CheckpointException) as err:  # noqa: BLE001 - every rank learns of it below, none is left waiting
            failure = err  # (torch.distributed.checkpoint's own error, a BaseException, names the ranks that failed)
        if self.reduce_boolean_decision(failure is not None, all=False):
            self._failed_write(checkpoint, tmp, path, failure)
        self.barrier("sharded_checkpoint_written")
        if self.global_rank == 0:
            replace_folder(tmp, path)
        self.barrier("sharded_checkpoint_done")

    def _failed_write(self, checkpoint: dict[str, Any], tmp: Path, path: Path, failure: BaseException | None) -> None:
        """A rank could not write its part: the temporary folder goes, the previous checkpoint stays,
        and every rank raises the same error (`StorageFull` for a full disk)."""
        full = self.reduce_boolean_decision(failure is not None and out_of_space(failure), all=False)
        if self.global_rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        self.barrier("sharded_checkpoint_failed")
        if full:
            last_good = last_good_checkpoint(path.parent)
            # what it needs: the last good folder's size (the same model, optimizer and data state), or
            # else the checkpoint's tensors (the shards alone; an estimate from below)
            needed = tree_bytes(last_good) if last_good is not None else _checkpoint_bytes(checkpoint)
            raise StorageFull("sharded checkpoint", path, needed, free_bytes(path.parent),
                              space_error_text(failure) if failure is not None else "no space left on device",
                              last_good, all_ranks=True)
        raise failure if failure is not None else RuntimeError(f"another rank could not write {path}")
