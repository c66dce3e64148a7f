"""Vectorized seeds (``data.num_seeds`` / ``fit --seeds S``): S independent runs in one process.

The module (`ppo_lightning.training.module`) holds a seed axis (`seed_axis`): a `SeedGroup`, or for a
single run a `SingleRun`, a group of one with the same interface whose network, guard, optimizer,
clipping and metrics are the plain ones; the module does not branch on which it has.

The module's network becomes a `ppo_lightning.nets.seed_stack.SeedStack` of S networks, seed k's
initialized exactly as a single run with seed ``seeds[k]`` initializes its own (the global
generator seeded with it, then the network built); the generator's state right after is the state a
single run samples its first actions from, handed to the data side as seed k's action generator
(`ppo_lightning.data.seed_group`).

Per seed, by construction rather than by bookkeeping, each with its single run's kernels on its own
slices wherever a kernel over the stacked tensors would round otherwise, so that a member's floats do
not depend on its group: with the MLP (`ppo_lightning.nets.mlp_stacked`) member k of any group ends
bitwise as its seed alone (32-true, one CPU type; `tests/test_group_invariance.py`), with the MinAtar
CNN's batched form to float tolerance:

- the loss: the loss module runs once on ``[S, B]`` minibatches with per-seed reductions
  (``PPOFamilyLoss(stacked_seeds=True)``: each loss term and diagnostic is ``[S]``); the optimized
  loss is the *sum* of the seeds' losses, so seed k's gradient is the gradient of its own loss alone;
- Adam: `MemberAdam`, torch's fused Adam kernel on each member's own slices (the kernel rounds a
  tensor's last elements in a scalar loop, the rest in a vector loop: on one stacked tensor a member's
  elements would fall otherwise than in its single run's), so S independent Adams, each its single
  run's bitwise (the step count is shared: all seeds step together); without the fused kernel, the
  unfused Adam over the stacked parameters;
- the EWMA proximal weights: elementwise too (`ppo_lightning.algos.proximal.ewma_update_`);
- gradient-norm clipping (``trainer.gradient_clip_val``): each seed's gradient by its own norm,
  computed as its single run's (`SeedGroup.clip_grad_norm_`);
- numerical faults: the module's `ppo_lightning.core.faults.NumericalGuard` checks each member's loss
  and gradient slices; a bad member's step is undone (its parameter and Adam-moment slices restored)
  and counted for that member, while the other members' steps proceed untouched;
- statistics: every per-step diagnostic is ``[S]``; each seed's metrics are logged under
  ``seed<k>/`` (and its own MLflow run where MLflow is on, `ppo_lightning.training.tracking`).

PPG and PPG-EWMA train as groups too (`ppo_lightning.algos.ppg`: per-seed shuffles, phase buffer
``[S, envs, time]``, per-seed auxiliary losses).

The adaptive-KL objective keeps one beta per seed (adapted on that seed's own KL).

Members with their own hyperparameters (``member_hparams``: `ppo_lightning.core.members.MEMBER_SETTINGS`):

- ``lr``, ``adam_betas``: `MemberAdam`, torch's fused Adam kernel called once per distinct (lr, betas)
  on the members' slices of the stacked parameters, gradients and moments (elementwise, so each
  member steps as Adam with its own settings; no extra pass over the parameters);
- ``proximal_com``: one EWMA decay per member (`ppo_lightning.algos.proximal.ewma_update_`); a
  member with null has the behavior policy as its anchor (PPO): the loss module
  (``behavior_anchor``) takes that member's anchor parameters from the behavior policy and its
  anchor log-prob from the (capped) behavior log-prob, so that the decoupled form is the
  standard one term by term, importance-ratio cap included;
- ``clip_eps``, ``entropy_coef``, ``value_coef``, ``kl_beta`` (its start; adapted per member after):
  the loss module's, as tensors over the members (`SeedGroup.configure_loss`,
  `ppo_lightning.algos.loss.PPOFamilyLoss.set_member_settings`);
- ``advantage_norm_span``, ``gamma``, ``gae_lambda``: the data side's (`ppo_lightning.data.seed_group`).

Not supported yet (one-line errors at configuration): micro-batches, gradient accumulation, staleness, ``model.compile``,
``model.proximal_precision`` and more than one device.
"""

from __future__ import annotations

from pathlib import Path

from typing import Any

import torch

from ppo_lightning.adapters import torch as torch_ops
from ppo_lightning.adapters.lightning import attached_trainer, mlflow_run_name
from ppo_lightning.algos.loss import MEMBER_LOSS_SETTINGS
from ppo_lightning.data.config import validate_member_hparams
from ppo_lightning.nets.seed_stack import SeedStack
from ppo_lightning.training.mlflow_sender import create_run
from ppo_lightning.training.tracking import SafeMLFlowLogger


def validate_seed_group(h) -> None:
    """One-line errors for settings a seed group does not support (yet), and for member settings
    without a group."""
    num_seeds = len(h.get("seeds") or ())
    members = h.get("member_hparams")
    if num_seeds <= 1:
        if members is not None:
            raise ValueError("model.member_hparams needs a seed group (data.num_seeds > 1, --seeds or data.member_seeds)")
        return
    refused = {
        "model.compile": h.get("compile", False) is not False,
        "model.proximal_precision": h.get("proximal_precision") is not None,
        "model.init_from": h.get("init_from") is not None,
    }
    for name, bad in refused.items():
        if bad:
            raise ValueError(f"data.num_seeds={num_seeds} (vectorized seeds) does not support {name} yet; run the seeds one by one")
    if members is not None:
        validate_member_hparams(members, num_seeds)
        if h.get("optimizer") == "sgd" and ({"lr", "adam_betas"} & set(members)):
            raise ValueError("member_hparams.lr / adam_betas (members' own Adam settings) need model.optimizer adam")
        if "proximal_com" in members and not h.get("decoupled"):
            raise ValueError("member_hparams.proximal_com needs model.decoupled=true (the EWMA is the decoupled anchor; "
                             "null: the behavior policy)")


def seed_axis(module, seeds: list[int] | None, member_hparams: dict[str, list] | None = None) -> "SingleRun":
    """The module's seed axis: a `SeedGroup` for more than one seed, else a `SingleRun`."""
    if seeds is not None and len(seeds) > 1:
        return SeedGroup(module, seeds, member_hparams)
    return SingleRun()


def make_optimizer(h, params: list, fused: bool | None, lr: float | None = None,
                   betas: tuple[float, float] | None = None) -> torch.optim.Optimizer:
    """``model.optimizer`` over ``params``: SGD, or Adam (``fused``: the fused kernel is allowed), at
    ``lr`` / ``betas`` (None: the model's)."""
    lr = h.lr if lr is None else lr
    if h.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr)
    return torch.optim.Adam(params, lr=lr, eps=h.adam_eps, betas=h.adam_betas if betas is None else betas, fused=fused)


class SingleRun:
    """The seed axis of a single run: a group of one where the arithmetic is the same, so that the module
    has one path. Its network, loss, optimizer, guard, clipping and metrics are the plain ones."""

    members = 1  # S: the size of the seed axis, one for a single run
    stacked_seeds = False  # the network is not stacked: one KL beta, no member loss settings
    group = None  # the module's ``seed_group``: None
    runs = None  # no member runs in the checkpoint

    def stacked(self, network: torch.nn.Module) -> torch.nn.Module:
        return network

    def proximal_com(self, com: float | None) -> float | None:
        return com

    def configure_loss(self, loss) -> None:
        pass

    def make_optimizer(self, h, params: list, fused: bool | None) -> torch.optim.Optimizer:
        return make_optimizer(h, params, fused)

    def adam(self, params: list, lr: float, betas, eps: float, fused: bool | None) -> torch.optim.Optimizer:
        """An Adam over ``params`` at ``lr``, ``betas``, ``eps`` (``fused``: the fused kernel is allowed)."""
        return torch.optim.Adam(params, lr=lr, eps=eps, betas=tuple(betas), fused=fused)

    def clip_gradients(self, module, gradient_clip_val, gradient_clip_algorithm) -> bool:
        """Whether the axis clipped the gradients itself (a single run: no, Lightning's clipping does)."""
        return False

    def publish(self, module, per_member: list[dict[str, float]]) -> None:
        pass

    def refill(self, module, k: int, seed: int, values: dict[str, Any]) -> None:
        raise ValueError("refilling a member needs a group of members (data.num_seeds > 1)")

    def set_member_lrs(self, module, lrs: list[float]) -> None:
        raise ValueError("members' own lrs need a group of members (data.num_seeds > 1)")

    def teardown(self, module) -> None:
        pass


class SeedGroup(SingleRun):
    """The module-side state of a seed group: the seed axis of S seeds (`SingleRun`'s interface)."""

    stacked_seeds = True

    def __init__(self, module, seeds: list[int], member_hparams: dict[str, list] | None = None) -> None:
        self.seeds = list(seeds)
        self.members = len(self.seeds)
        self.group = self
        self.member_hparams = dict(member_hparams or {})
        lrs, betas = self.member_hparams.get("lr"), self.member_hparams.get("adam_betas")
        betas = None if betas is None else [tuple(float(b) for b in x) for x in betas]
        # members' own Adam settings (MemberAdam) where they differ; else one plain Adam at their common values
        differ = (lrs is not None and len(set(lrs)) > 1) or (betas is not None and len(set(betas)) > 1)
        self.adam_members = (None if not differ else
                             ([float(x) for x in lrs] if lrs else None, betas))  # (lrs or None, betas or None)
        self.lr = float(lrs[0]) if lrs and not differ else None  # the members' common lr
        self.adam_betas = betas[0] if betas and not differ else None  # the members' common betas
        coms = self.member_hparams.get("proximal_com")
        self.behavior_anchor = (torch.tensor([c is None for c in coms]) if coms and any(c is None for c in coms)
                                 else None)
        saved = torch.get_rng_state()
        nets, self.action_rng_states = [], []
        for s in self.seeds:
            torch.manual_seed(s)  # as seed_everything(s) before a single run builds its network
            nets.append(module.make_network())
            self.action_rng_states.append(torch.get_rng_state())
        torch.set_rng_state(saved)
        self.network = SeedStack(nets)
        self.runs = SeedRuns(self.seeds)

    # ---------------------------------------------------------------- members' own hyperparameters
    def stacked(self, network: torch.nn.Module) -> torch.nn.Module:
        """The group's network (the seeds' networks stacked) in place of a single run's ``network``."""
        return self.network

    def make_optimizer(self, h, params: list, fused: bool | None) -> torch.optim.Optimizer:
        """The group's optimizer over its stacked ``params``, each member's step its single run's: with
        the fused kernel allowed (``fused``), `MemberAdam` (at the members' own lrs / betas, or their
        common ones, or the model's); else SGD or the unfused Adam at the common values (elementwise
        ops that round alike wherever a member's elements lie in the stacked tensor)."""
        if h.optimizer == "sgd" and (self.adam_members is not None or self.adam_betas is not None):
            raise ValueError("member_hparams.lr / adam_betas (members' own Adam settings) need model.optimizer adam")
        if self.adam_members is None and (h.optimizer == "sgd" or not fused):
            return make_optimizer(h, params, fused, self.lr, self.adam_betas)
        if not fused:  # members' own lrs / betas: fused Adam per setting
            raise ValueError("member_hparams.lr / adam_betas (members' own Adam settings) need the fused Adam: not "
                             "with trainer.gradient_clip_val under mixed precision")
        return self.adam(params, h.lr if self.lr is None else self.lr,
                         h.adam_betas if self.adam_betas is None else self.adam_betas, h.adam_eps, fused,
                         *(self.adam_members or ()))

    def adam(self, params: list, lr: float, betas, eps: float, fused: bool | None,
             lrs: list[float] | None = None, member_betas: list | None = None) -> torch.optim.Optimizer:
        """An Adam over the group's stacked ``params`` whose member k steps as its single run's Adam at
        ``lr``, ``betas`` (or its own ``lrs[k]``, ``member_betas[k]``): `MemberAdam` where the fused
        kernel is allowed, else the unfused Adam (elementwise ops, alike at any position)."""
        if not fused:
            return torch.optim.Adam(params, lr=lr, eps=eps, betas=tuple(betas))
        if lrs is None and member_betas is None:
            lrs = [float(lr)] * self.members
        return MemberAdam(params, lrs, member_betas, lr=lr, eps=eps, betas=tuple(betas))

    def clip_gradients(self, module, gradient_clip_val, gradient_clip_algorithm) -> bool:
        """Norm clipping per seed (`clip_grad_norm_`); other algorithms are Lightning's."""
        if gradient_clip_val and gradient_clip_algorithm in (None, "norm"):
            self.clip_grad_norm_(module.network.parameters(), gradient_clip_val)
            return True
        return False

    def publish(self, module, per_member: list[dict[str, float]]) -> None:
        """Each member's metrics of the iteration to its own MLflow run."""
        self.runs.publish(module, per_member)

    def proximal_com(self, com: float | None) -> float | list[float] | None:
        """The EWMA's center of mass: the config's, or one per member (PPO members' EWMA is kept at 0,
        unused: their anchor is the behavior policy, the loss module's ``behavior_anchor``)."""
        coms = self.member_hparams.get("proximal_com")
        if coms is None:
            return com
        return [0.0 if c is None else float(c) for c in coms]

    def configure_loss(self, loss) -> None:
        """The members' own settings on the loss module: PPO members' behavior anchor, and the loss
        settings members carry (clip range, entropy and value coefficients, KL beta's start;
        `ppo_lightning.algos.loss.PPOFamilyLoss.set_member_settings`)."""
        loss.behavior_anchor = self.behavior_anchor
        own = {k: v for k, v in self.member_hparams.items() if k in MEMBER_LOSS_SETTINGS}
        if own:
            loss.set_member_settings(own)

    # ---------------------------------------------------------------- refilling a member's slot
    @torch.no_grad()
    def refill(self, module, k: int, seed: int, values: dict[str, Any]) -> None:
        """Member k becomes a fresh run with ``seed`` and the member settings ``values`` (the names of
        ``member_hparams``): a tuning group refills a pruned trial's slot with the next trial. Between
        iterations (before a rollout), it gets what a single run with that seed and those settings starts
        with: its network initialized as that run's (the generator seeded, the network built) and the
        generator's state after as its action generator; a fresh Adam (moments zeroed, its own step
        count: `MemberAdam.restart_member`; a plain Adam becomes a `MemberAdam`); its EWMA restarted
        from the new weights (W = 1) at its center of mass; its loss settings and KL beta; its skipped-step
        counts; and on the data side fresh envs, normalizers, advantage moments, shuffle generator and
        episode statistics (`ppo_lightning.data.seed_group.SeedGroupSource.refill`). The others go on."""
        if set(values) != set(self.member_hparams):
            raise ValueError(f"refill: member settings {sorted(values)} differ from the group's {sorted(self.member_hparams)}")
        trainer = module.trainer
        if trainer.lr_scheduler_configs:
            raise ValueError("refill: a member's lr schedule would continue the group's; use model.lr_schedule constant")
        if module.hparams.get("schedules"):
            raise ValueError("refill: model.schedules follow the group's frames; a refilled member would start mid-schedule")
        phases = module.ppg_phases
        if phases is not None and not phases.at_phase_start:
            raise ValueError("refill: a PPG group refills a member where a phase starts (after an auxiliary phase), so "
                             "that the new member's phases are its single run's; `PPGPhases.at_phase_start` says when")
        for name, v in values.items():
            self.member_hparams[name][k] = v
        self.seeds[k] = seed
        module.hparams.member_hparams = {n: list(v) for n, v in self.member_hparams.items()}
        module.hparams.seeds = list(self.seeds)
        saved = torch.get_rng_state()
        torch.manual_seed(seed)  # as seed_everything(seed) before a single run builds its network
        fresh = module.make_network().state_dict()
        self.action_rng_states[k] = torch.get_rng_state()
        torch.set_rng_state(saved)
        for name, t in self.network.inner.state_dict().items():
            t[k].copy_(fresh[name])
        # Adam: a fresh one for member k in each optimizer (the group's step count is shared; member k
        # counts from 0); PPG's auxiliary Adam keeps ppg.aux_lr and ppg.aux_betas
        betas = values.get("adam_betas")
        for name, opt in self.member_adams(module, "refill").items():
            if name == "aux":
                opt.restart_member(k)
            else:
                opt.restart_member(k, values.get("lr"), None if betas is None else tuple(betas))
        # the EWMA (a PPO member's is kept at 0, unused) and the loss's member settings
        coms = self.member_hparams.get("proximal_com")
        self.behavior_anchor = (torch.tensor([c is None for c in coms]) if coms and any(c is None for c in coms)
                                else None)
        if module.proximal_source is not None:
            com = values.get("proximal_com", module.hparams.proximal_com)
            module.proximal_source.reset_member(k, 0.0 if com is None else float(com))
        own = {n: v for n, v in self.member_hparams.items() if n in MEMBER_LOSS_SETTINGS and n != "kl_beta"}
        module.loss_module.reset_member(k, float(values.get("kl_beta", module.hparams.kl_beta)), own,
                                        self.behavior_anchor)
        module.numerical_guard.reset_member(k)
        trainer.datamodule.reset_member(k, seed, self.member_hparams, self.action_rng_states[k])

    def member_adams(self, module, what: str) -> dict[str, "MemberAdam"]:
        """The group's optimizers by name (PPO: ``main``; PPG: ``policy``, ``value`` where it has one,
        ``aux``) as `MemberAdam` s: a plain Adam becomes one, its state carried over."""
        trainer = module.trainer
        names = module.updater.optimizer_names(module)
        opts = list(trainer.optimizers)
        for i, opt in enumerate(opts):
            if not isinstance(opt, MemberAdam):
                if type(opt) is not torch.optim.Adam:
                    raise ValueError(f"{what} needs model.optimizer adam, got {type(opt).__name__}")
                opts[i] = MemberAdam.from_adam(opt, self.members)
        if any(new is not old for new, old in zip(opts, trainer.optimizers)):
            trainer.strategy.optimizers = opts
        return dict(zip(names, opts, strict=True))

    def set_member_lrs(self, module, lrs: list[float]) -> None:
        """Every member's lr from now on (a tuning group's members each on their own lr schedule,
        counted from their own start: `ppo_lightning.tuning.reporter.TrialReporter`); PPG's auxiliary
        Adam keeps ppg.aux_lr, as a single run's does under a schedule."""
        if module.trainer.lr_scheduler_configs:
            raise ValueError("set_member_lrs: the group runs an lr schedule of its own; use model.lr_schedule constant")
        for name, opt in self.member_adams(module, "set_member_lrs").items():
            if name != "aux":
                opt.set_lrs(lrs)

    def teardown(self, module) -> None:
        """End the members' MLflow runs; preempted, they are KILLED as the group's run (a resume continues them)."""
        from ppo_lightning.training.preemption import preempted  # start-up cost: only at teardown

        trainer = attached_trainer(module)
        stopped = trainer is not None and preempted(trainer) is not None
        self.runs.finalize("KILLED" if stopped else "success")

    @torch.no_grad()
    def clip_grad_norm_(self, parameters, max_norm: float) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` per seed: each seed's gradient scaled by
        ``min(1, max_norm / (its norm + 1e-6))``; returns the seeds' norms ``[S]``. Seed k's norm is
        torch's for its single run (``get_total_norm`` of its gradient slices): one norm over every
        member's gradients at once, a reduction over rows or a strided axis, sums in another order."""
        S = self.members
        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return torch.zeros(S)
        total = torch.stack([torch.nn.utils.get_total_norm([g[k] for g in grads], 2.0) for k in range(S)])
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.reshape(S, *([1] * (g.dim() - 1))))
        return total


class MemberAdam(torch.optim.Adam):
    """Adam over a group's stacked parameters ``[S, ...]`` where member k steps with its own lr ``lrs[k]``
    and betas ``member_betas[k]`` (None: the optimizer's ``lr`` / ``betas`` for every member).

    torch's fused Adam kernel is elementwise; it is called once per distinct (lr, betas) on the
    members' slices of the parameters, gradients and moments, each member's slice a tensor of the
    kernel's lists, after the step counts are advanced once. So member k's update is its single
    run's fused Adam step with its settings, bitwise: the kernel runs a tensor's elements through
    its vectorized loop and the last ``numel % vector width`` through a scalar loop, which rounds
    otherwise, so a slice of several members would put some of member k's elements in the other
    loop than its single run's tensor does. The state (``step``, ``exp_avg``, ``exp_avg_sq`` per
    parameter) and checkpoints are Adam's own. An lr schedule scales every member's lr by the group
    lr's change (``param_groups[0]["lr"]`` starts at ``max(lrs)``; a member at that lr steps at the group's
    lr itself, as its single run's Adam under the same schedule). A group's fused Adam is this one,
    members with one setting included (`SeedGroup.make_optimizer`)."""

    def __init__(self, params, lrs: list[float] | None, member_betas: list[tuple[float, float]] | None = None,
                 lr: float = 1e-3, **kwargs) -> None:
        betas = member_betas
        n = len(lrs if lrs is not None else betas)
        super().__init__(params, lr=max(lrs) if lrs else lr, fused=True, **kwargs)
        self.base_lr = self.param_groups[0]["lr"]
        common = tuple(self.param_groups[0]["betas"])
        self.settings = [(float(lrs[k]) if lrs else self.base_lr, tuple(betas[k]) if betas else common) for k in range(n)]
        self._plan_runs()

    def _plan_runs(self) -> None:
        """Each member's (lr, betas, step offset); members with the same go to one kernel call."""
        offsets = self.param_groups[0].get("member_step_offsets") or [0] * len(self.settings)
        self.runs = [(k, setting, off) for k, (setting, off) in enumerate(zip(self.settings, offsets))]

    @classmethod
    def from_adam(cls, adam: torch.optim.Adam, num_members: int) -> "MemberAdam":
        """A `MemberAdam` continuing a plain Adam over a group's stacked parameters (every member at its
        lr and betas, its state - moments and step counts - carried over)."""
        group = adam.param_groups[0]
        if group["amsgrad"] or group["maximize"] or group.get("decoupled_weight_decay") or len(adam.param_groups) > 1:
            raise ValueError("MemberAdam: amsgrad, maximize, AdamW and several parameter groups are not supported")
        new = cls(group["params"], [group["lr"]] * num_members, None, eps=group["eps"], betas=tuple(group["betas"]),
                  weight_decay=group["weight_decay"])
        new.load_state_dict(adam.state_dict())
        new.param_groups[0]["fused"] = True
        return new

    @torch.no_grad()
    def restart_member(self, k: int, lr: float | None = None, betas: tuple[float, float] | None = None) -> None:
        """Member k starts again as a fresh Adam (a refilled slot of a tuning group): its moments zeroed
        and its own step count from 0 (its bias corrections those of a new optimizer: the group's count
        is shared, so member k steps with ``step - offset[k]``), at its new lr and betas."""
        group = self.param_groups[0]
        offsets = list(group.get("member_step_offsets") or [0] * len(self.settings))
        steps = [self.state[p]["step"] for p in group["params"] if "step" in self.state[p]]
        offsets[k] = int(steps[0].item()) if steps else 0
        group["member_step_offsets"] = offsets  # in param_groups: saved and restored with the optimizer's state
        for p in group["params"]:
            st = self.state[p]
            for name in ("exp_avg", "exp_avg_sq"):
                if name in st:
                    st[name][k].zero_()
        old_lr, old_betas = self.settings[k]
        self.settings[k] = (float(lr) if lr is not None else old_lr,
                            tuple(float(b) for b in betas) if betas is not None else old_betas)
        self._plan_runs()

    def member_lrs(self) -> list[float]:
        """The lr each member steps with now: its own times an lr schedule's factor (as `step` computes it)."""
        scale = self.param_groups[0]["lr"] / self.base_lr
        return [lr * scale if scale != 1.0 else lr for lr, _ in self.settings]

    def set_lrs(self, lrs: list[float]) -> None:
        """Member k steps at ``lrs[k]`` from the next step on (its betas and state kept)."""
        self.settings = [(float(lr), betas) for lr, (_, betas) in zip(lrs, self.settings, strict=True)]
        self._plan_runs()

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        if hasattr(self, "settings"):
            self._plan_runs()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["amsgrad"] or group["maximize"] or group.get("decoupled_weight_decay"):
                raise ValueError("MemberAdam: amsgrad, maximize and AdamW are not supported")
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = []
            for p in params:
                state = self.state[p]
                if len(state) == 0:  # as torch's fused Adam initializes its state
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                states.append(state)
            torch_ops.foreach_add_([st["step"] for st in states], 1)
            scale = group["lr"] / self.base_lr  # an lr schedule's factor (1.0 without one)
            by_setting: dict[tuple, tuple[list, list, list, list, list]] = {}
            for k, setting, off in self.runs:
                views = by_setting.setdefault((setting, off), ([], [], [], [], []))
                for p, st in zip(params, states):
                    for out, t in zip(views, (p, p.grad, st["exp_avg"], st["exp_avg_sq"])):
                        out.append(t[k])
                    views[4].append(st["step"] if not off else st["step"] - off)  # a restarted member's own count
            for ((lr, (beta1, beta2)), _), (ps, gs, ms, vs, steps) in by_setting.items():
                # torch's own fused Adam op, each member's slices with its own lr and betas
                torch_ops.fused_adam_(ps, gs, ms, vs, steps, lr=group["lr"] if lr == self.base_lr else lr * scale,
                                      beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"])
        return loss


class SeedRuns:
    """One MLflow run per seed, children of the group's run (the trainer's logger): each gets the
    seed's own metrics under the names a single run uses, stepped by frames, with the seed and the
    group's run id as parameters. Their ids are kept in the checkpoint, so a resumed group
    continues them. Nothing happens without an MLflow logger (or after it failed)."""

    def __init__(self, seeds: list[int]) -> None:
        self.seeds = seeds
        self._run_ids: list[str] | None = None
        self.loggers: list | None = None

    @property
    def run_ids(self) -> list[str] | None:
        """The seeds' run ids (read from their loggers: a run the tracking server was away for gets its
        id when the server is back)."""
        if self.loggers is not None:
            self._run_ids = [lg.run_id for lg in self.loggers]
        return self._run_ids

    @run_ids.setter
    def run_ids(self, value: list[str] | None) -> None:
        self._run_ids = value

    def _start(self, module, parent) -> None:
        name = mlflow_run_name(parent) or parent.run_id or "group"  # no request to the server in the loop
        previous = self._run_ids  # a resumed group's runs (read before `loggers` takes over `run_ids`)
        self.loggers = []
        for k, seed in enumerate(self.seeds):
            run_id = previous[k] if previous and k < len(previous) else None
            created = False
            tags = {"mlflow.parentRunId": parent.run_id, "seed": str(seed)}
            member_name = f"{name}-member{k}-seed{seed}" if module.hparams.get("member_hparams") else f"{name}-seed{seed}"
            if run_id is None and parent.run_id is not None and not (parent.sender is not None and parent.sender.down):
                # the parent's server answered: create the member's run now, so that the next checkpoint
                # holds its id (a resume continues it) instead of the id the sender would give it later
                try:
                    run_id = create_run(parent.experiment, parent.experiment_name, {**tags, "mlflow.runName": member_name})
                    created = True
                except Exception:  # noqa: BLE001 - gone since: the member's sender creates it when it is back
                    run_id = None
            logger = SafeMLFlowLogger(experiment_name=parent.experiment_name, tracking_uri=parent.tracking_uri,
                                      run_name=member_name, run_id=run_id, tags=tags,
                                      spool=None if parent.spool is None else
                                      str(Path(parent.spool).with_name(f"{Path(parent.spool).stem}-seed{k}.jsonl")))
            if created:
                logger.resumed = False  # a new run: nothing logged yet
            params = {k2: v for k2, v in dict(module.hparams).items() if k2 not in ("seeds", "member_hparams")}
            own = {n: v[k] for n, v in (module.hparams.get("member_hparams") or {}).items()}  # this member's values
            logger.log_hyperparams({**params, **own, "seed": seed, "seed_index": k, "group_run_id": parent.run_id})
            self.loggers.append(logger)

    def publish(self, module, per_seed: list[dict[str, float]]) -> None:
        trainer = attached_trainer(module)
        parent = trainer.logger if trainer is not None else None
        if not isinstance(parent, SafeMLFlowLogger) or parent.failed or not trainer.is_global_zero:
            return
        if self.loggers is None:
            self._start(module, parent)
        for logger, metrics in zip(self.loggers, per_seed):
            logger.log_metrics(metrics, step=module.trainer.global_step)

    def state_dict(self) -> list[str] | None:  # the module's checkpoint keeps the run ids
        return self.run_ids

    def load_state_dict(self, run_ids: list[str]) -> None:
        self.run_ids = list(run_ids)

    def finalize(self, status: str = "success") -> None:
        for logger in self.loggers or []:
            logger.finalize(status)
        if self.loggers is not None:
            self._run_ids = [lg.run_id for lg in self.loggers]  # kept: read after fit (`run_ids`)
        self.loggers = None
