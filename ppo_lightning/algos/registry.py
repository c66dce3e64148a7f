"""Objectives by name: the surrogate `ppo_lightning.algos.loss.PPOFamilyLoss` maximizes, chosen with
``model.objective``.

An objective is a pure function ``fn(x: SurrogateInputs, **settings) -> Tensor`` returning the
per-sample surrogate to MAXIMIZE, shaped like ``x.log_prob`` (``[S, B]``: S members, one for a single run,
by B samples; every input carries the member dimension, so an elementwise function works unchanged); the loss
negates and averages it. ``settings`` are the objective's own keyword arguments (with defaults),
given as ``model.objective_args`` and saved in the checkpoint with the other hyperparameters.

``model.objective`` names a registered objective (`objective_names`) or the import path of a
function (``my_pkg.variants.clip_higher``): importing its module registers what it decorates with
`register_objective`, so a checkpoint resumes by the same name. The names are checked here and only
here (`get_objective`), for the loss, the module and the command line alike.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import torch
from torch import Tensor

from ppo_lightning.algos import objectives as F
from ppo_lightning.algos.settings import check_settings, schema_of

__all__ = ["SurrogateInputs", "Objective", "register_objective", "get_objective", "objective_names", "OBJECTIVE_SETTINGS",
           "unused_settings"]

# The loss settings an objective may use or ignore (`Objective.uses`); the loss uses the others whatever
# the objective (the value loss, the entropy bonus, the decoupled form).
OBJECTIVE_SETTINGS = ("clip_eps", "kl_beta", "kl_target", "kl_form", "max_importance_ratio")


@dataclass(frozen=True)
class SurrogateInputs:
    """What an objective receives, per sample (``[S, B]``; S = 1 for a single run).

    Attributes:
        log_prob: ``log pi(a|s)`` of the current policy; carries the gradient.
        behavior_log_prob: ``log pi_behav(a|s)``, the collector's (batch key ``action_log_prob``), uncapped.
        advantage: the advantage (normalized as the data side configures).
        proximal_log_prob: ``log pi_prox(a|s)`` in the decoupled form (``model.decoupled``), else None.
        kl: ``KL[pi_anchor || pi]`` per sample in ``model.kl_form``, with gradient (the anchor is the
            proximal policy in the decoupled form, the behavior policy otherwise).
        beta: the KL coefficient (a tensor broadcastable to ``log_prob``; adapted per iteration by
            objectives registered with ``adaptive_beta``).
        clip_eps, max_importance_ratio: ``model.clip_eps`` and ``model.max_importance_ratio``.
    """

    log_prob: Tensor
    behavior_log_prob: Tensor
    advantage: Tensor
    proximal_log_prob: Tensor | None
    kl: Tensor
    beta: Tensor
    clip_eps: float
    max_importance_ratio: float | None

    @property
    def capped_behavior_log_prob(self) -> Tensor:
        """The behavior log-prob raised so that ``pi / pi_behav <= max_importance_ratio``
        (`ppo_lightning.algos.objectives.cap_behavior_log_prob`)."""
        return F.cap_behavior_log_prob(self.log_prob, self.behavior_log_prob, self.max_importance_ratio)

    @property
    def anchor_log_prob(self) -> Tensor:
        """The anchor of the trust region: the proximal policy's (decoupled) or the capped behavior log-prob."""
        return self.capped_behavior_log_prob if self.proximal_log_prob is None else self.proximal_log_prob

    @property
    def ratio(self) -> Tensor:
        """``r = pi / pi_anchor``, with gradient."""
        return torch.exp(self.log_prob - self.anchor_log_prob)

    def clamp_ratio(self, eps_low: float | Tensor | None = None, eps_high: float | Tensor | None = None) -> Tensor:
        """``clip(r, 1 - eps_low, 1 + eps_high)`` with ``r = x.ratio``; each bound ``x.clip_eps`` where not
        given (a seed group's per-member clip range included: its bounds in the ratio's dtype,
        `ppo_lightning.algos.objectives.clip_bounds`)."""
        ratio = self.ratio
        low = F.clip_bounds(self.clip_eps if eps_low is None else eps_low, ratio)[0]
        high = F.clip_bounds(self.clip_eps if eps_high is None else eps_high, ratio)[1]
        return ratio.clamp(low, high)

    @property
    def weight(self) -> Tensor | float:
        """The decoupled form's importance weight ``pi_prox / pi_behav`` without gradient; 1.0 in the
        standard form. ``weight * g(ratio)`` is the decoupled form of a surrogate ``g(r)`` (Hilton et
        al. 2021, eq. 2)."""
        if self.proximal_log_prob is None:
            return 1.0
        return torch.exp(self.proximal_log_prob - self.capped_behavior_log_prob).detach()


@dataclass(frozen=True)
class Objective:
    """A registered objective: its name, its function, whether ``beta`` adapts once per iteration
    (`ppo_lightning.algos.objectives.adaptive_kl_beta` on the mean ``kl_anchor``), its settings (a
    dataclass, ``settings=`` at registration, `ppo_lightning.algos.settings`, or the function's keyword
    arguments after ``x`` with their annotations and defaults), the loss settings of
    `OBJECTIVE_SETTINGS` it reads (``declared_uses``; None: not declared, every one counts as used) and
    its clip range for the diagnostics (``declared_clip_range``: a function of ``clip_eps`` and the
    objective's settings giving ``(eps_low, eps_high)``, the ratio clipped to ``[1 - eps_low, 1 +
    eps_high]``; None: ``(clip_eps, clip_eps)`` where it uses ``clip_eps``, else no clip range)."""

    name: str
    fn: Callable[..., Tensor]
    adaptive_beta: bool = False
    schema: type | None = None
    declared_uses: tuple[str, ...] | None = None
    declared_clip_range: Callable[..., tuple] | None = None

    @property
    def uses(self) -> tuple[str, ...]:
        """The loss settings of `OBJECTIVE_SETTINGS` this objective reads: its declared ones (an adaptive
        beta reads ``kl_target`` and ``kl_beta`` too), or all of them when it declared none."""
        if self.declared_uses is None:
            return OBJECTIVE_SETTINGS
        extra = ("kl_beta", "kl_target") if self.adaptive_beta else ()
        return tuple(n for n in OBJECTIVE_SETTINGS if n in self.declared_uses or n in extra)

    def clip_range(self, clip_eps, args: dict[str, Any]) -> tuple | None:
        """``(eps_low, eps_high)`` of this objective with ``clip_eps`` (a number, or one per member) and its
        settings ``args`` (every one, `full_args`); None for an objective that clips nothing."""
        if self.declared_clip_range is not None:
            return tuple(self.declared_clip_range(clip_eps, **args))
        return (clip_eps, clip_eps) if "clip_eps" in self.uses else None

    @property
    def settings_schema(self) -> type:
        return self.schema if self.schema is not None else schema_of(self.fn, skip=1)

    @property
    def settings(self) -> dict[str, Any]:
        """The settings by name with their defaults (``inspect.Parameter.empty``: required)."""
        import dataclasses

        return {f.name: f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else inspect.Parameter.empty)
            for f in dataclasses.fields(self.settings_schema)}

    def check_args(self, args: dict[str, Any] | None) -> dict[str, Any]:
        """``model.objective_args`` for this objective, checked against its settings (names, types,
        checks; one-line errors naming the setting, before training). Returns the given ones, converted."""
        args = dict(args or {})
        full = self.full_args(args)
        return {k: full[k] for k in args}

    def full_args(self, args: dict[str, Any] | None) -> dict[str, Any]:
        """Every setting of this objective, checked: the given ones and the defaults of the others (the
        keyword arguments its function is called with)."""
        return check_settings(self.settings_schema, args, "model.objective_args", f"objective {self.name!r}")


_OBJECTIVES: dict[str, Objective] = {}


def register_objective(name: str, fn: Callable[..., Tensor] | None = None, *, adaptive_beta: bool = False,
                       settings: type | None = None, uses: tuple[str, ...] | None = None,
                       clip_range: Callable[..., tuple] | None = None):
    """Register ``fn`` as objective ``name`` (usable as a decorator: ``@register_objective("name")``).
    ``settings``: a dataclass declaring its settings (types, defaults, checks; `ppo_lightning.algos.settings`),
    whose fields are ``fn``'s keyword arguments; without it, ``fn``'s own keyword arguments are.
    ``uses``: the loss settings of `OBJECTIVE_SETTINGS` it reads (a run that sets another is refused,
    `unused_settings`); None: not declared. ``clip_range``: ``fn(clip_eps, **settings) -> (eps_low,
    eps_high)``, its clip range for the clip fraction (`Objective.clip_range`).
    Registering a name again replaces it (re-importing a user module is harmless). Returns ``fn``."""
    if uses is not None:
        unknown = [u for u in uses if u not in OBJECTIVE_SETTINGS]
        if unknown:
            raise ValueError(f"objective {name!r}: uses={unknown} are not loss settings an objective may use "
                             f"({', '.join(OBJECTIVE_SETTINGS)})")

    def add(f: Callable[..., Tensor]) -> Callable[..., Tensor]:
        if not callable(f) or not list(inspect.signature(f).parameters):
            raise ValueError(f"objective {name!r}: a function of (x: SurrogateInputs, **settings) is needed")
        check_schema_matches(f"objective {name!r}", f, settings)
        _OBJECTIVES[name] = Objective(name, f, adaptive_beta, settings, None if uses is None else tuple(uses), clip_range)
        return f

    return add if fn is None else add(fn)


def objective_names() -> tuple[str, ...]:
    """The registered names, built-ins first."""
    return tuple(_OBJECTIVES)


E = TypeVar("E")


def lookup(table: dict[str, E], name: object, setting: str, adopt: Callable[[str, Callable, E | None], E]) -> E:
    """The entry of ``table`` (name -> entry with an ``fn``) that ``name`` names, for the setting
    ``setting``: a registered name, or a function's import path (``pkg.module.fn``; importing the
    module registers what it decorates). A path is entered into ``table`` under itself as
    ``adopt(path, fn, entry)``, ``entry`` the one already registered with that function (its
    declarations kept) or None. Anything else is a one-line `ValueError`. The one lookup of the
    objective, value-loss and auxiliary-term registries."""
    if isinstance(name, str) and name in table:
        return table[name]
    if isinstance(name, str) and "." in name:
        module, _, attr = name.rpartition(".")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"{setting} {name!r}: cannot import it ({err})") from None
        known = next((e for e in table.values() if getattr(e, "fn", None) is fn), None)
        return table.setdefault(name, adopt(name, fn, known))
    raise ValueError(f"{setting} must be one of {tuple(table)} or the import path of a function "
                     f"(pkg.module.fn), got {name!r}")


def _adopt_objective(name: str, fn: Callable[..., Tensor], known: Objective | None) -> Objective:
    if known is not None:
        return Objective(name, fn, known.adaptive_beta, known.schema, known.declared_uses, known.declared_clip_range)
    register_objective(name, fn)  # checks the function
    return _OBJECTIVES[name]


def get_objective(name: str) -> Objective:
    """The objective ``model.objective`` names: a registered name or a function's import path
    (``pkg.module.fn``; importing it registers what it decorates; `lookup`). The one check of the names."""
    return lookup(_OBJECTIVES, name, "model.objective", _adopt_objective)


def check_schema_matches(what: str, fn: Callable, settings: type | None) -> None:
    """A settings dataclass given at registration names ``fn``'s keyword arguments (after the inputs)."""
    if settings is None:
        return
    import dataclasses

    if not dataclasses.is_dataclass(settings):
        raise ValueError(f"{what}: settings must be a dataclass (ppo_lightning.algos.settings), got {settings!r}")
    params = inspect.signature(fn).parameters
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = [f.name for f in dataclasses.fields(settings) if f.name not in params and not takes_kwargs]
    if unknown:
        raise ValueError(f"{what}: its settings {', '.join(unknown)} are not keyword arguments of {fn.__name__}")


# ---------------------------------------------------------------------- the built-ins
def clip(x: SurrogateInputs) -> Tensor:
    """Clipped surrogate, standard or decoupled (`ppo_lightning.algos.objectives.clipped_surrogate`)."""
    return F.clipped_surrogate(x.log_prob, x.behavior_log_prob, x.advantage, x.clip_eps, x.proximal_log_prob,
                               x.max_importance_ratio)


def kl(x: SurrogateInputs) -> Tensor:
    """KL-penalized surrogate with the anchor's KL (`ppo_lightning.algos.objectives.kl_penalized_surrogate`)."""
    return F.kl_penalized_surrogate(x.log_prob, x.behavior_log_prob, x.advantage, x.kl, x.beta, x.max_importance_ratio)


register_objective("clip", clip, uses=("clip_eps", "max_importance_ratio"))
register_objective("kl", kl, uses=("kl_beta", "kl_form", "max_importance_ratio"))  # fixed beta
# beta adapted once per iteration (PPO paper), from kl_beta, towards kl_target
register_objective("adaptive_kl", kl, adaptive_beta=True, uses=("kl_beta", "kl_form", "max_importance_ratio"))


def unused_settings(objective: Objective, values: dict[str, Any], defaults: dict[str, Any],
                    member_settings: tuple[str, ...] = (), scheduled: tuple[str, ...] = ()) -> list[str]:
    """The settings of a run that its objective ignores (`Objective.uses`), each as ``model.<name>``
    with why it counts as set: a value other than the default (``values`` against ``defaults``), a
    member's own values (``member_settings``: ``data.member_hparams.<name>``) or a schedule
    (``scheduled``: ``model.schedules.<name>``). Empty when the objective uses every one it was given."""
    found = []
    for name in OBJECTIVE_SETTINGS:
        if name in objective.uses:
            continue
        if name in scheduled:
            found.append(f"model.schedules.{name}")
        elif name in member_settings:
            found.append(f"data.member_hparams.{name}")
        elif name in values and values[name] != defaults.get(name):
            found.append(f"model.{name} {values[name]!r}")
    return found
