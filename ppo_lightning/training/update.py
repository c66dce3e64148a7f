"""The update of one minibatch: zero -> accumulate -> guard -> clip -> step, one path for PPO and PPG.

One update object per algorithm, chosen when the module is built: `PPOUpdate` (one optimizer) or
`PPGUpdate` (up to three, one per phase); both are `Update`, whose `Update.step` every minibatch
takes under Lightning's manual optimization:

- **accumulate**: `accumulate`, the one gradient accumulation over ``model.micro_batch_size``
  chunks: each chunk's loss is a mean, weighted by the chunk's share of the minibatch, so the
  accumulated gradient is the minibatch's (up to float summation order); its diagnostics combine by
  `combine_chunk_stats`. A loss is ``[S]``, one per member (S = 1 for a single run; the gradient
  is that of their sum, so each member's is its own loss's);
- **guard**: the module's ``numerical_guard`` (`ppo_lightning.core.faults.NumericalGuard`, one check per
  member) gets the step's loss after the backward pass and drops a bad step's gradients (a bad
  member's alone in a group);
- **clip**: the module's ``configure_gradient_clipping`` (per member in a group) at the Trainer's
  ``gradient_clip_val`` (`Update.take_trainer_settings`);
- **step**: the optimizer's step, then the guard's parameter check; the lr schedules step once per
  iteration (`Update.on_iteration_end`).

PPG's phases, buffer and auxiliary loss are `ppo_lightning.algos.ppg`'s; the phase of a step comes
with its minibatch (`ppo_lightning.algos.ppg.PhaseBatch`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from tensordict import TensorDictBase

from ppo_lightning.adapters.lightning import attached_datamodule, attached_trainer
from ppo_lightning.algos.loss import MAX_ENTRIES
from ppo_lightning.algos.ppg import PHASE_TERMS, PhaseBatch
from ppo_lightning.core.faults import TrainingLoop
from ppo_lightning.data import parallel
from ppo_lightning.nets.recurrent import is_recurrent


def combine_chunk_stats(chunk_stats: list[tuple[float, dict[str, torch.Tensor]]]) -> dict[str, torch.Tensor]:
    """A minibatch's diagnostics from its chunks' ``(weight, stats by name)``: the size-weighted mean,
    and the maximum for the entries of `ppo_lightning.algos.loss.MAX_ENTRIES`, each member's own (``[S]``; on
    device: no host sync)."""
    return {name: torch.stack([st[name] for _, st in chunk_stats]).amax(0) if name in MAX_ENTRIES
            else sum(w * st[name] for w, st in chunk_stats) for name in chunk_stats[0][1]}


def check_micro_batch_size(micro_batch_size: int | None, sequence_length: int | None) -> None:
    """A recurrent run's micro-batches are whole segments: ``model.micro_batch_size`` (samples) must be
    a multiple of the segment length L (``sequence_length``; None: a feed-forward run, anything goes).
    One-line error otherwise."""
    if not isinstance(micro_batch_size, int) or sequence_length is None or micro_batch_size % sequence_length == 0:
        return
    raise ValueError(f"model.micro_batch_size {micro_batch_size} must be a multiple of the sequence length "
                     f"{sequence_length} (data.sequence_length, or data.rollout_steps when null): a recurrent "
                     "network's micro-batches are whole segments")


def micro_batches(batch: TensorDictBase, micro_batch_size: int | None, recurrent: bool
                  ) -> tuple[list[TensorDictBase], list[float]] | None:
    """The chunks of ``micro_batch_size`` samples of a minibatch and each one's share of it, or None
    for one chunk (no ``micro_batch_size``, or one at least the minibatch's size). A feed-forward
    minibatch ``[S, N]`` splits its samples (the last dimension); a recurrent one ``[S, B, L]``
    splits its segments (dimension 1), ``micro_batch_size / L`` per chunk (`check_micro_batch_size`)."""
    if micro_batch_size is None:
        return None
    if recurrent:
        segments, length = batch.shape[-2], batch.shape[-1]
        check_micro_batch_size(micro_batch_size, length)
        per_chunk, dim = micro_batch_size // length, -2
    else:
        segments, per_chunk, dim = batch.shape[-1], micro_batch_size, -1
    if per_chunk >= segments:
        return None
    chunks = batch.split(per_chunk, dim=dim)
    return chunks, [chunk.shape[dim] / segments for chunk in chunks]


def accumulate(module, batch: TensorDictBase, loss_and_stats: Callable, backward: Callable, backward_last: bool = True
               ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Back-propagate ``loss_and_stats(chunk)`` over the minibatch's chunks of ``model.micro_batch_size``
    samples (one chunk without it), each loss weighted by its share of the minibatch, with
    ``backward``; the last chunk's too unless ``backward_last`` is False (Lightning's automatic
    optimization back-propagates the returned loss). Returns (the last chunk's weighted loss, the
    minibatch's loss detached, the combined diagnostics by name). The chunks split the samples, the
    last batch dimension of an ``[S, B]`` minibatch; a recurrent network's ``[S, B, L]`` minibatch
    splits into whole segments (`micro_batches`)."""
    split = micro_batches(batch, module.hparams.micro_batch_size, is_recurrent(module.network))
    if split is None:  # one chunk: the minibatch itself
        loss, stats = loss_and_stats(batch)
        if backward_last:
            backward(loss)
        return loss, loss.detach(), stats
    chunks, weights = split
    chunk_stats, total_loss = [], 0.0
    for i, (chunk, w) in enumerate(zip(chunks, weights)):
        loss, stats = loss_and_stats(chunk)
        loss = loss * w
        if backward_last or i < len(chunks) - 1:  # frees this chunk's activations
            backward(loss)
        chunk_stats.append((w, stats))
        total_loss = total_loss + loss.detach()
    return loss, total_loss, combine_chunk_stats(chunk_stats)


class TrainerLoop(TrainingLoop):
    """The guard's view of the Trainer that fits ``module`` (`ppo_lightning.core.faults.TrainingLoop`):
    its ranks, its strategy's all-reduce of a flag, the data module's iteration, the global step."""

    def __init__(self, module) -> None:
        self.module = module

    @property
    def world_size(self) -> int:
        trainer = attached_trainer(self.module)
        return trainer.world_size if trainer is not None else 1

    def any_rank(self, flag: bool) -> bool:
        return attached_trainer(self.module).strategy.reduce_boolean_decision(flag, all=False)

    def iteration(self) -> Any:
        return getattr(attached_datamodule(self.module), "iteration", "?")

    def steps_taken(self) -> Any:
        trainer = attached_trainer(self.module)
        return trainer.global_step if trainer is not None else "?"


def one_clip_setting(trainer_clip: float | None, ppg_clip: float | None) -> float | None:
    """The gradient-norm clip of a run: ``trainer.gradient_clip_val``, or ``model.ppg.max_grad_norm``
    (the same setting spelled PPG's way); both set and different is one line."""
    if trainer_clip and ppg_clip is not None and float(ppg_clip) != float(trainer_clip):
        raise ValueError(f"trainer.gradient_clip_val {trainer_clip} and model.ppg.max_grad_norm {ppg_clip} differ: set "
                         "trainer.gradient_clip_val alone (it clips PPO and PPG alike)")
    return float(trainer_clip) if trainer_clip else ppg_clip


class Update:
    """The one step path of PPO and PPG (Lightning's manual optimization): zero, accumulate
    (micro-batches, and ``accumulate_grad_batches`` minibatches), guard, clip, step, and the lr schedules
    once per iteration. The optimizers are the subclass's, by name (`optimizer_names`).

    Clipping and accumulation are the Trainer's settings (``gradient_clip_val``,
    ``gradient_clip_algorithm``, ``accumulate_grad_batches``: one setting for PPO and PPG). Lightning's
    manual optimization refuses a Trainer that has them, so `take_trainer_settings` moves them here when
    Lightning attaches the module (`PPOLightningModule.configure_callbacks`, which Lightning calls before
    that check) and leaves the Trainer without them. The clip runs in the module's
    ``on_before_optimizer_step``, after the callbacks' (`ppo_lightning.training.noise_scale` reads the
    unclipped gradients), as Lightning's automatic optimization orders them."""

    automatic_optimization = False

    def __init__(self) -> None:
        self.optimizer_index: dict[str, int] = {}
        self.changed_policy = True  # the last step changed the policy (the EWMA moves after it)
        self.clip_val: float | None = None
        self.clip_algorithm: str | None = None
        self.accumulate = 1
        self._took = False
        self._clip_pending = False

    # ---------------------------------------------------------------- settings
    def own_clip(self, module) -> float | None:
        """The algorithm's own clip setting besides the Trainer's (PPG: ``model.ppg.max_grad_norm``)."""
        return None

    def take_trainer_settings(self, module, trainer) -> None:
        """Move the Trainer's clipping and accumulation settings into this update (see the class doc);
        a second attach (another ``fit`` on the same Trainer) keeps what the first took."""
        clip, algorithm, k = trainer.gradient_clip_val, trainer.gradient_clip_algorithm, trainer.accumulate_grad_batches
        if self._took and not clip and k == 1:
            return
        self.clip_val = one_clip_setting(clip, self.own_clip(module))
        self.clip_algorithm = (algorithm.value if hasattr(algorithm, "value") else algorithm) if clip else "norm"
        self.accumulate = int(k)
        trainer.gradient_clip_val, trainer.accumulate_grad_batches = None, 1
        self._took = True

    # ---------------------------------------------------------------- one minibatch
    def step(self, module, opt, data: TensorDictBase, loss_and_stats: Callable, batch_idx: int
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """zero (first minibatch of an accumulation), accumulate this minibatch's chunks, and on the last
        minibatch of an accumulation (or of the iteration) guard -> clip -> step. Every backward pass
        but the step's last bypasses DDP's gradient sync (`ppo_lightning.data.parallel.backward_chunk`).
        Returns the minibatch's loss (detached; ``[S]`` for a group) and diagnostics."""
        k = self.accumulate
        if batch_idx % k == 0:
            opt.zero_grad()
        stepping = (batch_idx + 1) % k == 0 or module.trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        last, loss, stats = accumulate(module, data, loss_and_stats,
                                       lambda chunk_loss: parallel.backward_chunk(module, chunk_loss.sum(), k),
                                       backward_last=False)
        if stepping:
            module.manual_backward(last.sum() / k)  # as Lightning scales the loss it back-propagates
            guard = module.numerical_guard
            self._clip_pending = guard.after_backward(module, opt.optimizer, loss) and self.clip_val is not None
            opt.step()  # Lightning's hooks, then `clip` (module.on_before_optimizer_step), then the step
            self._clip_pending = False
            guard.check_parameters(module, opt.optimizer)
        else:
            parallel.backward_chunk(module, last.sum(), k)
        return loss, stats

    def clip(self, module, optimizer) -> None:
        """The step's clip, if the guard kept it (`step`): per member in a group (`configure_gradient_clipping`)."""
        if self._clip_pending:
            module.configure_gradient_clipping(optimizer, self.clip_val, self.clip_algorithm)

    @staticmethod
    def on_iteration_end(module) -> None:
        """Lightning leaves a manual step's schedulers to it: each steps once per iteration (their state
        is in the checkpoint, Lightning's ``lr_schedulers``)."""
        for config in module.trainer.lr_scheduler_configs:
            config.scheduler.step()

    @staticmethod
    def on_train_start(module) -> None:
        pass


class PPOUpdate(Update):
    """PPO's one optimizer (``main``) and its step (`Update.step`)."""

    @staticmethod
    def optimizer_names(module) -> list[str]:
        """PPO's one optimizer (`PPGUpdate.optimizer_names`: PPG's by phase)."""
        return ["main"]

    def configure_optimizers(self, module):
        self.optimizer_index = {"main": 0}
        return module.configure_ppo_optimizers()

    def training_step(self, module, batch: TensorDictBase, batch_idx: int) -> torch.Tensor:
        module.numerical_guard.check_batch(batch)
        m = module.hparams.micro_batch_size
        if m is not None and m < batch.shape[-1] * (batch.shape[-2] if is_recurrent(module.network) else 1) \
                and module.loss_module.decoupled:
            batch = module.add_proximal(batch)  # one no-grad pass for the whole minibatch, not one per chunk
        loss, stats = self.step(module, module.optimizers(), batch, module.loss_and_stats, batch_idx)
        module.record_step(stats)
        return loss.sum()


class PPGUpdate(Update):
    """PPG's optimizers and their step (`Update.step`; `ppo_lightning.algos.ppg`): one policy(-phase)
    optimizer, a value optimizer when E_V != E_pi, the auxiliary Adam; every one over all parameters,
    as in the reference code. The phase of a step is its minibatch's (`ppo_lightning.algos.ppg.PhaseBatch`)."""

    def own_clip(self, module) -> float | None:
        return module.ppg_phases.cfg["max_grad_norm"]

    @staticmethod
    def _fusable(params: list) -> bool | None:
        return all(type(p) is torch.nn.Parameter and p.device.type in ("cpu", "cuda") for p in params) or None

    @staticmethod
    def optimizer_names(module) -> list[str]:
        """``["policy", "aux"]``, or ``["policy", "value", "aux"]`` when E_V != E_pi (reference ``opt_keys``)."""
        e_v = module.ppg_phases.cfg["epochs_value"]
        dm = attached_datamodule(module)
        separate = e_v is not None and dm is not None and e_v != dm.update_epochs
        return ["policy", "value", "aux"] if separate else ["policy", "aux"]

    def configure_optimizers(self, module) -> list[torch.optim.Optimizer]:
        h, cfg = module.hparams, module.ppg_phases.cfg
        trainer = attached_trainer(module)
        wrapped = trainer.model if trainer is not None else None
        if isinstance(wrapped, torch.nn.parallel.DistributedDataParallel) and not wrapped.find_unused_parameters:
            raise ValueError("model.ppg under DDP: its policy steps leave the auxiliary value head unused; use "
                             "trainer.strategy ddp_find_unused_parameters_true (the CLI does so for 'ddp')")
        params = list(module.network.parameters())
        names = self.optimizer_names(module)
        self.optimizer_index = {n: i for i, n in enumerate(names)}
        self.optimizer_index["joint"] = 0
        opts, schedulers = [], []
        for name in names:
            if name == "aux":  # the auxiliary phase keeps ppg.aux_lr: the lr schedule is the policy's and value's
                opts.append(module.seed_axis.adam(params, cfg["aux_lr"], cfg["aux_betas"], h.adam_eps, self._fusable(params)))
                continue
            opts.append(module.seed_axis.make_optimizer(h, params, self._fusable(params)))  # a group's members' own lrs
            scheduler = module.lr_scheduler_for(opts[-1])
            if scheduler is not None:
                schedulers.append(scheduler)
        return (opts, schedulers) if schedulers else opts

    def training_step(self, module, batch: PhaseBatch, batch_idx: int) -> dict[str, Any]:
        """One gradient step of the minibatch's phase (``batch.phase``). A vectorized seed group steps
        every seed at once: the loss is the sum of the seeds' losses (each seed's gradient is its own
        loss's), the guard and gradient clipping act per seed."""
        phases, phase, data = module.ppg_phases, batch.phase, batch.data
        opt = module.optimizers()[self.optimizer_index[phase]]
        if phase == "aux":
            device = next(module.network.parameters()).device
            phases.start_aux_step(module.network, device)
            data = phases.gather(data, device)
            module.numerical_guard.check_batch(data)
            loss, stats = self.step(module, opt, data,
                                    lambda c: phases.aux_loss_and_stats(module.network, module.loss_module, c), batch_idx)
            phases.record_aux_stats(stats)
        else:
            module.numerical_guard.check_batch(data)
            if module.loss_module.decoupled and phase == "value":  # the value loss ignores the anchor: no EWMA forward
                data.set("proximal", data.select(*module.param_keys))
            elif module.loss_module.decoupled:  # one proximal pass per minibatch, not per chunk
                data = module.add_proximal(data)
            terms = PHASE_TERMS[phase]
            loss, stats = self.step(module, opt, data, lambda c: module.loss_and_stats(c, terms), batch_idx)
            module.record_step(stats)
        phases.last_step_phase = phase
        self.changed_policy = phase in ("joint", "policy")
        if batch.last:  # the auxiliary phase's last step
            phases.finish_aux_phase()
            if module.proximal_source is not None:
                module.proximal_source.reset(module.network)
        return {"loss": loss.sum(), "ppg_phase": phase}

    def take_trainer_settings(self, module, trainer) -> None:
        super().take_trainer_settings(module, trainer)
        if self.accumulate != 1:  # a step is one phase's optimizer: minibatches of two phases cannot add up
            raise ValueError(f"model.ppg steps one phase's optimizer per minibatch: trainer.accumulate_grad_batches "
                             f"{self.accumulate} is not supported (leave it at 1)")

    @staticmethod
    def on_train_start(module) -> None:
        """A resume in the middle of a policy phase starts a new one: the EWMA restarts from the weights."""
        if module.ppg_phases.take_restart() and module.proximal_source is not None:
            module.proximal_source.reset(module.network)


def make_updater(ppg: dict | None) -> PPOUpdate | PPGUpdate:
    """The update of a minibatch for ``model.ppg`` (None: PPO)."""
    return PPOUpdate() if ppg is None else PPGUpdate()
