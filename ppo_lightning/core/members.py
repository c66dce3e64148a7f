"""The settings a seed group's members may each have their own of: one declaration, `MEMBER_SETTINGS`.

Member k of a group (``data.member_seeds`` + ``data.member_hparams``) trains as the single run with
seed ``seeds[k]`` and the values ``member_hparams[name][k]``. Every list of member settings in the
package is derived from `MEMBER_SETTINGS`: the names a group accepts and their checks
(`validate_member_values`), the data side's and the loss's
(`DATA_MEMBER_SETTINGS`, `LOSS_MEMBER_SETTINGS`), the fit options a study arm or a search space may
vary within one group (`MEMBER_OPTIONS`: ``ppo_lightning.studies.runner``,
``ppo_lightning.tuning.space``) and the table in docs/guides/configs.md (`members_table`, checked by
tests/test_docs.py). A new member setting is one entry here plus the code that applies it per member.

Plain data, no torch: the study and tuning front ends read it without the training stack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _betas(v: Any) -> bool:
    return (isinstance(v, (list, tuple)) and len(v) == 2
            and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0.0 <= b < 1.0 for b in v))


@dataclass(frozen=True)
class MemberSetting:
    """One setting members may differ in."""

    name: str  # its name in ``data.member_hparams``
    option: str  # the fit option it replaces (``model.lr``)
    default: Any  # that option's default (the module's or the data module's)
    meaning: str  # what it is, for the docs table
    need: str  # the valid values, for errors and the table
    valid: Callable[[Any], bool]  # whether a value is valid
    loss: bool = False  # the loss module applies it (`ppo_lightning.algos.loss.PPOFamilyLoss.set_member_settings`)
    always: bool = False  # a study or search carries it for every member, not only where an arm or space sets it
    note: str = ""  # restrictions, for the docs table

    @property
    def side(self) -> str:
        """``model`` or ``data``: which module takes it."""
        return self.option.split(".")[0]


MEMBER_SETTINGS: tuple[MemberSetting, ...] = (
    MemberSetting("lr", "model.lr", 5e-4, "Adam's step size", "> 0", lambda v: _number(v) and v > 0, always=True,
                  note="fused Adam only (`MemberAdam`)"),
    MemberSetting("proximal_com", "model.proximal_com", None, "the EWMA's center of mass, gradient steps",
                  ">= 0 or null (the behavior policy as anchor: PPO)", lambda v: v is None or (_number(v) and v >= 0),
                  always=True, note="needs `model.decoupled: true`; `null`: the behavior policy is the anchor (PPO)"),
    MemberSetting("advantage_norm_span", "data.advantage_norm_span", 1.0, "the advantage normalizer's span, iterations",
                  ">= 1", lambda v: _number(v) and v >= 1, always=True),
    MemberSetting("adam_betas", "model.adam_betas", [0.9, 0.999], "Adam's `[beta1, beta2]`",
                  "two numbers in [0, 1)", _betas, always=True, note="fused Adam only"),
    MemberSetting("clip_eps", "model.clip_eps", 0.2, "the clip range", "> 0", lambda v: _number(v) and v > 0, loss=True),
    MemberSetting("entropy_coef", "model.entropy_coef", 0.01, "the entropy coefficient", ">= 0",
                  lambda v: _number(v) and v >= 0, loss=True),
    MemberSetting("value_coef", "model.value_coef", 0.5, "the value-loss coefficient", ">= 0",
                  lambda v: _number(v) and v >= 0, loss=True),
    MemberSetting("kl_beta", "model.kl_beta", 1.0, "the KL beta (its start with `adaptive_kl`, adapted per member after)",
                  ">= 0", lambda v: _number(v) and v >= 0, loss=True),
    MemberSetting("kl_target", "model.kl_target", 0.01, "the adaptive KL's target d_targ (`adaptive_kl`)", "> 0",
                  lambda v: _number(v) and v > 0, loss=True),
    MemberSetting("gamma", "data.gamma", 0.99, "the discount (returns, reward normalization)", "in [0, 1]",
                  lambda v: _number(v) and 0 <= v <= 1),
    MemberSetting("gae_lambda", "data.gae_lambda", 0.95, "GAE's lambda", "in [0, 1]", lambda v: _number(v) and 0 <= v <= 1),
)

BY_NAME = {s.name: s for s in MEMBER_SETTINGS}
MEMBER_NAMES = tuple(BY_NAME)  # the names ``data.member_hparams`` accepts
DATA_MEMBER_SETTINGS = tuple(s.name for s in MEMBER_SETTINGS if s.side == "data")  # each member's returns and advantages
LOSS_MEMBER_SETTINGS = tuple(s.name for s in MEMBER_SETTINGS if s.loss)
MEMBER_OPTIONS = {s.option: s.name for s in MEMBER_SETTINGS}  # a fit option -> the member setting it is
ALWAYS_MEMBER_SETTINGS = tuple(s.name for s in MEMBER_SETTINGS if s.always)
# fit options carried only where an arm or a search space sets them, with their defaults
OPTIONAL_MEMBER_OPTIONS = {s.option: s.default for s in MEMBER_SETTINGS if not s.always}


def validate_member_values(member_hparams: dict[str, Any], num_members: int) -> None:
    """One-line errors for ``member_hparams`` (``{name: [one value per member]}``)."""
    for name, values in member_hparams.items():
        setting = BY_NAME.get(name)
        if setting is None:
            raise ValueError(f"member_hparams: {name!r} cannot differ between members; choose from {list(MEMBER_NAMES)}")
        if not isinstance(values, (list, tuple)) or len(values) != num_members:
            raise ValueError(f"member_hparams.{name} needs one value per member ({num_members}), got {values!r}")
        for v in values:
            if not setting.valid(v):
                raise ValueError(f"member_hparams.{name} values must be {setting.need}, got {v!r}")


def members_table() -> str:
    """The member settings as a Markdown table (docs/guides/configs.md)."""
    rows = ["| name | per member | valid values | note |", "|---|---|---|---|"]
    for s in MEMBER_SETTINGS:
        note = f"instead of `{s.option}`" + (f"; {s.note}" if s.note else "")
        rows.append(f"| `{s.name}` | {s.meaning} | {s.need} | {note} |")
    return "\n".join(rows) + "\n"


# ----------------------------------------------------------------------------- members' metrics
class PerMember(tuple):
    """One metric's value for each member of a run, in member order (a single run's has one).

    The training components (loss diagnostics, the data module's episodes, the EWMA proximal policy,
    PPG's auxiliary phase, the numerical guard, the noise scale) return these; `name_members` is the
    one place a member's metric gets its name."""


def member_metric(k: int, name: str) -> str:
    """The logged name of member ``k``'s metric ``name`` in a group: ``seed<k>/<name>``."""
    return f"seed{k}/{name}"


def name_members(metrics: dict[str, Any], num_members: int) -> tuple[dict[str, float], list[dict[str, float]]]:
    """The metrics to log, and each member's own (for its child run, under the single-run names).

    A `PerMember` value of a group is member k's under ``seed<k>/<name>`` and the mean over the members
    that have one under ``<name>``; a single run's is ``<name>``; a NaN member value (no episode yet) is
    not logged. Any other value is shared by every member, under its name. A `PerMember` of the wrong
    length is a ValueError (a component that lost a member)."""
    logged: dict[str, float] = {}
    own: list[dict[str, float]] = [{} for _ in range(num_members)]
    shared: dict[str, float] = {}
    for name, value in metrics.items():
        if not isinstance(value, PerMember):
            shared[name] = value
            continue
        if len(value) != num_members:
            raise ValueError(f"metric {name!r} has {len(value)} member values for {num_members} members")
        have = [(k, float(v)) for k, v in enumerate(value) if not math.isnan(v)]  # NaN: none yet (no episode)
        if num_members == 1:
            if have:
                logged[name] = own[0][name] = have[0][1]
            continue
        for k, v in have:
            logged[member_metric(k, name)] = own[k][name] = v
        if have:
            logged[name] = sum(v for _, v in have) / len(have)
    logged.update(shared)
    return logged, [{**shared, **m} for m in own]
