"""Studies and searches on every env family, not MinAtar alone: a MuJoCo search of two trials x 2 seeds
runs as one group, and the Extending guide's seed group trains on CartPole. (A CartPole study of two
learning rates x 3 seeds on two workers: the Studies guide's worked example, tests/test_study_guide.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml


ROOT = Path(__file__).resolve().parents[1]


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
