"""The update of one minibatch: accumulate (micro-batches) -> guard -> clip -> step.

`accumulate` is the one gradient accumulation over ``model.micro_batch_size`` chunks, for PPO and
PPG alike: each chunk's loss is a mean, weighted by the chunk's share of the minibatch, so the
accumulated gradient is the minibatch's (up to float summation order); its diagnostics combine by
`combine_chunk_stats`. PPO steps under Lightning's automatic optimization (the module's
``optimizer_step`` guards, ``configure_gradient_clipping`` clips); PPG, with up to three optimizers,
steps in `PPGUpdate` (manual optimization) through the same guard and clipping rules. PPG's phases,
buffer and auxiliary loss are `ppo_lightning.algos.ppg`'s; the optimizers and the step are here.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from tensordict import TensorDictBase

from ppo_lightning.algos.loss import MAX_ENTRIES
from ppo_lightning.algos.ppg import PHASE_TERMS, aux_loss_and_stats


def combine_chunk_stats(chunk_stats: list[tuple[float, torch.Tensor]], names: list[str] | None) -> torch.Tensor:
    """A minibatch's diagnostics from its chunks' ``(weight, stats)``: the size-weighted mean, and the
    maximum for the entries of `ppo_lightning.algos.loss.MAX_ENTRIES` (on device: no host sync)."""
    total = sum(w * st for w, st in chunk_stats)
    if len(chunk_stats) > 1:
        for name in MAX_ENTRIES:
            if names is not None and name in names:
                k = names.index(name)
                total[k] = torch.stack([st[k] for _, st in chunk_stats]).max()
    return total


def accumulate(module, batch: TensorDictBase, loss_and_stats: Callable, backward: Callable,
               names: Callable[[], list[str] | None] = lambda: None, backward_last: bool = True
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Back-propagate ``loss_and_stats(chunk)`` over the minibatch's chunks of ``model.micro_batch_size``
    samples (one chunk without it), each loss weighted by its share of the minibatch, with
    ``backward``; the last chunk's too unless ``backward_last`` is False (Lightning's automatic
    optimization back-propagates the returned loss). Returns (the last chunk's weighted loss, the
    minibatch's loss detached, the combined diagnostics; ``names()`` names their rows)."""
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
    return loss, total_loss, combine_chunk_stats(chunk_stats, names())


class PPGUpdate:
    """PPG's optimizers and its manual step (`ppo_lightning.algos.ppg`): one policy(-phase) optimizer,
    a value optimizer when E_V != E_pi, the auxiliary Adam; every one over all parameters, as in the
    reference code. The phase of a step is its minibatch's (`PPGPhases.phase_of`)."""

    def __init__(self) -> None:
        self.optimizer_index: dict[str, int] = {}

    @staticmethod
    def _adam(params: list, lr: float, betas, eps: float) -> torch.optim.Adam:
        fused = all(type(p) is torch.nn.Parameter and p.device.type in ("cpu", "cuda") for p in params) or None
        return torch.optim.Adam(params, lr=lr, eps=eps, betas=tuple(betas), fused=fused)

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
        opts = []
        for name in names:
            if name == "aux":
                opts.append(self._adam(params, cfg["aux_lr"], cfg["aux_betas"], h.adam_eps))
            elif h.optimizer == "sgd":
                opts.append(torch.optim.SGD(params, lr=h.lr))
            else:
                opts.append(self._adam(params, h.lr, h.adam_betas, h.adam_eps))
        return opts

    def training_step(self, module, batch, batch_idx: int) -> dict[str, Any]:
        """One gradient step of either phase. A vectorized seed group (``module.seed_group``) steps
        every seed at once: the loss is the sum of the seeds' losses (each seed's gradient is its own
        loss's), the guard and gradient clipping act per seed."""
        phases = module.ppg_phases
        group = module.seed_group
        phase = phases.phase_of(batch_idx)
        opt = module.optimizers()[self.optimizer_index[phase]]
        opt.zero_grad()
        guard = module.numerical_guard  # the same skip / stop rules as PPO's automatic optimization
        if phase == "aux":
            device = next(module.network.parameters()).device
            phases.start_aux_step(module.network, device)
            mb = phases.gather(batch, device)
            guard.check_batch(mb)
            if group is None:
                _, loss, stats = accumulate(module, mb, lambda c: aux_loss_and_stats(module, c), module.manual_backward)
            else:
                per_seed, stats = aux_loss_and_stats(module, mb)
                loss, guard.seed_losses = self._group_backward(module, per_seed)
            phases.record_aux_stats(stats)
        else:
            guard.check_batch(batch)
            if module.loss_module.decoupled and phase == "value":  # the value loss ignores the anchor: no EWMA forward
                batch.set("proximal", batch.select(*module.param_keys))
            elif module.loss_module.decoupled:  # one proximal pass per minibatch, not per chunk
                batch = module.add_proximal(batch)
            terms = PHASE_TERMS[phase]
            if group is None:
                _, loss, stats = accumulate(module, batch, lambda c: module._loss_and_stats(c, terms),
                                            module.manual_backward, lambda: module._stat_names)
            else:
                _, stats, per_seed = group.loss_and_stats(module, batch, terms, detach=False)
                module._stat_names = group.stat_names
                loss, guard.seed_losses = self._group_backward(module, per_seed)
            module._step_stats.append(stats)
        clip = phases.cfg["max_grad_norm"]
        if group is not None:  # per seed: a bad seed's step is undone after the update, the others proceed
            guard.after_backward(module, opt.optimizer)
            if clip is not None:
                group.clip_grad_norm_(module.network.parameters(), clip)
        elif guard.after_backward(module, opt.optimizer, loss):  # else the gradients are dropped: no update
            if clip is not None:
                module.clip_gradients(opt, gradient_clip_val=clip, gradient_clip_algorithm="norm")
        opt.step()
        guard.check_parameters(module, opt.optimizer)
        phases.last_step_phase = phase
        module._policy_step = phase in ("joint", "policy")
        if phase == "aux" and batch_idx == len(phases.plan) - 1:
            phases.finish_aux_phase()
            if module.proximal_source is not None:
                module.proximal_source.reset(module.network)
        return {"loss": loss, "ppg_phase": phase}

    @staticmethod
    def _group_backward(module, per_seed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Back-propagate the sum of a seed group's losses ``[S]``; returns it and the losses, detached."""
        loss = per_seed.sum()
        module.manual_backward(loss)
        return loss.detach(), per_seed.detach()
