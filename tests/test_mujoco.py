"""Issue 12: the MuJoCo recipe (observation normalization in the network, linear lr annealing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ppo_lightning.nets.obs_norm import RunningObservationNorm
from ppo_lightning.algos.schedules import make_lr_scheduler

ROOT = Path(__file__).resolve().parents[1]


def test_running_observation_norm_matches_the_moments_of_all_data():
    rng = np.random.default_rng(0)
    chunks = [rng.normal(3.0, 2.0, size=(n, 5)) * np.arange(1, 6) for n in (7, 100, 1)]
    norm = RunningObservationNorm(5)
    for chunk in chunks:
        norm.update(torch.from_numpy(chunk).float().reshape(-1, 1, 5))  # any leading shape
    data = np.concatenate([c.astype(np.float32) for c in chunks]).astype(np.float64)
    np.testing.assert_allclose(norm.mean.numpy(), data.mean(0), rtol=1e-9)
    np.testing.assert_allclose(norm.var.numpy(), data.var(0), rtol=1e-9)
    assert norm.count.item() == len(data)
    x = torch.tensor([data[0], data.mean(0) + 100 * data.std(0)], dtype=torch.float32)
    y = norm(x)
    np.testing.assert_allclose(y[0].numpy(), (data[0] - data.mean(0)) / np.sqrt(data.var(0) + 1e-8), rtol=1e-5)
    assert torch.all(y[1] == 10.0)  # clipped


def test_linear_lr_annealing():
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=3e-4)
    sched = make_lr_scheduler("linear", opt, total_frames=1000, frames_per_iteration=250)["scheduler"]
    lrs = []
    for _ in range(4):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([3e-4, 3e-4 * 0.75, 3e-4 * 0.5, 3e-4 * 0.25])
    assert make_lr_scheduler("constant", opt, 1000, 250) is None


@pytest.mark.parametrize("config", ["ppo_hopper.yaml", "ppo_halfcheetah.yaml"])
def test_mujoco_config_trains_and_saves_its_normalizer(config, tmp_path):
    pytest.importorskip("mujoco")
    from ppo_lightning.cli.fit import main

    args = ["fit", "--config", str(ROOT / "ppo_lightning/configs/mujoco" / config), "--data.num_envs", "2",
            "--data.rollout_steps", "32", "--data.num_minibatches", "2", "--data.update_epochs", "1",
            "--data.total_frames", "192", "--mlflow.enabled", "false", "--video_every", "null",
            "--trainer.enable_progress_bar", "false", "--run_dir", str(tmp_path)]
    assert main(args) == 0
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    # statistics of the rollouts before the last one (updated before each collection)
    assert ckpt["state_dict"]["network.obs_norm.count"].item() == 2 * 64
    assert ckpt["hyper_parameters"]["lr_schedule"] == "linear"
    assert ckpt["lr_schedulers"][0]["last_epoch"] == 3
