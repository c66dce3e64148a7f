"""Settings with a schema: a dataclass declares a component's settings (type, default, check, meaning),
as `ppo_lightning.algos.loss.LossSettings` does for the loss; `check_settings` checks given values against
it before training, with one-line errors naming the setting.

A registered objective, value loss, auxiliary term or schedule (`ppo_lightning.algos.registry`,
`ppo_lightning.algos.hooks`, `ppo_lightning.algos.schedules`) and a loss subclass declare theirs either as
a dataclass::

    @dataclass
    class ClipHigher:
        eps_high: float = setting(0.28, check="> 0")

    @register_objective("clip_higher", settings=ClipHigher)
    def clip_higher(x, eps_high): ...

or, without one, by the function's (or ``__init__``'s) keyword arguments: their annotations are the
types, their defaults the defaults (`schema_of`). ``check`` is a comparison or several (``"> 0"``,
``">= 0, < 1"``), a tuple of allowed values, or a function of the value returning True when it is valid.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import operator
import types
import typing
from typing import Any, Callable

__all__ = ["setting", "schema_of", "check_settings", "settings_doc"]

_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "!=": operator.ne}


def setting(default: Any = dataclasses.MISSING, check: str | tuple | Callable[[Any], bool] | None = None,
            doc: str = "", resume_safe: bool = False):
    """A dataclass field with a check and a meaning: ``eps_high: float = setting(0.28, check="> 0")``.

    ``resume_safe``: the setting may change when a run resumes (``--ckpt_path``) without
    ``--resume_override`` (`ppo_lightning.run.resume`)."""
    metadata = {"check": check, "doc": doc, "resume_safe": resume_safe}
    if isinstance(default, (list, dict, set)):
        value = default
        return dataclasses.field(default_factory=lambda: type(value)(value), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def schema_of(obj: Callable, skip: int = 1, exclude: tuple[str, ...] = (), name: str | None = None) -> type:
    """A settings dataclass from a function's keyword arguments after the first ``skip`` parameters
    (or a class's ``__init__`` after ``self``), minus ``exclude``: annotations as types (Any without),
    defaults as defaults (required without). A class with a ``Settings`` dataclass attribute declares its
    own."""
    if isinstance(obj, type) and dataclasses.is_dataclass(getattr(obj, "Settings", None)):
        return obj.Settings
    target = obj.__init__ if isinstance(obj, type) else obj
    params = list(inspect.signature(target).parameters.values())[skip + (1 if isinstance(obj, type) else 0):]
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # noqa: BLE001  (unresolvable annotations: no types)
        hints = {}
    fields = []
    for p in params:
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) or p.name in exclude:
            continue
        kind = hints.get(p.name, Any)
        if p.default is inspect.Parameter.empty:
            fields.append((p.name, kind))
        else:
            fields.append((p.name, kind, setting(p.default)))
    return dataclasses.make_dataclass(name or f"{getattr(obj, '__name__', 'Settings')}Settings", fields)


def _type_ok(value: Any, kind: Any) -> tuple[bool, Any]:
    """Whether ``value`` is of ``kind`` (a float setting takes an int, as YAML writes 1 for 1.0), and the
    value converted (an int for a float becomes a float)."""
    if kind is Any or kind is inspect.Parameter.empty or isinstance(kind, str):
        return True, value
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(kind):
            ok, converted = _type_ok(value, arg)
            if ok:
                return True, converted
        return False, value
    if origin is typing.Annotated:
        return _type_ok(value, typing.get_args(kind)[0])
    if origin is typing.Literal:
        return value in typing.get_args(kind), value
    if kind is type(None):
        return value is None, value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False, value
        return True, float(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if origin in (list, tuple):
        return isinstance(value, (list, tuple)), value
    if origin is dict:
        return isinstance(value, dict), value
    if isinstance(kind, type):
        return isinstance(value, kind), value
    return True, value


def _type_name(kind: Any) -> str:
    return kind.__name__ if isinstance(kind, type) else str(kind).replace("typing.", "")


def _check(value: Any, check) -> str | None:
    """None when ``value`` passes ``check``, else what it must be."""
    if check is None or value is None:
        return None
    if isinstance(check, tuple):
        return None if value in check else f"one of {check}"
    if callable(check):
        return None if check(value) else f"valid ({getattr(check, '__doc__', None) or 'its check failed'})"
    for part in str(check).split(","):
        part = part.strip()
        op = next(o for o in sorted(_OPS, key=len, reverse=True) if part.startswith(o))
        bound = float(part[len(op):])
        if not (isinstance(value, (int, float)) and math.isfinite(value) and _OPS[op](value, bound)):
            return str(check)
    return None


def check_settings(schema: type, values: dict[str, Any] | None, where: str, owner: str) -> dict[str, Any]:
    """``values`` checked against the settings dataclass ``schema``: every name is one of its fields
    (a close misspelling is named), every value of its type and passing its check, the required ones
    given; then the dataclass is built (its ``__post_init__`` may check more). Returns every setting
    with its value (defaults filled). Errors are one line: ``{where}.{name} ...`` naming ``owner``."""
    values = dict(values or {})
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in values:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{where}: {key!r} is not a setting of {owner} (its settings: "
                             f"{', '.join(fields) or 'none'}){hint}")
    missing = [n for n, f in fields.items() if n not in values and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{where}: {owner} needs {', '.join(missing)}")
    try:
        hints = typing.get_type_hints(schema)
    except Exception:  # noqa: BLE001
        hints = {}
    for key, value in list(values.items()):
        kind = hints.get(key, fields[key].type)
        ok, values[key] = _type_ok(value, kind)
        if not ok:
            raise ValueError(f"{where}.{key} of {owner} must be {_type_name(kind)}, got {value!r}")
        problem = _check(values[key], fields[key].metadata.get("check"))
        if problem:
            raise ValueError(f"{where}.{key} of {owner} must be {problem}, got {value!r}")
    try:
        instance = schema(**values)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{where} of {owner}: {err}") from None
    return {name: getattr(instance, name) for name in fields}


def settings_doc(schema: type) -> list[tuple[str, str, Any, str]]:
    """``(name, type, default, meaning)`` of each setting of ``schema`` (for docs and ``--help``)."""
    out = []
    for f in dataclasses.fields(schema):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "(required)")
        out.append((f.name, _type_name(f.type), default, f.metadata.get("doc", "")))
    return out
