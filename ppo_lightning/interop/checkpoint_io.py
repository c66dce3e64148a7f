"""The one reader of training checkpoints: a Lightning ``.ckpt`` file or an FSDP-sharded folder.

Every module that reads a checkpoint comes here; nothing else in the package calls ``torch.load``
on one (`tests/test_layout.py`). Files are read with ``torch.load(weights_only=True)`` (a pickled
payload is refused, never run): `load_file`, `read_meta` (a file, or a sharded folder's ``meta.pt``),
`read_hparams`. A Lightning FSDP-sharded checkpoint (a folder with ``.metadata``, ``*.distcp`` and
``meta.pt``) is read with ``torch.distributed.checkpoint`` and no process group, loading only the
network's tensors; its ``.metadata`` is unpickled allowing only DCP's own plain types.
`check_checkpoint_file` tells a complete checkpoint from a truncated one without unpickling it.

One error for every bad input, `UnreadableCheckpoint`, in one line, in one vocabulary: missing,
truncated or corrupt (`truncated_text`), an unsafe pickle (`unsafe_pickle_text`), not a checkpoint
of this package (`foreign_text`). (A checkpoint that records another run's folder is the run
folder's to judge: `ppo_lightning.interop.run_folder.own_tracking_state`.)

`load_network` builds the trained actor-critic of a checkpoint (``evaluate``, ``export-hf``).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from ppo_lightning.core.errors import CheckpointError
from ppo_lightning.core.members import DATA_MEMBER_SETTINGS

WEIGHTS_PREFIX = "network."
DATA_STATE_KEY = "RolloutDataModule"
SHARDED_META = "meta.pt"  # Lightning's file for the non-tensor parts of a sharded checkpoint


class ExportError(ValueError):
    """A checkpoint or folder that cannot be read, exported or loaded; the message is one line."""


class UnreadableCheckpoint(CheckpointError, ExportError):
    """A checkpoint that cannot be read: missing, truncated or corrupt, an unsafe pickle, or not a
    checkpoint of this package. One line, exit code 2, for every command (``fit`` catches it as a
    `CheckpointError`, ``evaluate`` and ``export-hf`` as an `ExportError`)."""


def one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".strip()


# weights_only unpickler messages that mean "a disallowed object", not "a damaged file" (matched in
# lower case: torch 2.13 says "Unsupported GLOBAL posix.system" or "unsupported GLOBAL", by path)
_UNSAFE_MARKERS = ("unsupported global", "unrecognized function", "can only build",
                   "can only create new object")


def unsafe_pickle_text(err: BaseException, what: str, path) -> str | None:
    """The one-line refusal of a file whose pickle names objects other than tensors and plain data
    (``torch.load(weights_only=True)`` refused it: nothing in it ran), or None if ``err`` is another
    failure (a truncated or foreign file)."""
    text = str(err)
    if not isinstance(err, pickle.UnpicklingError) or not any(m in text.lower() for m in _UNSAFE_MARKERS):
        return None
    found = re.search(r"GLOBAL (\S+)", text, flags=re.IGNORECASE)
    detail = f" (it calls {found.group(1)})" if found else ""
    return (f"refusing to load {what} {path}: an unsafe pickle{detail}, refused by torch.load(weights_only=True) and "
            "never run; a checkpoint must hold only tensors and plain data")


def truncated_text(what: str, path, err: BaseException | str) -> str:
    """The one line for a checkpoint file or folder that is incomplete or damaged."""
    return f"{what} {path} is truncated or corrupt ({err if isinstance(err, str) else one_line(err)})"


def foreign_text(path, reason: str) -> str:
    """The one line for a file that loads but is not a checkpoint of this package."""
    return f"{path} is not a ppo_lightning checkpoint: {reason}"


def load_file(path: str | os.PathLike, what: str = "checkpoint", mmap: bool = False, map_location: Any = "cpu",
              weights_only: bool = True) -> Any:
    """``torch.load`` of one checkpoint file (``weights_only`` unless a caller that trusts the file
    says otherwise; ``mmap``: tensors are mapped, not read, for a look at the hyperparameters); every
    failure an `UnreadableCheckpoint`: an unsafe pickle (refused, never run), or a truncated or foreign file."""
    path = Path(path)
    if not path.exists():
        raise UnreadableCheckpoint(f"{what} {path} does not exist")
    try:
        return torch.load(path, map_location=map_location, weights_only=weights_only, mmap=mmap)
    except pickle.UnpicklingError as err:
        refused = unsafe_pickle_text(err, what, path)
        raise UnreadableCheckpoint(refused or truncated_text(what, path, err)) from None
    except Exception as err:  # zip/EOF/runtime errors of truncated or foreign files
        raise UnreadableCheckpoint(truncated_text(what, path, err)) from None


def read_meta(path: str | os.PathLike, mmap: bool = False) -> dict[str, Any]:
    """A checkpoint's non-tensor part as a dict: the file (``mmap``: its tensors mapped, not read),
    or a sharded folder's ``meta.pt``."""
    path = Path(path)
    meta = path / SHARDED_META if path.is_dir() else path
    checkpoint = load_file(meta, "checkpoint", mmap=mmap and not path.is_dir())
    if not isinstance(checkpoint, dict):
        raise UnreadableCheckpoint(f"{meta} is not a Lightning checkpoint (not a dict)")
    return checkpoint


def read_hparams(path: str | os.PathLike, key: str = "hyper_parameters") -> dict[str, Any]:
    """A checkpoint's ``hyper_parameters`` (or ``key``: ``datamodule_hyper_parameters``), ``{}`` where it has none."""
    hparams = read_meta(path, mmap=True).get(key)
    return dict(hparams) if isinstance(hparams, dict) else {}


def check_checkpoint_file(path: str | os.PathLike) -> None:
    """Raise `UnreadableCheckpoint` (one line, naming the file) if ``path`` is not a complete checkpoint.

    Cheap: reads the zip directory (a truncated file has none) and the archive's CRCs of the small
    records, without unpickling anything. Folders (FSDP sharded checkpoints): `check_sharded_checkpoint`.
    """
    path = Path(path)
    if not path.exists():
        raise UnreadableCheckpoint(f"checkpoint {path} does not exist")
    if path.is_dir():
        check_sharded_checkpoint(path)
        return
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            if not any(n.endswith("data.pkl") for n in names):
                raise UnreadableCheckpoint(f"checkpoint {path} is not a torch.save archive (no data.pkl)")
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise UnreadableCheckpoint(truncated_text("checkpoint", path, f"{type(err).__name__}: {err}")) from None


def check_sharded_checkpoint(path: Path) -> None:
    """A sharded (FSDP2) checkpoint folder must hold ``.metadata``, a complete ``meta.pt`` and every
    shard file ``.metadata`` names, each at least as long as the records it holds."""
    if not (path / ".metadata").exists():
        raise UnreadableCheckpoint(f"checkpoint folder {path} has no .metadata (not a complete sharded checkpoint)")
    if not (path / SHARDED_META).exists():
        raise UnreadableCheckpoint(f"checkpoint folder {path} has no meta.pt (not a complete sharded checkpoint)")
    check_checkpoint_file(path / SHARDED_META)
    metadata = _read_metadata(path)
    need: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(need.items()):
        shard = path / name
        have = shard.stat().st_size if shard.exists() else None
        if have is None or have < size:
            state = "missing" if have is None else f"truncated ({have} of {size} bytes)"
            raise UnreadableCheckpoint(f"checkpoint folder {path} is incomplete: shard {name} is {state}")


def last_good_checkpoint(folder: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint (``*.ckpt`` file or sharded folder) in ``folder``, or None."""
    folder = Path(folder)
    try:
        found = [p for p in folder.glob("*.ckpt") if not p.name.startswith(".")]
        found.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return None
    for p in found:
        try:
            check_checkpoint_file(p)
        except (CheckpointError, OSError):
            continue
        return p
    return None


def _is_sharded(path: Path) -> bool:
    return path.is_dir() and (path / SHARDED_META).is_file() and (path / ".metadata").is_file()


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles a DCP ``.metadata`` file allowing only its own plain types.

    torch's ``FileSystemReader.read_metadata`` uses a bare ``pickle.load``, which would run any
    payload planted in a sharded checkpoint; this allows DCP's metadata dataclasses/enums,
    ``torch.Size``, dtypes, layouts and paths, and refuses every other global.
    """

    _MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
    _OTHERS = {
        ("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
        ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
        ("pathlib", "PureWindowsPath"), ("pathlib", "Path"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if module in self._MODULES and not name.startswith("__"):
            import importlib

            obj = getattr(importlib.import_module(module), name, None)
            # only the plain dataclasses and enums defined there (not functions, not readers/writers)
            if isinstance(obj, type) and obj.__module__ == module:
                if dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum):
                    return obj
        elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        elif (module, name) in self._OTHERS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {module}.{name} in checkpoint metadata")


def _safe_reader(path: Path):
    """A ``FileSystemReader`` whose ``read_metadata`` uses `_MetadataUnpickler` (tensors are
    already read with ``torch.load(weights_only=True)`` by torch)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
            with open(path / ".metadata", "rb") as f:
                metadata = _MetadataUnpickler(f).load()
            if not isinstance(metadata, Metadata):
                raise ValueError(f"not DCP metadata but {type(metadata).__name__}")
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeFileSystemReader(str(path))


def _read_metadata(path: Path):
    """A sharded folder's ``.metadata`` through `_MetadataUnpickler`; `UnreadableCheckpoint` in one line."""
    try:
        return _safe_reader(path).read_metadata()
    except pickle.UnpicklingError as err:
        if "unsupported global" in str(err).lower():
            raise UnreadableCheckpoint(
                f"refusing to load sharded checkpoint {path}: its .metadata is an unsafe pickle (it calls "
                f"{str(err).split('GLOBAL ')[-1].split()[0]}), refused and never run"
            ) from None
        raise UnreadableCheckpoint(truncated_text("sharded checkpoint", path, f".metadata: {one_line(err)}")) from None
    except Exception as err:  # noqa: BLE001 - any unreadable .metadata: one line
        raise UnreadableCheckpoint(truncated_text("sharded checkpoint", path, f".metadata: {one_line(err)}")) from None


def _read_sharded(path: Path) -> dict[str, Any]:
    """A Lightning sharded checkpoint: ``meta.pt`` plus the network's tensors, no process group.

    Only the ``state_dict`` entries under ``network.`` are read (optimizer shards are not), and
    only as tensors (``weights_only`` loads); ``meta.pt`` is read with ``weights_only=True`` and
    ``.metadata`` with `_MetadataUnpickler`, so no payload in the folder can run.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    checkpoint = read_meta(path)
    metadata = _read_metadata(path)
    # Lightning saves {"state_dict": {...}, "optimizer_0": ...}; DCP flattens it and keeps the
    # original key paths in planner_data.
    paths = metadata.planner_data or {}
    wanted: dict[str, torch.Tensor] = {}
    for flat_key, meta in metadata.state_dict_metadata.items():
        key_path = paths.get(flat_key, tuple(flat_key.split(".", 1)))
        if len(key_path) != 2 or key_path[0] != "state_dict" or not str(key_path[1]).startswith(WEIGHTS_PREFIX):
            continue
        if not isinstance(meta, TensorStorageMetadata):
            continue
        wanted[str(key_path[1])] = torch.empty(meta.size, dtype=meta.properties.dtype)
    if wanted:
        state = {"state_dict": wanted}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "no process group, loading in no_dist mode"
                dcp.load(state, storage_reader=_safe_reader(path), no_dist=True)
        except (Exception, CheckpointException) as err:  # CheckpointException is a BaseException
            failures = list(getattr(err, "failures", {}).values())
            cause = failures[0][0] if failures else err
            raise UnreadableCheckpoint(truncated_text("sharded checkpoint", path, f"shards: {one_line(cause)}")) from None
        wanted = state["state_dict"]
    checkpoint["state_dict"] = wanted
    return checkpoint


def read_checkpoint(ckpt: str | os.PathLike, seed_index: int | None = None) -> dict[str, Any]:
    """Load a ``.ckpt`` file or a sharded checkpoint folder and check that it is one of ours.

    Returns the checkpoint dict, with ``state_dict`` holding (at least) the ``network.`` weights.
    A vectorized seed group's checkpoint needs ``seed_index``: seed k's part then reads as the
    checkpoint of a single run (`select_seed`).
    """
    path = Path(ckpt)
    if not path.exists():
        raise UnreadableCheckpoint(f"checkpoint {path} does not exist")
    if path.is_dir():
        if not _is_sharded(path):
            raise UnreadableCheckpoint(
                f"{path} is a folder but not a sharded Lightning checkpoint (no {SHARDED_META} and .metadata)"
            )
        checkpoint = _read_sharded(path)
    else:
        checkpoint = load_file(path, "checkpoint")
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise UnreadableCheckpoint(f"{path} is not a Lightning checkpoint (no state_dict)")
    if not any(str(k).startswith(WEIGHTS_PREFIX) for k in checkpoint["state_dict"]):
        raise UnreadableCheckpoint(foreign_text(path, f"no '{WEIGHTS_PREFIX}' weights in its state_dict"))
    hparams = checkpoint.get("hyper_parameters")
    missing = [k for k in ("observation_space", "action_space") if not isinstance(hparams, dict) or not hparams.get(k)]
    if missing:
        raise UnreadableCheckpoint(foreign_text(path, f"hyper_parameters lack {', '.join(missing)}"))
    return select_seed(checkpoint, seed_index, str(path))


def select_seed(checkpoint: dict[str, Any], seed_index: int | None, where: str = "the checkpoint") -> dict[str, Any]:
    """Seed ``seed_index`` of a vectorized seed group's checkpoint as a single run's: its weights
    (``network.inner.X[k]`` -> ``network.X``), ``seeds`` of one, its own hyperparameters where the
    group's members have them (``member_hparams``), and its episode window for the model card. A single run's checkpoint passes unchanged (``seed_index`` None or 0)."""
    hparams = checkpoint["hyper_parameters"]
    seeds = list(hparams.get("seeds") or [])
    if len(seeds) <= 1:
        if seed_index not in (None, 0):
            raise ExportError(f"--seed_index {seed_index}: {where} is a single run, not a seed group")
        return checkpoint
    if seed_index is None:
        raise ExportError(f"{where} holds a vectorized group of {len(seeds)} seeds {seeds}: choose one with "
                          f"--seed_index K (0..{len(seeds) - 1})")
    if not (isinstance(seed_index, int) and 0 <= seed_index < len(seeds)):
        raise ExportError(f"--seed_index must lie in 0..{len(seeds) - 1} for {where} (seeds {seeds}), got {seed_index!r}")
    # start-up cost: `import ppo_lightning` imports this module; the seed stack pulls the networks
    from ppo_lightning.nets.seed_stack import unstack_state_dict

    out = dict(checkpoint)
    out["state_dict"] = unstack_state_dict(checkpoint["state_dict"], seed_index, WEIGHTS_PREFIX)
    out["hyper_parameters"] = {**hparams, "seeds": [seeds[seed_index]]}
    members = hparams.get("member_hparams")
    if members:  # a member with its own settings: the single run's hyperparameters (model card, evaluation)
        own = {name: values[seed_index] for name, values in members.items()}
        data_names = DATA_MEMBER_SETTINGS  # the data side's
        model_own = {k: v for k, v in own.items() if k not in data_names}
        if "proximal_com" in own and own["proximal_com"] is None:
            model_own["decoupled"] = False  # the behavior policy as anchor: PPO
        out["hyper_parameters"].update({**model_own, "member_hparams": None})
        dm = checkpoint.get("datamodule_hyper_parameters")
        if dm is not None:
            out["datamodule_hyper_parameters"] = {**dm, "member_hparams": None, "member_seeds": None, "num_seeds": 1,
                                                  "seed": seeds[seed_index],
                                                  **{k: v for k, v in own.items() if k in data_names}}
    data = checkpoint.get(DATA_STATE_KEY)
    try:
        group = data["per_rank"][0]["resume"]["seed_group"]["seeds"][seed_index]
        out[DATA_STATE_KEY] = {**data, "episodes": group["episodes"], "seed": seeds[seed_index]}
    except (KeyError, IndexError, TypeError):
        pass
    return out


def network_state_dict(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The actor-critic's weights: ``state_dict`` entries under ``network.``, prefix stripped."""
    return {
        k[len(WEIGHTS_PREFIX) :]: v.detach().cpu()
        for k, v in checkpoint["state_dict"].items()
        if k.startswith(WEIGHTS_PREFIX) and isinstance(v, torch.Tensor)
    }


def build_network_or_fail(observation_space: dict, action_space: dict, network_cfg: dict, where: str) -> torch.nn.Module:
    """``models.build_network``, its failure an `ExportError` naming ``where``."""
    # start-up cost: `import ppo_lightning` imports this module and must not pull tensordict and every
    # network (seconds); only building a network needs them
    from ppo_lightning.nets.models import build_network

    try:
        return build_network(observation_space, action_space, network_cfg)
    except Exception as err:
        raise ExportError(f"{where}: cannot build its network {network_cfg!r} ({one_line(err)})") from None


def load_network(ckpt: str | os.PathLike, seed_index: int | None = None) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The trained actor-critic of a checkpoint (eval mode, float32) and the checkpoint dict
    (seed ``seed_index`` of a seed group's)."""
    checkpoint = read_checkpoint(ckpt, seed_index)
    hparams = checkpoint["hyper_parameters"]
    net = build_network_or_fail(
        hparams["observation_space"], hparams["action_space"], hparams.get("network") or {"name": "mlp"}, str(ckpt)
    )
    try:
        net.load_state_dict(network_state_dict(checkpoint), strict=True)
    except RuntimeError as err:
        raise ExportError(
            f"{ckpt}: its network weights do not match the architecture in its hyperparameters ({one_line(err)})"
        ) from None
    return net.eval(), checkpoint


def is_checkpoint(path: str | os.PathLike) -> bool:
    """A ``.ckpt``-like file or a sharded checkpoint folder (not an exported Hugging Face folder)."""
    p = Path(path)
    return p.is_file() or _is_sharded(p)
