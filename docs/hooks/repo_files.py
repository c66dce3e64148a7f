"""MkDocs hook: files that live beside the experiments come into the site from there, not as copies.

- ``experiments/results/**/*.png``: the figures the experiment scripts write. They keep their
  repository path in the site, so ``docs/experiments/*.md`` show them as ``results/minatar/ewma.png``
  (the same relative links that ``experiments/README.md`` used).
- ``experiments/{procgen,mujoco}/README.md`` (each config folder's notes) become the pages
  ``experiments/procgen/`` and ``experiments/mujoco/``, with the PNGs beside them.

A rerun of an experiment script updates its page at the next ``make docs``; nothing to copy by hand.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
CONFIG_FOLDERS = ("procgen", "mujoco")


def repo_files(root: Path = ROOT) -> dict[str, Path]:
    """The site path (``src_uri``) of every file brought in, and the repository file it comes from."""
    out: dict[str, Path] = {}
    for png in sorted((root / "experiments" / "results").rglob("*.png")):
        out[png.relative_to(root).as_posix()] = png
    for folder in CONFIG_FOLDERS:
        path = root / "experiments" / folder
        out[f"experiments/{folder}/index.md"] = path / "README.md"
        for png in sorted(path.glob("*.png")):
            out[f"experiments/{folder}/{png.name}"] = png
    return out


def on_files(files: Files, config) -> Files:
    for uri, path in repo_files().items():
        if not path.is_file():
            raise PluginError(f"docs hook: {path.relative_to(ROOT)} is missing")
        if files.get_file_from_path(uri) is not None:
            raise PluginError(f"docs hook: {uri} is in docs/ and also brought in from {path.relative_to(ROOT)}")
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
