"""The GPU path's plumbing (ppo_lightning.data.devices), checked on the CPU; CUDA-only parts skip."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from ppo_lightning.algos.advantages import RewardNormalizer, make_gae
from ppo_lightning.data.devices import collector_devices, device_env_kwargs, network_device

ROOT = Path(__file__).resolve().parents[1]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_collector_devices_put_policy_and_rollout_on_the_training_device():
    assert collector_devices("cpu") == {}  # TorchRL's defaults: all on the CPU
    kw = collector_devices(torch.device("cuda", 1))
    assert kw["env_device"] == torch.device("cpu")  # the envs step on the host
    assert kw["policy_device"] == kw["storing_device"] == torch.device("cuda", 1)
    assert kw["no_cuda_sync"] is True  # only the actions' copy to the host synchronizes
    assert network_device(torch.nn.Linear(2, 2)) == torch.device("cpu")


def test_only_procgen_on_a_gpu_gets_pinned_observations():
    base = {"distribution_mode": "hard"}
    assert device_env_kwargs("procgen:coinrun", base, "cuda") == {**base, "pin_memory": True}
    assert device_env_kwargs("procgen:coinrun", base, "cpu") == base
    assert device_env_kwargs("CartPole-v1", {}, "cuda") == {}


def test_vectorized_gae_of_the_gpu_path_equals_the_cpu_loop():
    """The GPU path's GAE (vectorized) against the CPU's (time loop) on a rollout with episode ends."""
    g = torch.Generator().manual_seed(0)
    envs, steps = 3, 40
    done = torch.rand(envs, steps, 1, generator=g) < 0.1
    td = TensorDict({
        "state_value": torch.randn(envs, steps, 1, generator=g),
        "next": {"state_value": torch.randn(envs, steps, 1, generator=g),
                 "reward": torch.randn(envs, steps, 1, generator=g), "done": done, "terminated": done.clone()},
    }, batch_size=[envs, steps])
    loop, vec = make_gae(0.99, 0.95, "cpu"), make_gae(0.99, 0.95, "cuda")
    assert not loop.vectorized and vec.vectorized
    a, b = loop(td.clone()), vec(td.clone())
    torch.testing.assert_close(a["advantage"], b["advantage"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a["value_target"], b["value_target"], rtol=1e-5, atol=1e-5)


def test_reward_normalizer_checkpoint_state_is_on_the_host():
    norm = RewardNormalizer(num_envs=2, gamma=0.9)
    norm(torch.ones(2, 5, 1), torch.zeros(2, 5, 1, dtype=torch.bool))
    assert norm.state_dict()["ret"].device.type == "cpu"


def test_gpu_check_without_a_gpu_exits_at_once_with_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    env = {**os.environ, "PATH": str(tmp_path) + os.pathsep + os.environ.get("PATH", "")}
    fake = tmp_path / "nvidia-smi"  # no NVIDIA driver: nvidia-smi fails, as on a CPU machine
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    fake.chmod(0o755)
    t = time.perf_counter()
    proc = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_check.sh")], capture_output=True, text=True, env=env)
    assert time.perf_counter() - t < 5
    assert proc.returncode != 0 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "no NVIDIA GPU" in proc.stderr
    # The Python side alone (a machine with a driver but a CPU build of torch, or no visible GPU).
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_check.py")], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(ROOT)})
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1 and "gpu_check:" in proc.stderr


@cuda
def test_pinned_procgen_observations_match_the_plain_ones():
    from ppo_lightning.envs.procgen_env import ProcgenTorchEnv

    plain, pinned = ProcgenTorchEnv("coinrun", 4, seed=3), ProcgenTorchEnv("coinrun", 4, seed=3, pin_memory=True)
    a, b = plain.reset(), pinned.reset()
    for _ in range(5):
        assert b["observation"].is_pinned() and torch.equal(a["observation"], b["observation"])
        action = torch.randint(0, 15, (4,))
        a = plain.step(a.set("action", action))["next"]
        b = pinned.step(b.set("action", action))["next"]
    plain.close(), pinned.close()


@cuda
def test_procgen_training_on_a_gpu_keeps_the_rollout_there(tmp_path):
    """A small PPO-EWMA run with accelerator gpu: rollout, GAE and minibatches on the GPU."""
    import lightning.pytorch as pl

    from ppo_lightning.data.datamodule import RolloutDataModule
    from ppo_lightning.training.module import PPOLightningModule

    dm = RolloutDataModule(env_id="procgen:coinrun", num_envs=4, rollout_steps=32, num_minibatches=2,
                           update_epochs=1, total_frames=256, normalize_reward=True, num_threads=1)
    model = PPOLightningModule(dm.observation_space, dm.action_space,
                               network={"name": "impala_cnn", "channels": [8, 8, 8], "dense": 32},
                               decoupled=True, proximal_com=4.0)
    seen = []

    class Spy(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append(batch.get("observation").device.type)

    from ppo_lightning.training.precision import PPOTrainer

    trainer = PPOTrainer(accelerator="gpu", devices=1, max_epochs=-1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, callbacks=[Spy()], default_root_dir=tmp_path, precision="auto")
    trainer.fit(model, dm)
    assert dm.frames == 256 and seen and set(seen) == {"cuda"}
