"""The loss module against TorchRL's own PPO losses, and the decoupled == standard invariant."""

import copy

import pytest
import torch
from tensordict import TensorDict
from torchrl.objectives import ClipPPOLoss, KLPENPPOLoss

from ppo_lightning.algos.loss import PPOFamilyLoss
from ppo_lightning.nets.models import ActorCritic, make_distribution, make_policy_operator, make_value_operator

OBS = {"shape": [4], "dtype": "float32"}
ACT = {"type": "discrete", "n": 3}


def make_batch(net, n=64, seed=0, perturb=0.3):
    """Data 'collected' by a perturbed copy of the net, so ratios differ from 1 (and some clip)."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, 4, generator=g)
    behav = copy.deepcopy(net)
    with torch.no_grad():
        for p in behav.parameters():
            p.add_(perturb * torch.randn(p.shape, generator=g))
        logits, value = behav(obs)
        dist = make_distribution(ACT, logits)
        action = dist.sample()
    return TensorDict(
        {
            "observation": obs,
            "action": action,
            "action_log_prob": dist.log_prob(action),
            "logits": logits,
            "state_value": value,
            "advantage": torch.randn(n, 1, generator=g),
            "value_target": torch.randn(n, 1, generator=g),
        },
        batch_size=[n],
    )


def grads_of(net, loss):
    net.zero_grad()
    loss.backward()
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in net.parameters()]


def total(out):
    return out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]


def torchrl_oracle(loss_cls, net, **kwargs):
    """TorchRL's own PPO loss over the same network, with our coefficients and L2 critic loss."""
    return loss_cls(make_policy_operator(net, ACT), make_value_operator(net), entropy_coeff=0.01, critic_coeff=0.5,
                    loss_critic_type="l2", normalize_advantage=False, **kwargs)


def assert_same_losses_and_gradients(net, batch, ours, ref):
    out_ours, out_ref = ours(batch.clone()), ref(batch.clone())
    for key in ("loss_objective", "loss_critic", "loss_entropy"):
        torch.testing.assert_close(out_ours[key], out_ref[key], rtol=1e-5, atol=1e-6)
    for g1, g2 in zip(grads_of(net, total(ours(batch.clone()))), grads_of(net, total(ref(batch.clone())))):
        torch.testing.assert_close(g1, g2, rtol=1e-5, atol=1e-6)
    return out_ours, out_ref


def test_clip_matches_torchrl_clip_ppo_loss():
    torch.manual_seed(0)
    net = ActorCritic(OBS, ACT, hidden_sizes=(16, 16))
    batch = make_batch(net)
    ours = PPOFamilyLoss(net, ACT, objective="clip", clip_eps=0.2, value_coef=0.5, entropy_coef=0.01)
    out_ours, _ = assert_same_losses_and_gradients(net, batch, ours, torchrl_oracle(ClipPPOLoss, net, clip_epsilon=0.2))
    assert 0.0 < out_ours["clip_fraction"] < 1.0  # the case exercises the clip


def test_kl_matches_torchrl_klpen_ppo_loss():
    """TorchRL's KLPENPPOLoss adapts beta inside every call, by ``beta.data *= 2`` after the loss is
    built: the value uses the old beta but backward reads the new one. With its adaptation turned off
    (increment = decrement = 1) it is the fixed-beta KL objective, and values and gradients agree."""
    torch.manual_seed(1)
    net = ActorCritic(OBS, ACT, hidden_sizes=(16, 16))
    batch = make_batch(net, seed=1)
    ours = PPOFamilyLoss(net, ACT, objective="kl", kl_beta=0.7, value_coef=0.5, entropy_coef=0.01)
    ref = torchrl_oracle(KLPENPPOLoss, net, beta=0.7, increment=1.0, decrement=1.0)
    out_ours, out_ref = assert_same_losses_and_gradients(net, batch, ours, ref)
    torch.testing.assert_close(out_ours["kl_anchor"], out_ref["kl"].mean(), rtol=1e-5, atol=1e-6)
    assert out_ours["kl_anchor"] > 1e-3  # the penalty is active


@pytest.mark.parametrize("objective", ["clip", "kl", "adaptive_kl"])
def test_decoupled_equals_standard_when_proximal_is_behavior(objective):
    torch.manual_seed(2)
    net = ActorCritic(OBS, ACT, hidden_sizes=(16, 16))
    batch = make_batch(net, seed=2)
    standard = PPOFamilyLoss(net, ACT, objective=objective)
    decoupled = PPOFamilyLoss(net, ACT, objective=objective, decoupled=True)
    dec_batch = batch.clone()
    dec_batch.set("proximal", TensorDict({"logits": batch["logits"]}, batch_size=batch.batch_size))
    out_s, out_d = standard(batch.clone()), decoupled(dec_batch.clone())
    assert ("clip_fraction" in out_s.keys()) == ("clip_fraction" in out_d.keys()) == (objective == "clip")
    for key in ("loss_objective", "loss_critic", "loss_entropy", "clip_fraction", "kl_anchor"):
        if key in out_s.keys():
            torch.testing.assert_close(out_s[key], out_d[key])
    for g1, g2 in zip(grads_of(net, total(standard(batch.clone()))), grads_of(net, total(decoupled(dec_batch.clone())))):
        torch.testing.assert_close(g1, g2)


def test_decoupled_differs_when_proximal_differs():
    torch.manual_seed(3)
    net = ActorCritic(OBS, ACT, hidden_sizes=(16, 16))
    batch = make_batch(net, seed=3)
    batch.set("proximal", TensorDict({"logits": torch.zeros_like(batch["logits"])}, batch_size=batch.batch_size))
    a = PPOFamilyLoss(net, ACT)(batch.clone())["loss_objective"]
    b = PPOFamilyLoss(net, ACT, decoupled=True)(batch.clone())["loss_objective"]
    assert not torch.allclose(a, b)


def test_adaptive_beta_changes_only_per_iteration():
    net = ActorCritic(OBS, ACT, hidden_sizes=(16,))
    loss = PPOFamilyLoss(net, ACT, objective="adaptive_kl", kl_beta=1.0, kl_target=0.01)
    batch = make_batch(net, perturb=1.0)
    for _ in range(3):
        loss(batch.clone())
    assert float(loss.kl_beta) == 1.0  # forward never adapts
    assert loss.update_kl_beta(1.0) == 2.0
    assert loss.update_kl_beta(0.0) == 1.0
    fixed = PPOFamilyLoss(net, ACT, objective="kl", kl_beta=1.0)
    assert fixed.update_kl_beta(1.0) == 1.0  # fixed beta never adapts


def test_continuous_actions():
    act = {"type": "continuous", "shape": [2]}
    net = ActorCritic(OBS, act, hidden_sizes=(8,))
    obs = torch.randn(16, 4)
    loc, scale, value = net(obs)
    dist = make_distribution(act, loc, scale)
    a = dist.sample()
    batch = TensorDict(
        {"observation": obs, "action": a, "action_log_prob": dist.log_prob(a), "loc": loc.detach(),
         "scale": scale.detach(), "state_value": value.detach(), "advantage": torch.randn(16, 1),
         "value_target": torch.randn(16, 1)},
        batch_size=[16],
    )
    out = PPOFamilyLoss(net, act, objective="kl")(batch)
    assert out["kl_anchor"].abs() < 1e-6  # anchor == current at the start
    assert torch.isfinite(total(out))


@pytest.mark.parametrize("kwargs", [dict(objective="clip", max_importance_ratio=2.0, value_clip_eps=0.1),
                                    dict(objective="kl", decoupled=True, kl_form="sq_logratio")])
def test_stacked_seeds_reduce_per_seed(kwargs):
    """``stacked_seeds``: one call on ``[S, B]`` minibatches gives, for every loss term and diagnostic,
    seed k's value of the loss on seed k's minibatch alone (vectorized seeds, issue 18)."""
    from ppo_lightning.nets.seed_stack import SeedStack

    torch.manual_seed(4)
    nets = [ActorCritic(OBS, ACT, hidden_sizes=(16, 16)) for _ in range(3)]
    batches = [make_batch(net, n=32, seed=10 + k) for k, net in enumerate(nets)]
    if kwargs.get("decoupled"):
        for b in batches:
            b.set("proximal", TensorDict({"logits": b["logits"] + 0.05 * torch.randn_like(b["logits"])}, batch_size=[32]))
    stacked = PPOFamilyLoss(SeedStack(nets), ACT, stacked_seeds=True, **kwargs)(torch.stack(batches))
    for k, (net, batch) in enumerate(zip(nets, batches)):
        alone = PPOFamilyLoss(net, ACT, **kwargs)(batch.clone())
        assert alone.keys() == stacked.keys()
        for key in alone.keys():
            want = alone[key]
            got = stacked[key][k]  # kl_beta too: one per seed
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=f"seed {k}: {key}")
    if kwargs["objective"] == "clip":  # the KL objectives clip nothing: no clip fraction
        assert stacked["clip_fraction"].shape == (3,) and 0 < stacked["clip_fraction"].max() < 1
    else:
        assert "clip_fraction" not in stacked.keys()
    if kwargs.get("max_importance_ratio"):
        assert 0 < stacked["importance_ratio_capped_fraction"].max()  # the cap is active
