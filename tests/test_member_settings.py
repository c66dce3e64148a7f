"""Group members with their own loss and return settings (issue 40): clip range, entropy and value
coefficients, gamma and GAE lambda, the KL beta. Member k trains as the single run with its seed and
settings; a group whose members share a value stays on the scalar path."""

import lightning.pytorch as pl
import pytest
import torch

from ppo_lightning.data.datamodule import RolloutDataModule
from ppo_lightning.training.module import PPOLightningModule
from tests.test_group_members import DATA, NET, KeepSource, fit

ITERATIONS = 4  # 16 gradient steps


def assert_member_is_its_single_run(group, gdm, k, seed, model_kwargs, data_kwargs):
    pl.seed_everything(seed)
    dm = RolloutDataModule(**{**DATA, **data_kwargs}, total_frames=32 * ITERATIONS, seed=seed)
    alone, dm, _ = fit(dm, **model_kwargs)
    ref, got = alone.network.state_dict(), group.network.seed_state_dict(k)
    for name in ref:  # the group's convolution is a matmul, the single run's oneDNN's: float order differs
        torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=3e-5, msg=f"member {k} {name}")
    assert dm.states[0].episodes.state_dict() == gdm.kept.states[k].episodes.state_dict()
    return alone


def test_members_with_their_own_clip_coefficients_gamma_and_lambda_are_their_single_runs():
    members = [  # (seed, clip_eps, entropy_coef, value_coef, gamma, gae_lambda)
        (0, 0.1, 0.0, 1.0, 0.9, 0.8),
        (0, 0.3, 0.05, 0.25, 0.99, 1.0),
    ]
    names = ("clip_eps", "entropy_coef", "value_coef", "gamma", "gae_lambda")
    hp = {n: [m[i + 1] for m in members] for i, n in enumerate(names)}
    pl.seed_everything(0)
    gdm = RolloutDataModule(**DATA, total_frames=32 * ITERATIONS, seed=0, member_seeds=[m[0] for m in members],
                            member_hparams=hp)
    group, _, _ = fit(gdm, member_hparams=hp, lr=3e-3)
    assert group.loss_module.clip_eps.shape == (2, 1) and group.loss_module.value_coef.shape == (2,)
    finals = []
    for k, (seed, clip, ent, vf, gamma, lam) in enumerate(members):
        alone = assert_member_is_its_single_run(group, gdm, k, seed, dict(lr=3e-3, clip_eps=clip, entropy_coef=ent,
                                                                          value_coef=vf), dict(gamma=gamma, gae_lambda=lam))
        finals.append(torch.cat([t.flatten() for t in alone.network.state_dict().values()]))
    assert (finals[0] - finals[1]).abs().max() > 1e-3  # one seed at two settings: two different runs


def test_members_with_their_own_kl_beta_adapt_it_as_their_single_runs():
    hp = {"kl_beta": [0.25, 4.0]}
    model = dict(objective="adaptive_kl", kl_target=0.001, lr=3e-3)
    pl.seed_everything(0)
    gdm = RolloutDataModule(**DATA, total_frames=32 * ITERATIONS, seed=0, member_seeds=[0, 1], member_hparams=hp)
    group, _, gtr = fit(gdm, member_hparams=hp, **model)
    for k, (seed, beta) in enumerate(zip([0, 1], hp["kl_beta"])):
        alone = assert_member_is_its_single_run(group, gdm, k, seed, dict(model, kl_beta=beta), {})
        assert float(group.loss_module.kl_beta[k]) == float(alone.loss_module.kl_beta) != beta  # adapted from its own start


def test_members_with_their_own_kl_target_adapt_their_betas_as_their_single_runs():
    """Adaptive KL members with their own d_targ in one group (one below the KL these steps reach, one
    above): each beta adapts on its own KL towards its own target and ends at its single run's; weights too."""
    hp = {"kl_target": [1e-5, 0.03]}
    model = dict(objective="adaptive_kl", kl_beta=1.0, lr=3e-3)
    pl.seed_everything(0)
    gdm = RolloutDataModule(**DATA, total_frames=32 * ITERATIONS, seed=0, member_seeds=[0, 0], member_hparams=hp)
    group, _, _ = fit(gdm, member_hparams=hp, **model)
    assert group.loss_module.kl_target.tolist() == [1e-5, 0.03]
    for k, target in enumerate(hp["kl_target"]):
        alone = assert_member_is_its_single_run(group, gdm, k, 0, dict(model, kl_target=target), {})
        assert float(group.loss_module.kl_beta[k]) == float(alone.loss_module.kl_beta)
    assert float(group.loss_module.kl_beta[0]) != float(group.loss_module.kl_beta[1])  # one seed, two targets


def test_members_sharing_a_loss_setting_keep_it_a_number():
    from ppo_lightning.algos.loss import PPOFamilyLoss
    from ppo_lightning.nets.models import ActorCritic
    from ppo_lightning.nets.seed_stack import SeedStack
    from tests.test_loss import ACT, OBS

    loss = PPOFamilyLoss(SeedStack([ActorCritic(OBS, ACT, hidden_sizes=(8,)) for _ in range(2)]), ACT, stacked_seeds=True)
    loss.set_member_settings({"clip_eps": [0.1, 0.1], "value_coef": [0.5, 1.0]})
    assert loss.clip_eps == 0.1 and loss.value_coef.tolist() == [0.5, 1.0]
    with pytest.raises(ValueError, match="'lr' is not a per-member loss setting"):
        loss.set_member_settings({"lr": [1.0, 2.0]})


@pytest.mark.parametrize("hp, match", [
    ({"gamma": [0.9, 1.5]}, r"gamma values must be in \[0, 1\]"),
    ({"clip_eps": [0.1, 0.0]}, "clip_eps values must be > 0"),
    ({"entropy_coef": [0.1, -0.01]}, "entropy_coef values must be >= 0"),
    ({"kl_beta": [1.0, None]}, "kl_beta values must be >= 0"),
    ({"num_envs": [1, 2]}, "'num_envs' cannot differ between members"),
])
def test_bad_member_loss_settings_are_one_line_errors(hp, match):
    with pytest.raises(ValueError, match=match):
        RolloutDataModule(env_id="minatar:breakout", num_seeds=2, member_hparams=hp)


# ----------------------------------------------------------------------------------- refilling a slot
class RefillAt(pl.Callback):
    """Refill member ``k`` with ``(seed, values)`` before iteration ``at`` (0-based) starts."""

    def __init__(self, at, k, seed, values):
        self.at, self.k, self.seed, self.values = at, k, seed, values

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.at:
            pl_module.refill_member(self.k, self.seed, self.values)


def test_a_refilled_member_is_a_fresh_single_run_of_its_trial():
    """A group of 2 (one lr: a plain Adam) trains 3 iterations; member 1's slot is then refilled with
    another seed and other settings (lr, EWMA age, clip range, gamma) and trains 4 more. Member 1
    ends as the fresh single run of the new trial over 4 iterations (weights within float tolerance,
    the same episodes), member 0 as its own single run over 7: fresh weights, Adam moments and step
    count, EWMA, normalizers, envs and episode statistics for the slot, the rest untouched."""
    first = {"lr": [3e-3, 3e-3], "proximal_com": [4.0, None], "clip_eps": [0.2, 0.1], "gamma": [0.99, 0.9]}
    new = {"lr": 1e-3, "proximal_com": 8.0, "clip_eps": 0.3, "gamma": 0.95}
    pl.seed_everything(0)
    gdm = RolloutDataModule(**DATA, total_frames=32 * 7, seed=0, member_seeds=[0, 1], member_hparams=first)
    model = PPOLightningModule(gdm.observation_space, gdm.action_space, network=NET, seeds=gdm.seeds, decoupled=True,
                               proximal_com=4.0, member_hparams=first, max_importance_ratio=1.05)
    trainer = pl.Trainer(max_epochs=-1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, callbacks=[KeepSource(), RefillAt(3, 1, 5, new)])
    trainer.fit(model, datamodule=gdm)
    assert type(trainer.optimizers[0]).__name__ == "MemberAdam" and gdm.seeds == [0, 5]
    assert trainer.optimizers[0].param_groups[0]["member_step_offsets"] == [0, 12]
    pl.seed_everything(5)
    dm = RolloutDataModule(**DATA, total_frames=32 * 4, seed=5, gamma=0.95)
    alone, dm, _ = fit(dm, lr=1e-3, decoupled=True, proximal_com=8.0, clip_eps=0.3, max_importance_ratio=1.05)
    for name, ref in alone.network.state_dict().items():
        torch.testing.assert_close(model.network.seed_state_dict(1)[name], ref, rtol=1e-5, atol=3e-5, msg=f"member 1 {name}")
    assert dm.states[0].episodes.state_dict() == gdm.kept.states[1].episodes.state_dict()
    assert model.proximal_source.com == [4.0, 8.0]
    pl.seed_everything(0)
    dm0 = RolloutDataModule(**DATA, total_frames=32 * 7, seed=0)
    alone0, dm0, _ = fit(dm0, lr=3e-3, decoupled=True, proximal_com=4.0, clip_eps=0.2, max_importance_ratio=1.05)
    for name, ref in alone0.network.state_dict().items():
        torch.testing.assert_close(model.network.seed_state_dict(0)[name], ref, rtol=1e-5, atol=3e-5, msg=f"member 0 {name}")


PPG = {"n_pi": 2, "n_aux_epochs": 1, "aux_mbsize": 1, "aux_lr": 2e-3}
PPG_NET = {**NET, "arch": "dual", "aux_value_head": True}


def test_a_refilled_ppg_member_is_a_fresh_single_run_where_a_phase_starts():
    """PPG-EWMA in a group of 2 (auxiliary phase every 2 iterations): a refill in the middle of a phase
    is refused in one line; at the phase start after 2 iterations member 1's slot takes another seed,
    lr, EWMA age and clip range and trains 4 more iterations (two phases). Member 1 ends within float
    tolerance of that trial's fresh single run over 4 (its policy and auxiliary Adams restarted: their
    step counts offset), member 0 as its own single run over 6."""
    first = {"lr": [3e-3, 3e-3], "proximal_com": [2.0, 2.0], "clip_eps": [0.2, 0.2]}
    new = {"lr": 1e-3, "proximal_com": 4.0, "clip_eps": 0.3}

    class MidPhaseRefused(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == 1:
                with pytest.raises(ValueError, match="refills a member where a phase starts"):
                    pl_module.refill_member(1, 5, new)

    pl.seed_everything(0)
    gdm = RolloutDataModule(**DATA, total_frames=32 * 6, seed=0, member_seeds=[0, 1], member_hparams=first)
    model = PPOLightningModule(gdm.observation_space, gdm.action_space, network=PPG_NET, seeds=gdm.seeds, decoupled=True,
                               proximal_com=2.0, member_hparams=first, ppg=PPG)
    trainer = pl.Trainer(max_epochs=-1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, callbacks=[KeepSource(), MidPhaseRefused(), RefillAt(2, 1, 5, new)])
    trainer.fit(model, datamodule=gdm)
    assert model.ppg_phases.phase == 3 and gdm.seeds == [0, 5]
    assert [type(o).__name__ for o in trainer.optimizers] == ["MemberAdam", "MemberAdam"]
    assert [o.param_groups[0]["member_step_offsets"][1] for o in trainer.optimizers] == [8, 4]  # policy, aux
    for seed, frames, kw, k in ((5, 4, dict(lr=1e-3, proximal_com=4.0, clip_eps=0.3), 1),
                                (0, 6, dict(lr=3e-3, proximal_com=2.0, clip_eps=0.2), 0)):
        pl.seed_everything(seed)
        dm = RolloutDataModule(**DATA, total_frames=32 * frames, seed=seed)
        alone, dm, _ = fit(dm, network=PPG_NET, decoupled=True, ppg=PPG, **kw)
        for name, ref in alone.network.state_dict().items():
            torch.testing.assert_close(model.network.seed_state_dict(k)[name], ref, rtol=1e-5, atol=3e-5,
                                       msg=f"member {k} {name}")
        assert dm.states[0].episodes.state_dict() == gdm.kept.states[k].episodes.state_dict()


def restarted_adam(own_step_count: bool):
    """3 members on one stacked parameter: 5 steps of a plain fused Adam, then member 1 restarts
    (`MemberAdam.from_adam`, `restart_member` at another lr) and 3 more steps; beside it, each member's
    own torch Adam (member 1's a fresh one from the restart). ``own_step_count`` False: the control,
    member 1 keeps the group's step count."""
    from ppo_lightning.training.seed_group import MemberAdam

    g = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(3, 5, generator=g))
    alone = [torch.nn.Parameter(p.detach()[k].clone()) for k in range(3)]
    opt = torch.optim.Adam([p], lr=1e-2, eps=1e-5, fused=True)
    refs = [torch.optim.Adam([a], lr=1e-2, eps=1e-5, fused=True) for a in alone]
    for step in range(8):
        if step == 5:
            opt = MemberAdam.from_adam(opt, 3)
            opt.restart_member(1, lr=3e-3)
            if not own_step_count:
                opt.param_groups[0]["member_step_offsets"] = [0, 0, 0]
                opt._plan_runs()
            refs[1] = torch.optim.Adam([alone[1]], lr=3e-3, eps=1e-5, fused=True)
        p.grad = torch.randn(3, 5, generator=g)
        for k in range(3):
            alone[k].grad = p.grad[k].clone()
        opt.step()
        for r in refs:
            r.step()
    return opt, p, alone


def test_a_restarted_member_steps_as_a_fresh_adam_and_a_shared_step_count_would_not():
    """After 5 group steps member 1 restarts: 3 steps later its slice equals a fresh Adam's 3 steps at
    its new lr, the others' their own Adam's 8 steps. With the group's shared step count its first
    steps' bias corrections are the group's (at step 6: a first update about half a fresh Adam's),
    and it ends elsewhere."""
    opt, p, alone = restarted_adam(True)
    assert opt.param_groups[0]["member_step_offsets"] == [0, 5, 0]
    for k in range(3):
        torch.testing.assert_close(p.detach()[k], alone[k].detach(), rtol=1e-6, atol=1e-7)
    _, p, alone = restarted_adam(False)
    torch.testing.assert_close(p.detach()[0], alone[0].detach(), rtol=1e-6, atol=1e-7)
    assert (p.detach()[1] - alone[1].detach()).abs().max() > 1e-3


def test_study_arms_that_differ_in_loss_or_return_settings_pack_into_one_group(tmp_path):
    """A study's arms that differ only in the clip range and gamma train as one group whose members
    carry them (an arm that does not set one gets the base config's)."""

    from ppo_lightning.studies import runner
    from ppo_lightning.studies.spec import load_study
    from tests.test_studies import tiny

    study = load_study(tiny(tmp_path, seeds={"count": 2, "first": 0}, arms=[
        {"name": "a", "label": "A", "fit": {"model.clip_eps": 0.1, "data.gamma": 0.9}},
        {"name": "b", "label": "B", "fit": {"model.lr": 0.001}}], comparisons=[]))
    (group,) = runner.plan(study, set(), workers=1)
    hp = group.spec.members.settings
    assert hp["clip_eps"] == [0.1, 0.1, 0.2, 0.2] and hp["gamma"] == [0.9, 0.9, 0.99, 0.99]
    assert "entropy_coef" not in hp and "clip_eps" not in group.spec.model


def test_members_metrics_are_named_in_one_place():
    """A component's `PerMember` values: member k's under seed<k>/, the mean of the members that have
    one unprefixed, each member's own dict with the shared values; a single run's keep their names."""
    from ppo_lightning.core.members import PerMember, name_members

    metrics = {"train/kl": PerMember([0.1, 0.3, float("nan")]), "frames": 512.0}
    logged, own = name_members(metrics, 3)
    assert logged == {"seed0/train/kl": 0.1, "seed1/train/kl": 0.3, "train/kl": pytest.approx(0.2), "frames": 512.0}
    assert own == [{"train/kl": 0.1, "frames": 512.0}, {"train/kl": 0.3, "frames": 512.0}, {"frames": 512.0}]
    assert name_members({"train/kl": PerMember([0.5]), "frames": 1.0}, 1) == ({"train/kl": 0.5, "frames": 1.0},
                                                                              [{"train/kl": 0.5, "frames": 1.0}])
    with pytest.raises(ValueError, match="'train/kl' has 2 member values for 3 members"):
        name_members({"train/kl": PerMember([1.0, 2.0])}, 3)


def test_no_module_but_the_members_one_builds_a_members_metric_name():
    import ast
    from pathlib import Path

    pkg = Path(__file__).resolve().parents[1] / "ppo_lightning"
    found = []
    for path in pkg.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant) \
                    and str(node.values[0].value).startswith("seed") and any(
                        isinstance(v, ast.Constant) and "/" in str(v.value) for v in node.values[1:]):
                found.append(f"{path.relative_to(pkg)}:{node.lineno}")
    assert len(found) == 1 and found[0].startswith("core/members.py:"), found  # `member_metric`


def test_a_single_run_refuses_member_refills_and_member_lrs_in_one_line():
    """A single run is the group of one, but refilling a member or giving members their own lrs needs
    a group: each is one clear error, and a single run has no member runs of its own."""
    from ppo_lightning.data.datamodule import RolloutDataModule
    from ppo_lightning.training.module import PPOLightningModule

    dm = RolloutDataModule(env_id="CartPole-v1", num_envs=2, rollout_steps=8, num_minibatches=1, total_frames=16)
    model = PPOLightningModule(dm.observation_space, dm.action_space)
    assert model.members == 1 and model.member_run_ids is None
    with pytest.raises(ValueError, match=r"refilling a member needs a group of members"):
        model.refill_member(0, 1, {})
    with pytest.raises(ValueError, match=r"members' own lrs need a group of members"):
        model.set_member_lrs([1e-3])
