"""Group members with their own hyperparameters (``data.member_seeds``, ``data.member_hparams``): member k
trains as the single run with its seed and its settings; bad specs are one-line errors; resume is exact."""

import lightning.pytorch as pl
import pytest
import torch

from ppo_lightning.run.builder import fit_main
from ppo_lightning.data.datamodule import RolloutDataModule
from ppo_lightning.training.module import PPOLightningModule

NET = {"name": "minatar_cnn", "channels": 4, "hidden": 16}
DATA = dict(env_id="minatar:breakout", num_envs=2, rollout_steps=16, num_minibatches=2, update_epochs=2,
            normalize_reward=True, num_threads=1)


class KeepSource(pl.Callback):
    def on_train_end(self, trainer, pl_module):
        trainer.datamodule.kept = trainer.datamodule.source


def fit(dm, **model_kwargs):
    model = PPOLightningModule(dm.observation_space, dm.action_space, seeds=dm.seeds, **{"network": NET, **model_kwargs})
    trainer = pl.Trainer(max_epochs=-1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, callbacks=[KeepSource()])
    trainer.fit(model, datamodule=dm)
    return model, dm, trainer


# member k: (seed, lr, EWMA center of mass or None for PPO, advantage-normalization span, Adam's betas)
MEMBERS = [(0, 3e-3, 4.0, 1.0, (0.9, 0.999)), (0, 1e-3, None, 4.0, (0.9, 0.999)), (1, 3e-3, 16.0, 2.0, (0.8, 0.99))]
ITERATIONS = 9  # 36 gradient steps


def test_each_member_trains_as_its_single_run():
    """A group of 3 members - the same seed at two settings (a different lr, PPO instead of PPO-EWMA, a
    longer advantage span) and another seed with another EWMA age and Adam betas - ends with each member
    within float tolerance of the single run with its seed and settings (same episodes too)."""
    seeds = [m[0] for m in MEMBERS]
    hp = {"lr": [m[1] for m in MEMBERS], "proximal_com": [m[2] for m in MEMBERS],
          "advantage_norm_span": [m[3] for m in MEMBERS], "adam_betas": [list(m[4]) for m in MEMBERS]}
    pl.seed_everything(0)
    gdm = RolloutDataModule(**DATA, total_frames=32 * ITERATIONS, seed=0, member_seeds=seeds, member_hparams=hp)
    assert gdm.num_seeds == 3 and gdm.seeds == seeds
    group, _, gtr = fit(gdm, decoupled=True, proximal_com=4.0, member_hparams=hp, max_importance_ratio=1.05)
    assert gtr.global_step == 4 * ITERATIONS
    assert gtr.callback_metrics["seed2/proximal/com"] == 16.0
    finals = []
    for k, (seed, lr, com, span, betas) in enumerate(MEMBERS):
        pl.seed_everything(seed)
        dm = RolloutDataModule(**DATA, total_frames=32 * ITERATIONS, seed=seed, advantage_norm_span=span)
        ewma = {} if com is None else {"decoupled": True, "proximal_com": com}
        alone, dm, _ = fit(dm, lr=lr, adam_betas=betas, max_importance_ratio=1.05, **ewma)  # a cap that bites: PPO's form exactly
        ref, got = alone.network.state_dict(), group.network.seed_state_dict(k)
        for name in ref:  # the group's convolution is a matmul, the single run's oneDNN's: float order differs
            torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=3e-5, msg=f"member {k} {name}")
        assert dm.states[0].episodes.state_dict() == gdm.kept.states[k].episodes.state_dict()
        finals.append(torch.cat([t.flatten() for t in ref.values()]))
    assert (finals[0] - finals[1]).abs().max() > 1e-3  # the same seed at two settings: two different runs


def test_members_at_one_lr_are_a_plain_group_bitwise():
    """Members that share every setting are exactly a group of those seeds (no lr scaling step)."""
    pl.seed_everything(0)
    hp = {"lr": [3e-3, 3e-3]}
    a, _, _ = fit(RolloutDataModule(**DATA, total_frames=64, seed=0, num_seeds=2), lr=3e-3)
    pl.seed_everything(0)
    b, _, _ = fit(RolloutDataModule(**DATA, total_frames=64, seed=0, member_seeds=[0, 1], member_hparams=hp),
                  lr=1.0, member_hparams=hp)
    assert b.seed_group.adam_members is None
    assert type(b.optimizers(use_pl_optimizer=False)) is type(a.optimizers(use_pl_optimizer=False))
    sa, sb = a.network.state_dict(), b.network.state_dict()
    assert all(torch.equal(sa[n], sb[n]) for n in sa)


@pytest.mark.parametrize("data_kwargs, model_kwargs, match", [
    ({"member_hparams": {"max_importance_ratio": [2, 4]}}, {}, "'max_importance_ratio' cannot differ between members"),
    ({"member_hparams": {"lr": [1e-3]}}, {}, "one value per member"),
    ({"member_hparams": {"lr": [1e-3, -1.0]}}, {}, "lr values must be > 0"),
    ({"member_hparams": {"advantage_norm_span": [1, 0.5]}}, {}, "advantage_norm_span values must be >= 1"),
    ({"member_hparams": {"adam_betas": [[0.9, 0.999], [0.9]]}}, {}, "adam_betas values must be two numbers"),
    ({"member_seeds": [0, 1, 2], "num_seeds": 2}, {}, "member_seeds has 3 seeds but data.num_seeds"),
    ({"num_seeds": 1, "member_hparams": {"lr": [1e-3]}}, {}, "needs a seed group"),
    ({}, {"member_hparams": {"proximal_com": [1.0, None]}}, "needs model.decoupled=true"),
    ({}, {"member_hparams": {"lr": [1e-3, 2e-3]}, "optimizer": "sgd"}, "need model.optimizer adam"),
])
def test_bad_member_specs_are_one_line_errors(data_kwargs, model_kwargs, match):
    with pytest.raises(ValueError, match=match):
        dm = RolloutDataModule(**{"env_id": "minatar:breakout", "num_seeds": 2, **data_kwargs})
        PPOLightningModule(dm.observation_space, dm.action_space, network=NET, seeds=dm.seeds, **model_kwargs)


def test_member_hparams_of_a_single_run_are_refused():
    dm = RolloutDataModule(env_id="minatar:breakout")
    with pytest.raises(ValueError, match="needs a seed group"):
        PPOLightningModule(dm.observation_space, dm.action_space, network=NET, member_hparams={"lr": [1e-3]})


BASE = ["fit", "--config", "ppo_lightning/configs/minatar/ppo_ewma.yaml", "--data.member_seeds", "[0, 0, 1]",
        "--data.member_hparams", '{"lr": [5e-4, 2e-3, 5e-4], "proximal_com": [2, null, 8], "advantage_norm_span": [1, 2, 1], '
        '"adam_betas": [[0.9, 0.999], [0.9, 0.999], [0.81, 0.98]]}',
        "--data.num_envs", "2", "--data.rollout_steps", "16", "--data.num_minibatches", "2", "--data.update_epochs", "2",
        "--model.network.hidden", "16", "--data.num_threads", "1", "--mlflow.enabled", "false", "--video_every", "null",
        "--trainer.enable_progress_bar", "false", "--checkpoint_every", "1", "--trainer.precision", "32-true"]


def test_scale_applies_the_rules_to_each_member_and_a_mixed_group_resumes_exactly(tmp_path):
    """``--scale 2 --scale_adam_betas true``: each member's lr / sqrt(2), center of mass x 2 (null stays
    null), span x 2, betas ** (1/2). A mixed
    group stopped after 2 iterations and resumed to 4 ends bitwise as the uninterrupted one: weights,
    Adam moments and the per-member EWMA (weights, ages)."""
    scaled = BASE + ["--scale", "2", "--scale_adam_betas", "true"]
    cli = fit_main(scaled + ["--data.total_frames", "32", "--run_dir", str(tmp_path / "scaled")])
    hp = cli.model.hparams.member_hparams
    assert hp["lr"] == pytest.approx([5e-4 / 2 ** 0.5, 2e-3 / 2 ** 0.5, 5e-4 / 2 ** 0.5])
    assert hp["proximal_com"] == [4.0, None, 16.0] and hp["advantage_norm_span"] == [2.0, 4.0, 2.0]
    assert hp["adam_betas"][2] == pytest.approx([0.9, 0.98 ** 0.5])
    assert cli.datamodule.num_seeds == 3 and cli.model.seed_group.seeds == [0, 0, 1]

    from tests.test_seed_group import assert_same_training_state, uninterrupted_and_resumed

    a, b = uninterrupted_and_resumed(BASE, tmp_path, 128)
    assert a["state_dict"]["network.inner.policy_body.conv.weight"].shape[0] == 3
    assert_same_training_state(a, b)
    ea, eb = a["proximal_ewma"], b["proximal_ewma"]
    assert ea["com"] == [2.0, 0.0, 8.0] and ea["weight"] == eb["weight"] and ea["age_sum"] == eb["age_sum"]
    # export-hf of member 1 (PPO at lr 2e-3, span 2) describes that member's own run
    import json

    from ppo_lightning.interop.hf.writer import export_hf

    out = export_hf(tmp_path / "ref/checkpoints/last.ckpt", tmp_path / "hf", evaluate=0, seed_index=1)
    card = json.loads((out / "config.json").read_text())
    algo, env = card["algorithm"], card["environment"]
    assert algo["lr"] == 2e-3 and algo["decoupled"] is False and algo["proximal_com"] is None
    assert algo["seeds"] == [0] and algo["member_hparams"] is None
    assert env["advantage_norm_span"] == 2 and env["member_seeds"] is None and env["num_seeds"] == 1


def test_a_ppo_members_loss_is_ppos_with_the_importance_ratio_cap_biting():
    """A PPO member's anchor (the behavior policy, capped as PPO caps it) makes the decoupled loss the
    standard one, terms and gradients, where the cap bites; the decoupled form with the uncapped behavior
    policy as proximal would not be (its factor pi_prox / pi_behav and clip move with the cap)."""
    from tensordict import TensorDict

    from ppo_lightning.algos.loss import PPOFamilyLoss
    from ppo_lightning.nets.models import ActorCritic
    from tests.test_loss import ACT, OBS, grads_of, make_batch, total

    torch.manual_seed(4)
    net = ActorCritic(OBS, ACT, hidden_sizes=(16, 16))
    batch = make_batch(net, seed=4, perturb=1.0)
    batch.set("proximal", TensorDict({"logits": batch["logits"]}, batch_size=batch.batch_size))
    standard = PPOFamilyLoss(net, ACT, max_importance_ratio=1.1)
    member = PPOFamilyLoss(net, ACT, decoupled=True, max_importance_ratio=1.1)
    member.behavior_anchor = torch.tensor(True)
    plain = PPOFamilyLoss(net, ACT, decoupled=True, max_importance_ratio=1.1)
    assert standard(batch.clone())["importance_ratio_capped_fraction"] > 0.05
    for g1, g2 in zip(grads_of(net, total(standard(batch.clone()))), grads_of(net, total(member(batch.clone())))):
        torch.testing.assert_close(g1, g2)
    torch.testing.assert_close(standard(batch.clone())["loss_objective"], member(batch.clone())["loss_objective"])
    assert not torch.allclose(standard(batch.clone())["loss_objective"], plain(batch.clone())["loss_objective"])


def test_member_adam_steps_each_member_bitwise_as_adam_at_its_lr():
    """`MemberAdam` on stacked parameters [4, ...] with lrs (1e-3, 1e-3, 5e-4, 2e-3) and member 1's betas
    (0.8, 0.95): after 6 steps each member's slice, and its moments, equal torch's fused Adam with that
    member's settings on the slice alone, bitwise (the kernel gets each member's own slice); an lr schedule
    that halves the group's lr halves every member's."""
    from ppo_lightning.training.seed_group import MemberAdam

    g = torch.Generator().manual_seed(0)
    lrs = [1e-3, 1e-3, 5e-4, 2e-3]
    stacked = [torch.nn.Parameter(torch.randn(4, 5, 3, generator=g)), torch.nn.Parameter(torch.randn(4, 7, generator=g))]
    alone = [[torch.nn.Parameter(p.detach()[k].clone()) for p in stacked] for k in range(4)]
    betas = [(0.9, 0.99), (0.8, 0.95), (0.9, 0.99), (0.9, 0.99)]
    opt = MemberAdam(stacked, lrs, betas, eps=1e-5, betas=(0.9, 0.99))
    refs = [torch.optim.Adam(ps, lr=lr, eps=1e-5, betas=b, fused=True) for ps, lr, b in zip(alone, lrs, betas)]
    for step in range(6):
        if step == 3:  # a schedule's change of the group lr
            opt.param_groups[0]["lr"] /= 2
            for r in refs:
                r.param_groups[0]["lr"] /= 2
        for i, p in enumerate(stacked):
            p.grad = torch.randn(p.shape, generator=g)
            for k in range(4):
                alone[k][i].grad = p.grad[k].clone()
        opt.step()
        for r in refs:
            r.step()
    for k in range(4):
        for i, p in enumerate(stacked):
            assert torch.equal(p.detach()[k], alone[k][i].detach())
            assert torch.equal(opt.state[p]["exp_avg_sq"][k], refs[k].state[alone[k][i]]["exp_avg_sq"])
    assert not torch.equal(stacked[0].detach()[0], stacked[0].detach()[2])


def test_a_mixed_group_refuses_to_rescale_its_batch(tmp_path):
    fit_main(BASE + ["--data.total_frames", "32", "--run_dir", str(tmp_path / "a")])
    with pytest.raises(ValueError, match="members have their own hyperparameters"):
        fit_main(BASE + ["--data.total_frames", "64", "--run_dir", str(tmp_path / "a"), "--data.num_envs", "4",
                         "--rescale", "true", "--ckpt_path", str(tmp_path / "a/checkpoints/last.ckpt")])
