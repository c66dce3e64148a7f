"""Faults during training: numerical (non-finite losses, gradients, parameters) and environmental
(an env that raises, hangs or returns malformed data), each surfacing as one clear line.

Numerical faults (`NumericalGuard`). Before every optimizer step the guard checks the loss and the
gradients (one fused kernel and one sync). If either is non-finite, the step is *skipped* (and the
step's minibatches are scanned to name the non-finite input, if one is): the gradients are dropped (``p.grad = None``, so Adam/SGD leave the parameters *and* their moments
untouched), the step is counted (``train/skipped_steps``) and training goes on. After
``max_bad_steps`` consecutive skipped steps training stops with a `NumericalFault` naming the first
bad quantity of the streak. After a step that was taken, parameters that became non-finite (an
exploding learning rate) stop training at once, before the EWMA proximal policy or a checkpoint
can absorb them. Under data parallelism the skip decision is all-reduced, so every rank skips the
same steps. The data side keeps the normalizers finite: `normalize_rewards_finite` and
`update_moments_finite` feed them only finite values and leave the non-finite ones in the batch, where
the guard sees them.

Environment faults (`GuardedEnv`, one per gymnasium sub-env). An exception from ``step``/``reset``, a
call that does not return within ``timeout_s`` (SIGALRM, main thread only), an observation of the
wrong shape or with non-finite values, or a non-scalar reward becomes an `EnvFault` naming the env id,
the env index and (filled in by the data side) the PPO iteration. Training stops; checkpoints already
written are kept (nothing is saved on an exception).
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import numpy as np
import torch
from torch import Tensor

# the errors live in core.errors (no torch: commands name them before the training stack loads)
from ppo_lightning.core.errors import (  # noqa: F401  (re-exported: the faults' public names)
    CheckpointError,
    EnvFault,
    NumericalFault,
    StorageFull,
    TrainingFault,
    UnwritablePath,
    human_bytes,
)
from ppo_lightning.adapters import torch as torch_ops
from ppo_lightning.core.members import PerMember

# ---------------------------------------------------------------------------- numerical faults


_PLAIN_TENSORS = (Tensor, torch.nn.Parameter)


def _local(tensors) -> list[Tensor]:
    """This rank's shards (FSDP2 DTensors) or the tensors themselves, without empty ones."""
    out = [t if type(t) in _PLAIN_TENSORS else t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    return [t for t in out if t.numel() > 0]


def _all_finite(tensors) -> bool:
    """True if every value of every tensor is finite: per (device, dtype) group one fused check, the
    one `torch.amp.GradScaler` runs on every step (multiplying by 1 in place leaves values unchanged);
    cost in docs/benchmarks/index.md, "Fault guards"."""
    tensors = _local(tensors)
    first = tensors[0] if tensors else None
    if first is not None and all(t.dtype == first.dtype and t.device == first.device for t in tensors):
        groups = {(first.device, first.dtype): tensors}  # the usual case, without a dict per tensor
    else:
        groups: dict[tuple, list[Tensor]] = {}
        for t in tensors:
            groups.setdefault((t.device, t.dtype), []).append(t)
    flags = []
    with torch.no_grad():
        for (device, dtype), group in groups.items():
            if not dtype.is_floating_point:
                continue
            found, one = _scratch(device)
            found.zero_()
            torch_ops.non_finite_check_(group, found, one)
            flags.append(found)
    if not flags:
        return True
    return (flags[0] if len(flags) == 1 else torch.stack(flags).sum()).item() == 0


_SCRATCH: dict[torch.device, tuple[Tensor, Tensor]] = {}


def _scratch(device: torch.device) -> tuple[Tensor, Tensor]:
    if device not in _SCRATCH:
        _SCRATCH[device] = (torch.zeros(1, device=device), torch.ones(1, device=device))
    return _SCRATCH[device]


def first_nonfinite_key(batch, keys=None) -> str | None:
    """The first floating-point entry of a TensorDict batch with a non-finite value, or None."""
    for key in keys if keys is not None else batch.keys(include_nested=True, leaves_only=True):
        value = batch.get(key)
        if isinstance(value, Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return key if isinstance(key, str) else "/".join(key)
    return None


class TrainingLoop:
    """What `NumericalGuard` asks of the loop that trains it: how many data-parallel ranks step, whether
    a flag is set on any of them, and where training is (for its lines). This one is a single process
    whose place is unknown; the training layer gives the guard one that reads its Trainer
    (`ppo_lightning.training.update.TrainerLoop`)."""

    world_size = 1

    def any_rank(self, flag: bool) -> bool:
        """True if ``flag`` is True on any rank (every rank calls this together)."""
        return flag

    def iteration(self) -> Any:
        """The PPO iteration under way ("?" where unknown)."""
        return "?"

    def steps_taken(self) -> Any:
        """The optimizer steps taken so far ("?" where unknown)."""
        return "?"


class NumericalGuard:
    """Skips a member's optimizer step when its loss or gradient is non-finite; stops training when
    every member is lost.

    A run has S members (``members``: one for a single run; a group's parameters and gradients carry a
    leading member dimension ``[S, ...]``). The update (`ppo_lightning.training.update`) calls
    `check_batch` with each minibatch, `after_backward` with the step's loss (``[S]``) once the
    gradients are in (before clipping and the step), and `check_parameters` after the step.

    - Every member's step bad (a single run's bad step): the step is skipped, its gradients dropped
      (Adam and SGD then leave the parameters and their moments as they are).
    - Some members' steps bad (a group): their gradients are zeroed and, after the step, their
      slices of the parameters and of Adam's moments restored; the other members step.
    - Training stops (`NumericalFault`) when every member has had ``max_bad_steps`` bad steps in a
      row, with the first bad quantity of member 0's streak; or when the parameters of every member
      are non-finite after a step (the learning rate is probably too large). A group's member whose
      parameters went non-finite has bad steps from then on.
    - Under data parallelism every rank skips the same steps.

    ``loop`` (a `TrainingLoop`) says how many ranks step and where training is; the training layer sets it.
    """

    def __init__(self, max_bad_steps: int | None = 100, members: int = 1) -> None:
        self.max_bad_steps, self.members = max_bad_steps, members
        self.loop = TrainingLoop()
        self.skipped = [0] * members  # bad steps over the whole run (restored from checkpoints)
        self.consecutive = [0] * members
        self.first_bad: list[str | None] = [None] * members  # first bad quantity of the current streak
        self._batches: list = []  # this optimizer step's minibatches, set by check_batch
        self._restore: list = []  # a group's bad members' slices, put back after the step
        self._bad: list[int] = []

    @property
    def skipped_steps(self) -> int:
        return sum(self.skipped)

    def reset_member(self, k: int) -> None:
        """Member k starts again (a refilled slot): no skipped or bad steps counted."""
        self.skipped[k], self.consecutive[k], self.first_bad[k] = 0, 0, None

    # -- inputs
    def check_batch(self, batch) -> None:
        """Remember this step's minibatch (all of them under gradient accumulation): scanned only
        when the loss or a gradient is non-finite, to name the input that made it so."""
        self._batches.append(batch)

    # -- the optimizer step
    @torch.no_grad()
    def after_backward(self, module, optimizer, loss: Tensor | None) -> bool:
        """Check each member's loss and gradient; returns False when the step is skipped (every member bad)."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        grads = [p.grad for p in params if p.grad is not None]
        bad = self._bad_members(loss, grads)
        what = None
        if self.loop.world_size > 1:  # every rank skips the same steps
            any_bad = self.loop.any_rank(bool(bad))
            if any_bad and not bad:
                bad, what = list(range(self.members)), "a non-finite quantity on another data-parallel rank"
        batches, self._batches, self._restore, self._bad = self._batches, [], [], bad
        for k in range(self.members):
            if k not in bad:
                self.consecutive[k], self.first_bad[k] = 0, None
        if not bad:
            return True
        where = f"iteration {self.loop.iteration()}, step {self._step()}"
        for k in bad:
            self.skipped[k] += 1
            self.consecutive[k] += 1
            if self.first_bad[k] is None:
                self.first_bad[k] = f"{what or self._describe(module, params, loss, batches, k)} ({where})"
        skip = len(bad) == self.members
        if skip:
            for p in params:
                p.grad = None  # Adam and SGD skip parameters without a gradient: no update, no moment change
        else:
            for p in params:
                state = optimizer.state.get(p, {})
                moments = {name: state[name][bad].clone() for name in ("exp_avg", "exp_avg_sq") if name in state}
                self._restore.append((p, p.detach()[bad].clone(), moments, bool(state)))
                if p.grad is not None:
                    p.grad[bad] = 0.0
        if self.max_bad_steps is not None and all(c >= self.max_bad_steps for c in self.consecutive):
            n = min(self.consecutive)
            who = "" if self.members == 1 else f" by every member (member 0's streak: {self.consecutive[0]})"
            raise NumericalFault(f"{n} consecutive optimizer steps skipped{who} (model.max_bad_steps={self.max_bad_steps});"
                                 f" the first bad quantity: {self.first_bad[0]}")
        return not skip

    def _bad_members(self, loss: Tensor | None, grads: list[Tensor]) -> list[int]:
        """The members whose loss or gradient is non-finite."""
        losses = [loss.detach()] if isinstance(loss, Tensor) else []
        if self.members == 1:  # no member dimension in the parameters: one exact check (DTensor shards too)
            return [] if _all_finite(losses + grads) else [0]
        S = self.members
        # One reduction per parameter: a member's gradient sum is finite iff its entries are (short of
        # an overflow of the sum itself, which then counts as bad too).
        sums = [g.reshape(S, -1).sum(1) for g in grads] + [x.float().expand(S) for x in losses]
        ok = torch.isfinite(torch.stack(sums).sum(0))
        return (~ok).nonzero().flatten().tolist()

    def _member(self, t: Tensor, k: int) -> Tensor:
        return t if self.members == 1 else t[k]

    def _describe(self, module, params, loss, batches, k: int) -> str:
        """Member k's first non-finite quantity: a minibatch input, its loss, or a parameter's gradient."""
        of = "" if self.members == 1 else f" of member {k}"
        for batch in batches:
            key = first_nonfinite_key(batch[k] if batch.batch_dims > 1 else batch)
            if key is not None:
                return f"non-finite minibatch input {key!r}{of}"
        if isinstance(loss, Tensor):
            value = loss.detach().float().expand(self.members)[k] if loss.dim() else loss.detach()
            if not bool(torch.isfinite(value)):
                return f"non-finite loss ({float(value):g}){of}"
        names = {id(p): n for n, p in module.named_parameters()}
        for p in params:
            if p.grad is not None and not _all_finite([self._member(p.grad, k)]):
                return f"non-finite gradient of {names.get(id(p), 'a parameter')!r}{of}"
        return f"a non-finite quantity{of}"

    @torch.no_grad()
    def check_parameters(self, module, optimizer) -> None:
        """After a step: put back the bad members' slices; non-finite parameters of every member stop
        training now (before EWMA or checkpoint see them)."""
        if self._restore:
            bad = self._bad
            for p, saved, moments, had_state in self._restore:
                p.detach()[bad] = saved
                state = optimizer.state.get(p, {})
                for name in ("exp_avg", "exp_avg_sq"):
                    if name in state:
                        state[name][bad] = moments[name] if had_state else 0.0
            self._restore = []
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not params:
            return
        ok = _all_finite([p.detach() for p in params])
        if self.loop.world_size > 1 and hasattr(params[0], "to_local"):  # shards differ
            ok = not self.loop.any_rank(not ok)
        if ok:
            return
        if self.members > 1:
            S = self.members
            finite = torch.isfinite(torch.stack([p.detach().reshape(S, -1).sum(1) for p in params]).sum(0))
            if bool(finite.any()):
                return  # a group goes on: the lost members' next steps are bad (their losses non-finite)
        names = {id(p): n for n, p in module.named_parameters()}
        name = next((names.get(id(p), "a parameter") for p in params if not _all_finite([p.detach()])), "(another rank's)")
        lr = optimizer.param_groups[0].get("lr")
        raise NumericalFault(
            f"parameter {name!r} became non-finite after the optimizer step (iteration {self.loop.iteration()}, "
            f"step {self._step(taken=True)}, lr {lr:g}): the learning rate is probably too large; "
            f"the last checkpoint is unaffected"
        )

    def _step(self, taken: bool = False) -> Any:
        """The step's index (0 the first); ``taken``: after the optimizer step, which the loop's count
        already holds."""
        steps = self.loop.steps_taken()
        return steps - 1 if taken and isinstance(steps, int) else steps

    def metrics(self) -> dict[str, Any]:
        return {"train/skipped_steps": PerMember(float(n) for n in self.skipped)}

    def state_dict(self) -> dict[str, Any]:
        return {"skipped": list(self.skipped), "consecutive": list(self.consecutive), "first_bad": list(self.first_bad)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "skipped_steps" in state:  # a single run's checkpoint before the guard was per member
            state = {"skipped": [state["skipped_steps"]], "consecutive": [state["consecutive"]],
                     "first_bad": [state.get("first_bad")]}
        if "skipped" not in state:
            return
        self.skipped, self.consecutive = [int(n) for n in state["skipped"]], [int(n) for n in state["consecutive"]]
        self.first_bad = list(state["first_bad"])


def finite_mean(values: Tensor) -> float:
    """Mean over the finite entries (nan if there are none): per-iteration figures that skip bad steps."""
    ok = torch.isfinite(values)
    return float(values[ok].mean()) if bool(ok.any()) else float("nan")


@torch.no_grad()
def normalize_rewards_finite(normalizer, reward: Tensor, done: Tensor) -> Tensor:
    """``normalizer(reward, done)`` that never lets a non-finite reward into its running statistics:
    those rewards count as 0 for the running return and the variance, and stay non-finite in the output
    (the minibatches holding them are then skipped by `NumericalGuard`)."""
    ok = torch.isfinite(reward)
    if bool(ok.all()):
        return normalizer(reward, done)
    out = normalizer(torch.where(ok, reward, torch.zeros_like(reward)), done)
    return torch.where(ok, out, reward)


def update_moments_finite(moments, advantage: Tensor) -> None:
    """Advantage moments from the finite advantages only (no change if there are none)."""
    ok = torch.isfinite(advantage)
    # Always one call (it may be a collective over data-parallel ranks), possibly with no sample.
    moments.update(advantage if bool(ok.all()) else advantage[ok])


# ---------------------------------------------------------------------------- environment faults

DEFAULT_ENV_TIMEOUT_S = 60.0


class _EnvTimeout(BaseException):
    """Raised by the SIGALRM handler inside a hanging env call (a BaseException, so that an env's own
    ``except Exception`` does not swallow it); `GuardedEnv` turns it into an `EnvFault`."""


_ALARM = {"armed": False, "previous": None}
_MAIN_THREAD = threading.main_thread().ident


def _on_alarm(signum, frame):
    if _ALARM["armed"]:
        _ALARM["armed"] = False
        raise _EnvTimeout()
    previous = _ALARM["previous"]
    if callable(previous):  # someone else's alarm
        previous(signum, frame)


def _install_alarm_handler() -> bool:
    """Our SIGALRM handler (main thread only); other alarms go to the previous one. Checked on every
    call: Lightning restores the process's original handlers at the end of each fit."""
    if signal.getsignal(signal.SIGALRM) is not _on_alarm:
        if threading.get_ident() != _MAIN_THREAD:
            return False
        _ALARM["previous"] = signal.signal(signal.SIGALRM, _on_alarm)
    return True


def make_guarded_env_class():
    """`GuardedEnv` subclasses gymnasium's Wrapper; built lazily so that this module imports without gymnasium."""
    import gymnasium as gym

    class GuardedEnv(gym.Wrapper):
        """One sub-env of a vector env, with its faults named (see the module docstring)."""

        def __init__(self, env, env_id: str, index: int, timeout_s: float | None = DEFAULT_ENV_TIMEOUT_S) -> None:
            super().__init__(env)
            self.env_id, self.index, self.timeout_s = env_id, index, timeout_s
            self._obs_shape = tuple(env.observation_space.shape) if env.observation_space.shape is not None else None
            self._float_obs = env.observation_space.dtype is not None and np.issubdtype(env.observation_space.dtype, np.floating)

        def _call(self, what: str, fn, *args, **kwargs):
            # The timer: one setitimer pair per call (about 1 us); only in the main thread, where
            # Python delivers signals.
            timer = self.timeout_s and threading.get_ident() == _MAIN_THREAD and _install_alarm_handler()
            if timer:
                _ALARM["armed"] = True
                signal.setitimer(signal.ITIMER_REAL, self.timeout_s)
            try:
                return fn(*args, **kwargs)
            except _EnvTimeout:
                raise EnvFault(self.env_id, self.index, f"did not return from {what}() within {self.timeout_s:g} s "
                                                        f"(data.env_timeout_s)") from None
            except EnvFault:
                raise
            except Exception as err:
                raise EnvFault(self.env_id, self.index, f"raised {type(err).__name__} in {what}(): {err}") from err
            finally:
                if timer:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    _ALARM["armed"] = False

        def _check_obs(self, obs, what: str) -> None:
            if self._obs_shape is not None and np.shape(obs) != self._obs_shape:
                raise EnvFault(self.env_id, self.index,
                               f"returned an observation of shape {tuple(np.shape(obs))} from {what}(), expected {self._obs_shape}")
            if self._float_obs and not np.isfinite(obs).all():
                raise EnvFault(self.env_id, self.index, f"returned a non-finite observation from {what}()")

        def step(self, action):
            out = self._call("step", self.env.step, action)
            if not isinstance(out, tuple) or len(out) != 5:
                raise EnvFault(self.env_id, self.index, f"step() returned {type(out).__name__} of length "
                                                        f"{len(out) if hasattr(out, '__len__') else '?'}, expected 5 values")
            self._check_obs(out[0], "step")
            if np.ndim(out[1]) != 0:
                raise EnvFault(self.env_id, self.index, f"returned a reward of shape {np.shape(out[1])}, expected a scalar")
            return out

        def reset(self, **kwargs):
            out = self._call("reset", self.env.reset, **kwargs)
            self._check_obs(out[0], "reset")
            return out

    return GuardedEnv
