"""The LightningModule: owns the actor-critic; one training step is one minibatch, one optimizer step.

A PPO iteration is one Lightning epoch (see `ppo_lightning.data.datamodule`). Per-step diagnostics are kept
by name (the loss's output entries, one tensor each per step) and logged once per iteration, so the hot
path does no logging.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import math
import time
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.parsing import collect_init_args
from tensordict import TensorDict, TensorDictBase

from ppo_lightning.adapters.lightning import attached_datamodule, attached_trainer
from ppo_lightning.core.configs import plain
from ppo_lightning.data import parallel
from ppo_lightning.core.faults import NumericalGuard, finite_mean
from ppo_lightning.core.members import PerMember, name_members
from ppo_lightning.algos.loss import LOSS_SETTINGS, LOSS_TERMS, LossSettings, PPOFamilyLoss, check_loss_output
from ppo_lightning.nets.models import (OBS_KEY, build_network, dist_param_keys, is_sharded, make_distribution, resolve_network,
                                       shard_network)
from ppo_lightning.nets.recurrent import is_recurrent
from ppo_lightning.training.precision import take_precision_aliases
from ppo_lightning.algos import ppg as ppg_lib
from ppo_lightning.algos.schedules import LR_SCHEDULES
from ppo_lightning.algos.schedules import make_lr_scheduler
from ppo_lightning.interop.export import load_pretrained_weights
from ppo_lightning.training.compiled import validate_compile
from ppo_lightning.training.seed_group import seed_axis, validate_seed_group
from ppo_lightning.algos.ppg import validate_ppg_config
from ppo_lightning.algos.proximal import validate_proximal_com
from ppo_lightning.training.update import TrainerLoop, make_updater
from ppo_lightning.training.parts import make_anchor, make_compile_part, make_phases, make_ppg_part
from ppo_lightning.algos.hooks import AUX_PREFIX
from ppo_lightning.algos.settings import check_settings, schema_of
from ppo_lightning.algos.registry import OBJECTIVE_SETTINGS, unused_settings
from ppo_lightning.training.coefficients import ScheduledCoefficients, values_in_use

# Our `transfer_batch_to_device` is meant to apply with a data module; Lightning warns on every fit.
warnings.filterwarnings("ignore", message="You have overridden `transfer_batch_to_device`")


_SAID: set[str] = set()


def say_once(line: str) -> None:
    """Print ``line`` the first time this process is given it (a choice made for the user)."""
    if line not in _SAID:
        _SAID.add(line)
        print(line, flush=True)


def migrate_optimizer_steps(checkpoint: dict[str, Any]) -> None:
    """A PPO checkpoint from Lightning's automatic optimization counts its optimizer steps (the
    Trainer's ``global_step``) in the automatic loop's progress; the manual step (`Update`) counts them
    in the manual loop's. Copied over before Lightning restores the loops, the step count goes on."""
    loops = checkpoint.get("loops", {}).get("fit_loop", {})
    auto = loops.get("epoch_loop.automatic_optimization.optim_progress", {}).get("optimizer", {}).get("step")
    manual = loops.get("epoch_loop.manual_optimization.optim_step_progress")
    if auto and manual is not None and manual["total"]["completed"] == 0 and auto["total"]["completed"] > 0:
        loops["epoch_loop.manual_optimization.optim_step_progress"] = copy.deepcopy(auto)


class PPOLightningModule(pl.LightningModule):
    """PPO, decoupled PPO and PPO-EWMA; with ``ppg``, PPG and PPG-EWMA on the same loss module.

    Args:
        observation_space, action_space: plain dicts; taken from the data module by the CLI.
        network: ``{"name": "mlp", "hidden_sizes": [64, 64], "activation": "tanh",
            "shared_trunk": False}`` or ``{"name": "impala_cnn", ...}``; ``arch`` ("dual", "shared",
            "detach") and ``aux_value_head`` select PPG's layouts (`ppo_lightning.nets.models.resolve_arch`).
            ``{"name": "auto", ...}`` (the default): a CNN for image observations, ``nature_cnn`` or
            ``small_cnn`` by size, else the MLP (`ppo_lightning.nets.pixel_cnn.resolve_network`; printed once).
        loss: the loss module's factory, ``{class_path: ..., init_args: {...}}``: a subclass of
            `ppo_lightning.algos.loss.PPOFamilyLoss` (e.g. one overriding ``surrogate``), built by
            `make_loss` with the loss settings (``loss_settings``) and its ``init_args``. None: ``PPOFamilyLoss``.
        proximal_com: with ``decoupled``, keep the proximal policy as an EWMA of the weights with
            this center of mass in gradient steps (PPO-EWMA; the paper's default is 8). None: the
            proximal policy comes with the batch (staleness experiments) or equals the behavior one.
        lr, adam_eps, adam_betas, optimizer: Adam (default) or SGD.
        init_from: a Hugging Face folder exported by ``ppo-lightning export-hf`` to start from.
        proximal_precision: deprecated, as is ``network.precision``: the precision of every forward
            (rollout, update, EWMA proximal) is the Trainer's, ``--trainer.precision`` 32-true,
            bf16-mixed or auto (`ppo_lightning.training.precision`). The CLI maps these aliases onto
            it; here they only warn.
        ppg: Phasic Policy Gradient (``ppo_lightning.algos.ppg``): null (PPO) or a mapping of PPG
            settings (``n_pi``, ``epochs_value``, ``n_aux_epochs``, ``aux_mbsize``, ``beta_clone``,
            ``vf_true_weight``, ``aux_lr``, ``aux_betas``, ``max_grad_norm``; defaults: the paper's,
            ``ppo_lightning.algos.ppg.PPG_DEFAULTS``). The policy phase is this module's PPO family; the
            network gets ``arch`` (default "dual") and the auxiliary value head.
        micro_batch_size: split each minibatch into chunks of this many samples, each run forward
            and backward on its own with its gradient accumulated, then one optimizer step: the same
            gradient (up to float summation order) with a fraction of the activation memory. For the
            IMPALA CNN on CPU, 64-128 is also 1.6x faster than one 2048-sample pass (activations
            stay in cache; benchmarks/impala_step.py). The proximal forward still runs once per
            minibatch. None: the whole minibatch at once. Per-step diagnostics are then
            size-weighted means over chunks (maxima for ``importance_ratio_max``). With a recurrent
            network the chunks are whole segments: a multiple of the segment length L
            (``data.sequence_length``; one-line error otherwise).
        max_bad_steps: optimizer steps with a non-finite input, loss or gradient are skipped and
            counted (``train/skipped_steps``); this many in a row stop training with an error naming
            the first bad quantity (`ppo_lightning.core.faults.NumericalGuard`). None: never stop.
        compile: run the loss's network forward (and its backward) through ``torch.compile``:
            true (inductor: C++ kernels on CPU, Triton on GPU) or a backend name ("aot_eager",
            ...). Compiled once per run, when the first gradient step runs (its time is logged as
            ``time/compile_s`` and printed); minibatches have one shape, so no recompiles follow
            (`ppo_lightning.training.compiled`). Collection stays eager (its batch shapes vary). False: eager.
        seeds: the seeds of a vectorized seed group (taken from ``data.seeds`` by the CLI): with
            more than one, the network holds one copy per seed and every seed trains as alone
            (`ppo_lightning.training.seed_group`). None or one seed: a single run.
        member_hparams: a group's per-member hyperparameters ``{name: [one per seed]}`` (taken from
            ``data.member_hparams`` by the CLI; `ppo_lightning.core.members.MEMBER_SETTINGS`): ``lr``
            (instead of ``lr``), ``adam_betas`` (instead of ``adam_betas``), ``proximal_com`` (instead of
            ``proximal_com``; null: the behavior policy is the member's anchor, i.e. PPO; needs
            ``decoupled``), ``clip_eps``, ``entropy_coef``, ``value_coef``, ``kl_beta`` (the loss's);
            ``advantage_norm_span``, ``gamma`` and ``gae_lambda`` are the data side's.
        loss_settings: the loss settings, each ``model.<name>`` (`ppo_lightning.algos.loss.LossSettings`:
            ``objective``, ``objective_args``, ``decoupled``, ``clip_eps``, ``kl_beta``, ``kl_target``,
            ``max_importance_ratio``, ``value_coef``, ``entropy_coef``, ``value_clip_eps``, ``kl_form``,
            ``value_loss``, ``value_loss_args``, ``aux_terms``; the table in docs/guides/extending.md);
            saved with the other hyperparameters.
        schedules: coefficients scheduled by frames, ``{coefficient: schedule}`` for ``lr``, ``clip_eps``,
            ``entropy_coef``, ``value_coef``, ``kl_beta`` (`ppo_lightning.algos.schedules`): a registered
            schedule's name or ``{name: ..., <settings>}``; its factor scales the configured value (a
            group's members' own values too). None: constant.
    """

    def __init__(
        self,
        observation_space: dict | None = None,
        action_space: dict | None = None,
        network: dict[str, Any] | None = None,
        proximal_com: float | None = None,
        lr: float = 5e-4,
        adam_eps: float = 1e-5,
        adam_betas: tuple[float, float] = (0.9, 0.999),
        optimizer: str = "adam",
        init_from: str | None = None,
        proximal_precision: str | None = None,
        micro_batch_size: int | None = None,
        ppg: dict[str, Any] | None = None,
        lr_schedule: str = "constant",
        max_bad_steps: int | None = 100,
        compile: bool | str = False,
        seeds: list[int] | None = None,
        member_hparams: dict[str, list] | None = None,
        loss: dict[str, Any] | None = None,
        schedules: dict[str, Any] | None = None,
        **loss_settings: Any,
    ) -> None:
        super().__init__()
        loss_settings.pop("_class_path", None)  # a subclass's, given back by load_from_checkpoint
        settings = LossSettings(**loss_settings)  # model.objective, model.clip_eps, ... (checked)
        # ``name: auto`` (and no network at all): the network for the observation space, an image's CNN
        # (ppo_lightning.nets.pixel_cnn); the choice is saved with the hyperparameters and in config.yaml
        network, choice = resolve_network(observation_space or {}, dict(network or {"name": "auto"}))
        if choice is not None:
            say_once(choice)

        take_precision_aliases({"network": network, "proximal_precision": proximal_precision})

        ppg = ppg_lib.resolve_ppg_config(ppg)
        if ppg is not None:
            network = ppg_lib.ppg_network_config(network)
        # The hyperparameters are the init arguments of this class and of a subclass (its own
        # settings then resume with --ckpt_path) and every loss setting, normalized to plain values; a
        # subclass's class path goes with them, so that the CLI rebuilds the same class from a checkpoint.
        hparams = collect_init_args(inspect.currentframe(), [], classes=(pl.LightningModule,))
        hparams = {k: v for d in hparams for k, v in d.items() if k not in ("self", "__class__")}
        hparams.update({name: getattr(settings, name) for name in LOSS_SETTINGS})
        hparams.update(
            network=network,
            ppg=ppg,
            adam_betas=tuple(float(b) for b in adam_betas),
            seeds=None if seeds is None else [int(s) for s in seeds],
            member_hparams=None if member_hparams is None else {k: list(v) for k, v in dict(member_hparams).items()},
            objective_args=None if settings.objective_args is None else plain(settings.objective_args),
            loss=None if loss is None else plain(loss),
            schedules=None if schedules is None else plain(schedules),
            value_loss_args=None if settings.value_loss_args is None else plain(settings.value_loss_args),
            aux_terms=None if settings.aux_terms is None else plain(settings.aux_terms),
        )
        hparams.pop("proximal_precision", None)
        if type(self) is not PPOLightningModule:
            hparams["_class_path"] = f"{type(self).__module__}.{type(self).__qualname__}"
        self.save_hyperparameters(hparams)
        self.validate_config()
        self.network = build_network(observation_space, action_space, network)
        # The seed axis (ppo_lightning.training.seed_group): a single run, or a vectorized seed group whose
        # network stacks one copy per seed (and `seed_group` is that group).
        self.seed_axis = seed_axis(self, seeds, self.hparams.member_hparams)
        self.seed_group = self.seed_axis.group
        self.network = self.seed_axis.stacked(self.network)
        self.members = self.seed_axis.members
        if init_from is not None:
            load_pretrained_weights(self.network, init_from)
        self.loss_module = self.make_loss()
        self.coefficients.check_loss(self.loss_module)
        self.check_objective_settings()
        self.param_keys = dist_param_keys(action_space)
        # The proximal anchor (ppo_lightning.training.parts): the EWMA of the weights (PPO-EWMA, PPG-EWMA;
        # owned here, in this module's checkpoint; ProximalEWMAStep says when it moves) or the behavior.
        self.anchor = make_anchor(settings.decoupled, self.seed_axis.proximal_com(proximal_com))
        self.proximal_source = self.anchor.source
        # PPG: phase bookkeeping and buffer; manual optimization (a step picks one of its optimizers).
        self.ppg_phases = make_phases(ppg, action_space, self.network)
        # The update of a minibatch, one per algorithm (ppo_lightning.training.update).
        self.updater = make_updater(ppg)
        self.automatic_optimization = self.updater.automatic_optimization
        # This iteration's per-step diagnostics: one {entry name: tensor} per training step (the loss's
        # output entries, detached; `step_stat` reads one across the steps).
        self.step_stats: list[dict[str, torch.Tensor]] = []
        self._output_checked = False  # the loss's output contract is checked on its first output
        self._fit_t0: float | None = None
        # Loggers get an iteration's metrics at most once per this many frames (and at the last
        # iteration); 0: every iteration. Set by the CLI's --log_every_frames: at c = 64 an iteration is
        # 64 frames, and one MLflow write per run per iteration (~16 ms on sqlite) was a fifth to a third
        # of a seed group's CPU time (docs/benchmarks/small-batch.md).
        self.log_every_frames = 0
        self._logged_at_frames: float | None = None
        self._recorded: dict[str, float] = {}
        self._fit_frames0 = 0
        # Skips non-finite steps per member, stops when every member had max_bad_steps in a row.
        self.numerical_guard = NumericalGuard(max_bad_steps, self.members)
        self.numerical_guard.loop = TrainerLoop(self)
        # The optional parts' hooks run in this order (ppo_lightning.training.parts): PPG's buffer check,
        # then the compiled loss, then the anchor, at fit start.
        self.compile_part = make_compile_part(self.hparams.get("compile", False))
        self.parts = [p for p in (make_ppg_part(self.ppg_phases), self.compile_part, self.anchor) if p is not None]

    # ------------------------------------------------------------------ configuration
    def validate_config(self) -> None:
        """Fail before training, naming the field."""
        h = self.hparams
        if h.observation_space is None or h.action_space is None:
            raise ValueError("model.observation_space and model.action_space are required (the CLI takes them from data)")
        for name, value in {"lr": h.lr, "adam_eps": h.adam_eps}.items():
            if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise ValueError(f"model.{name} must be > 0, got {value!r}")
        if h.get("loss") is not None and not (isinstance(h.loss, dict) and isinstance(h.loss.get("class_path"), str)
                                              and set(h.loss) <= {"class_path", "init_args"}):
            raise ValueError(f"model.loss must be {{class_path: ..., init_args: {{...}}}} or null, got {h.loss!r}")
        # model.schedules (ppo_lightning.algos.schedules): checked here, applied every iteration
        self.coefficients = ScheduledCoefficients(h)
        validate_proximal_com(h.proximal_com, h.decoupled)
        if h.optimizer not in ("adam", "sgd"):
            raise ValueError(f"model.optimizer must be 'adam' or 'sgd', got {h.optimizer!r}")
        if h.micro_batch_size is not None and not (isinstance(h.micro_batch_size, int) and h.micro_batch_size > 0):
            raise ValueError(f"model.micro_batch_size must be a positive integer or null, got {h.micro_batch_size!r}")

        if h.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"model.lr_schedule must be one of {LR_SCHEDULES}, got {h.lr_schedule!r}")
        validate_compile(h.get("compile", False), ppg=h.get("ppg") is not None)
        validate_seed_group(h)
        if h.max_bad_steps is not None and not (isinstance(h.max_bad_steps, int) and h.max_bad_steps > 0):
            raise ValueError(f"model.max_bad_steps must be a positive integer or null, got {h.max_bad_steps!r}")
        if not all(0.0 <= b < 1.0 for b in h.adam_betas) or len(h.adam_betas) != 2:
            raise ValueError(f"model.adam_betas must be two numbers in [0, 1), got {h.adam_betas!r}")
        validate_ppg_config(h.get("ppg"), h)

    def check_objective_settings(self) -> None:
        """A setting the objective ignores (`ppo_lightning.algos.registry.Objective.uses`), given another
        value than its default, members' own values or a schedule, is a one-line error before training:
        the run would train without it. (A loss subclass with its own ``surrogate``, and an auxiliary term
        other than the built-in ``logit_l2``, may read any: nothing is refused then.)"""
        loss = self.loss_module
        own_terms = [hook.name for hook, _, _ in getattr(loss, "aux_specs", {}).values() if hook.name != "logit_l2"]
        if type(loss).surrogate is not PPOFamilyLoss.surrogate or own_terms:
            return
        h = self.hparams
        unused = unused_settings(loss.objective_spec, self.loss_settings(), LOSS_SETTINGS,
                                 tuple(h.get("member_hparams") or {}), tuple(self.coefficients.specs))
        if unused:
            uses = ", ".join(loss.objective_spec.uses) or f"none of {', '.join(OBJECTIVE_SETTINGS)}"
            raise ValueError(f"model.objective {loss.objective!r} ignores {', '.join(unused)} (it uses {uses}): the "
                             f"run would train without it; drop it or choose an objective that uses it")

    def loss_settings(self) -> dict[str, Any]:
        """The loss module's settings (`ppo_lightning.algos.loss.LOSS_SETTINGS`) from the hyperparameters."""
        return {k: self.hparams.get(k, default) for k, default in LOSS_SETTINGS.items()}

    def make_loss(self) -> torch.nn.Module:
        """The loss module: ``model.loss``'s class (default `PPOFamilyLoss`) built on this module's
        network with the loss settings and the class's own ``init_args``. Override to build another."""
        spec = self.hparams.get("loss") or {}
        cls = PPOFamilyLoss
        if spec.get("class_path"):
            module, _, name = spec["class_path"].rpartition(".")
            try:
                cls = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError, ValueError) as err:
                raise ValueError(f"model.loss.class_path {spec['class_path']!r}: cannot import it ({err})") from None
        init_args = dict(spec.get("init_args") or {})
        if cls is not PPOFamilyLoss:  # a subclass's own settings, checked (its Settings dataclass or __init__)
            schema = schema_of(cls, skip=0, exclude=("network", "action_space", "stacked_seeds", *LOSS_SETTINGS))
            checked = check_settings(schema, init_args, "model.loss.init_args", spec["class_path"])
            init_args = {k: checked[k] for k in init_args}
        loss = cls(self.network, self.hparams.action_space, **self.loss_settings(),
                   stacked_seeds=self.seed_axis.stacked_seeds, **init_args)
        self.seed_axis.configure_loss(loss)  # a group's members' own anchors and loss settings
        return loss

    def make_network(self) -> torch.nn.Module:
        """A fresh, unsharded network of this module's architecture."""
        h = self.hparams
        return build_network(h.observation_space, h.action_space, h.network)

    def configure_model(self) -> None:
        """FSDP2 under ``ModelParallelStrategy``: shard the network over the data-parallel mesh.

        Called by Lightning after the strategy has built ``self.device_mesh`` (None otherwise: DDP
        or one device keep the plain network). The methods the collector, the EWMA and the
        evaluation call besides ``forward`` are registered so that FSDP gathers the weights for them.
        """
        mesh = self.device_mesh
        if mesh is None or is_sharded(self.network):
            return
        if "tensor_parallel" in mesh.mesh_dim_names and mesh["tensor_parallel"].size() > 1:
            raise ValueError("ModelParallelStrategy: tensor parallelism is not supported; set tensor_parallel_size=1")
        shard_network(self.network, mesh["data_parallel"] if "data_parallel" in mesh.mesh_dim_names else mesh)

    def configure_callbacks(self):
        # Lightning calls this when it attaches the module, before it checks that a manual optimization's
        # Trainer neither clips nor accumulates: the update takes those settings (`Update.take_trainer_settings`).
        trainer = attached_trainer(self)
        if trainer is not None:
            self.updater.take_trainer_settings(self, trainer)
        return [cb for part in self.parts for cb in part.callbacks()]

    def step_proximal(self) -> None:
        """After an optimizer step (``ProximalEWMAStep``): move the anchor if the step changed the policy."""
        if self.updater.changed_policy:
            self.anchor.update()

    def on_fit_start(self) -> None:
        # After configure_model and the strategy's setup, so that (sharded) parameters are final.
        for part in self.parts:
            part.on_fit_start(self)

    def teardown(self, stage: str) -> None:
        for part in self.parts:
            part.teardown()
        self.seed_axis.teardown(self)

    @property
    def compiled(self):
        """The `ppo_lightning.training.compiled.CompiledLoss` of ``model.compile`` once fit started, else None."""
        return getattr(self.compile_part, "compiled", None)

    def _checkpointed_parts(self) -> dict[str, Any]:
        """This module's optional parts that keep state in its checkpoint, by checkpoint key."""
        parts = {"seed_runs": self.seed_axis.runs, "proximal_ewma": self.proximal_source,
                 "ppg": self.ppg_phases}
        return {key: part for key, part in parts.items() if part is not None}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["numerical_guard"] = self.numerical_guard.state_dict()
        checkpoint.update({key: part.state_dict() for key, part in self._checkpointed_parts().items()})

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        migrate_optimizer_steps(checkpoint)
        if "numerical_guard" in checkpoint:
            self.numerical_guard.load_state_dict(checkpoint["numerical_guard"])
        # Checkpoints from before the module owned the EWMA kept it in the callback's state.
        legacy = {"proximal_ewma": checkpoint.get("callbacks", {}).get("ProximalPolicyEWMA")}
        for key, part in self._checkpointed_parts().items():
            state = checkpoint.get(key) or legacy.get(key)
            if state:
                part.load_state_dict(state)

    def configure_optimizers(self):
        return self.updater.configure_optimizers(self)

    def configure_ppo_optimizers(self):
        """PPO's optimizer (`_make_optimizer`) and its lr schedule (`lr_scheduler_for`)."""
        optimizer = self._make_optimizer()
        scheduler = self.lr_scheduler_for(optimizer)
        return optimizer if scheduler is None else {"optimizer": optimizer, "lr_scheduler": scheduler}

    def lr_scheduler_for(self, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """``model.lr_schedule``'s or ``model.schedules.lr``'s scheduler of ``optimizer`` as a Lightning
        config stepped once per iteration; None for a constant lr (or before the data module is known)."""
        dm = attached_datamodule(self)
        if dm is None:
            return None
        if self.hparams.lr_schedule == "constant":
            return self.coefficients.lr_scheduler(self, optimizer)  # model.schedules.lr, if any
        return make_lr_scheduler(self.hparams.lr_schedule, optimizer, dm.total_frames, dm.frames_per_iteration)

    def _make_optimizer(self) -> torch.optim.Optimizer:
        params = list(self.network.parameters())
        return self.seed_axis.make_optimizer(self.hparams, params, self._fused(params))  # a group: members' own lrs

    def _fused(self, params: list) -> bool | None:
        """Whether Adam takes the fused kernel: one call per step instead of a Python loop over tensors
        (4x faster for the small CartPole MLP). Sharded (DTensor) parameters take the default path."""
        fused = all(type(p) is torch.nn.Parameter and p.device.type in ("cpu", "cuda") for p in params) or None
        trainer = attached_trainer(self)
        if fused and trainer is not None and trainer.precision != "32-true" and self.updater.clip_val:
            fused = None  # Lightning's mixed-precision plugin refuses to clip a fused optimizer's gradients
        return fused

    # ------------------------------------------------------------------ training
    def add_proximal(self, batch: TensorDictBase) -> TensorDictBase:
        """Write the proximal policy's distribution parameters under ``proximal`` (a recurrent
        network's: over the minibatch's segments from their stored start states, `ppo_lightning.algos.proximal`)."""
        if "proximal" in batch.keys():
            return batch  # supplied by the data side (staleness experiments)
        params = self.anchor.proximal_params(batch, self.param_keys)
        batch.set("proximal", TensorDict(dict(zip(self.param_keys, params)), batch_size=batch.batch_size))
        return batch

    def transfer_batch_to_device(self, batch, device, dataloader_idx: int):
        # Minibatches are built from a rollout already on the module's device; Lightning's generic
        # move (TensorDict.to on every step) cost ~0.15 ms per gradient step on CartPole.
        data = batch.data if isinstance(batch, ppg_lib.PhaseBatch) else batch  # PPG's minibatches carry their phase
        if isinstance(data, TensorDictBase) and data.get(OBS_KEY).device == device:
            return batch
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def training_step(self, batch: TensorDictBase, batch_idx: int) -> torch.Tensor:
        return self.updater.training_step(self, batch, batch_idx)

    # ------------------------------------------------------------------ members of the seed axis
    def refill_member(self, k: int, seed: int, values: dict) -> None:
        """Member k starts again as the single run with ``seed`` and the member settings ``values``
        (between iterations: a tuning group's pruned trial gives its slot to the next trial); each
        component resets its own slot (``reset_member(k)``)."""
        self.seed_axis.refill(self, k, seed, values)

    def set_member_lrs(self, lrs: list[float]) -> None:
        """Every member's lr from now on (members on lr schedules of their own)."""
        self.seed_axis.set_member_lrs(self, lrs)

    @property
    def at_refill_point(self) -> bool:
        """Whether `refill_member` may start a member before the next iteration: always for PPO; for
        PPG where the next iteration starts a policy phase (the new member's phases are its run's)."""
        return self.ppg_phases is None or self.ppg_phases.at_phase_start

    def member_returns(self, last: int = 20) -> list[float]:
        """Each member's mean return over its last ``last`` episodes (nan before its first), member
        order; a single run's is one value."""
        return [float(st.episodes.mean_return(last)) for st in attached_datamodule(self).states]

    @property
    def member_run_ids(self) -> list[str] | None:
        """The members' own MLflow run ids (a group's), or None: a single run's metrics are its run's."""
        runs = self.seed_axis.runs
        return None if runs is None else runs.run_ids

    @property
    def _ppg_optimizer_index(self) -> dict[str, int]:
        return self.updater.optimizer_index

    def on_before_optimizer_step(self, optimizer) -> None:
        # after the callbacks' hooks (which read the unclipped gradients), as Lightning orders its own clip
        self.updater.clip(self, optimizer)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        if not self.seed_axis.clip_gradients(self, gradient_clip_val, gradient_clip_algorithm):  # a group: per seed
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def loss_and_stats(
        self, batch: TensorDictBase, terms: tuple[str, ...] = LOSS_TERMS
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of a (micro)batch ``[S, B]`` (a recurrent network's ``[S, B, L]`` segments; the sum
        of ``terms``: ``[S]``, one per member; S = 1 for a single run) and its diagnostics by name: every entry of the loss's output, detached, as
        float32, ``[S]`` (a scalar entry counts for every member)."""
        if self.loss_module.decoupled:
            batch = self.add_proximal(batch)
        out = self.loss_module(batch)
        if not self._output_checked:
            check_loss_output(out, self.members)
            self._output_checked = True
        if "loss_objective" in terms:  # auxiliary terms (ppo_lightning.algos.hooks) join the policy's loss
            terms = tuple(terms) + tuple(k for k in out.keys() if k.startswith(AUX_PREFIX))
        stats = {k: v.detach().float() for k, v in out.items()}
        stats = {k: v.expand(self.members) for k, v in stats.items()}  # a scalar entry counts for every member
        return sum(out[k] for k in terms), stats

    def record_step(self, stats: dict[str, torch.Tensor]) -> None:
        """Keep one training step's diagnostics (by name) for the iteration's metrics."""
        self.step_stats.append(stats)

    def on_train_start(self) -> None:
        self._fit_t0 = time.perf_counter()
        dm = self.trainer.datamodule
        self._fit_frames0 = dm.frames if dm is not None else 0
        self.updater.on_train_start(self)

    def on_train_epoch_start(self) -> None:
        self.step_stats = []
        if self.coefficients:  # model.schedules: this iteration's coefficients, scaled from the configured ones
            self.record_metrics(self.coefficients.apply(self))
        self.record_metrics(values_in_use(self))  # the lr and the scheduled or per-member settings this iteration uses

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        for part in self.parts:
            part.step_started()

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        for part in self.parts:
            self.record_metrics(part.step_ended())

    def on_train_epoch_end(self) -> None:
        dm = self.trainer.datamodule
        metrics = self._train_metrics(dm)
        metrics.update(self.numerical_guard.metrics())
        if dm is not None and hasattr(dm, "iteration_metrics"):
            metrics.update(dm.iteration_metrics())
            parallel.pool_episode_metrics(self, dm, metrics)  # all ranks' episodes, same figure on every rank
            if self._fit_t0 is not None:
                elapsed = time.perf_counter() - self._fit_t0
                metrics["time/fps"] = (dm.frames - self._fit_frames0) * self.members / max(elapsed, 1e-9)
                metrics["time/elapsed_s"] = elapsed
            if dm.finished:
                self.trainer.should_stop = True
        self.updater.on_iteration_end(self)
        metrics.update(self._component_metrics())
        metrics.update(self._recorded)
        self._recorded = {}
        send = self._logging_due(dm)
        # members' values by name (`name_members`): a group's seed k under "seed<k>/", the members' mean
        # unprefixed, and each member's own to its own MLflow run
        logged, per_member = name_members(metrics, self.members)
        self.publish_metrics(logged, send)
        if send:
            self.seed_axis.publish(self, per_member)

    def _train_metrics(self, dm) -> dict[str, float]:
        """The iteration's means of the per-step diagnostics over the steps with finite ones (skipped
        steps have non-finite ones), and the adaptive KL beta's update: once per iteration, on the mean
        KL of the last update epoch (all ranks'); a NaN never reaches beta. Each member's own."""
        if not self.step_stats:
            return {}
        S = self.members
        stats = {name: self.step_stat(name).reshape(len(self.step_stats), S) for name in self.step_stats[0]}
        out = {f"train/{name}": PerMember(finite_mean(values[:, k]) for k in range(S)) for name, values in stats.items()}
        kl = stats["kl_anchor"][-getattr(dm, "num_minibatches", len(self.step_stats)):]
        mean_kl = [parallel.mean_over_ranks(self, finite_mean(kl[:, k])) for k in range(S)]
        out["train/kl_anchor_last_epoch"] = PerMember(mean_kl)
        out["train/kl_beta"] = PerMember(self.loss_module.update_kl_beta(v, k) for k, v in enumerate(mean_kl))
        return out

    def _component_metrics(self) -> dict[str, float]:
        """The iteration's metrics of the module's parts (the EWMA proximal policy, PPG's phases)."""
        return {k: v for part in self.parts for k, v in part.metrics().items()}

    # ------------------------------------------------------------------ per-iteration metrics
    def step_stat(self, name: str) -> torch.Tensor:
        """This iteration's per-step values of the loss's diagnostic ``name``: ``[steps]``, or
        ``[steps, S]`` for a seed group."""
        return torch.stack([stats[name] for stats in self.step_stats])

    def record_metrics(self, metrics: dict[str, float | PerMember]) -> None:
        """Add metrics (from callbacks) to this iteration's batch, published at the iteration's end: a
        float is the run's (every member's), a `PerMember` each member's own (`name_members`)."""
        self._recorded.update(metrics)

    def _logging_due(self, dm) -> bool:
        """Whether this iteration's metrics go to the loggers (``log_every_frames``; always the first
        and the last iteration)."""
        frames = getattr(dm, "frames", None)
        if not self.log_every_frames or frames is None or getattr(dm, "finished", True):
            due = True
        else:
            due = self._logged_at_frames is None or frames - self._logged_at_frames >= self.log_every_frames
        if due and frames is not None:
            self._logged_at_frames = frames
        return due

    def publish_metrics(self, metrics: dict[str, float], send: bool = True) -> None:
        """Send one iteration's metrics to the loggers (when ``send``) and to ``trainer.callback_metrics``.

        Every logger steps them by environment frames (the ``frames`` metric), the x-axis RL runs are
        compared on. Why not ``self.log_dict``: Lightning's result collection costs ~0.25 ms per key; with ~35
        keys per iteration that was ~9 ms per iteration, 6% of a CartPole run. Monitors
        (EarlyStopping, ModelCheckpoint) read ``trainer.callback_metrics``, updated here.
        """
        trainer = self.trainer
        trainer.callback_metrics.update({k: torch.tensor(float(v)) for k, v in metrics.items()})
        step = int(metrics["frames"]) if "frames" in metrics else trainer.global_step  # every logger's x-axis: frames
        for logger in trainer.loggers if send else ():  # as Lightning's logger connector does: log, then save
            logger.log_metrics(metrics, step=step)
            logger.save()

    # ------------------------------------------------------------------ acting
    @torch.no_grad()
    def act(self, observation: torch.Tensor, deterministic: bool = False, *, state: torch.Tensor | None = None,
            is_init: torch.Tensor | None = None):
        """Actions for a batch of observations (sampled, or the mode when ``deterministic``).

        A recurrent network (`ppo_lightning.nets.recurrent`) returns ``(actions, new_state)``, as an
        exported model's ``act`` does: ``state`` None starts every episode of the batch here (zeros,
        ``is_init`` True); with a state, ``is_init`` (default all False) marks the envs that just reset.
        A feed-forward network takes neither."""
        with torch.no_grad():
            if is_recurrent(self.network):
                batch = observation.shape[: observation.dim() - self.network.obs_ndim]
                if state is None:
                    state = self.network.initial_state(*batch, device=observation.device)
                    is_init = torch.ones(batch, dtype=torch.bool, device=observation.device)
                elif is_init is None:
                    is_init = torch.zeros(batch, dtype=torch.bool, device=observation.device)
                *params, _value, new_state = self.network.step(observation, state, torch.as_tensor(is_init).bool())
                dist = make_distribution(self.hparams.action_space, *params)
                return (dist.mode if deterministic else dist.sample()), new_state
            if state is not None or is_init is not None:
                raise ValueError("this policy is feed-forward: act takes no state or is_init")
            dist = make_distribution(self.hparams.action_space, *self.network.policy(observation))
        return dist.mode if deterministic else dist.sample()
