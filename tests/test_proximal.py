"""PPO-EWMA: the weighted EWMA equals the explicit weighted average of the weight history."""

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from ppo_lightning.algos.proximal import ProximalPolicyEWMA, beta_from_com, com_from_beta, ewma_update_


def test_com_beta_conversions():
    assert beta_from_com(8) == pytest.approx(8 / 9)  # 0.889, the paper's default
    assert com_from_beta(8 / 9) == pytest.approx(8.0)
    assert beta_from_com(0) == 0.0
    for com in (0.5, 3.0, 2048.0):
        assert com_from_beta(beta_from_com(com)) == pytest.approx(com)
    with pytest.raises(ValueError):
        beta_from_com(-1)
    with pytest.raises(ValueError):
        com_from_beta(1.0)


def explicit_average(history, beta):
    """sum_i beta^(n-i) theta_i / sum_i beta^(n-i) over the weights theta_0 (the copy) .. theta_n."""
    n = len(history) - 1
    w = torch.tensor([beta ** (n - i) for i in range(n + 1)], dtype=torch.float64)
    stacked = torch.stack([h.double() for h in history])
    return (w[:, None] * stacked).sum(0) / w.sum()


@pytest.mark.parametrize("com", [0.0, 2.0, 8.0])
def test_ewma_update_equals_weighted_history(com):
    beta = beta_from_com(com)
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(10, generator=g)
    prox = theta.clone()
    weight = 1.0
    history = [theta.clone()]
    for _ in range(25):
        theta = theta + torch.randn(10, generator=g)
        history.append(theta.clone())
        weight = ewma_update_([prox], [theta], beta, weight)
    torch.testing.assert_close(prox.double(), explicit_average(history, beta), rtol=1e-5, atol=1e-5)
    assert weight == pytest.approx(sum(beta**i for i in range(26)))
    if com == 0.0:
        torch.testing.assert_close(prox, theta)  # beta 0: the proximal policy is the current one


class RecordWeights(Callback):
    def __init__(self):
        self.history = []

    def on_train_start(self, trainer, pl_module):
        self.history.append(torch.nn.utils.parameters_to_vector(pl_module.network.parameters()).detach().clone())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.history.append(torch.nn.utils.parameters_to_vector(pl_module.network.parameters()).detach().clone())


def tiny_run(tmp_path, com=3.0, frames=3 * 64, **data_kwargs):
    from ppo_lightning.data.datamodule import RolloutDataModule
    from ppo_lightning.training.module import PPOLightningModule

    kw = dict(env_id="CartPole-v1", num_envs=4, rollout_steps=16, num_minibatches=2, update_epochs=2,
              total_frames=frames, seed=0)
    kw.update(data_kwargs)
    dm = RolloutDataModule(**kw)
    model = PPOLightningModule(dm.observation_space, dm.action_space, network={"name": "mlp", "hidden_sizes": [16]},
                               decoupled=True, proximal_com=com, lr=1e-2)
    return dm, model


def test_module_applies_ewma_after_every_optimizer_step(tmp_path):
    dm, model = tiny_run(tmp_path)
    rec = RecordWeights()
    trainer = pl.Trainer(max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[rec], default_root_dir=tmp_path)
    trainer.fit(model, dm)
    ewma = model.proximal_source
    assert isinstance(ewma, ProximalPolicyEWMA)
    steps = trainer.global_step
    assert steps == 3 * 2 * 2 and ewma.num_updates == steps and len(rec.history) == steps + 1
    prox = torch.nn.utils.parameters_to_vector(ewma.proximal.parameters())
    torch.testing.assert_close(prox.double(), explicit_average(rec.history, ewma.beta), rtol=1e-5, atol=1e-6)
    # The age is the center of mass of the weights actually averaged, tending to the COM.
    n = steps
    w = [ewma.beta ** (n - i) for i in range(n + 1)]
    assert ewma.age == pytest.approx(sum(wi * (n - i) for i, wi in enumerate(w)) / sum(w))
    assert 0 < ewma.age < 3.0


def test_ewma_state_round_trip():
    net = torch.nn.Linear(3, 2)
    cb = ProximalPolicyEWMA(com=4.0)
    cb.reset(net)
    with torch.no_grad():
        net.weight.add_(1.0)
    cb.update()
    state = cb.state_dict()
    other = ProximalPolicyEWMA(com=4.0)
    other.reset(torch.nn.Linear(3, 2))
    other.load_state_dict(state)  # pending until start() (fit start), as in a resumed fit
    assert other.weight == 1.0
    other.start(torch.nn.Linear(3, 2))
    assert other.weight == cb.weight and other.age == cb.age and other.num_updates == 1
    torch.testing.assert_close(other.proximal.weight, cb.proximal.weight)
    mismatch = ProximalPolicyEWMA(com=8.0)
    mismatch.start(torch.nn.Linear(3, 2))
    with pytest.raises(ValueError, match="center of mass"):
        mismatch.load_state_dict(state)


@pytest.mark.parametrize("members", [None, 3])
def test_proximal_policy_reads_the_networks_current_observation_statistics(members):
    """The EWMA averages weights, not the observation normalizer's statistics: right after a reset the
    proximal policy is the policy, also after the statistics moved (a new rollout's observations), for a
    single network and for a group's stacked one (each member its own statistics)."""
    from ppo_lightning.nets.actor_critic import ActorCritic
    from ppo_lightning.nets.obs_norm import update_member_observation_norms, update_observation_norm
    from ppo_lightning.nets.seed_stack import SeedStack

    def make(seed):
        torch.manual_seed(seed)
        return ActorCritic({"shape": [5], "dtype": "float32"}, {"type": "continuous", "shape": [2]},
                           hidden_sizes=(16, 16), normalize_observation=True)

    net = make(0) if members is None else SeedStack([make(s) for s in range(members)])
    src = ProximalPolicyEWMA(com=8.0)
    src.start(net)
    lead = () if members is None else (members,)
    for shift in (0.0, 5.0, 40.0):  # observations far from the initial statistics (mean 0, var 1)
        obs = torch.randn(*lead, 64, 5) * 7 + shift
        if members is None:
            update_observation_norm(net, obs)
        else:
            update_member_observation_norms(net, [obs[k] * (k + 1) for k in range(members)])
        with torch.no_grad():
            want = net.policy(obs)
        got = src.proximal_policy(obs)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    src.update()  # weights equal, so the average stays the policy
    for a, b in zip(src.proximal_policy(obs), net.policy(obs)):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=0)
