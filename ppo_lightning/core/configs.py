"""The YAML configs shipped with the package, and what ``--config`` accepts.

The configs travel in the wheel as package data, ``ppo_lightning/configs/<family>/<name>.yaml``
(``cartpole``, ``minatar``, ``procgen``, ``mujoco``, ``atari``), so an installed package trains the paper's
configurations without a clone of the repository, as RL Baselines3 Zoo ships its hyperparameters.
``--config`` takes a path or a shipped name such as ``cartpole/ppo_ewma``; ``ppo-lightning configs``
lists the names.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

FAMILIES = ("cartpole", "minatar", "procgen", "mujoco", "atari")


def configs_dir() -> Path:
    """The folder of the shipped configs (inside the installed package)."""
    return Path(str(resources.files("ppo_lightning") / "configs"))


def shipped_configs() -> list[str]:
    """The names of the shipped configs, ``<family>/<name>``, sorted."""
    root = configs_dir()
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.glob("*/*.yaml"))


def resolve_config(name_or_path: str | Path) -> Path:
    """A config file: ``name_or_path`` itself if it is a file, else the shipped config of that name
    (``cartpole/ppo_ewma``, with or without ``.yaml``; the repository path of an earlier release,
    ``experiments/cartpole/ppo_ewma.yaml``, names the same config). ValueError in one line otherwise."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    parts = path.with_suffix("").parts if path.suffix in ("", ".yaml", ".yml") else ()
    if len(parts) >= 2 and parts[-2] in FAMILIES and (len(parts) == 2 or parts[-3:-2] == ("experiments",)):
        shipped = configs_dir() / parts[-2] / f"{parts[-1]}.yaml"
        if shipped.is_file():
            return shipped
    raise ValueError(f"--config {name_or_path}: no such file and no shipped config of that name "
                     "(`ppo-lightning configs` lists them)")


def checked_config(name_or_path: str | Path) -> Path:
    """`resolve_config`, then the file read once with `ppo_lightning.core.safety.load_yaml` (bounded
    size and alias expansion: a YAML bomb is one line before jsonargparse expands it)."""
    from ppo_lightning.core.safety import load_yaml

    path = resolve_config(name_or_path)
    load_yaml(path, f"--config {path}")
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
