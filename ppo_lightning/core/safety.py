"""Inputs that come from someone else: a downloaded checkpoint, an exported folder, a shared study or
search-space file. They never run code and never write outside their place (issue 48).

- **No import from data** (`code_references`, `check_code`): a ``module:EnvId`` env id, an objective's
  import path, a loss, model, callback or logger class path found in a checkpoint, an exported folder's
  ``config.json`` or a study / space file (and the config files it names) is imported only when its
  package is one this project runs anyway (`TRUSTED_PACKAGES`), when the user typed the same value
  (command line, their own ``--config``), or after ``--trust-code`` (in the spirit of transformers'
  ``trust_remote_code``). Otherwise `UntrustedCode`, one line naming what would be imported and how to
  allow it.
- **Names that become paths** (`safe_name`, `env_dirname`): a study, arm, env, trial or group name is
  refused with one line when it is empty, ``.`` or ``..``, holds a path separator or a control
  character, or is longer than `MAX_NAME` bytes; checked when the file is read, before anything trains.
- **Writes that do not follow links** (`open_nofollow`, `refuse_symlink`, `refuse_symlinks_under`): lock
  files are opened with ``O_NOFOLLOW``; a run folder's config, checkpoint folder and spool, and every
  entry of a study's or search's run root, are refused when they are symbolic links.
- **Bounded YAML** (`load_yaml`): study, space and config files are read with a size limit and the
  number of nodes their aliases expand to counted on the composed graph (linear in the file) before
  anything is built from it: a "billion laughs" file is one line in milliseconds.
- **Finite values** (`first_nonfinite`): NaN or inf in a file's settings is one line naming the field.

May import: the standard library and PyYAML only.
"""

from __future__ import annotations

import errno
import math
import os
import unicodedata
from pathlib import Path
from typing import Any, Iterator

MAX_NAME = 100  # bytes of a name that becomes a file or folder name (a cell record joins three of them)
YAML_MAX_BYTES = 4 * 1024 * 1024
YAML_MAX_NODES = 100_000  # nodes after alias expansion; a config has a few hundred
TRUST_FLAG = "--trust-code"
# packages this project imports anyway: a class path or objective inside them runs no code from elsewhere
TRUSTED_PACKAGES = frozenset({"ppo_lightning", "lightning", "pytorch_lightning", "torch", "torchrl", "tensordict",
                              "gymnasium"})
ENV_FAMILIES = ("minatar:", "procgen:")  # `family:game` ids of this project: not gymnasium's module syntax
# keys whose string value is a class path that jsonargparse or the project imports (the last part of a
# dotted key: `trainer.callbacks+` -> callbacks)
CLASS_KEYS = frozenset({"class_path", "_class_path", "model", "callbacks", "logger", "strategy", "plugins", "profiler",
                        "accelerator", "cluster_environment", "checkpoint_io", "precision_plugin"})


class UnsafeInput(ValueError):
    """A name, path, YAML file or value that cannot be used safely: one line, exit code 2."""

    exit_code = 2


class UntrustedCode(UnsafeInput):
    """Data (a checkpoint, an exported folder, a study or space file) that would import code."""


# ---------------------------------------------------------------------------- names


def safe_name(name: Any, what: str, max_len: int = MAX_NAME) -> str:
    """``name`` if it can be one file or folder name: a non-empty string, not ``.`` or ``..``, with no
    path separator or control character, at most ``max_len`` bytes (UTF-8); else `UnsafeInput`."""
    if not isinstance(name, str) or name == "":
        raise UnsafeInput(f"{what}: a name is needed, got {name!r}")
    shown = name if len(name) <= 60 else f"{name[:40]!r}... ({len(name)} characters)"
    if name in (".", ".."):
        raise UnsafeInput(f"{what}: {name!r} is not a name (it would write into another folder)")
    if "/" in name or "\\" in name or os.sep in name or (os.altsep and os.altsep in name):
        raise UnsafeInput(f"{what}: {shown!r} holds a path separator (it would write outside its folder)")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in name):
        raise UnsafeInput(f"{what}: {name!r} holds a control character")
    if len(name.encode("utf-8")) > max_len:
        raise UnsafeInput(f"{what}: {shown} is longer than {max_len} bytes (it becomes a file name)")
    return name


def env_dirname(env: str, what: str = "env") -> str:
    """An env id as it appears in file and folder names (``minatar:breakout`` -> ``minatar-breakout``,
    as the study runner writes it), checked by `safe_name`."""
    if not isinstance(env, str) or env == "":
        raise UnsafeInput(f"{what}: an environment id is needed, got {env!r}")
    safe_name(env.replace(":", "-"), f"{what} {env[:60]!r}")
    return env.replace(":", "-")


# ---------------------------------------------------------------------------- YAML


def _loader():
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _expanded_nodes(root, limit: int) -> int:
    """Nodes of the composed YAML graph once every alias is expanded (memoized per node: linear in
    the file); stops counting past ``limit``; a recursive alias counts as unbounded."""
    import yaml

    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    active: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            active.discard(key)
            if isinstance(node, yaml.MappingNode):
                children = [n for pair in node.value for n in pair]
            else:
                children = list(node.value)
            sizes[key] = min(limit + 1, 1 + sum(sizes[id(c)] for c in children))
            continue
        if key in sizes:
            continue
        if key in active:  # an alias inside the node it names: infinite when expanded
            return limit + 1
        if isinstance(node, yaml.ScalarNode):
            sizes[key] = 1
            continue
        active.add(key)
        stack.append((node, True))
        children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else list(node.value)
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes.get(id(root), 1)


def load_yaml(path: str | os.PathLike, what: str | None = None, text: str | None = None,
              max_bytes: int = YAML_MAX_BYTES, max_nodes: int = YAML_MAX_NODES) -> Any:
    """``yaml.safe_load`` of a file (or of ``text``), bounded: at most ``max_bytes`` and ``max_nodes``
    nodes after alias expansion, else `UnsafeInput` (one line, before anything is built). A YAML
    syntax error is `UnsafeInput` too (``<what>: not YAML (...)``)."""
    import yaml

    what = what or str(path)
    if text is None:
        try:
            size = os.path.getsize(path)
            if size > max_bytes:
                raise UnsafeInput(f"{what}: {size} bytes, more than a settings file may hold ({max_bytes})")
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise UnsafeInput(f"{what}: cannot be read ({getattr(err, 'strerror', None) or err})") from None
    if len(text.encode("utf-8", "surrogateescape")) > max_bytes:
        raise UnsafeInput(f"{what}: more than {max_bytes} bytes, more than a settings file may hold")
    loader = _loader()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_nodes(node, max_nodes) > max_nodes:
            raise UnsafeInput(f"{what}: its YAML aliases expand to more than {max_nodes} values (an alias bomb?); "
                              f"refused before reading it")
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        raise UnsafeInput(f"{what}: not YAML ({str(err).strip().splitlines()[0]})") from None
    except RecursionError:
        raise UnsafeInput(f"{what}: nested too deeply to be a settings file") from None
    finally:
        loader.dispose()


# ---------------------------------------------------------------------------- code named in data


def imported_module(key: str, value: Any) -> str | None:
    """The module importing ``value`` would import, when ``key`` (a field name, possibly dotted) names
    code: an env id ``module:EnvId``, a class path, an objective's import path; else None."""
    if not isinstance(value, str) or not isinstance(key, str):
        return None
    last = key.rstrip("+").split(".")[-1]
    if last in ("env_id", "env", "envs"):
        if ":" in value and not value.startswith(ENV_FAMILIES):
            return value.partition(":")[0]
        return None
    if (last in CLASS_KEYS or last == "objective") and "." in value.strip(".") and " " not in value:
        return value.rpartition(".")[0]
    return None


def code_references(data: Any, where: str = "") -> list[tuple[str, str, str]]:
    """``(field, value, module)`` for every value in ``data`` (nested mappings and lists, as read from a
    file) that would import ``module``, outside `TRUSTED_PACKAGES`."""
    out: list[tuple[str, str, str]] = []

    def walk(node: Any, field: str, key: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{field}.{k}" if field else str(k), str(k))
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, f"{field}[{i}]", key)
        else:
            module = imported_module(key, node)
            if module is not None and module.split(".")[0] not in TRUSTED_PACKAGES:
                out.append((field, node, module))

    walk(data, where, where.split(".")[-1] if where else "")
    return out


def check_code(refs: list[tuple[str, str, str]], source: str, trusted: bool = False, flag: str = TRUST_FLAG,
               allowed: set[str] | frozenset = frozenset()) -> None:
    """Refuse (`UntrustedCode`) the first reference of ``refs`` (`code_references`) unless ``trusted``
    or its value is in ``allowed`` (what the user typed)."""
    if trusted:
        return
    for field, value, module in refs:
        if value in allowed:
            continue
        raise UntrustedCode(f"{source}: {field} {value!r} would import the module {module!r}; code named in a "
                            f"file is not run unless you allow it: add {flag} if you trust that file")


# ---------------------------------------------------------------------------- links


def _link_target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def refuse_symlink(path: str | os.PathLike, what: str) -> None:
    """`UnsafeInput` if ``path`` is a symbolic link (a write there would land at its target)."""
    path = Path(path)
    if path.is_symlink():
        raise UnsafeInput(f"{what} {path} is a symbolic link (to {_link_target(path)}): refusing to write through "
                          f"it; remove the link")


def refuse_symlinks_under(root: str | os.PathLike, what: str) -> None:
    """`UnsafeInput` naming the first symbolic link inside ``root`` (``root`` itself may be one: the
    user chose it)."""
    root = Path(root)
    if not root.is_dir():
        return
    for folder, dirs, files in os.walk(root):  # os.walk does not descend into linked folders
        for name in sorted(dirs + files):
            p = Path(folder) / name
            if p.is_symlink():
                raise UnsafeInput(f"{what} {root} holds a symbolic link, {p} (to {_link_target(p)}): refusing to "
                                  f"write through it; remove the link")


def open_nofollow(path: str | os.PathLike, flags: int, what: str, mode: int = 0o644) -> int:
    """``os.open(path, flags | O_NOFOLLOW)``: a descriptor, or `UnsafeInput` if ``path`` is a symbolic link."""
    try:
        return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), mode)
    except OSError as err:
        if err.errno == errno.ELOOP or Path(path).is_symlink():
            raise UnsafeInput(f"{what} {path} is a symbolic link (to {_link_target(Path(path))}): refusing to "
                              f"write through it; remove the link") from None
        raise


# ---------------------------------------------------------------------------- values


def _numbers(data: Any, field: str) -> Iterator[tuple[str, Any]]:
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _numbers(v, f"{field}.{k}" if field else str(k))
    elif isinstance(data, (list, tuple)):
        for i, v in enumerate(data):
            yield from _numbers(v, f"{field}[{i}]")
    else:
        yield field, data


def first_nonfinite(data: Any, where: str = "") -> tuple[str, Any] | None:
    """``(field, value)`` of the first NaN or infinite number in ``data`` (also the strings ``nan``,
    ``inf``, ``.nan``, ``.inf`` with any sign, as a command line carries them), else None."""
    for field, v in _numbers(data, where):
        if isinstance(v, float) and not math.isfinite(v):
            return field, v
        if isinstance(v, str) and v.strip().lower().lstrip("+-").lstrip(".") in ("nan", "inf", "infinity"):
            return field, v
    return None
