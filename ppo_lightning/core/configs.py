"""The YAML configs shipped with the package, and what ``--config`` accepts.

The configs travel in the wheel as package data, ``ppo_lightning/configs/<family>/<name>.yaml``
(``cartpole``, ``minatar``, ``procgen``, ``mujoco``, ``atari``), so an installed package trains the paper's
configurations without a clone of the repository, as RL Baselines3 Zoo ships its hyperparameters.
``--config`` takes a path or a shipped name such as ``cartpole/ppo_ewma``; ``ppo-lightning configs``
lists the names.
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path
from typing import Any

FAMILIES = ("cartpole", "minatar", "procgen", "mujoco", "atari")


def plain(value: Any, json_safe: bool = False) -> Any:
    """A config value as plain dicts, lists and scalars, as checkpoints keep hyperparameters and
    resume compares them: jsonargparse namespaces become dicts (``as_dict``; their ``_instantiator``
    entry, jsonargparse's bookkeeping, dropped), tuples lists, keys strings. ``json_safe`` (a JSON
    file read by other programs): also a one-element tensor becomes its number, NaN and infinities
    None, and any other value that is not None, bool, int, float or str its ``str``. The one
    config-to-plain converter."""
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    if isinstance(value, dict):
        return {str(k): plain(v, json_safe) for k, v in value.items() if k != "_instantiator"}
    if isinstance(value, (list, tuple)):
        return [plain(v, json_safe) for v in value]
    if not json_safe:
        return value
    if hasattr(value, "numel") and hasattr(value, "item") and value.numel() == 1:  # a torch tensor
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def configs_dir() -> Path:
    """The folder of the shipped configs (inside the installed package)."""
    return Path(str(resources.files("ppo_lightning") / "configs"))


def shipped_configs() -> list[str]:
    """The names of the shipped configs, ``<family>/<name>``, sorted."""
    root = configs_dir()
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.glob("*/*.yaml"))


def resolve_config(name_or_path: str | Path) -> Path:
    """A config file: ``name_or_path`` itself if it exists, else the shipped config of that name
    (``cartpole/ppo_ewma``, with or without ``.yaml``; the repository path of an earlier release,
    ``experiments/cartpole/ppo_ewma.yaml``, names the same config). ValueError in one line otherwise."""
    path = Path(name_or_path)
    if path.exists():  # a file; anything else there is refused by the reader (`checked_config`)
        return path
    parts = path.with_suffix("").parts if path.suffix in ("", ".yaml", ".yml") else ()
    if len(parts) >= 2 and parts[-2] in FAMILIES and (len(parts) == 2 or parts[-3:-2] == ("experiments",)):
        shipped = configs_dir() / parts[-2] / f"{parts[-1]}.yaml"
        if shipped.is_file():
            return shipped
    raise ValueError(f"--config {name_or_path}: no such file and no shipped config of that name "
                     "(`ppo-lightning configs` lists them)")


# the sections of a `fit` config whose value may be the path of a nested config (``data: data.yaml``)
SECTIONS = frozenset({"model", "data", "trainer", "optimizer", "lr_scheduler", "mlflow"})


def read_config(path: str | Path, what: str | None = None) -> dict:
    """A config file as a mapping, read by the bounded reader (`ppo_lightning.core.safety.load_yaml`:
    a regular file, bounded size and alias expansion, a YAML bomb is one line before jsonargparse
    expands it), with the configs it names read the same way (`check_named_configs`)."""
    from ppo_lightning.core.safety import UnsafeInput, check_named_configs, load_yaml  # stdlib + PyYAML: light

    what = what or str(path)
    data = load_yaml(path, what)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UnsafeInput(f"{what}: a config file is a YAML mapping of sections")
    check_named_configs(data, path, SECTIONS)
    return data


def checked_config(name_or_path: str | Path) -> Path:
    """`resolve_config`, then the file read once by `read_config`."""
    path = resolve_config(name_or_path)
    read_config(path, f"--config {path}")
    return path


def resolve_config_args(argv: list[str]) -> list[str]:
    """Command-line arguments with every ``--config X`` / ``--config=X`` / ``-c X`` value resolved
    by `resolve_config` (what LightningCLI then reads as a file) and checked by `checked_config`."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--config", "-c") and i + 1 < len(argv):
            out += [arg, str(checked_config(argv[i + 1]))]
            i += 2
            continue
        if arg.startswith("--config="):
            arg = "--config=" + str(checked_config(arg.split("=", 1)[1]))
        out.append(arg)
        i += 1
    return out
