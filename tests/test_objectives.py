"""Hand-computed cases for each equation of ppo_lightning.algos.objectives."""

import math

import pytest
import torch

from ppo_lightning.algos import objectives as F

log = math.log


def t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


def test_clipped_surrogate_standard_hand_values():
    # r = 1.5 and 0.7; A = +1 and -1; eps = 0.2
    lp = t(log(0.9), log(0.9), log(0.7), log(0.7))
    behav = t(log(0.6), log(0.6), log(1.0), log(1.0))
    adv = t(1.0, -1.0, 1.0, -1.0)
    out = F.clipped_surrogate(lp, behav, adv, 0.2)
    # min(1.5, 1.2) ; min(-1.5, -1.2) ; min(0.7, 0.8) ; min(-0.7, -0.8)
    torch.testing.assert_close(out, t(1.2, -1.5, 0.7, -0.8))


def test_clipped_surrogate_decoupled_hand_values_and_gradient():
    # pi_behav = 0.5, pi_prox = 0.6, pi = 0.9: weight 1.2, r = 1.5, A = 2 -> 1.2 * min(3, 2.4) = 2.88
    lp = t(log(0.9), log(0.9)).requires_grad_()
    behav, prox, adv = t(log(0.5), log(0.5)), t(log(0.6), log(0.6)), t(2.0, -2.0)
    out = F.clipped_surrogate(lp, behav, adv, 0.2, proximal_log_prob=prox)
    # A = -2: 1.2 * min(-3, -2.4) = -3.6 (unclipped branch, gradient flows)
    torch.testing.assert_close(out, t(2.88, -3.6))
    out.sum().backward()
    # clipped sample: zero gradient; unclipped: d/dlp [1.2 * exp(lp - prox) * A] = 1.2 * 1.5 * -2
    torch.testing.assert_close(lp.grad, t(0.0, -3.6))


def test_decoupled_weight_carries_no_gradient_to_proximal():
    lp = t(log(0.9))
    prox = t(log(0.6)).requires_grad_()
    out = F.clipped_surrogate(lp, t(log(0.5)), t(2.0), 0.2, proximal_log_prob=prox)
    out.sum().backward()
    # Only r = pi / pi_prox depends on prox; here r is clipped so even that path is flat.
    assert prox.grad is None or torch.all(prox.grad == 0)


def test_importance_ratio_cap():
    lp, behav = t(0.0, 0.0), t(-10.0, log(0.5))
    out = F.kl_penalized_surrogate(lp, behav, t(1.0, 1.0), t(0.0, 0.0), 0.0, max_importance_ratio=100.0)
    torch.testing.assert_close(out, t(100.0, 2.0))  # capped at 100; 2 is below the cap
    capped = F.cap_behavior_log_prob(lp, behav, 100.0)
    torch.testing.assert_close(capped, t(-log(100.0), log(0.5)))


def test_kl_penalized_surrogate_hand_value():
    out = F.kl_penalized_surrogate(t(log(0.6)), t(log(0.5)), t(2.0), t(0.1), 0.5)
    torch.testing.assert_close(out, t(1.2 * 2.0 - 0.05))


@pytest.mark.parametrize(
    "kl,expected", [(0.005, 0.5), (0.0067, 1.0), (0.01, 1.0), (0.0149, 1.0), (0.02, 2.0)]
)
def test_adaptive_kl_beta_rule(kl, expected):
    assert F.adaptive_kl_beta(1.0, kl, 0.01) == pytest.approx(expected)


def test_categorical_kl_hand_value():
    anchor = torch.log(t(0.5, 0.5))
    current = torch.log(t(0.9, 0.1))
    expected = 0.5 * log(0.5 / 0.9) + 0.5 * log(0.5 / 0.1)
    torch.testing.assert_close(F.categorical_kl(anchor, current), torch.tensor(expected, dtype=torch.float64))
    assert F.categorical_kl(current, current).abs() < 1e-12


def test_diagonal_normal_kl_matches_torch():
    a_loc, a_scale, loc, scale = torch.randn(5, 3), torch.rand(5, 3) + 0.5, torch.randn(5, 3), torch.rand(5, 3) + 0.5
    ref = torch.distributions.kl_divergence(
        torch.distributions.Independent(torch.distributions.Normal(a_loc, a_scale), 1),
        torch.distributions.Independent(torch.distributions.Normal(loc, scale), 1),
    )
    torch.testing.assert_close(F.diagonal_normal_kl(a_loc, a_scale, loc, scale), ref)


def test_diagnostics_hand_values():
    lp, anchor = t(log(1.5), log(1.1), log(0.5)), t(0.0, 0.0, 0.0)
    assert F.clip_fraction(lp, anchor, 0.2).item() == pytest.approx(2 / 3)
    # k3 estimator at r = 1.5: 0.5 - log 1.5
    assert F.approx_kl(t(log(1.5)), t(0.0)).item() == pytest.approx(0.5 - log(1.5))
    target = t(1.0, 2.0, 3.0, 4.0)
    assert F.explained_variance(target, target).item() == pytest.approx(1.0)
    assert F.explained_variance(torch.zeros(4, dtype=torch.float64) + 2.5, target).item() == pytest.approx(0.0)


def test_value_loss_plain_and_clipped():
    v, target, old = t(2.0), t(0.0), t(1.0)
    assert F.value_loss(v, target).item() == pytest.approx(4.0)
    # clipped prediction 1 + clip(1, -0.5, 0.5) = 1.5: max(4, 2.25) = 4
    assert F.value_loss(v, target, old, 0.5).item() == pytest.approx(4.0)
    v = t(-0.2)  # unclipped error 0.04; clipped prediction 0.5 -> 0.25: the max keeps 0.25
    assert F.value_loss(v, target, old, 0.5).item() == pytest.approx(0.25)


def test_ppg_auxiliary_loss_hand_values():
    # Two samples. Old policy p_old = (0.5, 0.5), new p = (0.8, 0.2) on both:
    # KL = 0.5 log(0.5/0.8) + 0.5 log(0.5/0.2) = 0.5 log(25/16) = log(5/4).
    old = torch.log(t(0.5, 0.5)).expand(2, 2)
    new = torch.log(t(0.8, 0.2)).expand(2, 2)
    kl = F.categorical_kl(old, new)
    torch.testing.assert_close(kl, t(log(1.25), log(1.25)))
    # V_aux - V_targ = (1, -3): 0.5 * mean(1, 9) = 2.5; V - V_targ = (2, 0): 0.5 * mean(4, 0) = 1.0
    out = F.ppg_auxiliary_loss(kl, aux_value=t(1.0, -1.0), value=t(2.0, 2.0), value_target=t(0.0, 2.0),
                               beta_clone=2.0, vf_true_weight=0.5)
    torch.testing.assert_close(out["pol_distance"], torch.tensor(log(1.25), dtype=torch.float64))
    torch.testing.assert_close(out["vf_aux"], torch.tensor(2.5, dtype=torch.float64))
    torch.testing.assert_close(out["vf_true"], torch.tensor(1.0, dtype=torch.float64))
    torch.testing.assert_close(out["loss"], torch.tensor(2.0 * log(1.25) + 2.5 + 0.5 * 1.0, dtype=torch.float64))


def test_ppg_auxiliary_loss_gradients():
    # d/dV_aux of 0.5 mean((V_aux - y)^2) = (V_aux - y) / n; the true head is weighted by vf_true_weight.
    aux, val = t(1.0, -1.0).requires_grad_(), t(2.0, 2.0).requires_grad_()
    out = F.ppg_auxiliary_loss(t(0.0, 0.0), aux, val, t(0.0, 2.0), beta_clone=1.0, vf_true_weight=3.0)
    out["loss"].backward()
    torch.testing.assert_close(aux.grad, t(0.5, -1.5))
    torch.testing.assert_close(val.grad, t(3.0, 0.0))
