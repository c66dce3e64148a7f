"""Issue 36 on a real SLURM (one node: `.ci/slurm.sh` starts munge, slurmctld and slurmd): a tiny study
runs through submitit's SLURM executor, its job is requeued mid-way (``scontrol requeue``, as a
preemption does), resumes from its checkpoint and records the cells and the report the local
executor gives for the same study. Skipped, with the reason, where SLURM is not installed or not up."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

import pytest

from ppo_lightning.studies.spec import load_study

from test_studies import ROOT, TINY_FIT, tiny


def _slurm_up() -> str | None:
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "SLURM is not installed (no sinfo/sbatch): .ci/slurm.sh installs and starts a one-node SLURM"
    out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=20)
    if out.returncode != 0 or not any(s.startswith(("idle", "mix")) for s in out.stdout.split()):
        return f"no idle SLURM node ({(out.stderr or out.stdout).strip()[:200]}): run .ci/slurm.sh"
    return None


def _jobs(name: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i %T"], capture_output=True, text=True, timeout=20)
    return [line.split()[0] for line in out.stdout.splitlines() if line.split()[1:] == ["RUNNING"]]


@pytest.mark.timeout(300)
def test_a_requeued_slurm_job_resumes_and_reports_as_the_local_executor(tmp_path, monkeypatch):
    reason = _slurm_up()
    if reason:
        pytest.skip(reason)
    from ppo_lightning.studies import runner
    from ppo_lightning.studies.report import analyse, markdown

    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    fit = {**TINY_FIT, "log_every_frames": 64}
    studies = {}
    for where in ("slurm", "local"):
        (tmp_path / where).mkdir()
        studies[where] = load_study(tiny(tmp_path / where, study=f"tiny-slurm-{os.getpid()}", fit=fit, frames=64 * 48))
    uri = lambda where: f"sqlite:///{tmp_path / where / 'mlflow.db'}"  # noqa: E731
    root = tmp_path / "slurm" / "runs"
    done: dict = {}
    run = threading.Thread(target=lambda: done.update(code=runner.run_study(
        studies["slurm"], workers=1, executor="slurm", run_root=root, tracking_uri=uri("slurm"), poll_s=1,
        checkpoint_frames=64)))
    run.start()
    # preempt it once it has checkpointed: requeued, the job runs again and resumes
    deadline = time.time() + 150
    ckpt = None
    while time.time() < deadline and ckpt is None:
        ckpt = next(iter(root.glob("groups/*/checkpoints/last.ckpt")), None)
        time.sleep(0.5)
    assert ckpt is not None, "the SLURM job wrote no checkpoint"
    jobs = _jobs(studies["slurm"].name)
    assert jobs, "no running SLURM job to requeue"
    subprocess.run(["scontrol", "requeue", jobs[0]], check=True, timeout=20)
    run.join(240)
    assert not run.is_alive() and done.get("code") == 0, done
    cells = runner.recorded(root)
    assert len(cells) == 2 and all(c.attempts == 2 for c in cells.values()), {k: c.attempts for k, c in cells.items()}
    assert runner.run_study(studies["local"], workers=1, executor="local", run_root=tmp_path / "local" / "runs",
                            tracking_uri=uri("local"), poll_s=1) == 0
    local = runner.recorded(tmp_path / "local" / "runs")
    assert {k: (c.curve, c.auc_return, c.final_return) for k, c in cells.items()} == {
        k: (c.curve, c.auc_return, c.final_return) for k, c in local.items()}
    from ppo_lightning.studies.records import load_cells

    texts = []
    for where in ("slurm", "local"):
        got = load_cells(studies[where], curves=True)
        texts.append(markdown(studies[where], analyse(studies[where], got), got, {}).splitlines()[1:])  # line 0: hours
    assert texts[0] == texts[1]
