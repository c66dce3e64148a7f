"""What a study file (`ppo_lightning.studies.spec`) and a search-space file (`ppo_lightning.tuning.space`)
share: one fit-option vocabulary, one validator of their common fields, and the Markdown tables their
guides show, generated from each file's field declarations.

- **Fit options** (`fit_options`): dotted keys as on the command line, in a section (``model.*``,
  ``data.*``, ``trainer.*``, ``mlflow.*``) or one of `TOP_LEVEL_FIT`. The settings a runner gives
  every run itself (`ppo_lightning.run.spec.RUNNER_SETTINGS`: env, seeds, frames, run folder) are
  refused; a runner may fix more (``fixed``: a search's trials record no videos, so ``video_every``
  is null there), and a file may then state the same value, not another.
- **Checks** (`need`, `check_keys`, `check_safe`, `check_name`, `config_list`, `seed_range`): each
  refusal is one line of the file's own error class (a subclass of `FileError`), naming the file
  and the field.
- **Tables** (`schema_table`): ``(part, ((name, required, what), ...))`` declarations as Markdown.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Callable

from ppo_lightning.core.configs import resolve_config
from ppo_lightning.core.safety import UnsafeInput, safe_name
from ppo_lightning.run.spec import RUNNER_SETTINGS

# fit options outside the sections that a study's arm or a search's trial may set
TOP_LEVEL_FIT = ("scale", "scale_rules", "scale_adam_betas", "log_every_frames", "checkpoint_every", "video_every",
                 "trainer.callbacks+")
FIT_SECTIONS = ("model", "data", "trainer", "mlflow")
NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class FileError(ValueError):
    """A study or search-space file that cannot run: the message is one line, naming the file and the field."""


def need(cond: bool, where: str, msg: str, error: type[FileError] = FileError) -> None:
    if not cond:
        raise error(f"{where}: {msg}")


def check_keys(d: dict, allowed: tuple[str, ...], where: str, prefix: str = "", error: type[FileError] = FileError) -> None:
    for key in d:
        need(key in allowed, where, f"{prefix}{key}: unknown field; fields: {', '.join(allowed)}", error)


def check_safe(check: Callable[[], Any], where: str, error: type[FileError] = FileError) -> None:
    """A `ppo_lightning.core.safety` check whose refusal becomes the file's own error."""
    try:
        check()
    except UnsafeInput as err:
        raise error(f"{where}: {err}") from None


def is_int(v: Any, lo: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_name(value: Any, where: str, field: str, error: type[FileError] = FileError, max_len: int | None = None) -> str:
    """A name that becomes folder and file names: letters, digits, ``_ . -``, not ``..``, bounded."""
    need(isinstance(value, str) and bool(NAME.match(value)), where,
         f"{field}: a name of letters, digits, _ . -, got {value!r}", error)
    check_safe(lambda: safe_name(value, field) if max_len is None else safe_name(value, field, max_len=max_len),
               where, error)
    return value


def resolve_ref(root: Path, spec_path: Path, ref: str | Path) -> Path:
    """A config a study or search-space file names: absolute, under the repository ``root``, beside
    the file, or a config shipped with the package (``minatar/ppo``: `ppo_lightning.core.configs`)."""
    p = Path(ref)
    for candidate in (p, root / p, spec_path.parent / p) if p.is_absolute() else (root / p, spec_path.parent / p):
        if candidate.exists():
            return candidate
    try:
        return resolve_config(p)
    except ValueError:
        return root / p


def config_list(value: Any, root: Path, path: Path, where: str, field: str,
                error: type[FileError] = FileError) -> tuple[str, ...]:
    """``base`` (or an arm's ``configs``): a config path or shipped name, or a list of them, each found."""
    items = [value] if isinstance(value, str) else value
    need(isinstance(items, list) and bool(items) and all(isinstance(x, str) and x for x in items), where,
         f"{field}: a path or shipped config name, or a list of them, got {value!r}", error)
    for c in items:
        need(resolve_ref(root, path, c).exists(), where, f"{field}: {c} is neither a file nor a shipped config name", error)
    return tuple(items)


def seed_range(value: Any, where: str, error: type[FileError] = FileError,
               default_count: int | None = None) -> tuple[int, ...]:
    """``seeds: {count: N, first: S}`` -> seeds S .. S + N - 1 (``count`` required unless ``default_count``)."""
    need(isinstance(value, dict), where, f"seeds: a mapping {{count: N, first: S}}, got {value!r}", error)
    check_keys(value, ("count", "first"), where, "seeds.", error)
    count, first = value.get("count", default_count), value.get("first", 0)
    need(is_int(count, 1), where, f"seeds.count: an integer >= 1, got {count!r}", error)
    need(is_int(first, 0), where, f"seeds.first: an integer >= 0, got {first!r}", error)
    return tuple(range(first, first + count))


def check_fit_key(key: Any, where: str, at: str, owner: str, error: type[FileError] = FileError) -> None:
    """One fit option's name (module doc); ``owner``: who sets the runner's settings ('the study')."""
    need(isinstance(key, str), where, f"{at}: a fit option's name, got {key!r}", error)
    need(key not in RUNNER_SETTINGS, where, f"{at}: set by {owner} itself (env, seeds, frames, run folder), not by fit",
         error)
    section, dot, rest = key.partition(".")
    need(key in TOP_LEVEL_FIT or (section in FIT_SECTIONS and dot and rest), where,
         f"{at}: not a fit option ({', '.join(s + '.*' for s in FIT_SECTIONS)}, or one of {', '.join(TOP_LEVEL_FIT)})",
         error)


def fit_options(value: Any, where: str, at: str, owner: str, error: type[FileError] = FileError,
                fixed: dict[str, tuple[Any, str]] | None = None) -> dict[str, Any]:
    """A ``fit:`` mapping of fit options, checked (`check_fit_key`); ``fixed``: ``{key: (value, why)}``
    the runner gives every run, which the file may state (the same value) but not change."""
    if value is None:
        return {}
    need(isinstance(value, dict), where, f"{at}: a mapping of fit options, got {value!r}", error)
    for key, v in value.items():
        check_fit_key(key, where, f"{at}.{key}", owner, error)
        if fixed and key in fixed and v != fixed[key][0]:
            want, why = fixed[key]
            need(False, where, f"{at}.{key}: {why}, so {owner} sets it to {_shown(want)} for every run (got {_shown(v)})",
                 error)
    return dict(value)


def _shown(v: Any) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else repr(v)


def schema_table(schema) -> str:
    """A file's field declarations, ``((part, ((name, required, what), ...)), ...)``, as Markdown
    tables, one per part (the guides' field tables)."""
    out = []
    for part, fields in schema:
        out += [f"| `{part}` field | required | what it is |", "|---|---|---|"]
        out += [f"| `{n}` | {'yes' if req else 'no'} | {what} |" for n, req, what in fields] + [""]
    return "\n".join(out).rstrip("\n")
