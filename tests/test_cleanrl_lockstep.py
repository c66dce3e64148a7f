"""benchmarks/cleanrl_lockstep.py (``throughput.py --cleanrl``): the child runs a script iteration by
iteration, timed alone, with the benchmark's sizes and threads. CleanRL's own script is not shipped;
a stand-in script that prints ``SPS:`` at the end of every iteration, as CleanRL's does, is enough."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lockstep():
    spec = importlib.util.spec_from_file_location("cleanrl_lockstep", ROOT / "benchmarks/cleanrl_lockstep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


STANDIN = """
import sys, time
import torch
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
expected = {"--env-id": "coinrun", "--num-envs": "4", "--num-steps": "8", "--num-minibatches": "2",
            "--update-epochs": "3"}
if any(args.get(k) != v for k, v in expected.items()) or torch.get_num_threads() != 1:
    raise SystemExit(f"wrong arguments {args} or threads {torch.get_num_threads()}")
iterations = int(args["--total-timesteps"]) // 32
for i in range(1, iterations + 1):
    t = time.process_time()
    while time.process_time() - t < 0.05 * i:  # iteration i burns 0.05 i CPU seconds
        pass
    print("global_step=..., episodic_return=...")  # dropped
    print("SPS:", 100)
"""


def test_cleanrl_lockstep_runs_one_timed_iteration_per_step(tmp_path):
    mod = _lockstep()
    script = tmp_path / "standin.py"
    script.write_text(textwrap.dedent(STANDIN))
    c = mod.CleanRLLockstep(str(script), game="coinrun", num_envs=4, num_steps=8, num_minibatches=2, update_epochs=3,
                            max_iterations=3, threads=1, procgen_threads=0)
    try:
        assert c.frames_per_iteration == 32 and c.warmup["cpu_s"] >= 0.05  # start-up + iteration 1
        rows = [c.step(), c.step()]  # iterations 2 and 3: 0.10 and 0.15 CPU seconds of burning
    finally:
        c.close()
    assert c.rows == rows and c._proc.returncode == 0  # stopped by the parent, not run to its end
    for row, burn in zip(rows, (0.10, 0.15)):
        assert burn <= row["cpu_s"] < burn + 0.05, rows  # one iteration each, timed alone
        assert row["wall_s"] >= row["cpu_s"] * 0.5


def test_cleanrl_lockstep_reports_the_script_error_and_missing_requirements(tmp_path):
    mod = _lockstep()
    script = tmp_path / "broken.py"
    script.write_text("raise ValueError('the script broke')\n")
    with pytest.raises(RuntimeError, match="the script broke"):
        mod.CleanRLLockstep(str(script), game="coinrun", num_envs=4, num_steps=8, num_minibatches=2,
                            update_epochs=3, max_iterations=1, threads=1, procgen_threads=0)
    with pytest.raises(FileNotFoundError, match="--cleanrl: no such file"):
        mod.CleanRLLockstep(str(tmp_path / "missing.py"), game="coinrun", num_envs=4, num_steps=8, num_minibatches=2,
                            update_epochs=3, max_iterations=1, threads=1, procgen_threads=0)
    # a folder that hides gym (an empty module named gym whose version is too new) gives one line
    fake = tmp_path / "site"
    (fake / "gym").mkdir(parents=True)
    (fake / "gym" / "__init__.py").write_text("")
    (fake / "gym-0.26.2.dist-info").mkdir()
    (fake / "gym-0.26.2.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: gym\nVersion: 0.26.2\n")
    error = mod.requirements_error(str(fake))
    assert error is not None and "\n" not in error and error.startswith("--cleanrl: the script needs")
    assert ("gym==0.23.1" in error) or ("pip install tyro tensorboard" in error)
