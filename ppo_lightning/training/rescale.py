"""Elastic batch-size invariance: resume a checkpoint on another world size or ``data.num_envs``.

A run's batch is ``world size x data.num_envs x data.rollout_steps`` frames per iteration. Resuming
it where that differs (2 ranks -> 1, 1 -> 4 nodes, other ``num_envs``) divides the batch by a factor
``c``; the paper's rules (`ppo_lightning.algos.scaling`, the oracle) say how the rest must change
for the learning curve against frames to stay (approximately) the same: Adam lr / sqrt(c), EWMA
center of mass x c, advantage-normalization span x c, PPG n_pi x c, optionally Adam betas ** (1/c).

``fit --ckpt_path X --rescale`` applies them (rules: ``--scale_rules``, ``--scale_adam_betas``) to the
resumed run, prints the table of what changed, and records it in the checkpoint (``ElasticResume``'s
state: every rescale so far and the settings in force, re-applied by later resumes) and in MLflow
(``rescale/<k>/...`` parameters). Without ``--rescale`` a change of the batch geometry is refused in
one line naming it. ``data.num_minibatches`` must stay, so that the minibatch scales by the same c.

What a new geometry cannot keep: ranks without a saved state (more ranks than before) and ranks
whose ``num_envs`` changed start new environments (episodes in progress are lost; normalizer
statistics, frames, RNG streams carry on); a PPG run starts a new policy phase (its phase buffers
are per rank and per batch shape). Runs with artificial staleness are refused.

Sequences (a recurrent network, ``model.network.core``): a minibatch is made of segments of L steps
(``data.sequence_length``; null: the rollout length), and ``c`` divides the segments per minibatch,
never L: the resumed run must keep the checkpoint's L (one line otherwise; with a null
``data.sequence_length`` a changed ``data.rollout_steps`` changes L, so give L explicitly), and its
segments must split into the same ``data.num_minibatches`` (the data module checks). The rules are
the feed-forward ones, unchanged: ``c`` is the same factor on the samples and on the segments. The
same holds for ``--scale c`` (`ppo_lightning.algos.scaling.scale_segments`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback

from ppo_lightning.algos.scaling import format_scale_table
from ppo_lightning.core.configs import plain
from ppo_lightning.interop.checkpoint_io import read_meta


def geometry(world: int, num_envs: int, rollout_steps: int, num_minibatches: int) -> dict[str, int]:
    return {"world": int(world), "num_envs": int(num_envs), "rollout_steps": int(rollout_steps),
            "num_minibatches": int(num_minibatches)}


def batch(g: dict[str, int]) -> int:
    return g["world"] * g["num_envs"] * g["rollout_steps"]


def _describe(g: dict[str, int]) -> str:
    return (f"{g['world']} rank(s) x {g['num_envs']} envs x {g['rollout_steps']} steps = {batch(g)} frames per "
            f"iteration")


def saved_settings(meta: dict[str, Any]) -> dict[str, Any]:
    """The c = 1 values of the settings the rules scale: the ones in force in the checkpoint."""
    h, d = meta.get("hyper_parameters") or {}, meta.get("datamodule_hyper_parameters") or {}
    ppg = h.get("ppg")
    out = {"lr": float(h["lr"]), "proximal_com": h.get("proximal_com"),
           "adv_norm_span": float(d.get("advantage_norm_span", 1.0)),
           "ppg_n_pi": None if ppg is None else int(ppg["n_pi"]),
           "adam_betas": tuple(float(b) for b in h.get("adam_betas", (0.9, 0.999))),
           "optimizer": h.get("optimizer", "adam")}
    record = (meta.get("callbacks") or {}).get("ElasticResume") or {}
    out.update({k: (tuple(v) if k == "adam_betas" else v) for k, v in (record.get("settings") or {}).items()})
    return out


def plan(ckpt_path: str | Path, world: int, data, rescale: bool, rules: tuple[str, ...]) -> dict[str, Any]:
    """Compare the checkpoint's batch geometry with this run's. Returns the plan for `ElasticResume`
    (``c`` None: the same geometry); raises ValueError (one line) for a change without ``rescale``."""
    meta = read_meta(ckpt_path, mmap=True)
    dm_state = meta.get("RolloutDataModule") or {}
    d = meta.get("datamodule_hyper_parameters") or {}
    old = geometry(len(dm_state.get("per_rank") or [None]), d.get("num_envs", data.num_envs),
                   d.get("rollout_steps", data.rollout_steps), d.get("num_minibatches", data.num_minibatches))
    new = geometry(world, data.num_envs, data.rollout_steps, data.num_minibatches)
    settings = saved_settings(meta)
    out = {"c": None, "old": old, "new": new, "settings": settings, "rules": list(rules),
           "history": list(((meta.get("callbacks") or {}).get("ElasticResume") or {}).get("history") or [])}
    if old == new:
        return out
    c = batch(old) / batch(new)
    if not rescale:
        if old["world"] != new["world"]:
            what = f"the world size changes from {old['world']} to {new['world']} rank(s)"
        elif old["num_envs"] != new["num_envs"]:
            what = f"the checkpoint has {old['num_envs']} environments per rank, the config {new['num_envs']} (data.num_envs)"
        elif old["rollout_steps"] != new["rollout_steps"]:
            what = f"data.rollout_steps changes from {old['rollout_steps']} to {new['rollout_steps']}"
        else:
            what = f"data.num_minibatches changes from {old['num_minibatches']} to {new['num_minibatches']}"
        raise ValueError(f"{what}: the batch goes from {batch(old)} to {batch(new)} frames per iteration (c = {c:g}); "
                         f"resume with --rescale to apply the batch-size scaling rules, or with the checkpoint's geometry "
                         f"({_describe(old)})")
    if old["num_minibatches"] != new["num_minibatches"]:
        raise ValueError(f"--rescale scales both batch sizes by the same c: keep data.num_minibatches="
                         f"{old['num_minibatches']} (the config has {new['num_minibatches']})")
    check_sequence_length(meta, d, old, data)
    if (dm_state.get("per_rank") or [{}])[0].get("staleness_queue") is not None or getattr(data, "staleness", 0):
        raise ValueError("--rescale: runs with artificial staleness (data.staleness) cannot change their batch geometry")
    if getattr(data, "member_hparams", None):
        raise ValueError("--rescale: a group whose members have their own hyperparameters (data.member_hparams) cannot "
                         "change its batch geometry yet; resume with the checkpoint's geometry")
    out["c"] = c
    return out


def check_sequence_length(meta: dict[str, Any], saved_data: dict[str, Any], old: dict[str, int], data) -> None:
    """A recurrent run (the checkpoint's ``model.network.core``) rescaled keeps its segment length L
    (``data.sequence_length``, or ``data.rollout_steps`` when null): ``c`` divides the segments per
    minibatch, never L. One-line error otherwise."""
    network = (meta.get("hyper_parameters") or {}).get("network") or {}
    if network.get("core") is None:
        return
    old_length = int(saved_data.get("sequence_length") or old["rollout_steps"])
    new_length = int(getattr(data, "sequence_length", None) or data.rollout_steps)
    if old_length != new_length:
        raise ValueError(f"--rescale divides the segments per minibatch, never their length: the checkpoint's segments "
                         f"are {old_length} steps, the config's {new_length} (set data.sequence_length={old_length})")


def scaled_settings(settings: dict[str, Any], c: float, rules: tuple[str, ...]) -> tuple[dict[str, Any], dict]:
    """The settings after the rules for factor ``c`` (`ppo_lightning.algos.scaling.batch_size_scaling`)
    and the report ``{name: {"from", "to"}}`` of those that changed."""
    from ppo_lightning.algos.scaling import batch_size_scaling

    s = batch_size_scaling(c, lr=settings["lr"], proximal_com=settings["proximal_com"],
                           adv_norm_span=settings["adv_norm_span"], ppg_n_pi=settings["ppg_n_pi"],
                           adam_betas=settings["adam_betas"] if "adam_betas" in rules else None,
                           optimizer=settings["optimizer"])
    names = {"lr": ("lr", "model.lr"), "com": ("proximal_com", "model.proximal_com"),
             "adv_span": ("adv_norm_span", "data.advantage_norm_span"), "ppg_n_pi": ("ppg_n_pi", "model.ppg.n_pi"),
             "adam_betas": ("adam_betas", "model.adam_betas")}
    new, report = dict(settings), {}
    for rule in rules:
        key, label = names[rule]
        value = s[key]
        if value is None:
            continue
        if value != settings[key]:
            report[label] = {"from": settings[key], "to": value}
        new[key] = value
    return new, report


class ElasticResume(Callback):
    """Applies a rescale plan (see the module docstring) and carries the record in checkpoints."""

    def __init__(self, plan: dict[str, Any] | None = None) -> None:
        self.plan = plan or {}
        self.history: list[dict[str, Any]] = list(self.plan.get("history") or [])
        self.settings: dict[str, Any] | None = None
        self.report: dict[str, Any] = {}
        self.table: str | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.plan.get("c") is not None and trainer.datamodule is not None:  # before the restore
            old, new = self.plan["old"], self.plan["new"]
            trainer.datamodule.elastic_resume = {"saved_num_envs": old["num_envs"], "num_envs": new["num_envs"]}

    def on_train_start(self, trainer, pl_module) -> None:
        """After the restore (which brings back the c = 1 optimizer settings): apply the settings."""
        if not self.plan:
            return
        settings = self.plan["settings"]
        c = self.plan.get("c")
        if c is not None:
            rules = tuple(self.plan["rules"])
            settings, self.report = scaled_settings(settings, c, rules)
            self.history.append({"c": c, "from": self.plan["old"], "to": self.plan["new"], "rules": list(rules),
                                 "iteration": int(getattr(trainer.datamodule, "iteration", 0)),
                                 "changed": {k: {"from": plain(v["from"]), "to": plain(v["to"])}
                                             for k, v in self.report.items()}})
        elif not self.history:
            return  # never rescaled: nothing to re-apply
        self.settings = {k: plain(v) for k, v in settings.items()}
        apply_settings(trainer, pl_module, settings, restart_ppg_phase=c is not None)
        if c is not None:
            old, new = self.plan["old"], self.plan["new"]
            self.table = (format_scale_table(c, self.plan["rules"], self.report)
                          + f"\n  from {_describe(old)}\n  to   {_describe(new)}")
            if trainer.is_global_zero:
                print(self.table, flush=True)
            params = {f"rescale/{len(self.history)}/c": c,
                      f"rescale/{len(self.history)}/from": _describe(old), f"rescale/{len(self.history)}/to": _describe(new)}
            params.update({f"rescale/{len(self.history)}/{k}": f"{plain(v['from'])} -> {plain(v['to'])}"
                           for k, v in self.report.items()})
            for logger in trainer.loggers:
                logger.log_hyperparams(params)

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history, "settings": self.settings}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass  # read before fit by `plan` (it knows the record before the objects exist)


def apply_settings(trainer, pl_module, settings: dict[str, Any], restart_ppg_phase: bool) -> None:
    """Put ``settings`` into the live objects: optimizers (and schedulers' base lr), EWMA, advantage
    moments, PPG, and the saved hyperparameters (so that the next checkpoint holds them)."""
    from ppo_lightning.algos.advantages import ewma_beta_from_span
    from ppo_lightning.algos.proximal import beta_from_com

    h = pl_module.hparams
    lr, betas = float(settings["lr"]), tuple(float(b) for b in settings["adam_betas"])
    aux = [] if pl_module.ppg_phases is None else [trainer.optimizers[-1]]  # PPG's auxiliary Adam keeps its own
    for opt in trainer.optimizers:
        if opt in aux:
            continue
        for group in opt.param_groups:
            group["lr"] = lr
            if "betas" in group:
                group["betas"] = betas
    for config in trainer.lr_scheduler_configs:
        sched = config.scheduler
        if hasattr(sched, "base_lrs"):
            sched.base_lrs = [lr for _ in sched.base_lrs]
    h["lr"], h["adam_betas"] = lr, betas
    if pl_module.proximal_source is not None and settings.get("proximal_com") is not None:
        com = float(settings["proximal_com"])
        pl_module.proximal_source.com, pl_module.proximal_source.beta = com, beta_from_com(com)
        h["proximal_com"] = com
    dm = trainer.datamodule
    if dm is not None:
        span = float(settings["adv_norm_span"])
        dm.config.advantage_norm_span = span
        for state in dm.states:
            state.advantage_moments.span, state.advantage_moments.beta = span, ewma_beta_from_span(span)
        dm.hparams["advantage_norm_span"] = span
    phases = pl_module.ppg_phases
    if phases is not None and settings.get("ppg_n_pi") is not None:
        phases.cfg["n_pi"] = int(settings["ppg_n_pi"])
        h["ppg"] = {**h["ppg"], "n_pi": int(settings["ppg_n_pi"])}
        if restart_ppg_phase:  # buffers are per rank and per batch shape: a new phase
            phases.buffer.clear()
            phases.phase_iteration = 0
            phases.restart_pending = True  # the module resets the EWMA at its train start



def check_resumed_scaled_settings(ckpt_path: str | Path, model, scale: float) -> None:
    """With ``--ckpt_path`` and ``--scale``: the scaled settings (``model``: the model's config after
    the scaling) must be the checkpoint's, a resume continuing the run it was; another c or base needs
    ``--rescale``'s record of the change. One-line error naming the settings that differ."""
    saved = read_meta(ckpt_path, mmap=True).get("hyper_parameters") or {}

    def show(v):
        return "null" if v is None else (f"{float(v):.4g}" if not isinstance(v, (list, tuple)) else
                                         "[" + ", ".join(f"{float(x):.4g}" for x in v) + "]")

    diffs = []
    for key in ("lr", "proximal_com", "adam_betas"):
        if key not in saved or key not in model:
            continue
        a, b = saved[key], model[key]
        same = (a is None) == (b is None) and (a is None or all(
            math.isclose(float(x), float(y), rel_tol=1e-9) for x, y in zip(*(
                (list(v) if isinstance(v, (list, tuple)) else [v]) for v in (a, b)))))
        if not same:
            diffs.append(f"model.{key} {show(a)} in the checkpoint, {show(b)} after --scale {scale:g}")
    saved_n_pi = (saved.get("ppg") or {}).get("n_pi")
    n_pi = (dict(model.get("ppg") or {})).get("n_pi")
    if saved_n_pi is not None and n_pi is not None and int(saved_n_pi) != int(n_pi):
        diffs.append(f"model.ppg.n_pi {saved_n_pi} in the checkpoint, {n_pi} after --scale {scale:g}")
    if diffs:
        raise ValueError(f"--ckpt_path {ckpt_path} was trained with other scaled settings ("
                         + "; ".join(diffs) + "): resume with the first run's --scale and base values")
