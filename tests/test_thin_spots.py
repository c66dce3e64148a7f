"""Regression tests where the suite was thin (issue 13, item 7): each checks the pipeline against an
independent oracle (a closed form over recorded data, a transcribed table), not a copy of the code."""

import math

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from ppo_lightning.algos.advantages import RewardNormalizer
from ppo_lightning.data.datamodule import RolloutDataModule
from ppo_lightning.nets.models import build_network
from ppo_lightning.training.module import PPOLightningModule


def test_reward_normalizer_over_several_rollouts_and_at_its_clip():
    """Running std of the per-env discounted return over *all* rollouts so far (population variance
    of every return seen; it would be off with the merge term of the running moments dropped), the
    return restarting after each end, and the clip at +-10."""
    gamma, n_envs, T = 0.9, 3, 7
    rng = np.random.default_rng(0)
    norm = RewardNormalizer(n_envs, gamma)
    seen, ret = [], np.zeros(n_envs)
    for k, scale in enumerate((1.0, 5.0, 0.2, 3.0)):  # rollouts of different scales: the merge term matters
        r = rng.normal(scale * (k - 1), scale, (n_envs, T))
        d = rng.random((n_envs, T)) < 0.15
        out = norm(torch.tensor(r, dtype=torch.float32).unsqueeze(-1), torch.tensor(d).unsqueeze(-1)).squeeze(-1)
        for t in range(T):  # the oracle: plain loops over the recorded data
            ret = gamma * ret + r[:, t]
            seen.extend(ret.tolist())
            ret[d[:, t]] = 0.0
        std = np.sqrt(np.var(seen) + 1e-8)
        np.testing.assert_allclose(out.numpy(), np.clip(r / std, -10, 10), rtol=2e-4, atol=1e-5)
    # Two outliers ending their episodes (each enters the variance once) among 150 zero returns:
    # std = 1e4 * sqrt(2 / 255) < 1e3, so both exceed 10 std and are clipped.
    T2 = 50
    huge, done = torch.zeros(n_envs, T2, 1), torch.zeros(n_envs, T2, 1, dtype=torch.bool)
    huge[1, 3], huge[2, 5] = 1e4, -1e4
    done[1, 3], done[2, 5] = True, True
    done[:, 0] = True  # the returns carried over from the rollouts above end first
    out = norm(huge, done).squeeze(-1)
    assert out[1, 3] == 10.0 and out[2, 5] == -10.0 and out[0].abs().max() == 0.0


def test_advantage_ewma_moments_with_a_window_inside_the_pipeline():
    """Span 2 (a window of 2 iterations: decay 1 - 1/2 = 0.5) through the rollout source: each iteration's advantages are normalized by the
    mean and std of *all* advantages so far, sample j of iteration i weighted 0.5**(k - i)."""
    dm = RolloutDataModule(num_envs=4, rollout_steps=8, num_minibatches=2, update_epochs=1, seed=1,
                           advantage_norm_span=2.0)
    net = build_network(dm.observation_space, dm.action_space, {"name": "mlp", "hidden_sizes": [8]})
    source = dm.make_source(net)
    raws = []
    try:
        for k in range(4):
            rollout = source.rollouts()[0]
            raws.append(rollout.get("advantage").reshape(-1).double().clone())
            got = source.prepare(rollout).get("advantage").reshape(-1).double()
            w = torch.cat([torch.full_like(a, 0.5 ** (k - i)) for i, a in enumerate(raws)])
            x = torch.cat(raws)
            mean = (w * x).sum() / w.sum()
            std = ((w * (x - mean) ** 2).sum() / w.sum()).sqrt()
            torch.testing.assert_close(got, (raws[-1] - mean) / (std + 1e-8), rtol=1e-4, atol=1e-5)
    finally:
        source.collector.shutdown()


class KLRecorder(pl.Callback):
    """Per iteration: the mean kl_anchor of the last epoch's steps (before the module adapts beta) and
    the beta before and after."""

    def __init__(self):
        self.rows = []

    def on_train_epoch_start(self, trainer, pl_module):
        self.beta_before = float(pl_module.loss_module.kl_beta)

    def on_train_epoch_end(self, trainer, pl_module):  # callbacks run before the module's hook
        kl = pl_module.step_stat("kl_anchor")
        per_epoch = trainer.datamodule.num_minibatches
        self.rows.append({"before": self.beta_before, "kl_last_epoch": kl[-per_epoch:].mean().item(),
                          "kl_all": kl.mean().item()})

    def on_train_end(self, trainer, pl_module):
        self.final_beta = float(pl_module.loss_module.kl_beta)


@pytest.mark.parametrize("kl_target,factor", [(1e-7, 2.0), (1e3, 0.5)])
def test_adaptive_kl_doubles_or_halves_on_the_last_epochs_kl(kl_target, factor):
    """PPO paper: beta x2 when the KL exceeds 1.5 target, /2 below target/1.5, decided once per
    iteration on the mean KL (to the anchor) of the iteration's last epoch."""
    pl.seed_everything(0)
    dm = RolloutDataModule(num_envs=4, rollout_steps=16, num_minibatches=2, update_epochs=3, total_frames=3 * 64,
                           seed=2)
    model = PPOLightningModule(dm.observation_space, dm.action_space, network={"name": "mlp", "hidden_sizes": [16]},
                               objective="adaptive_kl", kl_beta=1.0, kl_target=kl_target, lr=1e-2)
    rec = KLRecorder()
    trainer = pl.Trainer(max_epochs=-1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, callbacks=[rec])
    trainer.fit(model, dm)
    betas = [r["before"] for r in rec.rows] + [rec.final_beta]
    assert betas == [factor**i for i in range(4)]
    for r in rec.rows:
        assert (r["kl_last_epoch"] > 1.5 * kl_target) if factor == 2.0 else (r["kl_last_epoch"] < kl_target / 1.5)
    assert trainer.callback_metrics["train/kl_anchor_last_epoch"].item() == pytest.approx(rec.rows[-1]["kl_last_epoch"])
    assert rec.rows[-1]["kl_last_epoch"] != pytest.approx(rec.rows[-1]["kl_all"])  # which KL matters


def test_held_out_evaluation_with_episodes_that_end():
    """CartPole pays 1 per step, so every ended episode's return equals its length: the evaluation's
    return and length means must agree, and episodes must have ended."""
    from types import SimpleNamespace

    from ppo_lightning.interop.evaluation import HeldOutEvaluation

    pl.seed_everything(0)
    dm = RolloutDataModule(num_envs=2, rollout_steps=8, total_frames=16)
    model = PPOLightningModule(dm.observation_space, dm.action_space, network={"name": "mlp", "hidden_sizes": [8]})
    ev = HeldOutEvaluation(num_envs=4, num_steps=120, train_levels=True)
    trainer = SimpleNamespace(datamodule=dm, global_rank=0)
    ev.setup(trainer, model, "fit")
    try:
        m = ev.evaluate(trainer, model)
        m2 = ev.evaluate(trainer, model)  # envs persist: episodes running at the end carry on
    finally:
        ev.teardown(trainer, model, "fit")
    for split in ("test", "train"):
        assert m[f"eval/{split}/episodes"] >= 4
        assert m[f"eval/{split}/return_mean"] == pytest.approx(m[f"eval/{split}/length_mean"])
        assert 8 <= m[f"eval/{split}/length_mean"] <= 120
    assert m2["eval/test/episodes"] >= 1


# Transcribed from the Procgen paper's normalization constants (as published with Procgen / PPG);
# the implementation's dict must agree with this independent copy, game by game.
PROCGEN_TABLE = """
coinrun 5 10 5 10
starpilot 2.5 64 1.5 35
caveflyer 3.5 12 2 13.4
dodgeball 1.5 19 1.5 19
fruitbot -1.5 32.4 -0.5 27.2
chaser 0.5 13 0.5 14.2
miner 1.5 13 1.5 20
jumper 1 10 1 10
leaper 1.5 10 1.5 10
maze 5 10 4 10
bigfish 1 40 0 40
heist 3.5 10 2 10
climber 2 12.6 1 12.6
plunder 4.5 30 3 30
ninja 3.5 10 2 10
bossfight 0.5 13 0.5 13
"""


def test_all_16_procgen_score_constants():
    from ppo_lightning.envs.procgen_env import GAMES
    from ppo_lightning.envs.procgen_scores import normalized_return, return_range

    rows = [line.split() for line in PROCGEN_TABLE.strip().splitlines()]
    assert sorted(r[0] for r in rows) == sorted(GAMES) and len(rows) == 16
    for game, e_min, e_max, h_min, h_max in rows:
        assert return_range(game, "easy") == (float(e_min), float(e_max)), game
        assert return_range(game, "hard") == (float(h_min), float(h_max)), game
        assert return_range(game, "memory") == (float(h_min), float(h_max)), game  # other modes use hard
        assert normalized_return(game, "hard", float(h_max)) == 1.0 and normalized_return(game, "hard", float(h_min)) == 0.0
    assert math.isnan(normalized_return("coinrun", "hard", float("nan")))


@pytest.mark.parametrize("mode", ["behavior", "proximal"])
def test_staleness_behavior_and_proximal_modes_through_the_data_module(mode):
    """Staleness 1 through the rollout source, weights moved between iterations. ``behavior``: the
    old policy is the one that collected the data (its log-probs kept); ``proximal``: it is the
    current network's. In both, values are the collecting critic's; no ``proximal`` key is added."""
    import copy

    from ppo_lightning.nets.models import make_distribution

    dm = RolloutDataModule(num_envs=2, rollout_steps=8, num_minibatches=1, update_epochs=1, seed=0, staleness=1,
                           staleness_mode=mode)
    net = build_network(dm.observation_space, dm.action_space, {"name": "mlp", "hidden_sizes": [8]})
    source = dm.make_source(net)
    try:
        previous_net = None  # the network that collected the rollout trained on next
        for it in range(3):
            collector_net = copy.deepcopy(net)  # this iteration's fresh rollout is collected by this network
            (batch,) = list(iter(source))
            obs, action = batch["observation"], batch["action"]
            with torch.no_grad():
                current_lp = make_distribution(dm.action_space, *net.policy(obs)).log_prob(action)
                # values stay the collecting critic's (the reference's protocol: only the bootstrap is recomputed)
                collected_by = net if it == 0 else previous_net
                torch.testing.assert_close(batch["state_value"].reshape(-1), collected_by.value(obs).reshape(-1))
                if it >= 1:  # trains on the rollout collected one iteration ago, by the previous network
                    assert not torch.allclose(previous_net.value(obs), net.value(obs))
                    old_lp = make_distribution(dm.action_space, *previous_net.policy(obs)).log_prob(action)
                    expected = old_lp if mode == "behavior" else current_lp
                    torch.testing.assert_close(batch["action_log_prob"], expected)
                    assert not torch.allclose(old_lp, current_lp)
            assert "proximal" not in batch.keys()
            previous_net = collector_net
            with torch.no_grad():  # "training"
                for p in net.parameters():
                    p.add_(0.3 * torch.randn_like(p))
    finally:
        source.collector.shutdown()
