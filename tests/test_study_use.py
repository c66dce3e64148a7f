"""Studies in use: the launcher's progress per worker, the failing arm's first error line, the MLflow
parent run ended with the study, a study file anywhere reports, and CLI output piped into `head`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from ppo_lightning.run import RunSpec
from ppo_lightning.studies.spec import load_study

ROOT = Path(__file__).resolve().parents[1]
TINY_FIT = {"data.num_envs": 4, "data.rollout_steps": 16, "data.num_minibatches": 2, "data.update_epochs": 1,
            "trainer.precision": "32-true", "checkpoint_every": 1000000, "video_every": None, "log_every_frames": 64}


def study_file(folder: Path, **over) -> Path:
    d = {"study": "use", "base": "minatar/ppo", "fit": TINY_FIT, "envs": ["minatar:breakout"],
         "seeds": {"count": 2, "first": 0}, "frames": 256, "score": "raw", "target_half_width": 0.05,
         "arms": [{"name": "ppo", "label": "PPO", "fit": {"model.lr": 0.001}},
                  {"name": "ppo_ewma", "label": "PPO-EWMA", "fit": {"model.decoupled": True, "model.proximal_com": 4}}],
         "comparisons": [{"claim": "EWMA differs from PPO", "a": "ppo_ewma", "b": "ppo", "test": "difference"}]}
    d.update(over)
    path = folder / "use.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def test_cli_output_piped_into_head_ends_quietly(tmp_path):
    out = subprocess.run(f"{sys.executable} -m ppo_lightning configs | head -1", shell=True, capture_output=True,
                         text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.stdout.strip() and "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr


def test_a_study_file_outside_the_repository_reports_with_the_shipped_references(tmp_path):
    """`score: minatar-500k` outside the repository: R_ref comes with the package, not from files
    beside the study."""
    from ppo_lightning.studies.records import Cell, write_export
    from ppo_lightning.studies.report import report

    study = load_study(study_file(tmp_path, score="minatar-500k", seeds={"count": 3, "first": 0}))
    assert study.root == tmp_path  # no repository above it
    curve = [(64.0, 1.0), (128.0, 2.0), (256.0, 3.0)]
    write_export(study, [Cell(a, "minatar:breakout", s, 256, 2.0 + s + (a == "ppo_ewma"), 3.0, curve=curve)
                         for a in study.arms for s in study.seeds])
    text = report(study, tmp_path / "out", plots=False)
    assert "| EWMA differs from PPO (PPO-EWMA vs PPO) | AUC | breakout |" in text and "Scores: minatar-500k" in text


def test_progress_lines_count_recorded_groups_whole_and_the_running_one_from_its_file(tmp_path):
    from ppo_lightning.studies import runner
    from ppo_lightning.studies.records import Cell

    study = load_study(study_file(tmp_path, frames=1000))
    root = tmp_path / "runs"
    g1 = runner.Group("minatar:breakout", [("ppo", 0), ("ppo_ewma", 0)], RunSpec(seed=0))
    g2 = runner.Group("minatar:breakout", [("ppo", 1), ("ppo_ewma", 1)], RunSpec(seed=1))
    g3 = runner.Group("minatar:asterix", [("ppo", 0)], RunSpec(seed=2))
    for a, s in g1.members:  # the first group is recorded
        runner._write_json(runner._cell_path(root, a, g1.env, s), json.loads(json.dumps(Cell(a, g1.env, s, 1000, 1.0, 1.0).__dict__)))
    (root / "groups" / g2.name).mkdir(parents=True)  # the second runs: 250 of 1000 frames, 500 member-frames in 10 s
    (root / "groups" / g2.name / "progress.json").write_text(json.dumps(
        {"frames": 250, "total_frames": 1000, "members": 2, "attempt_frames": 250, "attempt_s": 10.0}))
    lines = runner.progress_lines(study, root, [[g1, g2], [g3]])
    # worker 1: 2000 + 500 of 4000 member-frames; 1500 left at 50 member-frames/s = 30 s
    assert lines[0] == "worker 1: [############........] 2.5k/4.0k member-frames (62%), ~30 s left", lines
    assert lines[1] == "worker 2: [....................] 0.0k/1.0k member-frames (0%), starting", lines


@pytest.mark.parametrize("log, line", [
    ("Traceback (most recent call last):\n  File x\nppo_lightning.core.faults.NumericalFault: non-finite loss at step 3\n",
     "NumericalFault: non-finite loss at step 3"),
    ("some notice\nerror: model.lr: must be > 0, got -1\nTraceback (most recent call last):\nSystemExit: 2\n",
     "error: model.lr: must be > 0, got -1"),
    ("Traceback (most recent call last):\n  File x\nppo_lightning.core.safety.UnsafeInput: --run_dir a and "
     "--trainer.default_root_dir b name two run folders\n",
     "UnsafeInput: --run_dir a and --trainer.default_root_dir b name two run folders"),
    ("all quiet\n", None),
])
def test_the_first_error_line_of_a_worker_log(log, line):
    from ppo_lightning.studies.runner import first_error_line

    assert first_error_line(log) == line


def test_a_failed_job_names_its_arms_and_its_first_error_line(tmp_path):
    from ppo_lightning.studies.runner import job_failures

    err = tmp_path / "0_0_log.err"
    err.write_text("loading\nTraceback (most recent call last):\n  File y\nValueError: observation shape (3,) vs (4,)\n")

    class Failed:
        job_id, paths = "123", SimpleNamespace(stderr=err)

        def result(self):
            raise RuntimeError("Job failed\n...\nSystemExit: 1")

    [line] = job_failures([Failed()], lambda i: "arms ppo, ppo_ewma on CartPole-v1")
    assert line == f"job 123 (arms ppo, ppo_ewma on CartPole-v1): ValueError: observation shape (3,) vs (4,) [log: {err}]"


def test_a_scheduler_that_refuses_the_jobs_is_one_line_with_the_way_out():
    """sbatch with SLURM's controller down: submitit raises its whole stderr; the runner says one line."""
    import submitit

    from ppo_lightning.studies.runner import SubmissionFailed, submit_jobs

    class Refused:
        cluster = "slurm"

        def submit(self, payload):
            raise submitit.core.utils.FailedJobError(
                "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)")

    with pytest.raises(SubmissionFailed) as err:
        submit_jobs(Refused(), [object()])
    assert str(err.value) == ("slurm refused the jobs: sbatch: error: Batch job submission failed: Unable to contact "
                              "slurm controller (connect failure); `--executor local` runs the jobs as processes on "
                              "this machine")


def test_a_study_run_shows_progress_and_ends_its_parent_run_finished(tmp_path, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    from ppo_lightning.studies import runner

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    study = load_study(study_file(tmp_path))
    root, uri = tmp_path / "runs", f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert runner.run_study(study, workers=1, executor="local", run_root=root, tracking_uri=uri, poll_s=0.5,
                            progress_s=1) == 0
    out = capsys.readouterr().out
    assert "worker 1: [####################] 1.0k/1.0k member-frames (100%), done" in out or "4/4 cells done" in out, out
    assert "worker 1: [" in out
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(study.name)
    [parent] = client.search_runs([exp.experiment_id], filter_string="tags.study_parent = 'true'")
    assert parent.info.status == "FINISHED" and "missing_cells" not in parent.data.tags
    [group] = list((root / "groups").glob("*/progress.json"))
    assert json.loads(group.read_text())["frames"] == 256


def test_the_effects_plot_keeps_every_label_whole_and_splits_long_files(tmp_path):
    """64 comparisons: three images of at most 24 rows, each label the arms' full labels (wrapped, never cut)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from ppo_lightning.studies import report as rep
    from ppo_lightning.studies.analysis import Result

    study = load_study(study_file(tmp_path))
    results = [Result(claim="c", a="ppo_ewma", b="ppo", metric=m, test="difference", envs=("minatar:breakout",), n_a=8, n_b=8,
                      effect=0.005 * i, low=-0.1, high=0.2, method="stratified bootstrap", p_improve=None, verdict="",
                      resolved=False, seeds_for_target=8, stratum=f"s{i}")
               for i in range(32) for m in ("auc", "final")]
    seen = []
    real = plt.Figure.savefig

    def spy(fig, path, **kw):
        seen.append([t.get_text() for t in fig.axes[0].get_yticklabels()])
        return real(fig, path, **kw)

    plt.Figure.savefig = spy
    try:
        paths = rep.effects_plot(study, results, tmp_path / "x_effects.png", "32-true")
    finally:
        plt.Figure.savefig = real
    assert [p.name for p in paths] == ["x_effects.png", "x_effects_2.png"] and all(p.exists() for p in paths)
    assert [len(labels) for labels in seen] == [24, 8]
    assert all(t.replace("\n", " ").startswith("PPO-EWMA vs PPO [s") for labels in seen for t in labels)


def test_a_raw_score_study_reports_in_returns_with_its_stated_half_width(tmp_path):
    """Issue 65: a raw-score study that compares arms states its target half-width (in returns); the
    report names the units, gives each claim's text in its row and, for an arm of 2 seeds, no interval
    but "n = 2" and the two runs."""
    from ppo_lightning.studies.records import Cell, write_export
    from ppo_lightning.studies.report import report
    from ppo_lightning.studies.spec import StudyError

    d = {"study": "raw", "base": "minatar/ppo", "fit": TINY_FIT, "envs": ["minatar:breakout"], "seeds": {"count": 2, "first": 0},
         "frames": 256, "arms": [{"name": "ppo", "label": "PPO"}, {"name": "hi", "label": "PPO, lr 1e-3", "fit": {"model.lr": 0.001}}],
         "comparisons": [{"claim": "a higher lr learns faster", "a": "hi", "b": "ppo", "test": "difference"}]}
    path = tmp_path / "raw.yaml"
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(StudyError, match=r"^.*raw\.yaml: target_half_width: required with score: raw where the file compares arms"):
        load_study(path)
    path.write_text(yaml.safe_dump({**d, "comparisons": []}))  # nothing compared: nothing to resolve, no target needed
    assert load_study(path).target_half_width is None
    path.write_text(yaml.safe_dump({**d, "target_half_width": 25}))
    study = load_study(path)
    assert study.units == "raw return" and study.target_half_width == 25
    runs = {("ppo", 0): 10.0, ("ppo", 1): 14.0, ("hi", 0): 30.0, ("hi", 1): 36.0}
    write_export(study, [Cell(a, "minatar:breakout", s, 256, v, v, curve=[(128.0, v), (256.0, v)]) for (a, s), v in runs.items()])
    text = report(study, tmp_path / "out", plots=False)
    assert "normalized score" not in text
    assert "difference of means (a - b) of the raw return" in text and "target 25 (raw return)" in text
    header = next(line for line in text.splitlines() if line.startswith("| claim (a vs b) |"))
    assert "effect (a - b) [95% CI], raw return" in header and header.endswith("| seeds/arm for ±25 |")
    row = next(line for line in text.splitlines() if line.startswith("| a higher lr learns faster (PPO, lr 1e-3 vs PPO) | AUC |"))
    # 2 seeds an arm: Welch's t, half-width t(0.975, 1.74 dof) sqrt(36/2 / 2 + 8 / 2) = 17.9 returns, within the 25 stated
    assert "**+21.000 [+3.066, +38.934]** (2 vs 2 seeds; Welch t" in row and "CI half-width" not in row
    arms = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith(("| PPO |", "| PPO, lr 1e-3 |"))}
    assert arms["| PPO"].startswith("| PPO | 2 | 12.000 (n = 2: 10.000, 14.000) |  | 12.000 (n = 2: 10.000, 14.000) |  |")
    assert arms["| PPO, lr 1e-3"].startswith("| PPO, lr 1e-3 | 2 | 33.000 (n = 2: 30.000, 36.000) |")
    assert "Arms (all 1 envs; raw return;" in text
