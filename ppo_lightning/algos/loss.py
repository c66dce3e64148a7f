"""One TorchRL loss module for the PPO family: any registered objective, standard or decoupled.

It composes the pure functions of `ppo_lightning.algos.objectives`; no equation is written here. The
surrogate is the objective ``model.objective`` names in `ppo_lightning.algos.registry` (built in:
"clip", "kl", "adaptive_kl"), or a subclass's `PPOFamilyLoss.surrogate`.

Input contract (renamable with ``set_keys``, as TorchRL losses do): observation, action,
``action_log_prob`` (the behavior log-prob, written by the collector), the behavior distribution's
parameters (``logits`` or ``loc``/``scale``, written by the collector), advantage, value_target,
``state_value`` (the value at collection, for value clipping) and, for the decoupled forms, the
proximal policy's distribution parameters under the ``proximal`` sub-tensordict.

Output contract (`check_loss_output`): ``forward`` returns a TensorDict whose ``loss_*`` entries are
the terms of the loss to minimize (the module sums `LOSS_TERMS`; PPG's phases sum subsets,
`ppo_lightning.algos.ppg.PHASE_TERMS`) and whose other entries are detached diagnostics, logged as
``train/<name>``; `REQUIRED_ENTRIES` must be there (``kl_anchor``, the mean KL to the anchor, drives
the adaptive beta). Every reduction is over the samples, the inputs' last dimension: a minibatch
``[S, B]`` (S = 1 for a single run) gives one value per member (``[S]``; a scalar entry is taken as
every member's), a ``[B]`` batch of a caller's own gives scalars.

A recurrent network's minibatch (`ppo_lightning.nets.recurrent`) is ``[S, B, L]``: B segments of L
consecutive steps, with each step's stored ``recurrent_state`` and ``is_init``. The network runs over
the segments (``nets.recurrent.call``: each unrolled from the state stored at its first step, reset
where ``is_init``), then the minibatch and the outputs are flattened to ``[S, B * L]`` samples
(`flatten_segments`) and the same equations follow; the proximal parameters under ``proximal`` come
over the same segments (`ppo_lightning.training.module.PPOLightningModule.add_proximal`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torchrl.objectives import LossModule

from ppo_lightning.algos import objectives as F
from ppo_lightning.algos.hooks import VALUE_LOSSES, TermInputs, ValueInputs, check_aux_terms
from ppo_lightning.algos.registry import SurrogateInputs, get_objective, objective_names
from ppo_lightning.core.members import LOSS_MEMBER_SETTINGS
from ppo_lightning.nets.composite import composite_kl
from ppo_lightning.nets.models import dist_param_keys, make_distribution
from ppo_lightning.nets.recurrent import call, is_recurrent

KL_FORMS = ("analytic", "sq_logratio")
# Loss settings a seed group's members may each have their own of (`PPOFamilyLoss.set_member_settings`;
# declared with the other member settings in `ppo_lightning.core.members`).
MEMBER_LOSS_SETTINGS = LOSS_MEMBER_SETTINGS
# The terms the module sums into the loss it minimizes (PPO's joint step).
LOSS_TERMS = ("loss_objective", "loss_critic", "loss_entropy")
# Entries the module reads besides the loss terms.
REQUIRED_ENTRIES = LOSS_TERMS + ("kl_anchor",)
# Diagnostics that are maxima: over a minibatch's micro-batches they combine by maximum, the others
# by size-weighted mean.
MAX_ENTRIES = ("importance_ratio_max",)


def __getattr__(name: str):
    if name == "OBJECTIVES":  # the registered names (objectives can be registered after import)
        return objective_names()
    raise AttributeError(name)


def check_loss_output(out, members: int | None = None) -> None:
    """The output contract of a PPO-family loss (module docstring): the required entries are there
    and every entry is a scalar (``[S]`` or a scalar for a group of ``members``); one-line error otherwise."""
    missing = [k for k in REQUIRED_ENTRIES if k not in out.keys()]
    if missing:
        raise ValueError(f"the loss module's output lacks {', '.join(missing)} (required: {', '.join(REQUIRED_ENTRIES)}; "
                         "ppo_lightning.algos.loss)")
    for key in out.keys():
        shape = tuple(out[key].shape)
        if shape not in ((), (members,) if members else ()):
            want = f"a scalar or [{members}] (one per member)" if members else "a scalar"
            raise ValueError(f"the loss module's entry {key!r} has shape {list(shape)}, not {want}")


def flatten_segments(batch: TensorDictBase, params: list[torch.Tensor], value: torch.Tensor
                     ) -> tuple[TensorDictBase, list[torch.Tensor], torch.Tensor]:
    """A recurrent minibatch ``[*, B, L]`` (B segments of L steps) and the network's outputs on it
    (``[*, B, L, ...]``) as ``[*, B * L]`` samples, segment after segment: the layout of a
    feed-forward minibatch, over whose last dimension the loss reduces."""
    d = batch.batch_dims
    return (batch.flatten(d - 2, d - 1), [p.flatten(d - 2, d - 1) for p in params], value.flatten(d - 2, d - 1))


@dataclass
class LossSettings:
    """The settings of a PPO-family loss, each declared once here: its name (``model.<name>`` in YAML
    and on the command line, and in the checkpoint's hyperparameters), type, default and meaning. The
    loss (`PPOFamilyLoss`) and the module (`ppo_lightning.training.module.PPOLightningModule`) take
    them as keyword arguments; `settings_table` writes the table of docs/guides/extending.md from them.
    Building one checks the values (one-line errors naming ``model.<name>``)."""

    objective: str = "clip"
    """The surrogate: "clip", "kl" (fixed beta), "adaptive_kl" (beta adapted once per iteration), another
    name registered in `ppo_lightning.algos.registry`, or a function's import path (``my_pkg.variants.fn``)."""
    objective_args: dict[str, Any] | None = None
    """The objective's own settings (keyword arguments of its function), e.g. ``{eps_high: 0.28}``."""
    decoupled: bool = False
    """The decoupled objective (Hilton et al. 2021): the behavior policy for importance sampling, the
    proximal policy as the anchor of the clip / KL term (with ``model.proximal_com``: PPO-EWMA)."""
    clip_eps: float = 0.2
    """The clip range of the clipped surrogate (and of the clip fraction); an objective that sets its own
    range (`ppo_lightning.algos.registry.Objective.clip_range`) reports the clip fraction in that one."""
    kl_beta: float = 1.0
    """The KL coefficient of the "kl" objectives (adaptive_kl: its start)."""
    kl_target: float = 0.01
    """The target KL of adaptive_kl: beta halves below it / 1.5 and doubles above 1.5 times it."""
    max_importance_ratio: float | None = None
    """Cap of ``pi / pi_behav`` (the PPO-EWMA reference code's 100); null: no cap."""
    value_coef: float = 0.5
    """Coefficient of the L2 value loss."""
    entropy_coef: float = 0.01
    """Coefficient of the entropy bonus."""
    value_clip_eps: float | None = None
    """Clip the value around the behavior value (PPO2 baselines); null: off."""
    kl_form: str = "analytic"
    """The KL term of the "kl" objectives: "analytic" (exact KL between the anchor's and the current
    distribution) or "sq_logratio" (the reference code's ``0.5 (log pi(a) - log pi_anchor(a))^2``)."""
    value_loss: str = "mse"
    """The value loss, a hook of `ppo_lightning.algos.hooks` by name: "mse", "clipped", "huber", another
    registered name or a function's import path; times ``value_coef``."""
    value_loss_args: dict[str, Any] | None = None
    """The value loss's own settings, e.g. ``{delta: 0.5}`` for "huber"."""
    aux_terms: dict[str, Any] | None = None
    """Auxiliary loss terms added to the loss, ``{name: {coef: c, <settings>}}`` (hooks of
    `ppo_lightning.algos.hooks`, e.g. ``{logit_l2: {coef: 0.001}}``); null: none."""

    def __post_init__(self) -> None:
        get_objective(self.objective).check_args(self.objective_args)
        VALUE_LOSSES.check(self.value_loss, self.value_loss_args, "model.value_loss_args")
        check_aux_terms(self.aux_terms)
        for name in ("clip_eps", "kl_target"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise ValueError(f"model.{name} must be > 0, got {value!r}")
        for name in ("kl_beta", "value_coef", "entropy_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"model.{name} must be >= 0, got {getattr(self, name)!r}")
        if self.max_importance_ratio is not None and self.max_importance_ratio <= 1:
            raise ValueError(f"model.max_importance_ratio must be > 1, got {self.max_importance_ratio}")
        if self.value_clip_eps is not None and self.value_clip_eps <= 0:
            raise ValueError(f"model.value_clip_eps must be > 0, got {self.value_clip_eps}")
        if self.kl_form not in KL_FORMS:
            raise ValueError(f"model.kl_form must be one of {KL_FORMS}, got {self.kl_form!r}")


# The loss settings by name, with their defaults (`LossSettings`).
LOSS_SETTINGS: dict[str, Any] = {f.name: f.default for f in fields(LossSettings)}


def settings_table() -> str:
    """The loss settings as a Markdown table (name, type, default, meaning; members: whether a seed
    group's members may each have their own), from `LossSettings`'s fields and their docstrings."""
    import docstring_parser  # jsonargparse's; reads the attribute docstrings

    docs = {p.arg_name: p.description for p in docstring_parser.parse_from_object(LossSettings).params}
    rows = ["| setting | type | default | per member | meaning |", "|---|---|---|---|---|"]
    for f in fields(LossSettings):
        default = "null" if f.default is None else str(f.default).lower() if isinstance(f.default, bool) else f.default
        doc, kind = " ".join(docs[f.name].split()).replace("|", "\\|"), str(f.type).replace("|", "\\|")
        rows.append(f"| `model.{f.name}` | `{kind}` | `{default}` | {'yes' if f.name in MEMBER_LOSS_SETTINGS else ''} | {doc} |")
    return "\n".join(rows) + "\n"


class PPOFamilyLoss(LossModule):
    """PPO losses of Schulman et al. (2017) and their decoupled forms (Hilton et al. 2021).

    Args:
        network: an actor-critic whose ``forward(obs)`` returns ``(*dist_params, value)`` (a recurrent
            one's ``forward(obs, state, is_init)`` over segments, `ppo_lightning.nets.recurrent`).
        action_space: plain dict (see `ppo_lightning.nets.models`).
        settings: the loss settings, `LossSettings` (the module's ``model.<name>`` settings): the
            objective (``adaptive_kl``'s beta is adapted once per iteration by `update_kl_beta`, never
            inside ``forward``), the decoupled form, the clip range, coefficients and KL form.
        stacked_seeds: the network is a group's stacked network (`ppo_lightning.nets.seed_stack.SeedStack`),
            its inputs ``[S, B]``: the KL beta is one per member (``[S]``, each adapted on its own
            KL) and members may have their own loss settings (`set_member_settings`). The forward
            is the same code for both: it reduces over the samples, so a group's entries are ``[S]``.
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

    def __init__(self, network: nn.Module, action_space: dict, *, stacked_seeds: bool = False, **settings: Any) -> None:
        super().__init__()
        settings = LossSettings(**settings)
        self.kl_form = settings.kl_form
        self.objective_spec = get_objective(settings.objective)
        self.objective_args = self.objective_spec.check_args(settings.objective_args)
        self.objective_call_args = self.objective_spec.full_args(self.objective_args)  # defaults filled
        # the hooks past the surrogate (ppo_lightning.algos.hooks): the value loss and auxiliary terms
        self.value_loss_spec, self.value_loss_args = VALUE_LOSSES.check(settings.value_loss, settings.value_loss_args,
                                                                        "model.value_loss_args")
        self.aux_specs = check_aux_terms(settings.aux_terms)
        # Not registered as a submodule: the LightningModule owns the network (one copy of the
        # weights in its state_dict, and FSDP wraps it there).
        self.__dict__["network"] = network
        self.action_space = action_space
        self.param_keys = dist_param_keys(action_space)
        self.objective = self.objective_spec.name
        self.decoupled = settings.decoupled
        self.clip_eps = settings.clip_eps
        self.kl_target = settings.kl_target
        self.max_importance_ratio = settings.max_importance_ratio
        self.value_coef = settings.value_coef
        self.entropy_coef = settings.entropy_coef
        self.value_clip_eps = settings.value_clip_eps
        self.stacked_seeds = stacked_seeds
        # [S] bools of a group whose members have their own anchors (``member_hparams.proximal_com``):
        # True where the anchor is the behavior policy (PPO members of a decoupled group); set by the module
        self.behavior_anchor: torch.Tensor | None = None
        # A buffer, so that the adapted beta is saved in (and restored from) the checkpoint; one per
        # seed of a vectorized group ([S], S of the stacked network: each seed's beta adapts to its own KL).
        beta = torch.tensor(float(settings.kl_beta), dtype=torch.float64)
        self.register_buffer("kl_beta", beta.expand(network.members).clone() if stacked_seeds else beta)

    def set_member_settings(self, values: dict[str, list]) -> None:
        """A group's members with their own loss settings (``stacked_seeds``): ``values`` maps a name of
        `MEMBER_LOSS_SETTINGS` to one value per seed. Where the members' values differ, the setting
        becomes a tensor over the seeds that broadcasts against the ``[S, B]`` samples and the ``[S]``
        reductions, each seed's entries those of its own single run (the clip range in float64 as a
        Python number, `ppo_lightning.algos.objectives.clip_bounds`; the coefficients in the loss's
        dtype, as a number meets a tensor); where they agree it stays a number (the path of a plain group).
        The KL beta's start fills the per-seed buffer (adapted per seed after)."""
        if not self.stacked_seeds:
            raise ValueError("per-member loss settings need a seed group (stacked_seeds)")
        for name, vals in values.items():
            if name not in MEMBER_LOSS_SETTINGS:
                raise ValueError(f"{name!r} is not a per-member loss setting ({', '.join(MEMBER_LOSS_SETTINGS)})")
            vals = [float(v) for v in vals]
            if len(vals) != self.network.members:
                raise ValueError(f"member loss setting {name}: {len(vals)} values for {self.network.members} seeds")
            if name == "kl_beta":
                self.kl_beta.copy_(torch.tensor(vals, dtype=self.kl_beta.dtype))
            elif len(set(vals)) == 1:
                setattr(self, name, vals[0])
            elif name == "clip_eps":
                self.clip_eps = torch.tensor(vals, dtype=torch.float64)[:, None]
            elif name == "kl_target":  # read once per iteration per member, as the Python number of its run
                self.kl_target = torch.tensor(vals, dtype=torch.float64)
            else:
                setattr(self, name, torch.tensor(vals))

    def reset_member(self, k: int, kl_beta: float, settings: dict[str, list], behavior_anchor: torch.Tensor | None) -> None:
        """Member k of a group starts again (a refilled slot): its KL beta back to ``kl_beta`` (the
        others' adapted betas go on), the members' loss ``settings`` (`set_member_settings`, member k's
        values new) and which members anchor to the behavior policy."""
        self.behavior_anchor = behavior_anchor
        if settings:
            self.set_member_settings(settings)
        self.kl_beta[k] = kl_beta

    def _forward_value_estimator_keys(self, **kwargs) -> None:
        pass  # GAE runs on the data side; nothing to forward.

    def kl(self, anchor_params, params):
        """Exact ``KL[anchor || current]`` per sample from the two distributions' parameters."""
        if self.action_space["type"] == "discrete":
            return F.categorical_kl(anchor_params[0], params[0])
        if self.action_space["type"] == "composite":  # the sum of the parts' KLs (ppo_lightning.nets.composite)
            return composite_kl(self.action_space["space"], anchor_params[0], params[0])
        return F.diagonal_normal_kl(anchor_params[0], anchor_params[1], params[0], params[1])

    _kl = kl

    def surrogate(self, x: SurrogateInputs) -> torch.Tensor:
        """The per-sample surrogate to maximize: the registered objective's function with
        ``objective_args``. A subclass may override this one method instead of registering a function."""
        return self.objective_spec.fn(x, **self.objective_call_args)

    def value_loss(self, v: ValueInputs) -> torch.Tensor:
        """The per-sample value loss: the hook ``model.value_loss`` names with ``value_loss_args``
        (`ppo_lightning.algos.hooks`). A subclass may override this one method instead."""
        return self.value_loss_spec.fn(v, **self.value_loss_args)

    def update_kl_beta(self, mean_kl: float, member: int = 0) -> float:
        """Adapt ``member``'s beta once per iteration (PPO paper rule) on its own mean KL; returns the
        new beta. A non-finite KL leaves beta as it is. (A single run's beta is a scalar: its member 0.)"""
        beta = self.kl_beta if self.kl_beta.dim() == 0 else self.kl_beta[member]
        target = self.kl_target if not isinstance(self.kl_target, torch.Tensor) else float(self.kl_target[member])
        if self.objective_spec.adaptive_beta and math.isfinite(mean_kl):
            beta.fill_(F.adaptive_kl_beta(float(beta), mean_kl, target))
        return float(beta)

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        keys = self.tensor_keys
        # Reductions run over the samples, the last dimension: [S, B] minibatches (S = 1 for a single
        # run) give one value per member, a caller's [B] batch scalars (the same reduction either way).
        dim = -1

        def mean(x: torch.Tensor) -> torch.Tensor:
            return x.mean(dim)

        if is_recurrent(self.network):
            # [*, B, L] segments, each unrolled from its stored start state (ppo_lightning.nets.recurrent),
            # then the batch and the outputs flattened to [*, B * L] samples for the unchanged math below
            *params, value = call(self.network, "forward", tensordict)
            tensordict, params, value = flatten_segments(tensordict, params, value)
        else:
            *params, value = self.network(tensordict.get(keys.observation))
        action = tensordict.get(keys.action)
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

        kl_anchor = self.kl([p.detach() for p in anchor_params], params)
        if self.kl_form == "sq_logratio":  # the reference code's penalty: 0.5 (log pi - log pi_anchor)^2
            kl_anchor = F.squared_log_ratio_kl(log_prob, anchor_log_prob.detach())
        beta = self.kl_beta.float().unsqueeze(-1)  # [S, 1] against [S, B] samples (a single run's scalar beta: [1])
        x = SurrogateInputs(log_prob, behavior_log_prob, advantage, proximal_log_prob, kl_anchor, beta, self.clip_eps,
                            self.max_importance_ratio)
        surrogate = self.surrogate(x)

        value = value.reshape(log_prob.shape)
        value_target = tensordict.get(keys.value_target).reshape(log_prob.shape)
        behavior_value = tensordict.get(keys.behavior_value, None)
        if behavior_value is not None:
            behavior_value = behavior_value.reshape(log_prob.shape)
        entropy = dist.entropy()

        value_inputs = ValueInputs(value, value_target, behavior_value, self.value_clip_eps)
        out = TensorDict(
            {
                "loss_objective": -mean(surrogate),
                "loss_critic": self.value_coef * mean(self.value_loss(value_inputs)),
                "loss_entropy": -self.entropy_coef * mean(entropy),
            },
            batch_size=[],
        )
        if self.aux_specs:  # auxiliary terms (hooks): coef * mean, summed by the module with the others
            terms = TermInputs(x, value_inputs, entropy, tuple(params), tensordict.get(keys.observation))
            for entry, (hook, coef, args) in self.aux_specs.items():
                out.set(entry, coef * mean(hook.fn(terms, **args)))
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
                    "importance_ratio_max": ratio_behav.amax(dim),
                    "importance_ratio_capped_fraction": mean((capped != behavior_log_prob).float()),
                    "explained_variance": F.explained_variance(value.detach(), value_target, dim),
                    "kl_beta": self.kl_beta.float(),
                }
            )
            clip_range = self.objective_spec.clip_range(self.clip_eps, self.objective_call_args)
            if clip_range is not None:  # the objective's own range (none for the KL objectives)
                out.set("clip_fraction", F.clip_fraction(lp, anchor_log_prob, clip_range[0], dim, eps_high=clip_range[1]))
        return out

