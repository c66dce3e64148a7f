"""Phasic Policy Gradient (Cobbe et al. 2021) and PPG-EWMA (Hilton et al. 2021), on the PPO loop.

Built as the reference code of the batch-size-invariance paper builds it (openai/ppo-ewma
``ppg.py`` / ``ppo.py``):

- **Policy phase**: ``n_pi`` iterations of the PPO family, unchanged (`ppo_lightning.algos.loss`): per
  iteration ``E_V`` value epochs then ``E_pi`` policy epochs, each of ``data.num_minibatches``
  minibatches. ``E_pi = data.update_epochs``, ``E_V = model.ppg.epochs_value`` (null: the same). When
  they are equal one Adam steps the joint loss (policy + value + entropy), as the reference does;
  otherwise a value Adam steps the value loss and a policy Adam the policy loss. Every rollout of the
  phase is kept (observations in their native dtype, uint8 for Procgen; value targets) on the CPU.
- **Auxiliary phase**, after every ``n_pi``-th iteration's policy epochs: the old policy's outputs
  are computed on all stored data without gradient, then ``n_aux_epochs`` epochs whose minibatches
  are ``aux_mbsize`` whole env trajectories drawn across all stored rollouts, on
  `ppo_lightning.algos.objectives.ppg_auxiliary_loss` with its own Adam (``aux_lr``, ``aux_betas``; its
  state persists across phases and is in the checkpoint). Then the buffer is freed and, with
  PPO-EWMA's proximal policy, the EWMA restarts from the current weights (``EwmaModel.reset``).
  The EWMA moves after every optimizer step that changes the policy, never after value-only or
  auxiliary steps.

The optimizers and the gradient step are `ppo_lightning.training.update.PPGUpdate`'s (the same
micro-batch accumulation, guard and clipping as PPO's). Lightning structure: one Lightning epoch is
one iteration, as for PPO; the auxiliary phase's
minibatches are extra training steps at the end of the ``n_pi``-th iteration's epoch. Every step
is one ``training_step`` (manual optimization: one step picks one of up to three optimizers);
the phase of a step travels with its minibatch (`PhaseBatch`); callbacks see it in
``outputs["ppg_phase"]`` and ``pl_module.ppg_phases.last_step_phase`` ("joint", "value", "policy" or
"aux"). The data side yields auxiliary minibatches as index tensors (which trajectories), gathered
from the buffer when the step runs: Lightning fetches one batch ahead, and the old policy's outputs
must be computed after the last policy step.

Checkpoints: a phase buffer of at most ``checkpoint_buffer_mib`` MiB per rank (default 256: CartPole,
MinAtar, small Procgen runs) is saved with each rank's data-module state, so a checkpoint taken in the
middle of a policy phase resumes exactly (bitwise, with `ppo_lightning.data.resume_state`). A larger one
(GiBs at the paper's Procgen configuration) is not saved: a checkpoint taken at the end of an
iteration that closed a phase (every ``n_pi`` iterations) still resumes exactly; one taken in the
middle of a policy phase resumes by starting a new phase: phase iteration 0, empty buffer, EWMA reset
to the current weights (a warning says so). ``checkpoint_every`` a multiple of ``n_pi`` avoids it.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from ppo_lightning.algos import objectives as F
from ppo_lightning.core.members import PerMember
from ppo_lightning.envs.space_layout import leaf_layout
from ppo_lightning.nets import recurrent
from ppo_lightning.nets.models import OBS_KEY, dist_param_keys
from ppo_lightning.nets.recurrent import IS_INIT_KEY, STATE_KEY

# The paper's / reference's defaults (openai/ppo-ewma train.py; Cobbe et al. 2021).
PPG_DEFAULTS: dict[str, Any] = {
    "n_pi": 32,  # policy-phase iterations per auxiliary phase (scaled by c under --scale)
    "epochs_value": None,  # E_V; None: data.update_epochs (= E_pi)
    "n_aux_epochs": 6,
    "aux_mbsize": 4,  # env trajectories per auxiliary minibatch
    "beta_clone": 1.0,
    "vf_true_weight": 1.0,
    "aux_lr": 5e-4,
    "aux_betas": (0.9, 0.999),
    "max_grad_norm": None,  # trainer.gradient_clip_val spelled PPG's way (training.update.one_clip_setting)
    "checkpoint_buffer_mib": 256,  # phase buffers up to this size (per rank) go into checkpoints
}
TARGET_KEY = "value_target"
OLD_PREFIX = "old_"
PHASES = ("joint", "value", "policy", "aux")
# Loss-module terms each policy-phase step minimizes (reference: losses "pi" and "vf").
PHASE_TERMS = {
    "joint": ("loss_objective", "loss_critic", "loss_entropy"),
    "policy": ("loss_objective", "loss_entropy"),
    "value": ("loss_critic",),
}
AUX_STATS = ("loss", "pol_distance", "vf_aux", "vf_true")


class PhaseBatch:
    """A PPG minibatch and its phase ("joint", "value", "policy" or "aux"; ``last``: the last step of
    an auxiliary phase), as the data side yields it. Attribute access falls through to the minibatch
    (callbacks read ``batch.shape``, ``batch.get``); ``to`` moves the minibatch."""

    __slots__ = ("phase", "data", "last")

    def __init__(self, phase: str, data, last: bool = False) -> None:
        self.phase, self.data, self.last = phase, data, last

    def __getattr__(self, name: str):
        return getattr(self.data, name)

    def to(self, *args, **kwargs) -> "PhaseBatch":
        return PhaseBatch(self.phase, self.data.to(*args, **kwargs), self.last)


def resolve_ppg_config(ppg: dict[str, Any] | None) -> dict[str, Any] | None:
    """``model.ppg`` with defaults filled in, as plain values (None: PPG off)."""
    if ppg is None:
        return None
    if not isinstance(ppg, dict):
        raise ValueError(f"model.ppg must be a mapping of PPG settings or null, got {ppg!r}")
    unknown = sorted(set(ppg) - set(PPG_DEFAULTS))
    if unknown:
        raise ValueError(f"model.ppg: unknown setting(s) {unknown}; known: {sorted(PPG_DEFAULTS)}")
    out = {**PPG_DEFAULTS, **ppg}
    out["aux_betas"] = [float(b) for b in out["aux_betas"]]
    return out


def validate_ppg_config(cfg: dict[str, Any] | None, hparams) -> None:
    """Fail before training, naming the field (None: PPO, nothing to check)."""
    if cfg is None:
        return
    for name in ("n_pi", "aux_mbsize"):
        v = cfg[name]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"model.ppg.{name} must be a positive integer, got {v!r}")
    for name in ("n_aux_epochs",):
        v = cfg[name]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"model.ppg.{name} must be an integer >= 0, got {v!r}")
    ev = cfg["epochs_value"]
    if ev is not None and (isinstance(ev, bool) or not isinstance(ev, int) or ev < 1):
        raise ValueError(f"model.ppg.epochs_value must be a positive integer or null (= data.update_epochs), got {ev!r}")
    for name in ("beta_clone", "vf_true_weight"):
        v = cfg[name]
        if not (isinstance(v, (int, float)) and v >= 0 and math.isfinite(v)):
            raise ValueError(f"model.ppg.{name} must be >= 0, got {v!r}")
    if not (isinstance(cfg["aux_lr"], (int, float)) and cfg["aux_lr"] > 0):
        raise ValueError(f"model.ppg.aux_lr must be > 0, got {cfg['aux_lr']!r}")
    betas = cfg["aux_betas"]
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"model.ppg.aux_betas must be two numbers in [0, 1), got {betas!r}")
    mib = cfg["checkpoint_buffer_mib"]
    if isinstance(mib, bool) or not (isinstance(mib, (int, float)) and mib >= 0):
        raise ValueError(f"model.ppg.checkpoint_buffer_mib must be a number >= 0, got {mib!r}")
    g = cfg["max_grad_norm"]
    if g is not None and not (isinstance(g, (int, float)) and g > 0):
        raise ValueError(f"model.ppg.max_grad_norm must be > 0 or null, got {g!r}")
    if (hparams.network or {}).get("aux_value_head") is False:
        raise ValueError("model.ppg needs the auxiliary value head: remove model.network.aux_value_head: false")


def ppg_network_config(network: dict[str, Any]) -> dict[str, Any]:
    """The network config PPG trains: ``arch`` (default "dual", or "shared" from ``shared_trunk``)
    and the auxiliary value head, written into the saved hyperparameters (the export rebuilds it)."""
    network = dict(network)
    if "arch" not in network:
        network["arch"] = "shared" if network.get("shared_trunk") else "dual"
    network.setdefault("aux_value_head", True)
    return network


# ---------------------------------------------------------------------- memory
def frame_bytes(observation_space: dict, action_space: dict, state_size: int = 0) -> int:
    """Bytes one stored frame takes in the phase buffer: observation (native dtype), value target,
    the old policy's distribution parameters (float32) and, for a recurrent network, the stored state
    (``state_size`` float32) and ``is_init`` (a bool)."""
    dtype = getattr(torch, observation_space.get("dtype", "float32"))
    obs = math.prod(observation_space["shape"]) * torch.empty((), dtype=dtype).element_size()
    if action_space["type"] == "composite":  # one parameter tensor (ppo_lightning.nets.composite)
        k = sum(p_size for *_, p_size in leaf_layout(action_space["space"]))
    else:
        k = action_space["n"] if action_space["type"] == "discrete" else 2 * math.prod(action_space["shape"])
    return int(obs + 4 + 4 * k + (4 * state_size + 1 if state_size else 0))


def phase_buffer_bytes(observation_space: dict, action_space: dict, num_envs: int, rollout_steps: int, n_pi: int,
                       state_size: int = 0) -> int:
    """Size of one auxiliary phase's buffer, per data-parallel rank."""
    return n_pi * num_envs * rollout_steps * frame_bytes(observation_space, action_space, state_size)


def available_memory_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_phase_buffer_memory(hparams, data, processes: int = 1, available: int | None = None,
                              fraction: float = 0.8, state_size: int = 0) -> int:
    """Raise (naming the fields to change) if the phase buffers of ``processes`` ranks on this host
    would not fit in ``fraction`` of the available memory (``state_size``: a recurrent network's D);
    returns the per-rank size in bytes."""
    cfg = resolve_ppg_config(hparams.get("ppg"))
    if cfg is None or cfg["n_aux_epochs"] == 0:
        return 0
    need = phase_buffer_bytes(data.observation_space, data.action_space, data.num_envs, data.rollout_steps, cfg["n_pi"],
                              state_size)
    need *= int(getattr(data, "members", 1))  # a vectorized seed group keeps every seed's
    available = available_memory_bytes() if available is None else available
    if available is not None and need * processes > fraction * available:
        gib = 2.0**30
        raise ValueError(
            f"PPG phase buffer: model.ppg.n_pi={cfg['n_pi']} x data.num_envs={data.num_envs} x "
            f"data.rollout_steps={data.rollout_steps} frames x {frame_bytes(data.observation_space, data.action_space, state_size)} "
            f"bytes = {need / gib:.1f} GiB per rank ({processes} on this host) exceeds {fraction:.0%} of the "
            f"{available / gib:.1f} GiB available: lower model.ppg.n_pi, data.num_envs or data.rollout_steps"
        )
    return need


def segment_length(data) -> int:
    """The segment length L of a recurrent run's data config (or data module): ``data.sequence_length``,
    or ``data.rollout_steps`` when it is null."""
    return int(getattr(data, "sequence_length", None) or data.rollout_steps)


# ---------------------------------------------------------------------- phases
class PPGPhases:
    """Phase bookkeeping and the phase buffer. Owned by the LightningModule (``ppg_phases``); the
    data side feeds it each rollout and asks it for the iteration's minibatches.

    ``state_size``: a recurrent network's D (`ppo_lightning.nets.recurrent`; 0: feed-forward). The
    buffer then keeps each step's stored state and ``is_init`` too, and the old policy's outputs and
    the auxiliary minibatches are computed over segments of ``data.sequence_length`` steps (null: the
    rollout length), each unrolled from the state stored at its first step, as the policy phase's
    minibatches are: at the phase's first auxiliary step the current policy's outputs equal the old
    ones exactly."""

    def __init__(self, cfg: dict[str, Any], action_space: dict, state_size: int = 0) -> None:
        self.cfg = cfg
        self.param_keys = dist_param_keys(action_space)
        self.state_size = int(state_size)
        self.recurrent = self.state_size > 0
        # what the phase buffer keeps of each rollout
        self.stored_keys = (OBS_KEY, TARGET_KEY) + ((STATE_KEY, IS_INIT_KEY) if self.recurrent else ())
        self.sequence_length: int | None = None  # L of a recurrent run, from the data config (`iteration_batches`)
        self.phase_iteration = 0  # policy-phase iterations done in the current phase
        self.phase = 0  # auxiliary phases completed
        self.buffer: list[TensorDictBase] = []  # rollouts [envs, time]: observation, value_target (CPU)
        self.aux_ran = False  # this iteration ran an auxiliary phase
        self.last_step_phase: str | None = None
        self._old_ready = False
        self.aux_stats: list[dict[str, torch.Tensor]] = []  # this iteration's auxiliary steps', by name
        self._aux_t0: float | None = None
        self._aux_seconds = 0.0
        self.restart_pending = False  # resumed mid-phase: reset the EWMA at train start
        self.buffer_in_checkpoint = False  # set by `attach`: the buffer goes into checkpoints
        self.members = 1  # S, the members (`attach`): a single run is a group of one
        self._stacked: dict[str, torch.Tensor] | None = None  # a group's buffer stacked for gathering

    # -------------------------------------------------------------- data side
    @property
    def at_phase_start(self) -> bool:
        """The next iteration starts a policy phase (no rollout stored yet): where a group may refill a
        member (the module's ``refill_member``), whose phases then are its single run's."""
        return self.phase_iteration == 0 and not self.buffer

    @property
    def stores_rollouts(self) -> bool:
        return self.cfg["n_aux_epochs"] > 0

    def epochs(self, data) -> tuple[int, int]:
        e_pi = data.update_epochs
        return e_pi, self.cfg["epochs_value"] or e_pi

    def max_batches_per_iteration(self, data) -> int:
        """Training steps of the longest iteration (the one that ends with an auxiliary phase)."""
        e_pi, e_v = self.epochs(data)
        policy = (e_pi if e_pi == e_v else e_pi + e_v) * data.num_minibatches
        aux = self.cfg["n_aux_epochs"] * math.ceil(self.cfg["n_pi"] * data.num_envs / self.cfg["aux_mbsize"])
        return policy + aux

    def iteration_batches(self, stored, generators: list[torch.Generator], epoch_minibatches, data):
        """The minibatches of one iteration: value / policy epochs, then (every ``n_pi``-th iteration)
        the auxiliary phase's trajectory indices. The rollout source passes its S members' (S = 1 for a
        single run): ``stored()``, the
        rollout to keep for the auxiliary phase (``[S, envs, time]``; S = 1 for a single run);
        ``generators``, the shuffle generators (one per member); ``epoch_minibatches(e)``, the
        minibatches of ``e`` shuffled epochs, the source's own loop. The auxiliary permutations are
        drawn first, then the epochs' shuffles, so a group's seed k sees the minibatches of seed k
        alone. Each minibatch is yielded as a `PhaseBatch`."""
        if self.recurrent:
            self.sequence_length = segment_length(data)
        self.phase_iteration += 1
        self.aux_ran = False
        if self.stores_rollouts:
            self.buffer.append(stored())
        e_pi, e_v = self.epochs(data)
        epochs = [("joint", e_pi)] if e_pi == e_v else [("value", e_v), ("policy", e_pi)]
        aux = self.stores_rollouts and self.phase_iteration >= self.cfg["n_pi"]
        aux_batches = self._aux_index_batches(generators) if aux else []
        if not aux and self.phase_iteration >= self.cfg["n_pi"]:  # n_aux_epochs 0: phases without aux
            self.phase_iteration, self.phase = 0, self.phase + 1
        for phase, e in epochs:
            yield from (PhaseBatch(phase, mb) for mb in epoch_minibatches(e))
        yield from (PhaseBatch("aux", idx, i == len(aux_batches) - 1) for i, idx in enumerate(aux_batches))

    def _aux_index_batches(self, generators: list[torch.Generator]) -> list[torch.Tensor]:
        """``n_aux_epochs`` epochs of ``[S, k, 2]`` (rollout, env) index tensors, member k's from
        ``generators[k]``: every stored env trajectory once per epoch, ``aux_mbsize`` per minibatch,
        mixing rollouts (reference ``make_minibatches``)."""
        envs = self.buffer[0].batch_size[-2]
        pairs = torch.cartesian_prod(torch.arange(len(self.buffer)), torch.arange(envs))
        out = []
        for _ in range(self.cfg["n_aux_epochs"]):
            perms = [torch.randperm(len(pairs), generator=g).split(self.cfg["aux_mbsize"]) for g in generators]
            for parts in zip(*perms):
                out.append(torch.stack([pairs[i] for i in parts]))
        return out

    # -------------------------------------------------------------- module side
    def segments(self, rollouts: TensorDictBase) -> TensorDictBase:
        """Stored trajectories ``[S, k, time]`` of a recurrent run as ``[S, k * time / L, L]`` segments
        of ``sequence_length`` steps (each trajectory's in order)."""
        S, k, T = rollouts.batch_size
        L = self.sequence_length or T
        return rollouts.reshape(S, k * (T // L), L)

    @torch.no_grad()
    def compute_old_outputs(self, network: torch.nn.Module, device: torch.device, chunk: int = 4096) -> None:
        """The old policy's distribution parameters on every stored frame (reference
        ``compute_presleep_outputs``), before the first auxiliary step; the stored rollouts are
        ``[S, envs, time]``, each chunk of frames ``[S, chunk]`` (a recurrent network's: chunks of whole
        segments, `segments`, each unrolled from its stored start state)."""
        was_training = network.training
        network.eval()
        if self.recurrent:
            for seg in self.buffer:
                segs = self.segments(seg)
                per_chunk = max(1, chunk // segs.batch_size[-1])
                outs = [recurrent.call(network, "policy", c.to(device)) for c in segs.split(per_chunk, dim=1)]
                for j, key in enumerate(self.param_keys):
                    p = torch.cat([o[j] for o in outs], dim=1).float().cpu()
                    seg.set(OLD_PREFIX + key, p.reshape(*seg.batch_size, *p.shape[3:]))
            network.train(was_training)
            self._old_ready = True
            return
        for seg in self.buffer:
            obs = seg.get(OBS_KEY)
            flat_obs = obs.reshape(obs.shape[0], -1, *obs.shape[3:])
            outs = [network.policy(c.to(device)) for c in flat_obs.split(chunk, dim=1)]
            for j, key in enumerate(self.param_keys):
                p = torch.cat([o[j] for o in outs], dim=1).float().cpu()
                seg.set(OLD_PREFIX + key, p.reshape(*obs.shape[:3], *p.shape[2:]))
        network.train(was_training)
        self._old_ready = True

    def gather(self, index: torch.Tensor, device: torch.device) -> TensorDictBase:
        """The auxiliary minibatch of trajectories ``index`` (``[S, k, 2]``: each member's (rollout, env)
        pairs), flattened to ``[S, k * time]`` (a recurrent run's: ``[S, k * time / L, L]`` segments, `segments`)."""
        keys = [*self.stored_keys, *(OLD_PREFIX + k for k in self.param_keys)]
        if self._stacked is None:  # [S, rollouts, envs, time, ...], once per auxiliary phase
            self._stacked = {key: torch.stack([seg.get(key) for seg in self.buffer], dim=1) for key in keys}
        seeds = torch.arange(index.shape[0]).unsqueeze(1)
        cols = {key: v[seeds, index[..., 0], index[..., 1]] for key, v in self._stacked.items()}
        td = TensorDict(cols, batch_size=[*index.shape[:2], self.buffer[0].batch_size[-1]])
        if self.recurrent:
            return self.segments(td).to(device)
        return td.reshape(index.shape[0], -1).to(device)

    def start_aux_step(self, network, device) -> None:
        if not self._old_ready:
            self._aux_t0 = time.perf_counter()
            self.compute_old_outputs(network, device)

    def take_restart(self) -> bool:
        """Whether a resume in the middle of a policy phase started a new phase (answered once: the
        module then restarts the EWMA proximal policy from the current weights)."""
        pending, self.restart_pending = self.restart_pending, False
        return pending

    def record_aux_stats(self, stats: dict[str, torch.Tensor]) -> None:
        self.aux_stats.append(stats)

    def finish_aux_phase(self) -> None:
        """Free the buffer; a new policy phase starts."""
        self.buffer.clear()
        self._stacked = None
        self._old_ready = False
        self.phase_iteration, self.phase = 0, self.phase + 1
        self.aux_ran = True
        if self._aux_t0 is not None:
            self._aux_seconds = time.perf_counter() - self._aux_t0

    def aux_loss_and_stats(self, network, loss_module, batch: TensorDictBase
                           ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """`ppg_auxiliary_loss` on an auxiliary (micro)batch ``[S, B]`` and its `AUX_STATS` by name:
        the losses ``[S]`` (each member's mean over its samples), each stat ``[S]``. A recurrent
        network's ``[S, B, L]`` segments run from their stored start states, then flatten to ``[S, B * L]``."""
        cfg = self.cfg
        if self.recurrent:
            *params, value, aux_value = recurrent.call(network, "forward_aux", batch)
            d = batch.batch_dims
            batch = batch.flatten(d - 2, d - 1)
            *params, value, aux_value = (t.flatten(d - 2, d - 1) for t in (*params, value, aux_value))
        else:
            *params, value, aux_value = network.forward_aux(batch.get(OBS_KEY))
        old = [batch.get(OLD_PREFIX + k) for k in self.param_keys]
        kl = loss_module.kl(old, params)
        target = batch.get(TARGET_KEY).reshape(kl.shape)
        out = F.ppg_auxiliary_loss(kl, aux_value.reshape(kl.shape), value.reshape(kl.shape), target,
                                   cfg["beta_clone"], cfg["vf_true_weight"], dim=-1)
        return out["loss"], {k: out[k].detach().float() for k in AUX_STATS}

    def iteration_metrics(self) -> dict[str, float]:
        """``ppg/phase`` (auxiliary phases completed), ``ppg/phase_iteration`` (policy iterations of
        the current phase; 0 right after an auxiliary phase), auxiliary-loss means when one ran."""
        out = {
            "ppg/phase": float(self.phase),
            "ppg/phase_iteration": float(self.phase_iteration),
            "ppg/aux_phase": float(self.aux_ran),
            "ppg/buffer_frames": float(sum(seg.numel() for seg in self.buffer)),
        }
        if self.aux_stats:
            # the steps' means, [stats][S]: each member's own
            means = torch.stack([torch.stack([st[k] for k in AUX_STATS]) for st in self.aux_stats]).mean(0).tolist()
            out.update({f"ppg/aux_{k}": PerMember(v) for k, v in zip(AUX_STATS, means)})
            out["ppg/aux_steps"] = float(len(self.aux_stats))
            out["time/aux_phase_s"] = self._aux_seconds
        self.aux_stats = []
        return out

    # -------------------------------------------------------------- checkpoint
    def attach(self, data) -> None:
        """Register the phase buffer with the data module's per-rank resume state when it is small
        enough (``checkpoint_buffer_mib``); called once the data module builds its rollout source."""
        self.members = int(getattr(data, "members", 1))
        need = phase_buffer_bytes(data.observation_space, data.action_space, data.num_envs, data.rollout_steps,
                                  self.cfg["n_pi"], self.state_size) * self.members
        self.buffer_in_checkpoint = self.stores_rollouts and need <= self.cfg["checkpoint_buffer_mib"] * 2**20
        if self.buffer_in_checkpoint:
            data.resume_providers["ppg_buffer"] = PhaseBufferState(self)

    def state_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "phase_iteration": self.phase_iteration, "n_pi": self.cfg["n_pi"],
                "buffer_in_checkpoint": self.buffer_in_checkpoint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.phase = int(state["phase"])
        self.buffer.clear()
        self._stacked = None
        self._old_ready = False
        if state.get("buffer_in_checkpoint"):  # `PhaseBufferState` restores buffer and phase iteration
            self.phase_iteration = int(state["phase_iteration"])
            return
        if state["phase_iteration"]:
            warnings.warn(
                f"resuming in the middle of a PPG policy phase (iteration {state['phase_iteration']} of "
                f"{state['n_pi']}): its rollouts are not in the checkpoint, so a new phase starts "
                "(phase iteration 0, empty buffer, EWMA proximal policy reset to the current weights)",
                stacklevel=2,
            )
            self.restart_pending = True
        self.phase_iteration = 0


class PhaseBufferState:
    """The phase buffer as one rank's plain resume state (`ppo_lightning.data.resume_state` providers):
    each stored rollout as a dict of tensors with its batch size, loadable with ``weights_only``."""

    def __init__(self, phases: PPGPhases) -> None:
        self.phases = phases

    def state_dict(self) -> dict[str, Any]:
        return {"phase_iteration": self.phases.phase_iteration,
                "rollouts": [{"batch_size": list(td.batch_size), "data": td.to_dict()} for td in self.phases.buffer]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # [S, envs, time]; a single run's checkpoints before it was a group of one stored [envs, time]
        rollouts = [TensorDict(r["data"], batch_size=r["batch_size"]) for r in state["rollouts"]]
        self.phases.buffer = [td if td.batch_dims == 3 else td.unsqueeze(0) for td in rollouts]
        self.phases._stacked = None
        self.phases.phase_iteration = int(state["phase_iteration"])
        self.phases.restart_pending = False
