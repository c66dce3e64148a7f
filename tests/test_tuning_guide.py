"""The Tuning guide's worked example runs as printed: the space file the page shows is written into a
folder outside the repository (and is the repository's copy under experiments/tuning/examples/), then
each command of the page's bash block after it runs there, `ppo-lightning` being this checkout's. The
summary the guide shows for the committed Breakout search is what the command prints, its
'8 fresh seeds' command included."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from guide_helpers import blocks, examples
from ppo_lightning.tuning.space import load_space

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "tuning.md"
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_the_guide_shows_its_example_as_the_repository_has_it():
    found = examples(GUIDE)
    assert [name for name, _, _ in found] == ["cartpole_lr.yaml"]
    for name, text, commands in found:
        assert text == (ROOT / "experiments" / "tuning" / "examples" / name).read_text(), name
        assert commands and all(c.startswith("ppo-lightning tune ") and name in c for c in commands), commands


@pytest.mark.timeout(900)
def test_the_worked_example_runs_as_printed_outside_the_repository(tmp_path):
    name, text, commands = examples(GUIDE)[0]
    (tmp_path / name).write_text(text)
    space = load_space(tmp_path / name)
    assert space.fit["video_every"] is None  # a search's fit takes what a study's does
    outs = []
    for command in commands:
        argv = [sys.executable, "-m", "ppo_lightning", *shlex.split(command)[1:]]
        out = subprocess.run(argv, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=800)
        assert out.returncode == 0, f"{command}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        assert "Traceback" not in out.stderr, out.stderr[-3000:]
        outs.append(out.stdout)
    run_root = tmp_path / "runs" / "tuning" / space.name  # beside the file: no repository holds it
    assert (run_root / "best.json").exists() and (run_root / "journal.log").exists()
    assert f"{space.name}: {space.trials} complete" in outs[0], outs[0][-3000:]
    best = [ln for ln in outs[0].splitlines() if "train it on 8 fresh seeds:" in ln]
    assert len(best) == 1 and best[0].endswith(" --seeds 8") and "--seed_everything 1000" in best[0], best
    assert best[0] in outs[1].splitlines()  # --summary-only prints the same summary from the records


def test_the_summary_the_guide_shows_is_the_commands_own(tmp_path):
    """The guide's summary of the committed Breakout search, its '8 fresh seeds' command included
    (``--seeds 8``, as the text says), is what ``tune --summary-only`` prints from that journal."""
    page = GUIDE.read_text()
    shown = next(text for lang, text in blocks(page) if lang == "text" and text.startswith("[tune] minatar-breakout-500k:"))
    assert "train it on 8 fresh seeds:" in shown and shown.rstrip().endswith("--seeds 8")
    shutil.copy(ROOT / "experiments/tuning/records/minatar-breakout-500k.journal.log", tmp_path / "journal.log")
    out = subprocess.run([sys.executable, "-m", "ppo_lightning", "tune", "--space",
                          str(ROOT / "experiments/tuning/minatar_breakout_500k.yaml"), "--run-root", str(tmp_path),
                          "--summary-only", "--no-plots"], env=ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    printed = [ln for ln in out.stdout.splitlines() if ln.startswith("[tune]")]
    assert printed == shown.rstrip("\n").splitlines(), "\n".join(printed)
