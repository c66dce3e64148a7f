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
- **One bounded reader** (`read_bytes`, `read_text`, `load_yaml`, `load_json`, `read_csv`): every file
  that comes from outside a run (a ``--config`` and the configs a study or search-space file names,
  the study and space files, an exported folder's JSON, a study's records CSVs) is read through it.
  It looks at the file before opening it and again once open (``stat``, ``fstat``): anything but a
  regular file (a FIFO, ``/dev/zero``, a directory) is refused, as is a file larger than its bound;
  then at most that many bytes are read. The parsed values are counted too: YAML's nodes on the
  composed graph once aliases expand (linear in the file, before anything is built from it: a
  "billion laughs" file is one line in milliseconds), JSON's and CSV's values once parsed.
- **Finite values** (`first_nonfinite`): NaN or inf in a file's settings is one line naming the field.

May import: the standard library and PyYAML only.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import stat
import unicodedata
from pathlib import Path
from typing import Any, Iterator

MAX_NAME = 100  # bytes of a name that becomes a file or folder name (a cell record joins three of them)
YAML_MAX_BYTES = 4 * 1024 * 1024
YAML_MAX_NODES = 100_000  # nodes after alias expansion; a config has a few hundred
JSON_MAX_BYTES = YAML_MAX_BYTES  # an exported folder's config.json, a cell record
JSON_MAX_VALUES = YAML_MAX_NODES
# a study's records: the largest committed curves CSV is 6.4 MB, 0.8M values (159k rows of 5)
CSV_MAX_BYTES = 256 * 1024 * 1024
CSV_MAX_VALUES = 20_000_000
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


# ---------------------------------------------------------------------------- reading files


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _refuse_unless_regular(st: os.stat_result, what: str, max_bytes: int, limit: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeInput(f"{what}: {_kind(st.st_mode)}, not a regular file; refusing to read it")
    if st.st_size > max_bytes:
        raise UnsafeInput(f"{what}: {st.st_size} bytes, more than {limit} may hold ({max_bytes})")


def read_bytes(path: str | os.PathLike, what: str | None = None, max_bytes: int = YAML_MAX_BYTES,
               limit: str = "a settings file") -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes``; else `UnsafeInput` in one line
    (``<what>: ...``): a missing or unreadable file; anything but a regular file, checked with ``stat``
    before opening (a FIFO is never opened, ``/dev/zero`` never read) and with ``fstat`` on what was
    opened; a file larger than ``max_bytes`` by its size, before reading; one that grows past it while
    being read (at most ``max_bytes + 1`` bytes are read)."""
    what = what or str(path)
    try:
        _refuse_unless_regular(os.stat(path), what, max_bytes, limit)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as err:
        raise UnsafeInput(f"{what}: cannot be read ({err.strerror or err})") from None
    try:
        _refuse_unless_regular(os.fstat(fd), what, max_bytes, limit)  # the file opened is the one checked
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as err:
        raise UnsafeInput(f"{what}: cannot be read ({err.strerror or err})") from None
    finally:
        os.close(fd)
    if total > max_bytes:
        raise UnsafeInput(f"{what}: more than {max_bytes} bytes, more than {limit} may hold")
    return b"".join(chunks)


def read_text(path: str | os.PathLike, what: str | None = None, max_bytes: int = YAML_MAX_BYTES,
              limit: str = "a settings file") -> str:
    """`read_bytes`, decoded as UTF-8 (a file that is not UTF-8: `UnsafeInput`)."""
    what = what or str(path)
    try:
        return read_bytes(path, what, max_bytes, limit).decode("utf-8")
    except UnicodeDecodeError:
        raise UnsafeInput(f"{what}: not UTF-8 text") from None


def _count_values(data: Any, limit: int) -> int:
    """The values of parsed JSON (each container and each scalar), counted up to ``limit + 1``."""
    n, stack = 0, [data]
    while stack and n <= limit:
        node = stack.pop()
        n += 1
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return n


def load_json(path: str | os.PathLike, what: str | None = None, max_bytes: int = JSON_MAX_BYTES,
              max_values: int = JSON_MAX_VALUES) -> Any:
    """``json.loads`` of a file read by `read_text`, of at most ``max_values`` values; a file that is
    not JSON, or holds more, is `UnsafeInput` in one line."""
    what = what or str(path)
    try:
        data = json.loads(read_text(path, what, max_bytes))
    except (ValueError, RecursionError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UnsafeInput(f"{what}: not JSON ({first})") from None
    if _count_values(data, max_values) > max_values:
        raise UnsafeInput(f"{what}: more than {max_values} values, more than a settings file may hold")
    return data


def read_csv(path: str | os.PathLike, what: str | None = None, max_bytes: int = CSV_MAX_BYTES,
             max_values: int = CSV_MAX_VALUES) -> list[dict]:
    """The rows of a CSV file with a header line (as ``csv.DictReader`` gives them), read by
    `read_text` with a records file's bounds: at most ``max_bytes`` and ``max_values`` cells, else
    `UnsafeInput` in one line."""
    what = what or str(path)
    text = read_text(path, what, max_bytes, limit="a records file")
    rows, values = [], 0
    try:
        for row in csv.DictReader(io.StringIO(text, newline="")):
            values += len(row)
            if values > max_values:
                raise UnsafeInput(f"{what}: more than {max_values} values, more than a records file may hold")
            rows.append(row)
    except csv.Error as err:
        raise UnsafeInput(f"{what}: not CSV ({err})") from None
    return rows


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
    """``yaml.safe_load`` of a file (read by `read_text`) or of ``text``, bounded: at most ``max_bytes``
    and ``max_nodes`` nodes after alias expansion, else `UnsafeInput` (one line, before anything is
    built). A YAML syntax error is `UnsafeInput` too (``<what>: not YAML (...)``)."""
    import yaml

    what = what or str(path)
    if text is None:
        text = read_text(path, what, max_bytes)
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


CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
MAX_CONFIG_DEPTH = 8  # configs naming configs: a few levels; deeper is a loop or a bomb


def check_named_configs(data: Any, source: str | os.PathLike, sections: frozenset | set = frozenset(),
                        _depth: int = 0, _seen: frozenset = frozenset()) -> None:
    """Read every file a config names where jsonargparse would load a nested config from it, through
    the bounded reader, before jsonargparse opens it: a string value that names an existing path (as
    given, beside ``source``, or from the working folder) other than a folder is refused when it is
    not a regular file (jsonargparse opens a FIFO as a config and would wait on it forever); a regular
    file is read by `load_yaml` (and what it names in turn) when it is a config by its suffix
    (``.yaml``, ``.yml``, ``.json``) or is the value of a top-level section (``sections``: ``data:
    data.yaml``). Other regular files (a checkpoint for ``model.init_from``) are left to their reader."""
    source = Path(source)
    if _depth > MAX_CONFIG_DEPTH:
        raise UnsafeInput(f"{source}: configs name configs more than {MAX_CONFIG_DEPTH} levels deep")
    for field, value in _numbers(data, ""):
        if not isinstance(value, str) or not value.strip() or "\n" in value or len(value) > 4096:
            continue
        candidates = [Path(value)] if os.path.isabs(value) else [source.parent / value, Path(value)]
        for p in candidates:
            try:
                st = os.stat(p)
            except (OSError, ValueError):
                continue
            if stat.S_ISDIR(st.st_mode):
                break
            what = f"{source}: {field} names {value}"
            if not stat.S_ISREG(st.st_mode):
                raise UnsafeInput(f"{what}: {_kind(st.st_mode)}, not a regular file; refusing to read it")
            if p.suffix.lower() in CONFIG_SUFFIXES or ("." not in field and field in sections):
                key = os.path.realpath(p)
                if key not in _seen:
                    check_named_configs(load_yaml(p, what), p, frozenset(), _depth + 1, _seen | {key})
            break


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
