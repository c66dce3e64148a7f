"""Artificial staleness (Hilton, Cobbe & Schulman 2021, section 5.1 / Fig. 1).

Every rollout waits ``k`` iterations in a queue before it is trained on, so the data of iteration
``t`` was collected by the policy of ``k`` iterations earlier. At training time the *recent* policy
is the network at the start of the iteration that trains on the data (its weights before that
iteration's first optimizer step). The reference code's three choices for the "old" policy:

``behavior``   the stale policy in both roles: standard PPO on stale data (the collected log-probs
               and distribution parameters are kept).
``proximal``   the recent policy in both roles: the collected log-probs and distribution parameters
               are replaced by the recent policy's (importance sampling is then wrong by the
               staleness; this is what naive asynchronous PPO that recomputes log-probs does).
``decoupled``  stale behavior log-probs for importance sampling, recent policy as the proximal one:
               its distribution parameters go under ``proximal``, which the decoupled loss reads
               (``model.decoupled: true``; `PPOLightningModule.add_proximal` leaves them untouched).

Choices made here (documented, tested):

* Start-up: the queue is *filled* in the first iteration by collecting ``k`` extra rollouts with the
  initial policy (``k + 1`` rollouts), and that iteration trains on the first of them. As in the
  reference code (openai/ppo-ewma ``ppo.py``: while the queue fills, the loop ``continue``s before
  counting interactions), the ``k`` start-up rollouts are *not* counted in ``data.frames``: a stale
  run of N frames makes as many iterations as a synchronous one. From then on each iteration
  collects one rollout and trains on the one collected ``k`` iterations earlier; the policy lag is
  ``min(t - 1, k)`` iterations at iteration ``t``.
* Values: as in the reference code, a delayed rollout keeps the state values predicted at
  collection time; only the bootstrap values (V of the rollout's final observation, and of the
  final observation of an episode cut by truncation) are computed by the *current* critic
  (`ppo_lightning.algos.advantages.next_values`, after `relabel`). (Rewards are normalized at collection
  time, in order; the reference normalizes at training time, in the same order.)
* The queue's contents are checkpointed with the data module (``StalenessQueue.state_dict``: up to
  ``k`` rollouts, so a Procgen checkpoint with k = 8 holds eight rollouts), so a resumed run trains
  on the same delayed rollouts as an uninterrupted one.
"""

from __future__ import annotations

import collections
from typing import Callable

import torch
from tensordict import TensorDict, TensorDictBase

from ppo_lightning.core.errors import CheckpointError
from ppo_lightning.nets.models import OBS_KEY, dist_param_keys, make_distribution

STALENESS_MODES = ("behavior", "proximal", "decoupled")
LOG_PROB_KEY = "action_log_prob"


def validate_staleness(staleness, mode: str, *, decoupled: bool | None = None,
                       proximal_com: float | None = None, recurrent: bool | None = None) -> None:
    """Fail before training, naming the field. Model fields are checked only when given (``recurrent``:
    whether the network has a recurrent core; a delayed rollout's states were the stale network's, and
    `relabel` recomputes no sequence, so staleness is refused there)."""
    if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
        raise ValueError(f"data.staleness must be an integer >= 0 (iterations of delay), got {staleness!r}")
    if mode not in STALENESS_MODES:
        raise ValueError(f"data.staleness_mode must be one of {STALENESS_MODES}, got {mode!r}")
    if staleness == 0:
        return
    if recurrent:
        raise ValueError(f"data.staleness={staleness} is not supported with a recurrent network "
                         f"(model.network.core): set data.staleness to 0")
    if mode == "decoupled" and decoupled is False:
        raise ValueError(
            "data.staleness_mode=decoupled needs model.decoupled=true (the loss must read the recent policy "
            "under 'proximal'); use staleness_mode=behavior or proximal for the standard objective"
        )
    if proximal_com is not None:
        raise ValueError(
            f"data.staleness={staleness} supplies the proximal policy with the data; model.proximal_com must be "
            f"null (got {proximal_com}), otherwise the EWMA proximal policy would be silently ignored or mixed in"
        )


@torch.no_grad()
def relabel(rollout: TensorDictBase, network: torch.nn.Module, mode: str, action_space: dict) -> TensorDictBase:
    """Prepare a delayed rollout for training by the current ``network`` (in place; returns it).

    Keeps the collection-time state values (the reference protocol: only bootstrap values are
    recomputed, by `next_values`); by ``mode``, keeps the behavior policy (``behavior``), replaces
    it by the recent policy (``proximal``), or adds the recent policy's distribution parameters
    under ``proximal`` (``decoupled``).
    """
    if mode not in STALENESS_MODES:
        raise ValueError(f"data.staleness_mode must be one of {STALENESS_MODES}, got {mode!r}")
    obs = rollout.get(OBS_KEY)
    if mode == "behavior":
        return rollout
    keys = dist_param_keys(action_space)
    params = tuple(network.policy(obs))
    if mode == "proximal":
        old_lp = rollout.get(LOG_PROB_KEY)
        log_prob = make_distribution(action_space, *params).log_prob(rollout.get("action"))
        for k, p in zip(keys, params):
            rollout.set(k, p.to(rollout.get(k).dtype))
        rollout.set(LOG_PROB_KEY, log_prob.to(old_lp.dtype).reshape(old_lp.shape))
    else:  # decoupled
        rollout.set("proximal", TensorDict(dict(zip(keys, params)), batch_size=rollout.batch_size))
    return rollout


class StalenessQueue:
    """Delays every rollout by ``staleness`` iterations (see the module docstring for start-up).

    `delay` takes the rollout just collected and the policy version that collected it (the number
    of iterations trained before), and returns the rollout to train on now. ``collect_more`` is
    called ``staleness`` times on the first call, to fill the queue. After each call,
    ``last_index`` is the 0-based collection index of the returned rollout and ``last_lag`` its
    policy lag in iterations.
    """

    def __init__(self, staleness: int, mode: str = "decoupled") -> None:
        validate_staleness(staleness, mode)
        self.staleness, self.mode = staleness, mode
        self.queue: collections.deque[tuple[int, int, TensorDictBase]] = collections.deque()
        self.collected = 0
        self.last_index: int | None = None
        self.last_lag: int | None = None

    def __len__(self) -> int:
        return len(self.queue)

    def state_dict(self) -> dict:
        """Plain tensors, lists and numbers (loads with ``torch.load(weights_only=True)``)."""
        return {
            "staleness": self.staleness,
            "mode": self.mode,
            "collected": self.collected,
            "queue": [{"index": i, "version": v, "batch_size": list(td.batch_size), "data": td.to_dict()}
                      for i, v, td in self.queue],
        }

    def load_state_dict(self, state: dict) -> None:
        if (state["staleness"], state["mode"]) != (self.staleness, self.mode):
            raise CheckpointError(
                f"checkpoint's staleness queue (data.staleness={state['staleness']}, staleness_mode="
                f"{state['mode']}) differs from the config's ({self.staleness}, {self.mode})"
            )
        self.collected = state["collected"]
        self.queue = collections.deque(
            (e["index"], e["version"], TensorDict(e["data"], batch_size=e["batch_size"])) for e in state["queue"]
        )

    def _push(self, rollout: TensorDictBase, version: int) -> None:
        self.queue.append((self.collected, version, rollout))
        self.collected += 1

    def delay(self, rollout: TensorDictBase, version: int,
              collect_more: Callable[[], TensorDictBase] | None = None) -> TensorDictBase:
        if not self.queue and self.staleness:
            # Start-up: the oldest rollout trains now, k more by the same (initial) policy follow.
            self._push(rollout, version)
            if collect_more is None:
                raise ValueError("StalenessQueue needs collect_more to fill the queue at start-up")
            for _ in range(self.staleness):
                self._push(collect_more(), version)
        else:
            self._push(rollout, version)
        index, collected_by, out = self.queue.popleft()
        self.last_index, self.last_lag = index, version - collected_by
        return out
