"""Checkpoints to Hugging Face folders and back: ``ppo-lightning export-hf CKPT OUT_DIR``.

An exported folder holds

- ``config.json``: ``model_type`` ``ppo_lightning_actor_critic``, the network hyperparameters
  (``network``, defaults filled in), ``observation_space``, ``action_space``, ``torch_dtype``, the
  algorithm's hyperparameters, the environment (the data module's hyperparameters), training frames
  and iterations, the last episodes' mean return, and ``auto_map`` for transformers;
- ``model.safetensors`` (or ``model-0000N-of-0000M.safetensors`` + ``model.safetensors.index.json``
  above ``max_shard_size``), written by ``huggingface_hub.save_torch_state_dict``: the actor-critic's
  weights only (the ``network.`` entries of the checkpoint's state dict, prefix stripped). The
  proximal (EWMA) copy, optimizer state and normalizer statistics are not model weights and stay out;
- ``configuration_ppo_lightning.py`` / ``modeling_ppo_lightning.py`` for
  ``AutoModel.from_pretrained(folder, trust_remote_code=True)``; the modeling file builds the network
  with ``ppo_lightning.models.build_network`` (one definition of every architecture), so it needs
  ``ppo_lightning`` installed;
- ``README.md``, a model card.

`load_pretrained` reads a folder back without transformers and without pickle;
`load_pretrained_weights` is what ``PPOLightningModule(init_from=folder)`` uses.

Checkpoints are read with ``torch.load(weights_only=True)`` (a pickled payload is refused, never
run). A Lightning FSDP-sharded checkpoint (a folder with ``.metadata``, ``*.distcp`` and
``meta.pt``) is read with ``torch.distributed.checkpoint`` and no process group, loading only the
network's tensors. Every bad input raises `ExportError` with a one-line message, before anything is
written; the folder is written beside ``out_dir`` under a temporary name, then renamed.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import inspect
import json
import math
import os
import pickle
import re
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

MODEL_TYPE = "ppo_lightning_actor_critic"
FORMAT_VERSION = 1
WEIGHTS_PREFIX = "network."
DATA_STATE_KEY = "RolloutDataModule"
SHARDED_META = "meta.pt"  # Lightning's file for the non-tensor parts of a sharded checkpoint
HF_FILES = ("configuration_ppo_lightning.py", "modeling_ppo_lightning.py")
AUTO_MAP = {
    "AutoConfig": "configuration_ppo_lightning.PPOLightningConfig",
    "AutoModel": "modeling_ppo_lightning.PPOLightningActorCritic",
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ExportError(ValueError):
    """A checkpoint or folder that cannot be exported or loaded; the message is one line."""


# ---------------------------------------------------------------------------------------- reading
def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".strip()


# weights_only unpickler messages that mean "a disallowed object", not "a damaged file"
_UNSAFE_MARKERS = ("Unsupported global", "unrecognized function", "Can only build", "Can only create new object")


def _safe_torch_load(path: Path, what: str) -> Any:
    """``torch.load(weights_only=True)``, every failure an `ExportError`."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        text = str(err)
        if any(marker in text for marker in _UNSAFE_MARKERS):
            found = re.search(r"GLOBAL (\S+)", text)
            detail = f" ({found.group(1)})" if found else ""
            raise ExportError(
                f"refusing to load {what} {path}: it holds pickled objects{detail} other than tensors and "
                "plain containers (read with torch.load(weights_only=True); nothing was executed)"
            ) from None
        raise ExportError(f"cannot read {what} {path}: corrupt or truncated ({_one_line(err)})") from None
    except Exception as err:  # zip/EOF/runtime errors of truncated or foreign files
        raise ExportError(f"cannot read {what} {path}: corrupt or truncated ({_one_line(err)})") from None


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


def _read_sharded(path: Path) -> dict[str, Any]:
    """A Lightning sharded checkpoint: ``meta.pt`` plus the network's tensors, no process group.

    Only the ``state_dict`` entries under ``network.`` are read (optimizer shards are not), and
    only as tensors (``weights_only`` loads); ``meta.pt`` is read with ``weights_only=True`` and
    ``.metadata`` with `_MetadataUnpickler`, so no payload in the folder can run.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    checkpoint = _safe_torch_load(path / SHARDED_META, "sharded checkpoint metadata")
    if not isinstance(checkpoint, dict):
        raise ExportError(f"{path / SHARDED_META} is not a Lightning checkpoint (not a dict)")
    try:
        metadata = _safe_reader(path).read_metadata()
    except pickle.UnpicklingError as err:
        if "Unsupported global" in str(err):
            raise ExportError(
                f"refusing to load sharded checkpoint {path}: its .metadata holds pickled objects "
                f"({str(err).split('GLOBAL ')[-1].split()[0]}) other than checkpoint metadata; nothing was executed"
            ) from None
        raise ExportError(f"cannot read sharded checkpoint {path}: corrupt .metadata ({_one_line(err)})") from None
    except Exception as err:
        raise ExportError(f"cannot read sharded checkpoint {path}: corrupt .metadata ({_one_line(err)})") from None
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
            raise ExportError(f"cannot read sharded checkpoint {path}: corrupt shards ({_one_line(cause)})") from None
        wanted = state["state_dict"]
    checkpoint["state_dict"] = wanted
    return checkpoint


def read_checkpoint(ckpt: str | os.PathLike) -> dict[str, Any]:
    """Load a ``.ckpt`` file or a sharded checkpoint folder and check that it is one of ours.

    Returns the checkpoint dict, with ``state_dict`` holding (at least) the ``network.`` weights.
    """
    path = Path(ckpt)
    if not path.exists():
        raise ExportError(f"checkpoint not found: {path}")
    if path.is_dir():
        if not _is_sharded(path):
            raise ExportError(
                f"{path} is a folder but not a sharded Lightning checkpoint (no {SHARDED_META} and .metadata)"
            )
        checkpoint = _read_sharded(path)
    else:
        checkpoint = _safe_torch_load(path, "checkpoint")
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise ExportError(f"{path} is not a Lightning checkpoint (no state_dict)")
    if not any(str(k).startswith(WEIGHTS_PREFIX) for k in checkpoint["state_dict"]):
        raise ExportError(f"{path} is not a ppo_lightning checkpoint: no '{WEIGHTS_PREFIX}' weights in its state_dict")
    hparams = checkpoint.get("hyper_parameters")
    missing = [k for k in ("observation_space", "action_space") if not isinstance(hparams, dict) or not hparams.get(k)]
    if missing:
        raise ExportError(f"{path} is not a ppo_lightning checkpoint: hyper_parameters lack {', '.join(missing)}")
    return checkpoint


def network_state_dict(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The actor-critic's weights: ``state_dict`` entries under ``network.``, prefix stripped."""
    return {
        k[len(WEIGHTS_PREFIX) :]: v.detach().cpu()
        for k, v in checkpoint["state_dict"].items()
        if k.startswith(WEIGHTS_PREFIX) and isinstance(v, torch.Tensor)
    }


# ---------------------------------------------------------------------------------------- config
def _plain(value: Any) -> Any:
    """JSON-safe copy: tuples to lists, tensors/numbers to Python numbers, NaN to None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _resolved_network(net: torch.nn.Module, network_cfg: dict[str, Any]) -> dict[str, Any]:
    """``network_cfg`` with the network class's defaults filled in (informative, JSON-safe)."""
    out = dict(network_cfg)
    out.setdefault("name", "mlp")
    try:
        params = inspect.signature(type(net).__init__).parameters
    except (TypeError, ValueError):
        return _plain(out)
    for name, p in params.items():
        if name in ("self", "observation_space", "action_space") or name in out:
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is inspect.Parameter.empty:
            continue
        if p.default is None or isinstance(p.default, (bool, int, float, str, tuple, list)):
            out[name] = p.default
    return _plain(out)


def _build(observation_space: dict, action_space: dict, network_cfg: dict, where: str) -> torch.nn.Module:
    from ppo_lightning.models import build_network

    try:
        return build_network(observation_space, action_space, network_cfg)
    except Exception as err:
        raise ExportError(f"{where}: cannot build its network {network_cfg!r} ({_one_line(err)})") from None


def _mean_return(data_state: dict | None, last: int = 20) -> float | None:
    try:
        returns = list(data_state["episodes"]["returns"])[-last:]
    except (KeyError, TypeError):
        return None
    return float(sum(returns) / len(returns)) if returns else None


def _find_test_return(checkpoint: dict[str, Any]) -> float | None:
    """A final test/eval return, if some callback stored one (keys like ``test_return``)."""
    for state in (checkpoint.get("callbacks") or {}).values():
        if not isinstance(state, dict):
            continue
        for key in ("test_return", "test_return_mean", "eval_return", "eval_return_mean"):
            value = state.get(key)
            if isinstance(value, (int, float, torch.Tensor)):
                return float(value)
    return None


def build_config(checkpoint: dict[str, Any], net: torch.nn.Module, dtype: str) -> dict[str, Any]:
    hparams = dict(checkpoint["hyper_parameters"])
    data_state = checkpoint.get(DATA_STATE_KEY)
    data_state = data_state if isinstance(data_state, dict) else None
    algorithm = {k: v for k, v in hparams.items() if k not in ("observation_space", "action_space", "network", "init_from")}
    frames = data_state.get("frames") if data_state else None
    try:
        from importlib.metadata import version

        pkg_version = version("ppo-lightning")
    except Exception:
        pkg_version = None
    return _plain(
        {
            "model_type": MODEL_TYPE,
            "architectures": ["PPOLightningActorCritic"],
            "auto_map": AUTO_MAP,
            "format_version": FORMAT_VERSION,
            "network": _resolved_network(net, hparams.get("network") or {"name": "mlp"}),
            "observation_space": hparams["observation_space"],
            "action_space": hparams["action_space"],
            "torch_dtype": dtype,
            "algorithm": algorithm,
            "environment": checkpoint.get("datamodule_hyper_parameters"),
            "training": {
                "frames": None if frames is None else int(frames),
                "iterations": data_state.get("iteration") if data_state else None,
                "global_step": checkpoint.get("global_step"),
                "episodes": (data_state.get("episodes") or {}).get("count") if data_state else None,
                "final_train_return_mean20": _mean_return(data_state),
                "final_test_return": _find_test_return(checkpoint),
            },
            "training_frames": None if frames is None else int(frames),
            "ppo_lightning_version": pkg_version,
        }
    )


def _model_card(config: dict[str, Any], num_params: int) -> str:
    algo = config.get("algorithm") or {}
    env = config.get("environment") or {}
    training = config.get("training") or {}
    if algo.get("decoupled") and algo.get("proximal_com") is not None:
        name = f"PPO-EWMA (decoupled PPO, proximal policy an EWMA of the weights, center of mass {algo['proximal_com']})"
    elif algo.get("decoupled"):
        name = "decoupled PPO"
    else:
        name = "PPO"
    objective = algo.get("objective", "clip")
    env_id = env.get("env_id", "unknown")

    def fmt(v: Any) -> str:
        return "unknown" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))

    rows = "\n".join(f"| `{k}` | `{json.dumps(v)}` |" for k, v in algo.items())
    env_rows = "\n".join(f"| `{k}` | `{json.dumps(v)}` |" for k, v in env.items())
    return f"""---
library_name: ppo_lightning
tags:
- reinforcement-learning
- ppo
- {env_id}
---

# {env_id} actor-critic trained with ppo_lightning

- Algorithm: {name}, `{objective}` objective.
- Network: `{json.dumps(config['network'])}`, {num_params:,} parameters, stored as `{config['torch_dtype']}`.
- Observation space: `{json.dumps(config['observation_space'])}`; action space: `{json.dumps(config['action_space'])}`.
- Environment: `{env_id}`.
- Training frames: {fmt(training.get('frames'))}; iterations: {fmt(training.get('iterations'))}; gradient steps: {fmt(training.get('global_step'))}.
- Final train return (mean of the last 20 episodes): {fmt(training.get('final_train_return_mean20'))}.
- Final test return: {fmt(training.get('final_test_return'))}.

## Loading

Without transformers (safetensors only, no pickle):

```python
from ppo_lightning import load_pretrained
net = load_pretrained("path/to/this/folder")   # the plain actor-critic nn.Module
*dist_params, value = net(observation)          # logits (discrete) or loc, scale; and the value
```

With transformers (the modeling file builds the network with `ppo_lightning`, which must be installed):

```python
from transformers import AutoModel
model = AutoModel.from_pretrained("path/to/this/folder", trust_remote_code=True)
action = model.act(observation)                # model.distribution(obs), model.value(obs), model(obs)
```

To continue training from these weights: `PPOLightningModule(..., init_from="path/to/this/folder")`.

The weights are the policy-and-value network only: the proximal (EWMA) copy, optimizer state and
normalizer statistics of the checkpoint are not included.

## Algorithm hyperparameters

| name | value |
|---|---|
{rows}

## Environment and rollout configuration

| name | value |
|---|---|
{env_rows}
"""


# ---------------------------------------------------------------------------------------- export
def _check_out_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"output path exists and is not a folder: {out}")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"output folder {out} exists and is not empty (pass --overwrite to replace it)")


def _parse_dtype(dtype: str | torch.dtype) -> tuple[str, torch.dtype]:
    if isinstance(dtype, torch.dtype):
        names = {v: k for k, v in DTYPES.items()}
        if dtype not in names:
            raise ExportError(f"dtype must be one of {sorted(DTYPES)}, got {dtype}")
        return names[dtype], dtype
    if dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return dtype, DTYPES[dtype]


def export_hf(
    ckpt: str | os.PathLike,
    out_dir: str | os.PathLike,
    max_shard_size: int | str = "2GB",
    dtype: str = "float32",
    overwrite: bool = False,
) -> Path:
    """Export a checkpoint (``.ckpt`` file or sharded folder) to a Hugging Face folder; returns it."""
    from huggingface_hub import save_torch_state_dict
    from huggingface_hub.serialization._base import parse_size_to_int

    out = Path(out_dir)
    dtype_name, torch_dtype = _parse_dtype(dtype)
    if isinstance(max_shard_size, str):
        try:
            parse_size_to_int(max_shard_size)
        except ValueError as err:
            raise ExportError(f"invalid max_shard_size {max_shard_size!r} ({err})") from None
    elif not isinstance(max_shard_size, int) or max_shard_size <= 0:
        raise ExportError(f"max_shard_size must be a positive number of bytes or a size like '2GB', got {max_shard_size!r}")
    _check_out_dir(out, overwrite)

    checkpoint = read_checkpoint(ckpt)
    hparams = checkpoint["hyper_parameters"]
    weights = network_state_dict(checkpoint)
    net = _build(hparams["observation_space"], hparams["action_space"], hparams.get("network") or {"name": "mlp"}, str(ckpt))
    try:
        net.load_state_dict(weights, strict=True)
    except RuntimeError as err:
        raise ExportError(
            f"{ckpt}: its network weights do not match the architecture in its hyperparameters ({_one_line(err)})"
        ) from None
    weights = {
        k: (v.to(torch_dtype) if v.is_floating_point() else v).contiguous() for k, v in net.state_dict().items()
    }
    config = build_config(checkpoint, net, dtype_name)
    config["dtype"] = dtype_name  # transformers >= 5 name of torch_dtype
    num_params = sum(p.numel() for p in net.parameters())

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        save_torch_state_dict(weights, tmp, max_shard_size=max_shard_size, metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        src = Path(__file__).parent / "hf"
        for name in HF_FILES:
            shutil.copyfile(src / name, tmp / name)
        (tmp / "README.md").write_text(_model_card(config, num_params))
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _replace_dir(tmp: Path, out: Path) -> None:
    """Move ``tmp`` to ``out``; an existing ``out`` is moved aside first and removed after."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.rename(out, old / out.name)
    try:
        os.rename(tmp, out)
    except BaseException:
        if old is not None:
            os.rename(old / out.name, out)
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------------- loading
def read_pretrained_config(path: str | os.PathLike) -> dict[str, Any]:
    """``config.json`` of an exported folder, checked to be ours."""
    folder = Path(path)
    cfg_file = folder / "config.json"
    if not folder.is_dir():
        raise ExportError(f"pretrained folder not found: {folder}")
    if not cfg_file.is_file():
        raise ExportError(f"{folder} is not an exported ppo_lightning folder (no config.json)")
    try:
        config = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ExportError(f"{cfg_file} is not valid JSON ({_one_line(err)})") from None
    if not isinstance(config, dict) or config.get("model_type") != MODEL_TYPE:
        got = config.get("model_type") if isinstance(config, dict) else None
        raise ExportError(f"{folder} is not a ppo_lightning model (model_type {got!r}, expected {MODEL_TYPE!r})")
    for key in ("observation_space", "action_space", "network"):
        if not isinstance(config.get(key), dict):
            raise ExportError(f"{cfg_file} lacks {key}")
    return config


def _load_weights_into(net: torch.nn.Module, folder: Path) -> None:
    from huggingface_hub import load_torch_model

    try:
        load_torch_model(net, folder, strict=True, safe=True)
    except (FileNotFoundError, ValueError) as err:
        raise ExportError(f"cannot load the weights in {folder} ({_one_line(err)})") from None
    except RuntimeError as err:
        raise ExportError(f"the weights in {folder} do not match its config.json ({_one_line(err)})") from None


def load_pretrained(path: str | os.PathLike, dtype: str | torch.dtype | None = "float32") -> torch.nn.Module:
    """The actor-critic of an exported folder, in eval mode, without transformers or pickle.

    ``dtype``: the parameters' dtype (default float32, which the networks' float32 observations
    need); ``"auto"`` or None keeps the stored ``torch_dtype``.
    """
    folder = Path(path)
    config = read_pretrained_config(folder)
    net = _build(config["observation_space"], config["action_space"], config["network"], str(folder))
    if dtype in (None, "auto"):
        dtype = config.get("torch_dtype") or "float32"
    net.to(_parse_dtype(dtype)[1])
    _load_weights_into(net, folder)
    return net.eval()


def _structure(net: torch.nn.Module) -> tuple[list, dict]:
    modules = [(name, type(m).__name__) for name, m in net.named_modules()]
    shapes = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    return modules, shapes


def load_pretrained_weights(network: torch.nn.Module, path: str | os.PathLike) -> None:
    """Copy an exported folder's weights into ``network`` (``PPOLightningModule(init_from=...)``).

    The folder's architecture (built from its config.json) must equal ``network``'s: same modules,
    same parameter names and shapes, and the same action space; otherwise `ExportError` says what
    differs.
    """
    folder = Path(path)
    config = read_pretrained_config(folder)
    where = f"init_from={folder}"
    own_space = getattr(network, "action_space", None)
    if own_space is not None and dict(own_space) != config["action_space"]:
        raise ExportError(f"{where}: action space {config['action_space']} differs from the model's {dict(own_space)}")
    reference = _build(config["observation_space"], config["action_space"], config["network"], where)
    ref_modules, ref_shapes = _structure(reference)
    own_modules, own_shapes = _structure(network)
    arch = f"(its network {config['network']}, observation space {config['observation_space']})"
    if [m for _, m in ref_modules] != [m for _, m in own_modules] or ref_shapes.keys() != own_shapes.keys():
        diff = sorted(set(ref_modules) ^ set(own_modules)) or sorted(set(ref_shapes) ^ set(own_shapes))
        raise ExportError(f"{where}: architecture differs from the model's {arch}; first difference: {diff[0] if diff else '?'}")
    for key, shape in ref_shapes.items():
        if own_shapes[key] != shape:
            raise ExportError(
                f"{where}: {key} has shape {list(shape)} there and {list(own_shapes[key])} in the model {arch}"
            )
    dtype = next(network.parameters()).dtype
    reference.to(dtype)
    _load_weights_into(reference, folder)
    with torch.no_grad():
        network.load_state_dict(reference.state_dict(), strict=True)


# ---------------------------------------------------------------------------------------- CLI
def export_main(argv: list[str] | None = None) -> int:
    """``ppo-lightning export-hf CKPT OUT_DIR [--max-shard-size 2GB] [--dtype ...] [--overwrite]``."""
    parser = argparse.ArgumentParser(
        prog="ppo-lightning export-hf",
        description="Export a ppo_lightning checkpoint (.ckpt file or sharded folder) to a Hugging Face folder.",
    )
    parser.add_argument("ckpt", help="a .ckpt file or an FSDP-sharded checkpoint folder")
    parser.add_argument("out_dir", help="the folder to write (must not exist or be empty, unless --overwrite)")
    parser.add_argument("--max-shard-size", default="2GB", help="largest safetensors file, e.g. 2GB, 500MB (default 2GB)")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="weights dtype (default float32)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing non-empty OUT_DIR")
    args = parser.parse_args(argv)
    size: int | str = int(args.max_shard_size) if str(args.max_shard_size).isdigit() else args.max_shard_size
    try:
        out = export_hf(args.ckpt, args.out_dir, max_shard_size=size, dtype=args.dtype, overwrite=args.overwrite)
    except ExportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"exported {args.ckpt} to {out}")
    return 0
