"""The network code of an exported folder, generated from the training code (pure torch).

An exported folder must load with only torch, transformers and safetensors installed, yet its
architecture must not drift from the one that trained it. So the folder's ``networks_ppo_lightning.py``
is not a second copy written by hand: `network_source` reads the source of
``ppo_lightning.nets.models`` (and the modules it imports from, e.g. ``impala`` and ``obs_norm``),
starts from ``build_network`` and ``make_distribution``, follows every top-level name they use
(functions, classes, constants; ``from ppo_lightning.x import y`` inside functions too) and writes
those definitions, in dependency order, into one file. A new architecture that ``build_network``
can build is exported with no change here.

The generated file may import only the standard library and torch: a definition that needs
anything else (tensordict, torchrl, lightning) raises `BundleError` at export time, naming it.
"""

from __future__ import annotations

import ast
import sys
import builtins
import importlib
import inspect

PACKAGE = "ppo_lightning"
ROOTS = (("ppo_lightning.nets.models", "build_network"), ("ppo_lightning.nets.models", "make_distribution"))
# torch and the standard library: what a virtualenv with only torch, transformers and safetensors has.
ALLOWED_IMPORTS = frozenset({"torch", *sys.stdlib_module_names})


class BundleError(RuntimeError):
    """The network code uses something that cannot go into a self-contained file."""


def _top_level(tree: ast.Module) -> tuple[dict[str, ast.stmt], dict[str, ast.stmt]]:
    """(definitions by name, imports by bound name) of a module."""
    defs: dict[str, ast.stmt] = {}
    imports: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        defs[n.id] = node
        elif isinstance(node, ast.Import):
            for a in node.names:
                imports[(a.asname or a.name).split(".")[0]] = ast.Import(names=[a])
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            for a in node.names:
                imports[a.asname or a.name] = ast.ImportFrom(module=node.module, names=[a], level=node.level)
    return defs, imports


class _Uses(ast.NodeTransformer):
    """Collects the names a definition uses (not in annotations) and drops inner package imports."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.package_imports: list[tuple[str, str, str]] = []  # (module, name, bound name)

    def visit_Name(self, node: ast.Name) -> ast.Name:
        self.names.add(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        return node  # skip the annotation

    def visit_FunctionDef(self, node):
        # the return annotation stays in the text, never evaluated (from __future__ import annotations)
        for field in ("decorator_list", "body"):
            setattr(node, field, [self.visit(n) for n in getattr(node, field)])
        node.args = self.visit(node.args)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node: ast.AnnAssign):
        if node.value is not None:
            node.value = self.visit(node.value)
        node.target = self.visit(node.target)
        return node

    def visit_ImportFrom(self, node: ast.ImportFrom):
        if node.module and node.module.split(".")[0] == PACKAGE:
            for a in node.names:
                self.package_imports.append((node.module, a.name, a.asname or a.name))
            return ast.Pass()
        return node


def network_source(roots: tuple[tuple[str, str], ...] = ROOTS) -> str:
    """The self-contained source of ``roots`` and everything they use (see the module doc)."""
    modules: dict[str, tuple[dict, dict]] = {}

    def module(name: str) -> tuple[dict, dict]:
        if name not in modules:
            modules[name] = _top_level(ast.parse(inspect.getsource(importlib.import_module(name))))
        return modules[name]

    emitted: dict[str, tuple[str, str]] = {}  # bound name -> (module, name)
    order: list[ast.stmt] = []
    header: dict[str, ast.stmt] = {}
    visiting: set[tuple[str, str]] = set()
    done_nodes: set[int] = set()

    def need(mod: str, name: str, chain: str) -> None:
        defs, imports = module(mod)
        key = (mod, name)
        if name in defs:
            if emitted.get(name, key) != key:
                raise BundleError(f"{name} is defined in both {emitted[name][0]} and {mod}")
            if key in visiting or id(defs[name]) in done_nodes:
                return
            visiting.add(key)
            uses = _Uses()
            node = uses.visit(ast.parse(ast.unparse(defs[name])).body[0])  # a copy, inner imports dropped
            for dep_mod, dep_name, bound in uses.package_imports:
                if bound != dep_name:
                    raise BundleError(f"{mod}.{name}: 'import {dep_name} as {bound}' cannot be bundled")
                need(dep_mod, dep_name, f"{chain} -> {dep_name}")
            for used in sorted(uses.names - {name}):
                if used in defs or used in imports:
                    need(mod, used, f"{chain} -> {used}")
            emitted[name] = key
            done_nodes.add(id(defs[name]))
            order.append(node)
            return
        if name in imports:
            imp = imports[name]
            target = imp.module if isinstance(imp, ast.ImportFrom) else imp.names[0].name
            if isinstance(imp, ast.ImportFrom) and target.split(".")[0] == PACKAGE:
                need(target, imp.names[0].name, chain)
                return
            if target.split(".")[0] not in ALLOWED_IMPORTS:
                raise BundleError(f"the exported network code would import {target} ({chain}); only torch and the standard library are allowed")
            header[ast.unparse(imp)] = imp
            return
        if not hasattr(builtins, name):
            raise BundleError(f"{mod}: cannot find {name!r} ({chain})")

    for mod, name in roots:
        need(mod, name, name)
    lines = [
        '"""Network code of a ppo_lightning actor-critic: generated by ``ppo-lightning export-hf`` from',
        "the package's own definitions (``ppo_lightning.interop.hf.bundle``). Pure torch: no ppo_lightning needed.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        *sorted(header),
        "",
    ]
    for node in order:
        lines += ["", ast.unparse(node), ""]
    return "\n".join(lines).rstrip() + "\n"
