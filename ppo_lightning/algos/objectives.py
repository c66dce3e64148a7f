"""The equations of the PPO family, one pure tensor function each.

Every surrogate returns the per-sample objective to MAXIMIZE, without reduction; the loss module
(`ppo_lightning.algos.loss`) negates and averages. Probabilities are handled in log space, as in the
reference code of Hilton, Cobbe & Schulman (2021), "Batch size-invariance for policy optimization"
(github.com/openai/ppo-ewma).

Notation: r = ratio, A = advantage, pi = current policy, pi_behav = the policy that collected the
data, pi_prox = the proximal policy (the anchor of the clip / KL term).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "cap_behavior_log_prob",
    "clipped_surrogate",
    "kl_penalized_surrogate",
    "adaptive_kl_beta",
    "categorical_kl",
    "diagonal_normal_kl",
    "approx_kl",
    "squared_log_ratio_kl",
    "clip_bounds",
    "clip_fraction",
    "value_loss",
    "huber_value_loss",
    "explained_variance",
    "ppg_auxiliary_loss",
]


def cap_behavior_log_prob(
    log_prob: Tensor, behavior_log_prob: Tensor, max_importance_ratio: float | None
) -> Tensor:
    """Cap the importance ratio pi/pi_behav at `max_importance_ratio` (reference code of Hilton et al.).

    The behavior log-prob is raised to at least ``log_prob.detach() - log(cap)``, so that
    ``exp(log_prob - behavior_log_prob) <= cap``. The cap acts through the (constant) behavior term
    only, so gradients through ``log_prob`` are untouched.
    """
    if max_importance_ratio is None:
        return behavior_log_prob
    if max_importance_ratio <= 0:
        raise ValueError(f"max_importance_ratio must be > 0, got {max_importance_ratio}")
    return torch.maximum(behavior_log_prob, log_prob.detach() - math.log(max_importance_ratio))


def clipped_surrogate(
    log_prob: Tensor,
    behavior_log_prob: Tensor,
    advantage: Tensor,
    clip_eps: float | Tensor,
    proximal_log_prob: Tensor | None = None,
    max_importance_ratio: float | None = None,
) -> Tensor:
    """Clipped surrogate objective, standard or decoupled.

    Standard (Schulman et al. 2017, PPO paper eq. 7), with r = pi / pi_behav:
        ``min(r A, clip(r, 1-eps, 1+eps) A)``
    Decoupled (Hilton et al. 2021, eq. 2), with r = pi / pi_prox:
        ``(pi_prox / pi_behav) * min(r A, clip(r, 1-eps, 1+eps) A)``
    where the factor pi_prox / pi_behav carries no gradient. With ``proximal_log_prob ==
    behavior_log_prob`` both forms coincide. ``max_importance_ratio`` caps pi / pi_behav (see
    `cap_behavior_log_prob`); in the decoupled form it bounds the factor pi_prox/pi_behav through
    the same raised behavior log-prob. ``clip_eps`` may be a tensor, one per seed (`clip_bounds`).
    """
    behavior_log_prob = cap_behavior_log_prob(log_prob, behavior_log_prob, max_importance_ratio)
    if proximal_log_prob is None:
        anchor_log_prob = behavior_log_prob
        weight = None
    else:
        anchor_log_prob = proximal_log_prob
        weight = torch.exp(proximal_log_prob - behavior_log_prob).detach()
    ratio = torch.exp(log_prob - anchor_log_prob)
    surrogate = torch.minimum(ratio * advantage, ratio.clamp(*clip_bounds(clip_eps, ratio)) * advantage)
    return surrogate if weight is None else weight * surrogate


def clip_bounds(clip_eps: float | Tensor, like: Tensor) -> tuple[float | Tensor, float | Tensor]:
    """``(1 - eps, 1 + eps)``. A tensor ``clip_eps`` (one per seed of a group, float64 ``[S, 1]``) gives
    its bounds computed in float64, as a Python number's are, then rounded to ``like``'s dtype as a
    number is when it meets the tensor: each seed's bounds those of a single run with its eps."""
    if isinstance(clip_eps, Tensor):
        return (1.0 - clip_eps).to(like.dtype), (1.0 + clip_eps).to(like.dtype)
    return 1.0 - clip_eps, 1.0 + clip_eps


def kl_penalized_surrogate(
    log_prob: Tensor,
    behavior_log_prob: Tensor,
    advantage: Tensor,
    kl: Tensor,
    beta: float | Tensor,
    max_importance_ratio: float | None = None,
) -> Tensor:
    """KL-penalized surrogate ``(pi / pi_behav) A - beta KL[pi_anchor || pi]``.

    PPO paper (Schulman et al. 2017) eq. 8 when the anchor is the old (behavior) policy; the
    decoupled form of Hilton et al. (2021, eq. 3) when the anchor is the proximal policy. ``kl`` is
    the per-sample KL, e.g. from `categorical_kl(anchor_logits, logits)`, and must carry gradient
    with respect to the current policy.
    """
    behavior_log_prob = cap_behavior_log_prob(log_prob, behavior_log_prob, max_importance_ratio)
    return torch.exp(log_prob - behavior_log_prob) * advantage - beta * kl


def adaptive_kl_beta(beta: float, mean_kl: float, kl_target: float) -> float:
    """Adaptive KL coefficient of the PPO paper (Schulman et al. 2017, section 4).

    After each iteration, with d the mean KL: if d < d_targ / 1.5 then beta / 2; if d > 1.5 d_targ
    then beta * 2; otherwise unchanged. Call it once per iteration, not per minibatch.
    """
    mean_kl = float(mean_kl)
    if mean_kl < kl_target / 1.5:
        return beta / 2.0
    if mean_kl > kl_target * 1.5:
        return beta * 2.0
    return beta


def categorical_kl(anchor_logits: Tensor, logits: Tensor) -> Tensor:
    """Exact ``KL[anchor || current]`` between categorical distributions given by logits, per sample.

    ``sum_a p_anchor(a) (log p_anchor(a) - log p(a))`` over the last dimension.
    """
    anchor_log_p = torch.log_softmax(anchor_logits, dim=-1)
    log_p = torch.log_softmax(logits, dim=-1)
    return (anchor_log_p.exp() * (anchor_log_p - log_p)).sum(-1)


def diagonal_normal_kl(anchor_loc: Tensor, anchor_scale: Tensor, loc: Tensor, scale: Tensor) -> Tensor:
    """Exact ``KL[anchor || current]`` between diagonal Gaussians, summed over the action dimension.

    Per dimension: ``log(s/s_a) + (s_a^2 + (m_a - m)^2) / (2 s^2) - 1/2``.
    """
    var_ratio = (anchor_scale / scale).pow(2)
    mean_term = ((anchor_loc - loc) / scale).pow(2)
    return 0.5 * (var_ratio + mean_term - 1.0 - var_ratio.log()).sum(-1)


def approx_kl(log_prob: Tensor, anchor_log_prob: Tensor) -> Tensor:
    """Low-variance estimator of ``KL[anchor || current]`` from samples of the anchor (Schulman's k3).

    ``(r - 1) - log r`` with ``r = pi / pi_anchor``; unbiased and non-negative.
    """
    log_ratio = log_prob - anchor_log_prob
    return torch.expm1(log_ratio) - log_ratio


def squared_log_ratio_kl(log_prob: Tensor, anchor_log_prob: Tensor) -> Tensor:
    """The KL penalty of the PPO-EWMA reference code (openai/ppo-ewma ``ppo.py``, ``pi_kl``):
    ``0.5 * (log pi - log pi_anchor)^2`` per sample, on the taken action (Schulman's k2 estimator
    of ``KL[anchor || current]``; carries gradient through ``log_prob``)."""
    return 0.5 * (log_prob - anchor_log_prob).pow(2)


def clip_fraction(log_prob: Tensor, anchor_log_prob: Tensor, clip_eps: float | Tensor, dim: int | None = None,
                  eps_high: float | Tensor | None = None) -> Tensor:
    """Fraction of samples whose ratio pi / pi_anchor lies outside [1 - eps, 1 + eps_high] (``eps_high``
    None: ``eps``, the symmetric range) (a scalar; with ``dim``, the fraction along that dimension)."""
    ratio = torch.exp(log_prob - anchor_log_prob)

    def as_ratio(eps):  # one per seed: [S, 1]
        return eps.to(ratio.dtype) if isinstance(eps, Tensor) else eps

    low, high = as_ratio(clip_eps), as_ratio(clip_eps if eps_high is None else eps_high)
    moved = ratio - 1.0
    outside = ((moved > high) | (-moved > low)).float()
    return outside.mean() if dim is None else outside.mean(dim)


def value_loss(
    value: Tensor, value_target: Tensor, old_value: Tensor | None = None, clip_eps: float | None = None
) -> Tensor:
    """Squared-error value loss ``(V - V_targ)^2`` per sample, optionally clipped.

    With ``clip_eps`` (PPO2 baselines): ``max((V - V_targ)^2, (V_old + clip(V - V_old, -eps, eps)
    - V_targ)^2)``. The value coefficient (0.5 in the papers) multiplies this, as TorchRL's "l2"
    critic loss does.
    """
    err = (value - value_target).pow(2)
    if clip_eps is not None and old_value is not None:
        clipped = old_value + (value - old_value).clamp(-clip_eps, clip_eps)
        err = torch.maximum(err, (clipped - value_target).pow(2))
    return err


def huber_value_loss(value: Tensor, value_target: Tensor, delta: float = 1.0) -> Tensor:
    """Huber loss of the value error per sample: ``0.5 e^2`` for ``|e| <= delta``, else ``delta (|e| - 0.5
    delta)``, ``e = V - V_targ`` (Huber 1964; TorchRL's "smooth_l1" critic loss at ``delta`` 1)."""
    return torch.nn.functional.huber_loss(value, value_target, reduction="none", delta=delta)


def explained_variance(prediction: Tensor, target: Tensor, dim: int | None = None) -> Tensor:
    """``1 - Var[target - prediction] / Var[target]`` (a scalar; nan when the target is constant;
    with ``dim``, the variances along that dimension)."""
    if dim is None:
        return 1.0 - (target - prediction).var(unbiased=False) / target.var(unbiased=False)
    return 1.0 - (target - prediction).var(dim, unbiased=False) / target.var(dim, unbiased=False)


def ppg_auxiliary_loss(
    kl_old_new: Tensor,
    aux_value: Tensor,
    value: Tensor,
    value_target: Tensor,
    beta_clone: float,
    vf_true_weight: float,
    dim: int | None = None,
) -> dict[str, Tensor]:
    """Auxiliary-phase loss of Phasic Policy Gradient (Cobbe et al. 2021, eqs. 2-3 and Algorithm 1).

    ``L = beta_clone * E[KL[pi_old || pi]] + E[0.5 (V_aux - V_targ)^2] + vf_true_weight * E[0.5 (V - V_targ)^2]``

    where ``pi_old`` is the policy at the start of the auxiliary phase (its outputs computed once on
    all stored data before the first auxiliary epoch), ``V_aux`` the auxiliary value head on the
    policy encoder and ``V`` the true value head; the factor 0.5 on both value terms is the
    reference code's (openai/ppo-ewma ``ppg.py``: ``compute_aux_loss``, ``name2coef``).
    ``kl_old_new`` is the per-sample KL (e.g. `categorical_kl(old_logits, logits)`). Returns the
    means: ``{"loss", "pol_distance", "vf_aux", "vf_true"}`` (``loss`` is the weighted sum); over
    every element, or over ``dim`` only (``-1`` for a seed group's ``[S, B]`` samples: one per seed).
    """
    def mean(x: Tensor) -> Tensor:
        return x.mean() if dim is None else x.mean(dim)

    pol_distance = mean(kl_old_new)
    vf_aux = 0.5 * mean((aux_value - value_target).pow(2))
    vf_true = 0.5 * mean((value - value_target).pow(2))
    loss = beta_clone * pol_distance + vf_aux + vf_true_weight * vf_true
    return {"loss": loss, "pol_distance": pol_distance, "vf_aux": vf_aux, "vf_true": vf_true}
