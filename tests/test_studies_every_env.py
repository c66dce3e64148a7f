"""Issue 46: studies and searches on every env family, not MinAtar alone. A CartPole study of two
learning rates x 3 seeds packs its cells into groups and runs end to end on two local workers; a
MuJoCo search of two trials x 2 seeds runs as one group."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from ppo_lightning.studies.spec import load_study

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE_FIT = {"data.num_envs": 2, "data.rollout_steps": 32, "data.num_minibatches": 2, "data.update_epochs": 1,
                "trainer.precision": "32-true", "checkpoint_every": 1000000, "video_every": None, "log_every_frames": 64}


@pytest.mark.timeout(600)
def test_a_cartpole_study_of_two_lrs_by_three_seeds_runs_on_two_workers(tmp_path, monkeypatch):
    from ppo_lightning.studies import runner

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    spec = {"study": "cartpole_lr", "base": "cartpole/ppo", "fit": CARTPOLE_FIT, "envs": ["CartPole-v1"],
            "seeds": {"count": 3, "first": 0}, "frames": 256, "score": "raw",
            "arms": [{"name": "lr_lo", "label": "lr 1e-3", "fit": {"model.lr": 0.001}},
                     {"name": "lr_hi", "label": "lr 3e-3", "fit": {"model.lr": 0.003}}],
            "comparisons": [{"claim": "lr does not matter", "a": "lr_lo", "b": "lr_hi", "test": "equivalence",
                             "margin": 100.0}]}
    path = tmp_path / "cartpole_lr.yaml"
    path.write_text(yaml.safe_dump(spec))
    study = load_study(path)
    groups = runner.plan(study, set(), workers=2)
    assert sum(len(g.members) for g in groups) == 6 and any(len(g.members) > 1 for g in groups)  # packed
    root, uri = tmp_path / "runs", f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert runner.run_study(study, workers=2, executor="local", run_root=root, tracking_uri=uri, poll_s=1) == 0
    assert len(list((root / "cells").glob("*.json"))) == 6
    rows = study.cells_csv.read_text().splitlines()
    assert len(rows) == 7 and all("CartPole-v1" in r for r in rows[1:])


@pytest.mark.timeout(600)
def test_a_mujoco_search_of_two_trials_by_two_seeds_trains_as_one_group(tmp_path, monkeypatch, capsys):
    """``tune`` on Hopper-v5 (the MuJoCo recipe: observation and reward normalization, lr annealing):
    two trials x 2 seeds, searched lr and clip range, as one group of 4 members on one local worker."""
    pytest.importorskip("mujoco")
    from optuna.trial import TrialState

    from ppo_lightning.tuning.command import main
    from ppo_lightning.tuning.space import load_space

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    space = {"tuning": "hopper", "base": "mujoco/ppo_hopper", "env": "Hopper-v5", "frames": 128, "trials": 2,
             "members": 4, "seeds": {"count": 2, "first": 0}, "objective": {"metric": "auc", "score": "raw"},
             "sampler": {"name": "random", "seed": 0},
             "fit": {"data.num_envs": 2, "data.rollout_steps": 32, "data.num_minibatches": 2, "data.update_epochs": 1,
                     "trainer.precision": "32-true"},
             "params": {"model.lr": {"type": "float", "low": 1e-4, "high": 1e-3, "log": True},
                        "model.clip_eps": {"type": "categorical", "choices": [0.1, 0.2]}}}
    path = tmp_path / "hopper.yaml"
    path.write_text(yaml.safe_dump(space))
    root = tmp_path / "runs"
    assert main(["--space", str(path), "--run-root", str(root), "--workers", "1", "--executor", "local"]) == 0
    from ppo_lightning.tuning import runner

    trials = runner.open_study(load_space(path), runner.journal_path(root)).get_trials()
    real = [t for t in trials if not t.user_attrs.get("surplus")]
    assert [t.state for t in real] == [TrialState.COMPLETE] * 2
    assert "[tune] best: trial" in capsys.readouterr().out


def test_the_extending_guides_cartpole_group_trains(tmp_path):
    """docs/guides/extending.md's example: ``--config cartpole/ppo_ewma ... --seeds 2`` (early stopping on
    the group's mean return included)."""
    from ppo_lightning.cli.fit import main

    args = ["fit", "--config", "cartpole/ppo_ewma", "--seeds", "2", "--data.total_frames", "512",
            "--mlflow.enabled", "false", "--video_every", "null", "--trainer.enable_progress_bar", "false",
            "--run_dir", str(tmp_path)]
    assert main(args) == 0
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()
