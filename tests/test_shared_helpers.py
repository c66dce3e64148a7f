"""One of each (issue 63): one atomic write, one folder swap, one registry lookup, one config-to-plain
converter, each used by every module that needs it."""

from __future__ import annotations

import ast
import json
import math
import os
from pathlib import Path

import pytest
import torch

from ppo_lightning.algos.hooks import AUX_TERMS, VALUE_LOSSES
from ppo_lightning.algos.registry import get_objective
from ppo_lightning.core.configs import plain
from ppo_lightning.core.storage import atomic_path, atomic_replace, fsync_tree, replace_folder

PACKAGE = Path(__file__).resolve().parents[1] / "ppo_lightning"


def test_an_atomic_write_is_the_old_file_or_the_new_one_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "state.json"
    atomic_replace(target, lambda f: f.write(b"old"))
    with pytest.raises(RuntimeError), atomic_path(target, tmp_suffix=".tmp.mp4") as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".state.json.") and tmp.name.endswith(".tmp.mp4")
        tmp.write_bytes(b"half")
        raise RuntimeError("the writer died")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["state.json"]
    with atomic_path(target) as tmp:  # a writer that takes a file name
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new" and os.listdir(tmp_path) == ["state.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask  # as a plain open() makes it


def test_an_exclusive_atomic_write_never_replaces_what_another_process_made(tmp_path):
    target = tmp_path / "mlflow.db"
    with atomic_path(target, exclusive=True) as tmp:
        tmp.write_bytes(b"first")
    with pytest.raises(FileExistsError), atomic_path(target, exclusive=True) as tmp:
        tmp.write_bytes(b"second")
    assert target.read_bytes() == b"first" and os.listdir(tmp_path) == ["mlflow.db"]


def test_a_folder_is_swapped_in_whole(tmp_path):
    out = tmp_path / "export"
    for content in ("one", "two"):
        tmp = tmp_path / ".export.tmp"
        (tmp / "sub").mkdir(parents=True)
        (tmp / "sub" / "weights").write_text(content)
        fsync_tree(tmp)
        replace_folder(tmp, out)
        assert (out / "sub" / "weights").read_text() == content and sorted(os.listdir(tmp_path)) == ["export"]
    (tmp_path / "file.ckpt").write_text("a single-file checkpoint of the same name")
    (tmp_path / ".file.ckpt.tmp").mkdir()
    replace_folder(tmp_path / ".file.ckpt.tmp", tmp_path / "file.ckpt")
    assert (tmp_path / "file.ckpt").is_dir()


def test_every_module_writes_files_in_place_through_core_storage():
    """No ``os.replace`` / ``os.rename`` / ``os.link`` outside `ppo_lightning.core.storage` (an AST walk)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "storage.py" and path.parent.name == "core":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in ("replace", "rename", "link")
                    and isinstance(node.value, ast.Name) and node.value.id == "os"):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} os.{node.attr}")
    assert not found, found


def test_one_config_to_plain_converter():
    class Namespace:  # a jsonargparse namespace, as far as the converter sees it
        def as_dict(self):
            return {"eps": 0.2, "_instantiator": "bookkeeping", "betas": (0.9, 0.999)}

    assert plain({"a": Namespace(), 1: [(1, 2)]}) == {"a": {"eps": 0.2, "betas": [0.9, 0.999]}, "1": [[1, 2]]}
    assert math.isnan(plain([float("nan")])[0])  # kept, unless the result must be JSON
    safe = plain({"r": torch.tensor(2.5), "nan": float("nan"), "inf": -math.inf, "path": Path("/x"), "n": None}, json_safe=True)
    assert safe == {"r": 2.5, "nan": None, "inf": None, "path": "/x", "n": None}
    json.dumps(safe, allow_nan=False)
    for path in PACKAGE.rglob("*.py"):  # no converter of its own anywhere (module, resume, rescale, export, builder had one)
        assert "def _plain(" not in path.read_text() and "._plain(" not in path.read_text(), path


def _user_fn(v, delta: float = 1.0):
    return v


def test_the_objective_and_hook_registries_share_one_lookup_and_its_messages():
    path = f"{__name__}._user_fn"
    for registry in (VALUE_LOSSES, AUX_TERMS):
        hook = registry.get(path)
        assert hook.fn is _user_fn and registry.get(path) is hook and "delta" in hook.settings_schema.__dataclass_fields__
        with pytest.raises(ValueError, match=rf"^{registry.setting} 'nowhere\.fn': cannot import it"):
            registry.get("nowhere.fn")
        with pytest.raises(ValueError, match=rf"^{registry.setting} must be one of \("):
            registry.get("no_such_name")
    with pytest.raises(ValueError, match=r"^model\.objective 'nowhere\.fn': cannot import it"):
        get_objective("nowhere.fn")
    with pytest.raises(ValueError, match=r"^model\.objective must be one of \('clip', 'kl'"):
        get_objective("no_such_name")
    builtin = get_objective("clip")
    again = get_objective(f"{builtin.fn.__module__}.{builtin.fn.__name__}")  # a registered function by its path
    assert again.fn is builtin.fn and again.schema is builtin.schema and again.adaptive_beta == builtin.adaptive_beta
