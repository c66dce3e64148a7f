"""Loading an exported Hugging Face folder back: no transformers, no pickle.

`load_pretrained` builds the actor-critic with ``ppo_lightning.nets.models`` (the class that trained it)
and reads ``model.safetensors`` (or its shards) with ``huggingface_hub.load_torch_model``;
`load_pretrained_weights` is what ``PPOLightningModule(init_from=folder)`` uses.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ppo_lightning.core.safety import UnsafeInput, load_json
from ppo_lightning.interop.checkpoint_io import ExportError, build_network_or_fail, one_line

MODEL_TYPE = "ppo_lightning_actor_critic"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(dtype: str | torch.dtype) -> tuple[str, torch.dtype]:
    if isinstance(dtype, torch.dtype):
        names = {v: k for k, v in DTYPES.items()}
        if dtype not in names:
            raise ExportError(f"dtype must be one of {sorted(DTYPES)}, got {dtype}")
        return names[dtype], dtype
    if dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return dtype, DTYPES[dtype]


def is_pretrained_folder(path: str | os.PathLike) -> bool:
    return Path(path).is_dir() and (Path(path) / "config.json").is_file()


def read_pretrained_config(path: str | os.PathLike) -> dict[str, Any]:
    """``config.json`` of an exported folder, checked to be ours."""
    folder = Path(path)
    cfg_file = folder / "config.json"
    if not folder.is_dir():
        raise ExportError(f"pretrained folder not found: {folder}")
    if not cfg_file.is_file():
        raise ExportError(f"{folder} is not an exported ppo_lightning folder (no config.json)")
    try:
        config = load_json(cfg_file)  # bounded: a folder from elsewhere is data
    except UnsafeInput as err:
        raise ExportError(str(err)) from None
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
        raise ExportError(f"cannot load the weights in {folder} ({one_line(err)})") from None
    except RuntimeError as err:
        raise ExportError(f"the weights in {folder} do not match its config.json ({one_line(err)})") from None


def load_pretrained(path: str | os.PathLike, dtype: str | torch.dtype | None = "float32") -> torch.nn.Module:
    """The actor-critic of an exported folder, in eval mode, without transformers or pickle.

    ``dtype``: the parameters' dtype (default float32, which the networks' float32 observations
    need); ``"auto"`` or None keeps the stored ``torch_dtype``.
    """
    folder = Path(path)
    config = read_pretrained_config(folder)
    net = build_network_or_fail(config["observation_space"], config["action_space"], config["network"], str(folder))
    if dtype in (None, "auto"):
        dtype = config.get("torch_dtype") or "float32"
    net.to(parse_dtype(dtype)[1])
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
    reference = build_network_or_fail(config["observation_space"], config["action_space"], config["network"], where)
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
