"""The adapters (`ppo_lightning.adapters`) hold every private name of another library the package
reads; each fails here, loudly and by name, when its library's pinned version moves. What replaced a
private helper of Lightning (`flat_params`, `PRECISION_INPUT`) is checked against that helper."""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from ppo_lightning.adapters import gymnasium as gym_adapter
from ppo_lightning.adapters import lightning as lightning_adapter
from ppo_lightning.adapters import torch as torch_adapter
from ppo_lightning.adapters import torchrl as torchrl_adapter


@pytest.mark.parametrize("adapter", [torch_adapter, torchrl_adapter, gym_adapter, lightning_adapter],
                         ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_each_adapter_reads_its_pinned_library_as_it_was_read(adapter):
    moved = adapter.check()
    assert not moved, (f"{adapter.__name__}: {', '.join(moved)} moved; reread its private accesses against "
                       f"this release and update VERIFIED")


def test_the_direct_vector_step_is_gymnasiums_own():
    """`step_rows` leaves a DISABLED-autoreset ``SyncVectorEnv`` as its own ``step`` does: the same
    observations, rewards and ends, and a partial reset after it resets the same sub-envs."""
    import gymnasium as gym

    def make():
        return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(3)],
                                        autoreset_mode=gym.vector.AutoresetMode.DISABLED)

    ours, theirs = make(), make()
    ours.reset(seed=3)
    theirs.reset(seed=3)
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(60):
        actions = rng.integers(0, 2, size=3)
        obs, rew, term, trunc = gym_adapter.step_rows(ours, actions)
        obs = np.stack(obs)
        want = theirs.step(actions)
        np.testing.assert_array_equal(obs, want[0])
        np.testing.assert_array_equal(rew, want[1])
        np.testing.assert_array_equal(term, want[2])
        np.testing.assert_array_equal(trunc, want[3])
        done = term | trunc
        if done.any():
            ended += 1
            np.testing.assert_array_equal(ours.reset(options={"reset_mask": done})[0],
                                          theirs.reset(options={"reset_mask": done})[0])
    assert ended  # the partial reset was exercised
    ours.close()
    theirs.close()


def test_the_fused_adam_step_is_torchs_adam():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5, 3))
    q = torch.nn.Parameter(p.detach().clone())
    adam = torch.optim.Adam([q], lr=1e-2, betas=(0.8, 0.95), eps=1e-6)
    m, v, step = torch.zeros_like(p), torch.zeros_like(p), torch.zeros(())
    for _ in range(3):
        g = torch.randn(5, 3)
        q.grad = g.clone()
        adam.step()
        torch_adapter.foreach_add_([step], 1)
        with torch.no_grad():
            torch_adapter.fused_adam_([p], [g], [m], [v], [step], lr=1e-2, beta1=0.8, beta2=0.95, weight_decay=0.0, eps=1e-6)
    torch.testing.assert_close(p, q, rtol=0, atol=1e-7)


def test_the_non_finite_check_finds_what_isfinite_finds():
    found, one = torch.zeros(1), torch.ones(1)
    torch_adapter.non_finite_check_([torch.ones(4), torch.zeros(2)], found, one)
    assert found.item() == 0
    torch_adapter.non_finite_check_([torch.ones(4), torch.tensor([0.0, float("nan")])], found, one)
    assert found.item() == 1


def test_a_module_without_a_trainer_has_none():
    from ppo_lightning.training.module import PPOLightningModule

    assert lightning_adapter.attached_trainer(torch.nn.Linear(2, 2)) is None
    module = PPOLightningModule.__new__(PPOLightningModule)
    torch.nn.Module.__init__(module)
    module._trainer, module._fabric, module._jit_is_scripting = None, None, False  # as LightningModule.__init__ sets them
    assert lightning_adapter.attached_trainer(module) is None and lightning_adapter.attached_datamodule(module) is None


def test_the_hyperparameters_are_flattened_as_lightnings_loggers_flatten_them():
    from lightning.fabric.utilities.logger import _convert_params, _flatten_dict  # the oracle

    from ppo_lightning.training.tracking import flat_params

    @dataclass
    class Net:
        hidden: int = 64
        extra: dict | None = None

    cases = [None, {}, Namespace(a=1, b={"c": None}),
             {"lr": 3e-4, "model": {"network": Net(32, {"act": "tanh"}), "betas": [0.9, 0.999]}, "ns": Namespace(x={"y": 2}),
              "empty": {}, 3: "int key"}]
    for params in cases:
        want = _flatten_dict(_convert_params(params))
        got = flat_params(params)
        assert got == want and list(got) == list(want), params


def test_the_trainer_precision_values_are_lightnings():
    from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT  # the oracle

    from ppo_lightning.training.precision import PRECISION_INPUT

    assert PRECISION_INPUT == _PRECISION_INPUT
