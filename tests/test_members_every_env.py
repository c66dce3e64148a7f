"""Issue 46: members for every env family. Member k of a group is seed k trained alone, for CartPole
(gymnasium), Hopper (MuJoCo, observation and reward normalization, lr schedule) and a Procgen game.

Where it is not bitwise, the cause: oneDNN/MKL choose different float orders for a batched matmul
(``baddbmm``, what ``vmap`` makes of ``F.linear`` over stacked weights) and for a single one (``addmm``):
up to ~1e-6 apart for some small shapes (e.g. ``[3, 16] @ [16, 2]``; other shapes agree bitwise). The
envs, seeds, action draws and episode bookkeeping are the single run's; the tests bound the drift.
"""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from ppo_lightning.data.datamodule import RolloutDataModule
from ppo_lightning.training.module import PPOLightningModule

MLP = {"name": "mlp", "hidden_sizes": [16, 16], "activation": "tanh"}


class KeepSource(pl.Callback):
    def on_train_end(self, trainer, pl_module):
        trainer.datamodule.kept = trainer.datamodule.source


def run(env_id, seed, num_seeds, iterations, data_kwargs=None, trainer_kwargs=None, **model_kwargs):
    data_kwargs = {"num_envs": 2, "rollout_steps": 16, "num_minibatches": 2, "update_epochs": 2, **(data_kwargs or {})}
    frames = data_kwargs["num_envs"] * data_kwargs["rollout_steps"] * iterations
    pl.seed_everything(seed)
    dm = RolloutDataModule(env_id=env_id, total_frames=frames, seed=seed, num_seeds=num_seeds, num_threads=1,
                           **data_kwargs)
    model_kwargs.setdefault("network", MLP)
    model = PPOLightningModule(dm.observation_space, dm.action_space, seeds=dm.seeds, **model_kwargs)
    trainer = pl.Trainer(max_epochs=-1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, callbacks=[KeepSource()], **(trainer_kwargs or {}))
    trainer.fit(model, datamodule=dm)
    return model, dm, trainer


def assert_member_is_alone(env_id, iterations, num_seeds=2, rtol=1e-5, atol=1e-5, same_episodes=True,
                           data_kwargs=None, trainer_kwargs=None, collector=None, **model_kwargs):
    group, gdm, gtr = run(env_id, 0, num_seeds, iterations, data_kwargs, trainer_kwargs, **model_kwargs)
    if collector is not None:
        assert type(gdm.kept.collector).__name__ == collector
    worst = 0.0
    for k in range(num_seeds):
        alone, dm, atr = run(env_id, k, 1, iterations, data_kwargs, trainer_kwargs, **model_kwargs)
        assert atr.global_step == gtr.global_step
        ref, got = alone.network.state_dict(), group.network.seed_state_dict(k)
        assert ref.keys() == got.keys()
        for name in ref:
            worst = max(worst, (got[name].double() - ref[name].double()).abs().max().item())
            torch.testing.assert_close(got[name], ref[name], rtol=rtol, atol=atol)
        if same_episodes:
            assert dm.states[0].episodes.state_dict() == gdm.kept.states[k].episodes.state_dict()
    return worst


@pytest.mark.parametrize("batched, collector", [(True, "BatchedRollout"), (False, "LockstepRollout")])
def test_cartpole_member_k_trains_as_seed_k_alone(batched, collector):
    """PPO-EWMA on CartPole-v1, 12 iterations of 4 gradient steps: each member of a group of 2 has its
    single run's episodes exactly and its weights within 1e-5 (matmul float order, module doc), whether
    the members' gymnasium vector envs are stepped directly (`VectorGames`) or through TorchRL's env."""
    worst = assert_member_is_alone("CartPole-v1", 12, lr=3e-3, decoupled=True, proximal_com=4.0,
                                   data_kwargs={"batched_rollout": batched}, collector=collector)
    assert worst < 1e-5


def test_hopper_member_k_trains_as_seed_k_alone():
    """The MuJoCo recipe (Hopper-v5: observation normalization in the network, reward normalization,
    linear lr annealing, value clipping, gradient-norm clipping) in a group of 2, 6 iterations: each
    member's weights, observation statistics included, within 1e-4 of its single run's (continuous
    actions carry the matmul's float-order differences into the simulator: the bound is looser)."""
    pytest.importorskip("mujoco")
    net = {**MLP, "normalize_observation": True}
    worst = assert_member_is_alone(
        "Hopper-v5", 6, rtol=1e-4, atol=1e-4, same_episodes=False, data_kwargs={"normalize_reward": True},
        collector="BatchedRollout",
        trainer_kwargs={"gradient_clip_val": 0.5}, network=net, lr=3e-4, lr_schedule="linear", value_clip_eps=0.2,
        entropy_coef=0.0)
    assert worst < 1e-4


def test_procgen_member_k_trains_as_seed_k_alone():
    """Procgen coinrun (easy, one procgen vector env per member with its own seed), a small IMPALA
    CNN, group of 2, 4 iterations: each member's episodes are its single run's and its weights within
    1e-4 (vmap runs the convolutions as one grouped convolution: another float order than oneDNN's)."""
    pytest.importorskip("procgen")
    net = {"name": "impala_cnn", "channels": [4, 8], "dense": 16}
    worst = assert_member_is_alone(
        "procgen:coinrun", 4, rtol=1e-4, atol=1e-4, collector="LockstepRollout",
        data_kwargs={"env_kwargs": {"distribution_mode": "easy"}, "num_envs": 2, "rollout_steps": 16}, network=net,
        lr=5e-4)
    assert worst < 1e-4


@pytest.mark.parametrize("config", ["cartpole/ppo_ewma", "mujoco/ppo_hopper"])
def test_a_group_resumes_exactly(tmp_path, config):
    """A group of 2 (CartPole PPO-EWMA; the Hopper recipe with its observation and reward normalization)
    stopped after 2 iterations and resumed to 4 ends bitwise as the uninterrupted group: the members'
    gymnasium envs (MuJoCo's simulation state included), carried steps, generators and normalizers
    are in its checkpoint."""
    from test_seed_group import assert_same_training_state, uninterrupted_and_resumed

    extra = []
    if "mujoco" in config:  # its linear lr schedule runs over data.total_frames, which the stopped run halves
        pytest.importorskip("mujoco")
        extra = ["--model.lr_schedule", "constant"]
    base = ["fit", "--config", config, "--seeds", "2", "--data.num_envs", "2", "--data.rollout_steps", "16",
            "--data.num_minibatches", "2", "--data.update_epochs", "2", "--data.num_threads", "1",
            "--mlflow.enabled", "false", "--video_every", "null", "--trainer.enable_progress_bar", "false",
            "--checkpoint_every", "1", "--trainer.precision", "32-true", *extra]
    a, b = uninterrupted_and_resumed(base, tmp_path, 128)
    assert_same_training_state(a, b)
    group = a["RolloutDataModule"]["per_rank"][0]["resume"]["seed_group"]
    assert all(e["restorable"] for e in group["envs"])


class PerMember(torch.nn.Module):
    """A network for ``[S, n, ...]`` inputs that runs ``net`` on each member's slice: the single run's own
    kernels, so that a rollout loop's env stepping and draws compare bitwise (no matmul float order)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, obs):
        return tuple(torch.stack(x) for x in zip(*(self.net(o) for o in obs)))


@pytest.mark.parametrize("env_id, loop", [("CartPole-v1", "BatchedRollout"), ("CartPole-v1", "LockstepRollout"),
                                          ("Hopper-v5", "BatchedRollout"), ("procgen:coinrun", "LockstepRollout")])
def test_a_members_rollouts_are_its_single_runs_collector_rollouts_bitwise(env_id, loop):
    """Three rollouts of one member (its envs seeded as the single run's, its actions on a generator at the
    single run's state) equal the single run's TorchRL collector rollouts bitwise, key by key: the
    gymnasium vector env stepped directly (`VectorGames`, discrete and continuous draws) or TorchRL's env
    stepped per member (`LockstepRollout`)."""
    pytest.importorskip("mujoco" if "Hopper" in env_id else "procgen" if "procgen" in env_id else "gymnasium")
    from ppo_lightning.data.batched_rollout import BatchedRollout
    from ppo_lightning.data.lockstep import LockstepRollout, vector_games
    from ppo_lightning.data.source import RolloutSource
    from ppo_lightning.envs import make_env
    from ppo_lightning.nets.models import build_network

    torch.set_num_threads(1)
    kwargs = {"distribution_mode": "easy"} if "procgen" in env_id else {}
    dm = RolloutDataModule(env_id=env_id, env_kwargs=kwargs, num_envs=3, rollout_steps=40, seed=5, num_minibatches=1)
    net_cfg = ({"name": "impala_cnn", "channels": [4, 8], "dense": 16} if "procgen" in env_id
               else {**MLP, "normalize_observation": True})
    torch.manual_seed(5)
    net = build_network(dm.observation_space, dm.action_space, net_cfg)
    state = torch.get_rng_state()
    source = dm.make_source(net)
    ref = [next(source._iterator) for _ in range(3)]
    generator = torch.Generator()
    generator.set_state(state)
    env = make_env(env_id, 3, 5, kwargs)
    args = ([env], PerMember(net), dm.action_space, 120, [generator])
    rollout = BatchedRollout(*args, games=vector_games) if loop == "BatchedRollout" else LockstepRollout(*args)
    got = [rollout.rollouts()[0] for _ in range(3)]
    assert sum(int(r.get(("next", "done")).sum()) for r in ref) > 0 or "CartPole" not in env_id  # resets compared
    for a, b in zip(ref, got):
        for key in b.keys(True, True):
            assert torch.equal(a.get(key), b.get(key)), key
