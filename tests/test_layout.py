"""The package layout stays what its folders say (issue 22): imports point one way, down the layers
adapters < core < envs < nets < algos < data < interop < training < run < studies < tuning < cli, with no import
cycles (type-only imports counted), checkpoints read in one module, and every name lives at one path: no placeholder
modules, no forwarding `__getattr__` in a subpackage. Other libraries' private names are read in `ppo_lightning.adapters`
only, and `core` reads nothing of Lightning (issue 63)."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "ppo_lightning"
LAYERS = ("adapters", "core", "envs", "nets", "algos", "data", "interop", "training", "run", "studies", "tuning", "cli")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, bool, int]]:
    """(imported ppo_lightning module or name, at module level?, line) for every import in the file,
    type-only ones (``if TYPE_CHECKING:``, counted at module level) included: a cycle through an
    annotation is a cycle for a reader too."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    top |= {id(stmt) for node in tree.body
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
            for stmt in node.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ppo_lightning"):
            for alias in node.names:  # `from ppo_lightning.data import resume_state` names a module
                found.append((f"{node.module}.{alias.name}", id(node) in top, node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("ppo_lightning"):
                    found.append((alias.name, id(node) in top, node.lineno))
    return found


def _layer(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def _sources() -> list[Path]:
    return [p for p in PKG.rglob("*.py") if "remote" not in p.parts]  # hf/remote: templates, never imported


def test_imports_point_down_the_layers():
    wrong = []
    for path in _sources():
        here = _layer(_module_name(path))
        if here is None:
            continue  # ppo_lightning/__init__.py: the package's front door
        for target, _, line in _imports(path):
            there = _layer(target)
            if there is not None and LAYERS.index(there) > LAYERS.index(here):
                wrong.append(f"{path.relative_to(PKG.parent)}:{line} ({here}) imports {target} ({there})")
    assert not wrong, "imports up the layers:\n" + "\n".join(wrong)


def test_a_lower_layer_never_imports_training_or_cli():
    # stated directly: nets never import training, and no library layer imports the command line
    # (studies and tuning train through the run API, `ppo_lightning.run`)
    for layer in LAYERS[:-1]:
        for path in (PKG / layer).rglob("*.py"):
            targets = {_layer(t) for t, _, _ in _imports(path)}
            assert "cli" not in targets, path
            assert LAYERS.index(layer) > LAYERS.index("data") or "training" not in targets, path


def test_no_import_cycles_even_through_imports_inside_functions():
    modules = {_module_name(p): p for p in _sources()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for target, _, _ in _imports(path):
            # `from pkg import name`: the module pkg.name if it is one, else pkg
            deps.add(target if target in modules else target.rsplit(".", 1)[0])
        graph[name] = {d for d in deps if d in modules and d != name and not name.startswith(d + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


# The checkpoint reader, and the one place where the ranks' gathered states are read back from bytes.
TORCH_LOAD_CALLS = {"interop/checkpoint_io.py": 1, "data/resume_state.py": 1}


def test_checkpoints_are_read_in_one_place():
    """``torch.load`` (or a zip archive, or DCP's reader) is called only by the checkpoint reader
    (`ppo_lightning.interop.checkpoint_io`), and once for the ranks' gathered resume states
    (`ppo_lightning.data.resume_state.gather_rank_states`, from bytes, never a file)."""
    readers = {("torch", "load"), ("zipfile", "ZipFile"), ("dcp", "load")}
    calls: dict[str, int] = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            name = None
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                name = (node.value.id, node.attr)
            elif isinstance(node, ast.ImportFrom) and node.module in ("torch", "zipfile"):
                name = next(((node.module, a.name) for a in node.names if (node.module, a.name) in readers), None)
            elif isinstance(node, ast.Name) and node.id == "FileSystemReader":
                name = ("dcp", "load")
            if name in readers:
                where = path.relative_to(PKG).as_posix()
                calls[where] = calls.get(where, 0) + 1
    outside = {k: v for k, v in calls.items() if k != "interop/checkpoint_io.py"}
    assert outside == {"data/resume_state.py": TORCH_LOAD_CALLS["data/resume_state.py"]}, calls
    assert calls.get("interop/checkpoint_io.py", 0) >= TORCH_LOAD_CALLS["interop/checkpoint_io.py"], calls


def test_imports_inside_functions_say_why():
    """An import of our own package inside a function is for an optional dependency or a measured
    start-up cost, and a comment (on the line, or within the three lines above it) says which."""
    silent = []
    for path in _sources():
        lines = path.read_text().splitlines()
        for target, top, line in _imports(path):
            if top or path.name == "__init__.py" and path.parent == PKG:
                continue
            window = lines[max(0, line - 4):line]
            if not any("#" in text for text in window) and '"""' not in "".join(window):
                silent.append(f"{path.relative_to(PKG.parent)}:{line} {target}")
    assert not silent, "imports inside functions without a reason:\n" + "\n".join(silent)


def _imports_inside_functions() -> list[str]:
    return [f"{path.relative_to(PKG.parent)}:{line} {target}" for path in _sources()
            for target, top, line in _imports(path) if not (top or path.name == "__init__.py" and path.parent == PKG)]


def test_imports_inside_functions_are_few():
    """At most 40 names of our own package imported inside functions (issue 46): each is an optional
    dependency or a start-up cost that a command avoids (Lightning, TorchRL, MLflow); the rest live
    at the top of their module, where the layer and cycle tests above read them."""
    inside = _imports_inside_functions()
    assert len(inside) <= 40, f"{len(inside)} imports inside functions:\n" + "\n".join(inside)


def test_the_harness_stands_on_the_run_api_and_core():
    """studies/ and tuning/ (the harness) import of the library only `ppo_lightning.run` (the run API and
    `ppo_lightning.run.harness`, what else they need of it) and `ppo_lightning.core`, even inside functions;
    of a trained run they use `ppo_lightning.run.Run` and the module's documented member methods."""
    allowed = ("run", "core", "studies", "tuning")
    wrong = [f"{path.relative_to(PKG.parent)}:{line} {target}"
             for layer in ("studies", "tuning") for path in (PKG / layer).rglob("*.py")
             for target, _, line in _imports(path) if _layer(target) not in allowed]
    assert not wrong, "the harness reaches past the run API:\n" + "\n".join(wrong)


def test_the_light_commands_start_without_the_training_stack():
    """``configs``, ``study`` and ``tune`` (parsing, status, reports, pre-flight lines) import no torch:
    the training stack loads only where a run trains or its settings are checked."""
    code = ("import sys; import ppo_lightning.cli.main, ppo_lightning.studies.runner, ppo_lightning.tuning.runner, "
            "ppo_lightning.tuning.summary, ppo_lightning.core.errors; "
            "print(sorted(m for m in ('torch', 'lightning', 'torchrl', 'mlflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _names_the_package_defines() -> set[str]:
    """Every name the package's own code defines: attributes it assigns, functions, classes, arguments,
    variables. A private name outside this set can only be another library's."""
    names: set[str] = set()
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias) and node.asname:
                names.add(node.asname)
    return names


def private_reads_of_dependencies(path: Path, ours: set[str], theirs: set[str]) -> list[str]:
    """``file:line what`` for each private name of another library that ``path`` reads or writes: an
    import of a private module or name, ``obj._name`` / ``getattr(obj, "_name")`` on anything but
    ``self``/``cls`` whose name the package never defines or that an adapter declares its library's
    (``theirs``: our own classes reuse some, such as ``_carrier``). The standard library's are not
    counted (``sys._getframe``)."""
    tree = ast.parse(path.read_text())
    stdlib = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
              if a.name.split(".")[0] in sys.stdlib_module_names}
    rel = path.relative_to(PKG.parent).as_posix()
    found = []

    def theirs_or_unknown(name: str) -> bool:
        return _private(name) and (name not in ours or name in theirs)

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and not node.module.startswith("ppo_lightning"):
            if node.module.split(".")[0] in sys.stdlib_module_names:
                continue
            if any(_private(p) for p in node.module.split(".")) or any(_private(a.name) for a in node.names):
                found.append((node.lineno, f"from {node.module} import {', '.join(a.name for a in node.names)}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in sys.stdlib_module_names and any(_private(p) for p in alias.name.split(".")):
                    found.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.Attribute) and theirs_or_unknown(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if isinstance(root, ast.Name) and root.id in stdlib:
                continue
            found.append((node.lineno, f"{ast.unparse(node)[:60]}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr", "setattr")
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and theirs_or_unknown(node.args[1].value)):
            found.append((node.lineno, f"{node.func.id}(..., {node.args[1].value!r})"))
    return [f"{rel}:{line} {what}" for line, what in found]


def test_other_libraries_private_names_are_read_in_the_adapters_only():
    """An AST walk of the package: outside `ppo_lightning.adapters`, no private name of another library
    (Optuna, Lightning, TorchRL, gymnasium, torch, ...) is read or written. The walk finds them: the
    adapters' own reads are found, one per private name they declare."""
    from ppo_lightning.adapters import gymnasium, lightning, torch, torchrl

    theirs = {name for m in (gymnasium, lightning, torch, torchrl) for name in m.PRIVATE}
    ours = _names_the_package_defines()
    outside = [hit for path in _sources() if "adapters" not in path.relative_to(PKG).parts
               for hit in private_reads_of_dependencies(path, ours, theirs)]
    assert not outside, "private names of other libraries outside ppo_lightning/adapters:\n" + "\n".join(outside)
    inside = " ".join(hit for path in sorted((PKG / "adapters").glob("*.py"))
                      for hit in private_reads_of_dependencies(path, ours, theirs))
    missed = [name for name in sorted(theirs) if name not in inside]
    assert not missed, f"the walk does not see the adapters' own reads of {missed}"


def test_core_reads_nothing_of_lightning():
    """`core` imports no Lightning (nor anything of ppo_lightning but itself and `adapters`), even inside
    functions; an import of it loads no Lightning."""
    for path in (PKG / "core").rglob("*.py"):
        tree = ast.parse(path.read_text())
        modules = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        modules += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        assert not [m for m in modules if m.split(".")[0] in ("lightning", "pytorch_lightning")], path
        assert all(_layer(m) in (None, "core", "adapters") for m in modules if m.startswith("ppo_lightning")), path
    code = ("import sys, ppo_lightning.core.faults, ppo_lightning.core.hardware, ppo_lightning.core.storage, "
            "ppo_lightning.core.members, ppo_lightning.core.threads; print('lightning' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False", out


OLD_FLAT_PATHS = ["ppo_lightning.module", "ppo_lightning.noise_scale", "ppo_lightning.evaluation", "ppo_lightning.hf.loader"]


def test_each_module_has_one_path():
    """The real module paths are the only ones: a flat path (``ppo_lightning.module``) is not a
    module, a subpackage forwards no names of another module (``ppo_lightning.data.RolloutDataModule``
    is not an attribute), and a submodule imports as itself, silently."""
    code = ("import importlib, warnings, json\nwarnings.simplefilter('error')\nout = {}\n"
            f"for old in {OLD_FLAT_PATHS!r}:\n"
            "    try:\n        importlib.import_module(old)\n        out[old] = 'imported'\n"
            "    except ModuleNotFoundError:\n        out[old] = 'missing'\n"
            "import ppo_lightning.data, ppo_lightning.cli\n"
            "out['data.RolloutDataModule'] = hasattr(ppo_lightning.data, 'RolloutDataModule')\n"
            "out['cli.PPOCLI'] = hasattr(ppo_lightning.cli, 'PPOCLI')\n"
            "from ppo_lightning.data import parallel, resume_state\n"
            "from ppo_lightning.cli import evaluate\n"
            "out['submodules'] = [parallel.__name__, resume_state.__name__, evaluate.__name__]\n"
            "print(json.dumps(out))\n")
    proc = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert all(out[old] == "missing" for old in OLD_FLAT_PATHS), out
    assert out["data.RolloutDataModule"] is False and out["cli.PPOCLI"] is False, out
    assert out["submodules"] == ["ppo_lightning.data.parallel", "ppo_lightning.data.resume_state",
                                 "ppo_lightning.cli.evaluate"], out
    forwarders = [str(p.relative_to(PKG.parent)) for p in PKG.rglob("__init__.py")
                  if p.parent != PKG and any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__"
                                             for n in ast.parse(p.read_text()).body)]
    assert not forwarders, forwarders


def test_every_subpackage_says_what_it_holds_and_may_import():
    for layer in LAYERS:
        doc = importlib.import_module(f"ppo_lightning.{layer}").__doc__ or ""
        assert "May import" in doc or layer == "envs", layer
