"""Data-parallel semantics: R ranks x N envs mean the same as 1 rank x R*N envs.

Every rank collects its own rollout and computes its own gradient; the strategy averages the
gradients. Statistics that shape the update must be global too, or the ranks train on differently
scaled data:

- advantage-normalization moments and reward-normalization statistics (count, mean, variance) are
  combined over ranks (`all_reduce_moments`: exact pooled moments, weighted by sample count);
- the adaptive KL coefficient is decided from the KL averaged over ranks (`mean_over_ranks`), so
  beta stays identical on every rank;
- episode statistics are pooled before logging (`pool_episode_metrics`), so every rank logs and
  monitors (EarlyStopping) the same figure and they stop together;
- micro-batched steps under DDP (`backward_chunk`): DDP all-reduces the accumulated gradients on
  every backward pass. That is exact (the part already averaged is the same on every rank, so
  averaging it again changes nothing: checked with the strategy's backward for every chunk as a
  negative control, ranks stayed identical), but costs one all-reduce of all gradients per chunk. The
  chunks before the last are therefore differentiated with ``torch.autograd.grad`` (which bypasses
  DDP's hooks) and added into ``.grad``; the last chunk's ordinary backward all-reduces the total: one
  all-reduce per optimizer step. FSDP2 keeps the strategy's backward (a reduce-scatter per chunk,
  also exact).

The same holds for the minibatches a step accumulates (``trainer.accumulate_grad_batches``): all but
the step's last go through ``backward_chunk``, each divided by their number.
"""

from __future__ import annotations

import math

import torch

from ppo_lightning.adapters.lightning import attached_trainer
from ppo_lightning.envs import PROCGEN_PREFIX
from ppo_lightning.envs.procgen_scores import normalized_return
from ppo_lightning.core.errors import TrainingFault


def _dist_world() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1


def _device() -> torch.device:
    backend = torch.distributed.get_backend()
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_moments(n: float, mean: float, var: float) -> tuple[float, float, float]:
    """Pooled (count, mean, population variance) of samples spread over the ranks."""
    if _dist_world() == 1:
        return n, mean, var
    t = torch.tensor([n, n * mean, n * (var + mean * mean)], dtype=torch.float64, device=_device())
    torch.distributed.all_reduce(t)
    total, s, q = t.tolist()
    if total <= 0:
        return 0.0, 0.0, 0.0
    m = s / total
    return total, m, max(q / total - m * m, 0.0)


def mean_over_ranks(module, value: float) -> float:
    """Mean of a per-rank figure over the ranks whose value is finite (nan if none)."""
    trainer = attached_trainer(module)
    if trainer is None or trainer.world_size == 1 or _dist_world() == 1:
        return value
    ok = math.isfinite(value)
    t = torch.tensor([value if ok else 0.0, 1.0 if ok else 0.0], dtype=torch.float64, device=_device())
    torch.distributed.all_reduce(t)
    return t[0].item() / t[1].item() if t[1].item() > 0 else float("nan")


def pool_episode_metrics(module, dm, metrics: dict[str, float], last: int = 20) -> None:
    """Replace the per-rank episode figures by those of the episodes of all ranks (the last ``last``
    episodes of each rank; counts summed). No-op on one process."""
    trainer = attached_trainer(module)
    if trainer is None or trainer.world_size == 1 or _dist_world() == 1:
        return
    episodes = dm.states[0].episodes  # data parallelism runs single runs only
    returns, lengths = list(episodes.returns)[-last:], list(episodes.lengths)[-last:]
    t = torch.tensor([sum(returns), sum(lengths), len(returns), episodes.count], dtype=torch.float64,
                     device=_device())
    torch.distributed.all_reduce(t)
    ret_sum, len_sum, k, count = t.tolist()
    metrics["episodes"] = count
    for key, value in (("episode/return_mean20", ret_sum / k if k else math.nan),
                       ("episode/length_mean20", len_sum / k if k else math.nan)):
        if math.isfinite(value):
            metrics[key] = value
        else:
            metrics.pop(key, None)
    if "episode/normalized_return_mean20" in metrics and "episode/return_mean20" in metrics:
        game, mode = dm.env_id[len(PROCGEN_PREFIX):], dm.env_kwargs.get("distribution_mode", "hard")
        metrics["episode/normalized_return_mean20"] = normalized_return(game, mode, metrics["episode/return_mean20"])


def _is_ddp(strategy) -> bool:
    from lightning.pytorch.strategies import DDPStrategy

    return isinstance(strategy, DDPStrategy) and strategy.world_size > 1


def backward_chunk(module, loss: torch.Tensor, accumulate: int = 1) -> None:
    """Back-propagate a micro-batch chunk (or minibatch) that is not the step's last (see the module
    docstring), divided by the ``accumulate`` minibatches a step adds up (`ppo_lightning.training.update.Update`)."""
    trainer = module.trainer
    loss = loss / accumulate
    strategy = trainer.strategy
    if not _is_ddp(strategy):
        strategy.backward(loss, None)
        return
    precision = strategy.precision_plugin
    scaled = precision.pre_backward(loss, module)
    params = [p for p in module.parameters() if p.requires_grad]
    grads = torch.autograd.grad(scaled, params, allow_unused=True)
    with torch.no_grad():
        for p, g in zip(params, grads):
            if g is None:
                continue
            if p.grad is None:
                p.grad = g.detach().clone()
            else:
                p.grad.add_(g)
    precision.post_backward(scaled, module)


def raise_together(fault: BaseException | None, rank: int, world_size: int) -> None:
    """Every rank calls this at the same point (after each collection); if any rank has a ``fault``
    (a `ppo_lightning.core.faults.TrainingFault`), every rank raises the lowest faulty rank's, naming
    that rank: all ranks then stop with the same one-line error and exit code, none is left waiting in
    a collective for a rank that is gone. One small all-reduce when no rank faulted."""
    if world_size == 1 or _dist_world() == 1:
        if fault is not None:
            raise fault
        return

    flag = torch.tensor([0.0 if fault is None else 1.0], dtype=torch.float64, device=_device())
    torch.distributed.all_reduce(flag)
    if flag.item() == 0:
        return
    mine = None if fault is None else (str(fault), getattr(fault, "exit_code", TrainingFault.exit_code))
    reports: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(reports, mine)
    first = next(r for r, rep in enumerate(reports) if rep is not None)
    message, code = reports[first]
    err = TrainingFault(f"{message} (data-parallel rank {first} of {world_size})")
    err.exit_code = code
    err.all_ranks = True
    raise err from (fault if rank == first else None)
