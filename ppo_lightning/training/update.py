"""The update of one minibatch: accumulate (micro-batches) -> guard -> clip -> step.

One update object per algorithm, chosen when the module is built: `PPOUpdate` (Lightning's
automatic optimization) or `PPGUpdate` (manual optimization: up to three optimizers). Both take the
same path through a step:

- **accumulate**: `accumulate`, the one gradient accumulation over ``model.micro_batch_size``
  chunks: each chunk's loss is a mean, weighted by the chunk's share of the minibatch, so the
  accumulated gradient is the minibatch's (up to float summation order); its diagnostics combine by
  `combine_chunk_stats`. A loss is a scalar, or ``[S]`` for a seed group (one per seed; the
  gradient is that of their sum, so each seed's is its own loss's);
- **guard**: the module's ``numerical_guard`` (`ppo_lightning.core.faults.NumericalGuard`, or
  `ppo_lightning.training.seed_group.SeedGroupGuard` per seed) gets the step's loss after the
  backward pass and drops a bad step's gradients;
- **clip**: the module's ``configure_gradient_clipping`` (per seed for a group);
- **step**: the optimizer's step, then the guard's parameter check.

PPG's phases, buffer and auxiliary loss are `ppo_lightning.algos.ppg`'s; the phase of a step comes
with its minibatch (`ppo_lightning.algos.ppg.PhaseBatch`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from tensordict import TensorDictBase

from ppo_lightning.algos.loss import MAX_ENTRIES
from ppo_lightning.algos.ppg import PHASE_TERMS, PhaseBatch
from ppo_lightning.data import parallel


def combine_chunk_stats(chunk_stats: list[tuple[float, dict[str, torch.Tensor]]]) -> dict[str, torch.Tensor]:
    """A minibatch's diagnostics from its chunks' ``(weight, stats by name)``: the size-weighted mean,
    and the maximum for the entries of `ppo_lightning.algos.loss.MAX_ENTRIES` (on device: no host sync)."""
    return {name: torch.stack([st[name] for _, st in chunk_stats]).max() if name in MAX_ENTRIES
            else sum(w * st[name] for w, st in chunk_stats) for name in chunk_stats[0][1]}


def accumulate(module, batch: TensorDictBase, loss_and_stats: Callable, backward: Callable, backward_last: bool = True
               ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Back-propagate ``loss_and_stats(chunk)`` over the minibatch's chunks of ``model.micro_batch_size``
    samples (one chunk without it), each loss weighted by its share of the minibatch, with
    ``backward``; the last chunk's too unless ``backward_last`` is False (Lightning's automatic
    optimization back-propagates the returned loss). Returns (the last chunk's weighted loss, the
    minibatch's loss detached, the combined diagnostics by name)."""
    n, m = batch.shape[0], module.hparams.micro_batch_size
    if m is None or m >= n:  # one chunk: the minibatch itself
        loss, stats = loss_and_stats(batch)
        if backward_last:
            backward(loss)
        return loss, loss.detach(), stats
    chunks = batch.split(m)
    chunk_stats, total_loss = [], 0.0
    for i, chunk in enumerate(chunks):
        w = chunk.shape[0] / n
        loss, stats = loss_and_stats(chunk)
        loss = loss * w
        if backward_last or i < len(chunks) - 1:  # frees this chunk's activations
            backward(loss)
        chunk_stats.append((w, stats))
        total_loss = total_loss + loss.detach()
    return loss, total_loss, combine_chunk_stats(chunk_stats)


def guarded_step(module, optimizer, loss: torch.Tensor | None, clip: float | None) -> None:
    """guard -> clip -> step after a manual backward pass: the guard sees ``loss`` (``[S]`` for a
    seed group) and the gradients; a kept step's gradients are clipped to norm ``clip``."""
    guard = module.numerical_guard
    if guard.after_backward(module, optimizer.optimizer, loss) and clip is not None:
        module.configure_gradient_clipping(optimizer, clip, "norm")
    optimizer.step()
    guard.check_parameters(module, optimizer.optimizer)


class PPOUpdate:
    """PPO's step under Lightning's automatic optimization: `training_step` accumulates (the last
    chunk's loss is back-propagated by Lightning), `optimizer_step` runs Lightning's closure, then
    the guard; Lightning clips (``configure_gradient_clipping``) and steps."""

    changed_policy = True  # every step changes the policy (the EWMA moves after it)
    automatic_optimization = True  # Lightning's loop zeroes, steps and clips

    def __init__(self) -> None:
        self.micro_batched = False  # this step's gradients were accumulated inside training_step
        self.losses: torch.Tensor | None = None  # the step's loss as the guard sees it

    @staticmethod
    def optimizer_names(module) -> list[str]:
        """PPO's one optimizer (`PPGUpdate.optimizer_names`: PPG's by phase)."""
        return ["main"]

    def configure_optimizers(self, module):
        return module.configure_ppo_optimizers()

    def training_step(self, module, batch: TensorDictBase, batch_idx: int) -> torch.Tensor:
        n, m = batch.shape[0], module.hparams.micro_batch_size
        module.numerical_guard.check_batch(batch)
        self.micro_batched = m is not None and m < n
        if self.micro_batched:
            # Lightning zeroes gradients between training_step and backward, so we zero here instead
            # (see zero_grad); `accumulate` back-propagates all chunks but the last, and Lightning the
            # returned one.
            if batch_idx % module.trainer.accumulate_grad_batches == 0:
                module.optimizers(use_pl_optimizer=False).zero_grad()
            if module.loss_module.decoupled:  # one no-grad pass for the whole minibatch, not one per chunk
                batch = module.add_proximal(batch)
        loss, total, stats = accumulate(module, batch, module.loss_and_stats,
                                        lambda chunk_loss: parallel.backward_chunk(module, chunk_loss),
                                        backward_last=False)
        self.losses = None if total.dim() == 0 else total  # a seed group's [S]: the guard's, per seed
        module.record_step(stats)
        return loss.sum()

    def optimizer_step(self, module, optimizer, closure) -> None:
        guard = module.numerical_guard

        def guarded():  # Lightning's closure (forward + backward), then the guard; Lightning clips after it
            loss = closure()
            guard.after_backward(module, optimizer, loss if self.losses is None else self.losses)
            return loss

        optimizer.step(closure=guarded)
        guard.check_parameters(module, optimizer)

    def zero_grad(self, optimizer) -> None:
        if not self.micro_batched:  # else training_step has zeroed them before the first chunk
            optimizer.zero_grad()

    @staticmethod
    def on_train_start(module) -> None:
        pass

    @staticmethod
    def on_iteration_end(module) -> None:
        pass  # Lightning steps the lr scheduler after the iteration (automatic optimization)


class PPGUpdate:
    """PPG's optimizers and its manual step (`ppo_lightning.algos.ppg`): one policy(-phase) optimizer,
    a value optimizer when E_V != E_pi, the auxiliary Adam; every one over all parameters, as in the
    reference code. The phase of a step is its minibatch's (`ppo_lightning.algos.ppg.PhaseBatch`)."""

    automatic_optimization = False  # manual optimization: a step picks one of PPG's optimizers

    def __init__(self) -> None:
        self.optimizer_index: dict[str, int] = {}
        self.changed_policy = True  # the last step changed the policy (the EWMA moves after it)

    @staticmethod
    def _fusable(params: list) -> bool | None:
        return all(type(p) is torch.nn.Parameter and p.device.type in ("cpu", "cuda") for p in params) or None

    @classmethod
    def _adam(cls, params: list, lr: float, betas, eps: float) -> torch.optim.Adam:
        return torch.optim.Adam(params, lr=lr, eps=eps, betas=tuple(betas), fused=cls._fusable(params))

    @staticmethod
    def optimizer_names(module) -> list[str]:
        """``["policy", "aux"]``, or ``["policy", "value", "aux"]`` when E_V != E_pi (reference ``opt_keys``)."""
        e_v = module.ppg_phases.cfg["epochs_value"]
        dm = module.trainer.datamodule if module._trainer is not None else None
        separate = e_v is not None and dm is not None and e_v != dm.update_epochs
        return ["policy", "value", "aux"] if separate else ["policy", "aux"]

    def configure_optimizers(self, module) -> list[torch.optim.Optimizer]:
        h, cfg = module.hparams, module.ppg_phases.cfg
        wrapped = module.trainer.model if module._trainer is not None else None
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
                opts.append(self._adam(params, cfg["aux_lr"], cfg["aux_betas"], h.adam_eps))
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
        opt.zero_grad()
        backward = lambda chunk_loss: module.manual_backward(chunk_loss.sum())  # noqa: E731
        if phase == "aux":
            device = next(module.network.parameters()).device
            phases.start_aux_step(module.network, device)
            data = phases.gather(data, device)
            module.numerical_guard.check_batch(data)
            _, loss, stats = accumulate(module, data, lambda c: phases.aux_loss_and_stats(module.network, module.loss_module, c),
                                        backward)
            phases.record_aux_stats(stats)
        else:
            module.numerical_guard.check_batch(data)
            if module.loss_module.decoupled and phase == "value":  # the value loss ignores the anchor: no EWMA forward
                data.set("proximal", data.select(*module.param_keys))
            elif module.loss_module.decoupled:  # one proximal pass per minibatch, not per chunk
                data = module.add_proximal(data)
            terms = PHASE_TERMS[phase]
            _, loss, stats = accumulate(module, data, lambda c: module.loss_and_stats(c, terms), backward)
            module.record_step(stats)
        guarded_step(module, opt, loss, phases.cfg["max_grad_norm"])
        phases.last_step_phase = phase
        self.changed_policy = phase in ("joint", "policy")
        if batch.last:  # the auxiliary phase's last step
            phases.finish_aux_phase()
            if module.proximal_source is not None:
                module.proximal_source.reset(module.network)
        return {"loss": loss.sum(), "ppg_phase": phase}

    @staticmethod
    def on_iteration_end(module) -> None:
        """Manual optimization: Lightning leaves the schedulers to us; each steps once per iteration, as
        PPO's do (their state is in the checkpoint, Lightning's ``lr_schedulers``)."""
        for config in module.trainer.lr_scheduler_configs:
            config.scheduler.step()

    @staticmethod
    def on_train_start(module) -> None:
        """A resume in the middle of a policy phase starts a new one: the EWMA restarts from the weights."""
        if module.ppg_phases.take_restart() and module.proximal_source is not None:
            module.proximal_source.reset(module.network)


def make_updater(ppg: dict | None) -> PPOUpdate | PPGUpdate:
    """The update of a minibatch for ``model.ppg`` (None: PPO)."""
    return PPOUpdate() if ppg is None else PPGUpdate()
