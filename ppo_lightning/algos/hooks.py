"""Hooks past the surrogate: the value loss and auxiliary loss terms, each a registered pure function
selected by name, as the objectives are (`ppo_lightning.algos.registry`).

- **Value loss** (``model.value_loss``, ``model.value_loss_args``): ``fn(v: ValueInputs, **settings)``
  returns the per-sample value loss to MINIMIZE (``[S, B]``; S = 1 for a single run); the loss
  averages it and multiplies by ``model.value_coef`` (``loss_critic``). Built in: ``mse`` (the default:
  ``(V - V_targ)^2``, clipped around the behavior value when ``model.value_clip_eps`` is set), ``clipped``
  (PPO2's clipped form with its own ``eps``), ``huber`` (``delta``).
- **Auxiliary terms** (``model.aux_terms: {name: {coef: c, <settings>}}``): ``fn(t: TermInputs,
  **settings)`` returns a per-sample loss to MINIMIZE; the loss adds ``coef * mean`` as the entry
  ``loss_aux_<name>`` (the last part of an import path), which the module sums with the other terms in
  PPO's joint step and PPG's policy phase. Built in: ``logit_l2`` (``0.5 * mean(logits^2)`` per sample,
  a penalty that keeps logits small).

A hook is named by its registered name or by a function's import path (``my_pkg.variants.huber``;
importing the module registers what it decorates). Its settings are its keyword arguments, or the
dataclass given as ``settings=`` (`ppo_lightning.algos.settings`), checked before training. A hook sees
only its documented inputs (`ValueInputs`, `TermInputs`): no attribute of the loss or the module.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from ppo_lightning.algos import objectives as F
from ppo_lightning.algos.registry import SurrogateInputs, check_schema_matches, lookup
from ppo_lightning.algos.settings import check_settings, schema_of, setting

__all__ = ["ValueInputs", "TermInputs", "Hook", "HookRegistry", "VALUE_LOSSES", "AUX_TERMS",
           "register_value_loss", "register_aux_term", "AUX_PREFIX"]

AUX_PREFIX = "loss_aux_"  # the entries of auxiliary terms in the loss's output


@dataclass(frozen=True)
class ValueInputs:
    """What a value loss receives, per sample (``[S, B]``; S = 1 for a single run).

    Attributes:
        value: ``V(s)`` of the current network; carries the gradient.
        value_target: the GAE return target (batch key ``value_target``).
        behavior_value: the value at collection (batch key ``state_value``), or None.
        value_clip_eps: ``model.value_clip_eps`` (None: off).
    """

    value: Tensor
    value_target: Tensor
    behavior_value: Tensor | None
    value_clip_eps: float | None


@dataclass(frozen=True)
class TermInputs:
    """What an auxiliary term receives, per sample.

    Attributes:
        surrogate: the `ppo_lightning.algos.registry.SurrogateInputs` of the step (log-probs, advantage,
            KL to the anchor, ratio, ...).
        value: the `ValueInputs` of the step.
        entropy: the policy's entropy per sample, with gradient.
        dist_params: the current policy's distribution parameters (``[logits]`` or ``[loc, scale]``),
            with gradient.
        observation: the observations.
    """

    surrogate: SurrogateInputs
    value: ValueInputs
    entropy: Tensor
    dist_params: tuple[Tensor, ...]
    observation: Tensor


@dataclass(frozen=True)
class Hook:
    """A registered hook: its name, function and settings dataclass (None: the function's keyword arguments)."""

    name: str
    fn: Callable[..., Tensor]
    schema: type | None = None

    @property
    def settings_schema(self) -> type:
        return self.schema if self.schema is not None else schema_of(self.fn, skip=1)


class HookRegistry:
    """Hooks of one kind by name (``kind``: "value loss"; ``setting``: the model setting that names one)."""

    def __init__(self, kind: str, setting: str, signature: str) -> None:
        self.kind, self.setting, self.signature = kind, setting, signature
        self._hooks: dict[str, Hook] = {}

    def register(self, name: str, fn: Callable | None = None, *, settings: type | None = None):
        """Register ``fn`` as ``name`` (a decorator without ``fn``); again replaces. Returns ``fn``."""
        def add(f: Callable) -> Callable:
            if not callable(f) or not list(inspect.signature(f).parameters):
                raise ValueError(f"{self.kind} {name!r}: a function of {self.signature} is needed")
            check_schema_matches(f"{self.kind} {name!r}", f, settings)
            self._hooks[name] = Hook(name, f, settings)
            return f

        return add if fn is None else add(fn)

    def names(self) -> tuple[str, ...]:
        return tuple(self._hooks)

    def get(self, name: str) -> Hook:
        """The hook ``name`` names: registered, or a function's import path (importing registers it)."""
        return lookup(self._hooks, name, self.setting,
                      lambda path, fn, known: Hook(path, fn, known.schema if known else None))

    def check(self, name: str, args: dict[str, Any] | None, where: str) -> tuple[Hook, dict[str, Any]]:
        """The hook and its settings (every one, defaults filled), checked: one-line errors before training."""
        hook = self.get(name)
        return hook, check_settings(hook.settings_schema, args, where, f"{self.kind} {name!r}")


VALUE_LOSSES = HookRegistry("value loss", "model.value_loss", "(v: ValueInputs, **settings)")
AUX_TERMS = HookRegistry("auxiliary term", "model.aux_terms", "(t: TermInputs, **settings)")
register_value_loss = VALUE_LOSSES.register
register_aux_term = AUX_TERMS.register


def check_aux_terms(aux_terms: dict[str, Any] | None) -> dict[str, tuple[Hook, float, dict[str, Any]]]:
    """``model.aux_terms`` (``{name: {coef: c, <settings>}}``; a bare name takes coef 1) checked:
    ``{entry name: (hook, coef, settings)}``."""
    if aux_terms is None:
        return {}
    if not isinstance(aux_terms, dict):
        raise ValueError(f"model.aux_terms must be {{name: {{coef: c, <settings>}}}} or null, got {aux_terms!r}")
    out = {}
    for name, spec in aux_terms.items():
        spec = dict(spec or {})
        coef = spec.pop("coef", 1.0)
        if isinstance(coef, bool) or not isinstance(coef, (int, float)) or coef < 0:
            raise ValueError(f"model.aux_terms.{name}.coef must be a number >= 0, got {coef!r}")
        hook, settings = AUX_TERMS.check(name, spec, f"model.aux_terms.{name}")
        out[AUX_PREFIX + str(name).rpartition(".")[2]] = (hook, float(coef), settings)
    return out


# ---------------------------------------------------------------------- built-in value losses
@register_value_loss("mse")
def mse(v: ValueInputs) -> Tensor:
    """``(V - V_targ)^2`` (clipped around the behavior value with ``model.value_clip_eps``;
    `ppo_lightning.algos.objectives.value_loss`)."""
    return F.value_loss(v.value, v.value_target, v.behavior_value, v.value_clip_eps)


@dataclass
class ClippedSettings:
    eps: float = setting(0.2, check="> 0", doc="the clip range around the behavior value")


@register_value_loss("clipped", settings=ClippedSettings)
def clipped(v: ValueInputs, eps: float = 0.2) -> Tensor:
    """PPO2's clipped value loss around the behavior value, with its own range ``eps``."""
    if v.behavior_value is None:
        raise ValueError("model.value_loss clipped needs the behavior value (batch key state_value)")
    return F.value_loss(v.value, v.value_target, v.behavior_value, eps)


@dataclass
class HuberSettings:
    delta: float = setting(1.0, check="> 0", doc="where the loss turns from quadratic to linear")


@register_value_loss("huber", settings=HuberSettings)
def huber(v: ValueInputs, delta: float = 1.0) -> Tensor:
    """Huber loss of ``V - V_targ`` (`ppo_lightning.algos.objectives.huber_value_loss`)."""
    return F.huber_value_loss(v.value, v.value_target, delta)


# ---------------------------------------------------------------------- built-in auxiliary terms
@register_aux_term("logit_l2")
def logit_l2(t: TermInputs) -> Tensor:
    """``0.5 * mean_a(logits^2)`` per sample (a discrete policy's first distribution parameter); the
    masked logits of illegal actions (`ppo_lightning.nets.composite.MASKED_LOGIT`) count as 0."""
    from ppo_lightning.nets.composite import MASKED_LOGIT

    logits = t.dist_params[0]
    return 0.5 * torch.where(logits > MASKED_LOGIT / 2, logits, 0.0).pow(2).mean(-1)
