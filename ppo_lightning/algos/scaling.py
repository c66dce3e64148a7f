"""Batch-size invariance (Hilton, Cobbe & Schulman 2021): the scaling rules as one function of c.

Scaling *both* batch sizes (the rollout batch and the minibatch) down by a factor ``c`` keeps the
learning curve against environment steps (approximately) unchanged if, at the same time,

    Adam lr      -> lr / sqrt(c)          (SGD: lr / c)
    proximal COM -> COM * c               (the EWMA proximal policy's center of mass, gradient steps)
    adv. span    -> span * c              (advantage-normalization window in iterations: EWMA decay
                                           1 - 1/span, `ppo_lightning.algos.advantages.ewma_beta_from_span`)
    PPG N_pi     -> N_pi * c              (policy-phase iterations between auxiliary phases)
    Adam betas   -> betas ** (1 / c)      (optional)

``c < 1`` scales up. `batch_size_scaling` is the pure arithmetic; `apply_scale` applies it to a
``ppo-lightning fit`` config namespace (``--scale c``): it divides ``data.num_envs`` (and, where ``c``
does not divide it, ``data.rollout_steps``) by ``c`` and keeps ``data.num_minibatches``, so the
minibatch size is divided by ``c`` as well and the number of gradient steps per iteration is kept.

With a recurrent network (``model.network.core``) a minibatch is made of segments of L steps
(``data.sequence_length``; null: the rollout length), and ``--scale c`` divides the segments per
minibatch, never L (`scale_segments`): ``data.num_envs`` first, then the segments per env rollout
(``data.rollout_steps / L``); L keeps its value (a null ``data.sequence_length``, one segment per env
rollout, keeps the rollout length: ``c`` then divides ``data.num_envs``). The rules above are the same: they count
gradient steps, iterations and samples, which a segment of L samples changes by the same c. ``c`` must
then divide ``num_envs x rollout_steps / L`` segments, and the scaled segments must split into
``data.num_minibatches`` equal minibatches.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

RULES = ("lr", "com", "adv_span", "ppg_n_pi", "adam_betas")
DEFAULT_RULES = ("lr", "com", "adv_span", "ppg_n_pi")  # adam_betas only on request


def _check_c(c: float) -> float:
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c <= 0:
        raise ValueError(f"scale must be a positive finite number, got {c!r}")
    return float(c)


def batch_size_scaling(
    c: float,
    *,
    lr: float,
    proximal_com: float | None,
    adv_norm_span: float,
    ppg_n_pi: int | None = None,
    adam_betas: tuple[float, float] | None = None,
    optimizer: str = "adam",
) -> dict[str, Any]:
    """Scaled hyperparameters for batch sizes divided by ``c`` (``c < 1``: multiplied by ``1/c``).

    Returns ``{"lr", "proximal_com", "adv_norm_span", "ppg_n_pi", "adam_betas"}``; entries given as
    None stay None. The advantage span cannot drop below 1 (per-batch normalization), so scaling up
    clamps it there. ``ppg_n_pi`` is rounded to the nearest integer (at least 1).
    """
    c = _check_c(c)
    if optimizer not in ("adam", "sgd"):
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    out: dict[str, Any] = {
        "lr": lr / math.sqrt(c) if optimizer == "adam" else lr / c,
        "proximal_com": None if proximal_com is None else proximal_com * c,
        "adv_norm_span": max(adv_norm_span * c, 1.0),
        "ppg_n_pi": None if ppg_n_pi is None else max(1, round(ppg_n_pi * c)),
        "adam_betas": None if adam_betas is None else tuple(float(b) ** (1.0 / c) for b in adam_betas),
    }
    return out


def parse_rules(rules: str | Iterable[str] | None, scale_adam_betas: bool = False) -> tuple[str, ...]:
    """``"all"`` (default rules), ``"none"`` or a comma list of `RULES`; ``scale_adam_betas`` adds betas."""
    if rules is None or rules == "all":
        chosen = list(DEFAULT_RULES)
    elif rules in ("none", ""):
        chosen = []
    else:
        chosen = [r.strip() for r in (rules.split(",") if isinstance(rules, str) else rules) if r.strip()]
    unknown = [r for r in chosen if r not in RULES]
    if unknown:
        raise ValueError(f"scale_rules: unknown rule(s) {unknown}; choose from {list(RULES)}, 'all' or 'none'")
    if scale_adam_betas and "adam_betas" not in chosen:
        chosen.append("adam_betas")
    return tuple(chosen)


def _as_int_factor(x: float) -> int | None:
    r = round(x)
    return r if r >= 1 and math.isclose(x, r, rel_tol=1e-9, abs_tol=1e-9) else None


def _envs_first(num_envs: int, per_env: int, c: float) -> tuple[int, int] | None:
    """``(num_envs, per_env)`` with their product divided by ``c`` (a checked factor): ``num_envs`` first,
    then the units per env (steps, or a recurrent run's segments); ``c < 1`` multiplies ``num_envs``.
    None where ``c`` does not divide them (the caller names its units); one-line errors for a ``c``
    that is neither an integer nor 1/n."""
    if c >= 1:
        k = _as_int_factor(c)
        if k is None:
            raise ValueError(f"scale={c} must be an integer when >= 1 (it divides the batch sizes)")
        g = math.gcd(num_envs, k)
        rest = k // g
        return None if per_env % rest else (num_envs // g, per_env // rest)
    k = _as_int_factor(1.0 / c)
    if k is None:
        raise ValueError(f"scale={c} < 1 must be 1/n for an integer n (it multiplies data.num_envs by n)")
    return num_envs * k, per_env


def scale_batch(num_envs: int, rollout_steps: int, num_minibatches: int, c: float) -> tuple[int, int]:
    """New ``(num_envs, rollout_steps)`` with the batch divided by ``c``: envs first, then steps."""
    c = _check_c(c)
    batch = num_envs * rollout_steps
    new = _envs_first(num_envs, rollout_steps, c)
    if new is None:
        raise ValueError(
            f"scale={c} does not divide the batch: data.num_envs={num_envs} x data.rollout_steps="
            f"{rollout_steps} (divide num_envs first, then rollout_steps)"
        )
    if (new[0] * new[1]) % num_minibatches:
        raise ValueError(
            f"scale={c}: the scaled batch of {new[0] * new[1]} frames (from {batch}) does not split into "
            f"data.num_minibatches={num_minibatches} equal minibatches"
        )
    return new


def scale_segments(num_envs: int, rollout_steps: int, sequence_length: int, num_minibatches: int, c: float
                   ) -> tuple[int, int]:
    """New ``(num_envs, rollout_steps)`` of a recurrent run with the batch divided by ``c``, its
    segments of ``sequence_length`` (L) steps kept whole: envs first, then the segments per env
    rollout (``rollout_steps / L``); ``c < 1`` multiplies ``num_envs``. One-line errors where ``c``
    does not divide the segments or the scaled segments do not split into ``num_minibatches``."""
    c = _check_c(c)
    L = int(sequence_length)
    if L < 1 or rollout_steps % L:
        raise ValueError(f"data.sequence_length {L} must divide data.rollout_steps {rollout_steps}")
    per_env = rollout_steps // L
    new = _envs_first(num_envs, per_env, c)
    if new is None:
        raise ValueError(
            f"scale={c} does not divide the segments: data.num_envs={num_envs} x {per_env} segments of "
            f"data.sequence_length={L} steps per env rollout (--scale divides the segments, never their length)"
        )
    envs, segments_per_env = new
    segments = envs * segments_per_env
    if segments % num_minibatches:
        raise ValueError(
            f"scale={c}: the scaled batch of {segments} segments of {L} steps (from {num_envs * per_env}) does not "
            f"split into data.num_minibatches={num_minibatches} equal minibatches"
        )
    return envs, segments_per_env * L


def recurrent_sequence_length(cfg) -> int | None:
    """L of a ``fit`` config namespace whose network is recurrent (``model.network.core`` set):
    ``data.sequence_length``, or ``data.rollout_steps`` when it is null; None for a feed-forward network."""
    model = cfg.model.init_args if "init_args" in cfg.model else cfg.model
    network = model.get("network") or {}
    if network.get("core") is None:
        return None
    return int(cfg.data.get("sequence_length") or cfg.data.rollout_steps)


def apply_scale(cfg, c: float, rules: str | Iterable[str] | None = "all",
                scale_adam_betas: bool = False) -> dict[str, dict[str, Any]]:
    """Apply ``--scale c`` to a ``fit`` config namespace in place; returns ``{name: {"from", "to"}}``.

    ``cfg.data.{num_envs, rollout_steps}`` are divided (the minibatch size follows, since
    ``num_minibatches`` is kept; a recurrent network's segments stay L steps long, `scale_segments`); ``model.lr``, ``model.proximal_com``, ``data.advantage_norm_span``,
    ``model.ppg.n_pi`` (PPG runs only) and (with ``scale_adam_betas``) ``model.adam_betas`` follow the
    rules named in ``rules``.
    """
    c = _check_c(c)
    chosen = parse_rules(rules, scale_adam_betas)
    data, model = cfg.data, cfg.model
    model = model.init_args if "init_args" in model else model  # a class path and its init arguments
    report: dict[str, dict[str, Any]] = {}

    def setv(ns, section: str, key: str, value) -> None:
        old = ns[key]
        if old != value:
            report[f"{section}.{key}"] = {"from": old, "to": value}
        ns[key] = value

    length = recurrent_sequence_length(cfg)
    if length is None:
        envs, steps = scale_batch(int(data.num_envs), int(data.rollout_steps), int(data.num_minibatches), c)
    else:
        envs, steps = scale_segments(int(data.num_envs), int(data.rollout_steps), length, int(data.num_minibatches), c)
    mb_before = data.num_envs * data.rollout_steps // data.num_minibatches
    setv(data, "data", "num_envs", envs)
    setv(data, "data", "rollout_steps", steps)
    report["data.minibatch_size"] = {"from": mb_before, "to": envs * steps // data.num_minibatches}
    if length is not None:  # what --scale divides with sequences
        report["data.segments_per_minibatch"] = {"from": mb_before // length,
                                                 "to": envs * steps // data.num_minibatches // length}

    betas = model.get("adam_betas") if "adam_betas" in chosen else None
    scaled = batch_size_scaling(
        c,
        lr=float(model.lr),
        proximal_com=model.get("proximal_com"),
        adv_norm_span=float(data.advantage_norm_span),
        ppg_n_pi=_ppg_n_pi(model),
        adam_betas=None if betas is None else tuple(betas),
        optimizer=model.get("optimizer", "adam"),
    )
    if "lr" in chosen:
        setv(model, "model", "lr", scaled["lr"])
    if "com" in chosen and scaled["proximal_com"] is not None:
        setv(model, "model", "proximal_com", scaled["proximal_com"])
    if "adv_span" in chosen:
        setv(data, "data", "advantage_norm_span", scaled["adv_norm_span"])
    if "adam_betas" in chosen and scaled["adam_betas"] is not None:
        setv(model, "model", "adam_betas", list(scaled["adam_betas"]))
    members = data.get("member_hparams")
    lengths = {len(v) if isinstance(v, (list, tuple)) else -1 for v in dict(members or {}).values()}
    if members and len(lengths) == 1 and min(lengths) > 0:  # (malformed lists: the data module's validation says so)
        members = {k: list(v) for k, v in dict(members).items()}  # each member's values by the same rules
        per_member = [scale_member(c, {k: v[i] for k, v in members.items()}, chosen, model.get("optimizer", "adam"))
                      for i in range(min(lengths))]
        for name, values in members.items():
            new = [m[name] for m in per_member]
            if new != values:
                report[f"data.member_hparams.{name}"] = {"from": values, "to": new}
            members[name] = new
        data.member_hparams = members
    if "ppg_n_pi" in chosen and scaled["ppg_n_pi"] is not None:
        ppg = dict(model.ppg)
        old = _ppg_n_pi(model)
        if old != scaled["ppg_n_pi"]:
            report["model.ppg.n_pi"] = {"from": old, "to": scaled["ppg_n_pi"]}
        ppg["n_pi"] = scaled["ppg_n_pi"]
        model.ppg = ppg
    return report


# A group member's own settings (names of ``data.member_hparams``) and the rule that scales each
MEMBER_RULES = {"lr": "lr", "proximal_com": "com", "advantage_norm_span": "adv_span", "adam_betas": "adam_betas"}


def scale_member(c: float, values: dict[str, Any], rules: Iterable[str], optimizer: str = "adam") -> dict[str, Any]:
    """One group member's settings ``{name: value}`` (names of `MEMBER_RULES`; a null center of mass is
    PPO's and stays null) after the chosen ``rules``, by `batch_size_scaling` as a single run's are."""
    scaled = batch_size_scaling(
        c,
        lr=float(values.get("lr", 1.0)),
        proximal_com=None if values.get("proximal_com") is None else float(values["proximal_com"]),
        adv_norm_span=float(values.get("advantage_norm_span", 1.0)),
        adam_betas=None if values.get("adam_betas") is None else tuple(values["adam_betas"]),
        optimizer=optimizer,
    )
    out = dict(values)
    for name, rule in MEMBER_RULES.items():
        if name in values and values[name] is not None and rule in rules:
            new = scaled[{"advantage_norm_span": "adv_norm_span"}.get(name, name)]
            out[name] = list(new) if name == "adam_betas" else new
    return out


def _ppg_n_pi(model) -> int | None:
    """``model.ppg.n_pi`` of a config namespace (its default when unset); None without PPG."""
    ppg = model.get("ppg")
    if ppg is None:
        return None
    # scaling stays pure arithmetic (no torch/tensordict at import, STYLE.md): PPG's defaults only for PPG
    from ppo_lightning.algos.ppg import PPG_DEFAULTS

    return int(ppg.get("n_pi", PPG_DEFAULTS["n_pi"]))


def format_scale_table(c: float, rules: Iterable[str], report: dict[str, dict[str, Any]]) -> str:
    """A printable table of the scaled values."""

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.6g}"
        if isinstance(v, (list, tuple)):
            return "(" + ", ".join(fmt(x) for x in v) + ")"
        return str(v)

    rows = [(k, fmt(v["from"]), fmt(v["to"])) for k, v in report.items()]
    w0 = max([len("setting")] + [len(r[0]) for r in rows])
    w1 = max([len("c = 1")] + [len(r[1]) for r in rows])
    lines = [f"batch-size scaling: c = {c:g} (rules: {', '.join(rules) or 'none'})",
             f"  {'setting':<{w0}}  {'c = 1':>{w1}}  ->  scaled"]
    lines += [f"  {k:<{w0}}  {a:>{w1}}  ->  {b}" for k, a, b in rows]
    return "\n".join(lines)


def scale_params(c: float, rules: Iterable[str], report: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Flat parameters for the tracker: ``scale``, ``scale_rules`` and ``unscaled/<setting>``."""
    out: dict[str, Any] = {"scale": c, "scale_rules": ",".join(rules) or "none"}
    for k, v in report.items():
        out[f"unscaled/{k}"] = v["from"]
        out[f"scaled/{k}"] = v["to"]
    return out
