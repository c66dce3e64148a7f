"""One TorchRL loss module for the PPO family: clipped / KL / adaptive-KL, standard or decoupled.

It composes the pure functions of `ppo_lightning.algos.objectives`; no equation is written here.

Data contract (renamable with ``set_keys``, as TorchRL losses do):
  observation, action, behavior_log_prob (written by the collector), behavior distribution
  parameters (``logits`` or ``loc``/``scale``, written by the collector), advantage, value_target,
  behavior_value (the value at collection, for value clipping) and, for the decoupled forms, the
  proximal policy's distribution parameters under the ``proximal`` sub-tensordict.

``forward`` returns a TensorDict whose ``loss_*`` entries sum to the loss to minimize and whose other
entries are diagnostics (scalars, detached).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torchrl.objectives import LossModule

from ppo_lightning.algos import objectives as F
from ppo_lightning.nets.models import dist_param_keys, make_distribution

OBJECTIVES = ("clip", "kl", "adaptive_kl")


KL_FORMS = ("analytic", "sq_logratio")


class PPOFamilyLoss(LossModule):
    """PPO losses of Schulman et al. (2017) and their decoupled forms (Hilton et al. 2021).

    Args:
        network: an actor-critic whose ``forward(obs)`` returns ``(*dist_params, value)``.
        action_space: plain dict (see `ppo_lightning.nets.models`).
        objective: "clip", "kl" (fixed beta) or "adaptive_kl" (beta adapted once per iteration
            by `update_kl_beta`, never inside ``forward``).
        decoupled: use the proximal policy as the anchor of the clip / KL term and the behavior
            policy for importance sampling.
        clip_eps, kl_beta, kl_target, max_importance_ratio: see `ppo_lightning.algos.objectives`.
        value_coef, entropy_coef: coefficients of the L2 value loss and the entropy bonus.
        value_clip_eps: clip the value around the behavior value (PPO2 baselines); None = off.
        kl_form: the KL term of the "kl" objectives: "analytic" (exact KL between the anchor's and
            the current distribution) or "sq_logratio" (the PPO-EWMA reference code's
            ``0.5 (log pi(a) - log pi_anchor(a))^2`` on the taken action).
        stacked_seeds: the inputs carry a leading seed dimension, ``[S, B]`` (vectorized seeds,
            `ppo_lightning.training.seed_group`): every reduction is over the samples of each seed,
            so each entry of the output is ``[S]``, seed k's own loss or diagnostic.
    """

    @dataclass
    class _AcceptedKeys:
        observation: str = "observation"
        action: str = "action"
        behavior_log_prob: str = "action_log_prob"
        advantage: str = "advantage"
        value_target: str = "value_target"
        behavior_value: str = "state_value"
        proximal: str = "proximal"

    default_keys = _AcceptedKeys
    default_value_estimator = None

    def __init__(
        self,
        network: nn.Module,
        action_space: dict,
        *,
        objective: str = "clip",
        decoupled: bool = False,
        clip_eps: float = 0.2,
        kl_beta: float = 1.0,
        kl_target: float = 0.01,
        max_importance_ratio: float | None = None,
        value_coef: float = 0.5,
        entropy_coef: float = 0.01,
        value_clip_eps: float | None = None,
        kl_form: str = "analytic",
        stacked_seeds: bool = False,
    ) -> None:
        super().__init__()
        if kl_form not in KL_FORMS:
            raise ValueError(f"model.kl_form must be one of {KL_FORMS}, got {kl_form!r}")
        self.kl_form = kl_form
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        # Not registered as a submodule: the LightningModule owns the network (one copy of the
        # weights in its state_dict, and FSDP wraps it there).
        self.__dict__["network"] = network
        self.action_space = action_space
        self.param_keys = dist_param_keys(action_space)
        self.objective = objective
        self.decoupled = decoupled
        self.clip_eps = clip_eps
        self.kl_target = kl_target
        self.max_importance_ratio = max_importance_ratio
        self.value_coef = value_coef
        self.entropy_coef = entropy_coef
        self.value_clip_eps = value_clip_eps
        self.stacked_seeds = stacked_seeds
        # [S] bools of a group whose members have their own anchors (`ppo_lightning.training.seed_group`):
        # True where the anchor is the behavior policy (PPO members of a decoupled group); set by the module
        self.behavior_anchor: torch.Tensor | None = None
        # A buffer, so that the adapted beta is saved in (and restored from) the checkpoint; one per
        # seed of a vectorized group ([S], S of the stacked network: each seed's beta adapts to its own KL).
        beta = torch.tensor(float(kl_beta), dtype=torch.float64)
        self.register_buffer("kl_beta", beta.expand(network.num_seeds).clone() if stacked_seeds else beta)

    def _forward_value_estimator_keys(self, **kwargs) -> None:
        pass  # GAE runs on the data side; nothing to forward.

    def _kl(self, anchor_params, params):
        if self.action_space["type"] == "discrete":
            return F.categorical_kl(anchor_params[0], params[0])
        return F.diagonal_normal_kl(anchor_params[0], anchor_params[1], params[0], params[1])

    def update_kl_beta(self, mean_kl: float, seed: int | None = None) -> float:
        """Adapt beta once per iteration (PPO paper rule); returns the new beta. ``seed``: that seed's
        beta of a vectorized group, on its own mean KL. A non-finite KL leaves beta as it is."""
        beta = self.kl_beta if seed is None else self.kl_beta[seed]
        if self.objective == "adaptive_kl" and math.isfinite(mean_kl):
            beta.fill_(F.adaptive_kl_beta(float(beta), mean_kl, self.kl_target))
        return float(beta)

    def _mean(self, x: torch.Tensor) -> torch.Tensor:
        """The mean over the samples (per seed with ``stacked_seeds``)."""
        return x.mean(-1) if self.stacked_seeds else x.mean()

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        keys = self.tensor_keys
        mean, dim = self._mean, (-1 if self.stacked_seeds else None)
        action = tensordict.get(keys.action)
        *params, value = self.network(tensordict.get(keys.observation))
        dist = make_distribution(self.action_space, *params)
        log_prob = dist.log_prob(action)
        behavior_log_prob = tensordict.get(keys.behavior_log_prob)
        advantage = tensordict.get(keys.advantage).reshape(log_prob.shape)
        behavior_params = [tensordict.get(k) for k in self.param_keys]

        if self.decoupled:
            anchor_params = [tensordict.get((keys.proximal, k)) for k in self.param_keys]
            mask = self.behavior_anchor
            if mask is not None:  # group members whose anchor is the behavior policy (PPO): its parameters
                anchor_params = [torch.where(mask.view(-1, *[1] * (a.dim() - 1)), b.to(a.dtype), a)
                                 for a, b in zip(anchor_params, behavior_params)]
            proximal_log_prob = make_distribution(self.action_space, *anchor_params).log_prob(action)
            if mask is not None:  # ... and its log-prob capped as PPO caps it: PPO's loss exactly
                proximal_log_prob = torch.where(mask.unsqueeze(-1), F.cap_behavior_log_prob(
                    log_prob, behavior_log_prob, self.max_importance_ratio), proximal_log_prob)
            anchor_log_prob = proximal_log_prob
        else:
            anchor_params, proximal_log_prob, anchor_log_prob = behavior_params, None, behavior_log_prob

        kl_anchor = self._kl([p.detach() for p in anchor_params], params)
        if self.kl_form == "sq_logratio":  # the reference code's penalty: 0.5 (log pi - log pi_anchor)^2
            kl_anchor = F.squared_log_ratio_kl(log_prob, anchor_log_prob.detach())
        if self.objective == "clip":
            surrogate = F.clipped_surrogate(
                log_prob, behavior_log_prob, advantage, self.clip_eps, proximal_log_prob, self.max_importance_ratio
            )
        else:
            surrogate = F.kl_penalized_surrogate(
                log_prob, behavior_log_prob, advantage, kl_anchor,
                self.kl_beta.float().unsqueeze(-1) if self.stacked_seeds else self.kl_beta.float(), self.max_importance_ratio
            )

        value = value.reshape(log_prob.shape)
        value_target = tensordict.get(keys.value_target).reshape(log_prob.shape)
        behavior_value = tensordict.get(keys.behavior_value, None)
        if behavior_value is not None:
            behavior_value = behavior_value.reshape(log_prob.shape)
        entropy = dist.entropy()

        out = TensorDict(
            {
                "loss_objective": -mean(surrogate),
                "loss_critic": self.value_coef
                * mean(F.value_loss(value, value_target, behavior_value, self.value_clip_eps)),
                "loss_entropy": -self.entropy_coef * mean(entropy),
            },
            batch_size=[],
        )
        with torch.no_grad():
            lp = log_prob.detach()
            capped = behavior_log_prob if self.max_importance_ratio is None else F.cap_behavior_log_prob(
                lp, behavior_log_prob, self.max_importance_ratio
            )
            ratio_behav = torch.exp(lp - behavior_log_prob)
            out.update(
                {
                    "entropy": mean(entropy.detach()),
                    "kl_anchor": mean(kl_anchor.detach()),
                    "approx_kl_behavior": mean(F.approx_kl(lp, behavior_log_prob)),
                    "approx_kl_proximal": mean(F.approx_kl(lp, anchor_log_prob)),
                    "clip_fraction": F.clip_fraction(lp, anchor_log_prob, self.clip_eps, dim),
                    "importance_ratio_max": ratio_behav.max() if dim is None else ratio_behav.amax(dim),
                    "importance_ratio_capped_fraction": mean((capped != behavior_log_prob).float()),
                    "explained_variance": F.explained_variance(value.detach(), value_target, dim),
                    "kl_beta": self.kl_beta.float(),
                }
            )
        return out
