"""The Studies guide's worked examples run as printed: each study file the page shows is written into a
folder outside the repository (and is the repository's copy under experiments/studies/examples/), then
each command of the page's bash blocks runs there, `ppo-lightning` being this checkout's."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from guide_helpers import examples
from ppo_lightning.studies.spec import load_study

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "studies.md"


def test_the_guide_shows_its_examples_as_the_repository_has_them():
    found = examples(GUIDE)
    assert [name for name, _, _ in found] == ["cartpole_two_lrs.yaml", "minatar_two_arms.yaml"]
    for name, text, commands in found:
        assert text == (ROOT / "experiments" / "studies" / "examples" / name).read_text(), name
        assert all(c.startswith("ppo-lightning study ") and name in c for c in commands), commands


@pytest.mark.timeout(900)
@pytest.mark.parametrize("example", ["cartpole_two_lrs.yaml", "minatar_two_arms.yaml"])
def test_a_worked_example_runs_as_printed_outside_the_repository(example, tmp_path):
    name, text, commands = next(e for e in examples(GUIDE) if e[0] == example)
    (tmp_path / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for command in commands:
        argv = [sys.executable, "-m", "ppo_lightning", *shlex.split(command)[1:]]
        out = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=800)
        assert out.returncode == 0, f"{command}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        assert "Traceback" not in out.stderr, out.stderr[-3000:]
        if " run " in command and example == "cartpole_two_lrs.yaml":  # CartPole, 2 lrs x 3 seeds, packed per lr
            assert "6 to run in 2 groups on 2 worker(s)" in out.stdout, out.stdout[-3000:]
    study = load_study(tmp_path / name)
    assert len(study.cells_csv.read_text().splitlines()) == 1 + len(study.cells())  # every cell recorded
    page = (tmp_path / "report" / name).with_suffix(".md").read_text()
    for arm in study.arms.values():
        assert arm.label in page
