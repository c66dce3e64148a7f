"""The rollout source: one PPO iteration per pass (collect, GAE, normalize, yield minibatches).

`RolloutSource` is the data module's iterable (`ppo_lightning.data.datamodule`) for a single run,
and the base of a group's (the data side of a group of members, a subclass), which replaces what it builds (`placement`, `make_envs`, `make_collector`, `make_gae`) and
what is per member in the collection (`collect_members`, `member_value`, `update_observation_norms`);
the collection itself (`rollouts`) is one path for both. A source is built from the run's
`RolloutConfig`, its `SeedState` per seed and `RolloutProgress`, and the network.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import Tensor
from torchrl.collectors import Collector

from ppo_lightning.algos.advantages import RewardNormalizer, make_gae, next_values
from ppo_lightning.algos.staleness import StalenessQueue, relabel
from ppo_lightning.core import faults
from ppo_lightning.data import resume_state
from ppo_lightning.data.config import RolloutConfig
from ppo_lightning.data.seed_state import RolloutProgress, SeedState
from ppo_lightning.data.batched_rollout import BatchedRollout, supports_batched_rollout
from ppo_lightning.data.lockstep import LockstepRollout, vector_games
from ppo_lightning.data.devices import collector_devices, device_env_kwargs, network_device, rollout_precision
from ppo_lightning.data.episodes import BATCH_KEYS
from ppo_lightning.data.parallel import raise_together
from ppo_lightning.envs import make_env
from ppo_lightning.nets.models import OBS_KEY, VALUE_KEY, dist_param_keys, make_policy_operator
from ppo_lightning.nets.obs_norm import RunningObservationNorm, update_observation_norm
from ppo_lightning.nets.recurrent import IS_INIT_KEY, STATE_KEY, is_recurrent

RANK_SEED_STRIDE = 1_000_003  # env seeds of different ranks never overlap for up to 1M envs


def rank_seed(seed: int, rank: int) -> int:
    """Env seed of a data-parallel rank (rank 0 keeps ``seed``)."""
    return seed + RANK_SEED_STRIDE * rank


def check_recurrent_settings(config: RolloutConfig, recurrent: bool) -> None:
    """One-line errors for the data settings a recurrent (or feed-forward) network cannot take."""
    if not recurrent:
        if config.sequence_length is not None:
            raise ValueError("data.sequence_length cuts rollouts into sequences for a recurrent network "
                             "(model.network.core: lstm or gru); this network is feed-forward: leave it null")
        return
    if config.staleness:
        raise ValueError(f"data.staleness={config.staleness} is not supported with a recurrent network "
                         f"(model.network.core): set data.staleness to 0")
    config.check_segments()


def recurrent_value(step):
    """A recurrent network's value function for V(next observation) (`ppo_lightning.algos.advantages.next_values`):
    ``(obs [N, ...], state [N, D]) -> [N, 1]``, one ``step`` from the state the step that led to ``obs``
    left (never reset: ``obs`` continues that episode, or is its final observation)."""
    def value(obs: Tensor, state: Tensor) -> Tensor:
        return step(obs, state, torch.zeros(state.shape[:-1], dtype=torch.bool, device=state.device))[-2]

    return value


def segments(rollout: TensorDictBase, length: int) -> TensorDictBase:
    """A rollout ``[envs, time]`` cut into ``[envs * time / length, length]``: env e's steps
    ``j * length ... (j + 1) * length - 1`` are segment ``e * time / length + j``."""
    envs, time_steps = rollout.batch_size
    return rollout.reshape(envs * (time_steps // length), length)


def stack_members(items: list[TensorDictBase]) -> TensorDictBase:
    """The members' items on a leading member dimension ``[S, ...]``; one member's as a view (a stack
    copies: a Procgen batch is ~200 MB)."""
    return items[0].unsqueeze(0) if len(items) == 1 else torch.stack(items)


class RolloutSource:
    """An iterable whose every pass is one PPO iteration: collect, GAE, normalize, yield minibatches.

    The seed axis: ``states`` holds what each seed keeps on the data side (episodes, advantage
    moments, reward normalizer, shuffle generator); a single run is a group of one. ``progress``
    counts the frames and iterations; ``trainer`` (optional) gives the data-parallel place and the
    precision of the rollout forwards. Minibatches are ``[S, minibatch_size]`` (S = 1 for a single run: the
    network, a plain module, flattens the leading dimensions of its input as it does for a rollout's
    ``[envs]`` and GAE's ``[envs, time]``). A group's subclass collects all its members' rollouts at
    once; the rest of the iteration is this class's.
    """

    def __init__(self, config: RolloutConfig, states: list[SeedState], network: torch.nn.Module,
                 progress: RolloutProgress, trainer=None) -> None:
        self.config = data = config
        self.states = states  # what each seed keeps on the data side (the data module's list)
        self.network = network
        self.progress = progress
        self.trainer = trainer
        self.param_keys = dist_param_keys(data.action_space)
        # Data-parallel ranks (DDP, FSDP) each collect their own rollout: distinct env seeds, and
        # every rank's frames count towards data.frames / total_frames (all ranks collect alike).
        self.rank, self.world_size = self.placement(trainer)
        # Envs on the CPU; policy, rollout, GAE and minibatches on the network's device (ppo_lightning.data.devices).
        self.device = network_device(network)
        self.recurrent = is_recurrent(network)
        check_recurrent_settings(data, self.recurrent)
        self.envs = self.make_envs()
        self.env = self.envs[0]
        self.collector = self.make_collector()
        self.gae = self.make_gae()
        self.last_timing: dict[str, float] = {}
        if self.world_size > 1:  # normalization statistics over all ranks' samples (ppo_lightning.data.parallel)
            from ppo_lightning.data.parallel import all_reduce_moments  # start-up cost: torch.distributed, only under DDP

            states[0].advantage_moments.reduce_moments = all_reduce_moments
            if states[0].reward_normalizer is not None:
                states[0].reward_normalizer.reduce_moments = all_reduce_moments
        # Artificial staleness (ppo_lightning.algos.staleness): train on the rollout of k iterations ago.
        self.stale = StalenessQueue(data.staleness, data.staleness_mode) if data.staleness else None
        self.phases = None  # PPG: the module's ppo_lightning.algos.ppg.PPGPhases (set by train_dataloader)
        self._normalizes_observations = any(isinstance(m, RunningObservationNorm) for m in network.modules())
        self._pending_observations = None

    # ---------------------------------------------------------------- what a group replaces
    def placement(self, trainer) -> tuple[int, int]:
        """(rank, world size): the Trainer's data-parallel place."""
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def make_envs(self) -> list:
        """The run's batched env, seeded for its rank."""
        data = self.config
        return [make_env(data.env_id, data.num_envs, rank_seed(data.seed, self.rank),
                         device_env_kwargs(data.env_id, data.env_kwargs, self.device), timeout_s=data.env_timeout_s)]

    def make_collector(self):
        """MinAtar: the batched loop (same rollouts, no per-step collector cost); else TorchRL's Collector.
        A recurrent network: this package's loops only (`recurrent_collector`)."""
        data = self.config
        if self.recurrent:
            collector = self.recurrent_collector()
            self._iterator = iter(collector)
            return collector
        self.policy = make_policy_operator(self.network, data.action_space, with_value=True)
        if data.batched_rollout and supports_batched_rollout(self.env, self.device):
            collector = BatchedRollout(self.env, self.network, data.action_space, data.frames_per_iteration)
        else:
            collector = Collector(self.env, self.policy, frames_per_batch=data.frames_per_iteration, total_frames=-1,
                                  auto_register_policy_transforms=False, trust_policy=True,
                                  **collector_devices(self.device))
        self._iterator = iter(collector)
        return collector

    def recurrent_collector(self):
        """A single run's loop for a recurrent network, which carries every env's state from step to
        step: `BatchedRollout` on the CPU (MinAtar's games, a gymnasium vector env through `VectorGames`),
        `LockstepRollout` otherwise (Procgen, ``data.batched_rollout: false``, a policy on a GPU)."""
        data = self.config
        args = (self.env, self.network, data.action_space, data.frames_per_iteration)
        if data.batched_rollout and supports_batched_rollout(self.env, self.device):
            return BatchedRollout(*args)
        if data.batched_rollout and self.device.type == "cpu" and vector_games(self.env) is not None:
            return BatchedRollout(*args, games=vector_games)
        return LockstepRollout([self.env], *args[1:])

    def make_gae(self):
        return make_gae(self.config.gamma, self.config.gae_lambda, self.device)

    def __len__(self) -> int:
        if self.phases is not None:  # an upper bound: the iteration that ends a PPG phase is longer
            return self.phases.max_batches_per_iteration(self.config)
        return self.config.update_epochs * self.config.num_minibatches

    # ---------------------------------------------------------------- collection: one path for every S
    @torch.no_grad()
    def rollouts(self) -> list[TensorDictBase]:
        """Every member's rollout of this iteration, ``[envs, time]`` each, with advantages and value
        targets (a single run: one member). Per member as a single run does it: observation statistics,
        collection, episodes, reward normalization, V(next observation), GAE; the reward normalizers'
        time loop and GAE run once for all members on seed-major ``[S, envs, time]`` tensors (both are
        elementwise over envs: each member's values those of its own call)."""
        data = self.config
        t0 = time.perf_counter()
        with self.precision_context():  # the network's forwards; GAE below runs in float32
            rollouts = self._next_rollouts()
            if self.stale is not None:  # delayed rollout (one member: groups refuse data.staleness)
                rollout = self.stale.delay(rollouts[0], self.progress.iteration - 1, lambda: self._next_rollouts(count=False)[0])
                relabel(rollout, self.network, data.staleness_mode, data.action_space)
                rollouts = [rollout]
            t1 = time.perf_counter()
            for k, rollout in enumerate(rollouts):
                rollout.set(("next", VALUE_KEY), next_values(rollout, self.member_value(k)))
        self._advantages(rollouts)
        t2 = time.perf_counter()
        self.last_timing = {"time/rollout_s": t1 - t0, "time/gae_s": t2 - t1}
        if self.stale is not None:
            self.last_timing["staleness/lag"] = float(self.stale.last_lag)
        return rollouts

    @torch.no_grad()
    def _next_rollouts(self, count: bool = True) -> list[TensorDictBase]:
        """The members' next rollouts by the current policy: counted (unless ``count`` is False: a stale
        run's start-up rollouts, see `ppo_lightning.algos.staleness`), episodes recorded, rewards normalized."""
        data = self.config
        was_training = self.network.training
        self.network.eval()
        if self._pending_observations is not None:  # normalizer statistics from the previous rollouts
            self.update_observation_norms(self._pending_observations)
        fault = rollouts = None
        try:
            rollouts = self.collect_members()
        except faults.EnvFault as err:  # name the iteration too
            err.iteration = self.progress.iteration
            fault = err
        # before any other collective: a fault on one data-parallel rank stops all of them
        raise_together(fault, self.rank, self.world_size)
        self._pending_observations = [r.get(OBS_KEY) for r in rollouts] if self._normalizes_observations else None
        self.network.train(was_training)
        for st, rollout in zip(self.states, rollouts):
            st.episodes.add_rollout(rollout)
        if count:  # per member: each counts its own frames, as alone
            self.progress.frames += rollouts[0].numel() * self.world_size
        self._normalize_rewards(rollouts)
        return rollouts

    def _normalize_rewards(self, rollouts: list[TensorDictBase]) -> None:
        normalizers = [st.reward_normalizer for st in self.states]
        if normalizers[0] is None:
            return
        reward = torch.stack([r.get(("next", "reward")) for r in rollouts])
        done = torch.stack([r.get(("next", "done")) for r in rollouts])
        reward = faults.normalize_rewards_finite(
            lambda r, d: RewardNormalizer.normalize_stacked(normalizers, r, d), reward, done)
        for k, rollout in enumerate(rollouts):
            rollout.set(("next", "reward"), reward[k])

    def _advantages(self, rollouts: list[TensorDictBase]) -> None:
        """GAE of every member at once on the stacked ``[S, envs, time]`` entries it reads."""
        entries = (VALUE_KEY, ("next", "reward"), ("next", "done"), ("next", "terminated"), ("next", VALUE_KEY))
        group = torch.stack([r.select(*entries) for r in rollouts])
        self.gae(group)
        for key in (self.gae.tensor_keys.advantage, self.gae.tensor_keys.value_target):
            values = group.get(key)
            for k, rollout in enumerate(rollouts):
                rollout.set(key, values[k])

    def precision_context(self):
        """The Trainer's precision for the rollout forwards, as Lightning applies it to the training
        step (``bf16-mixed``: bf16 autocast; ``32-true``: nothing); networks return float32, so GAE
        and the normalizers stay float32. Autocast's weight cache is on (`rollout_precision`)."""
        return rollout_precision(self.trainer)

    # ---------------------------------------------------------------- per member: what a group replaces
    def collect_members(self) -> list[TensorDictBase]:
        """The collector's next rollout, one per member."""
        return [next(self._iterator)]

    def member_value(self, k: int):
        """Member k's value function ``obs -> [..., 1]`` (a recurrent network's: ``(obs, state after
        the step that led to it) -> [..., 1]``, `recurrent_value`)."""
        return recurrent_value(self.network.step) if self.recurrent else self.network.value

    def update_observation_norms(self, observations: list[Tensor]) -> None:
        """Each member's observation normalizers merge its previous rollout's observations."""
        update_observation_norm(self.network, observations[0])

    def prepare(self, rollout: TensorDictBase, state=None) -> TensorDictBase:
        """Flatten to [envs*time], keep the keys the loss reads, normalize advantages (with the
        moments of ``state``, one of `states`; default: the first). A recurrent network's rollout is
        cut into segments instead (`segments`): ``[envs*time/L, L]`` with the states and ``is_init``."""
        moments = (state or self.states[0]).advantage_moments
        keys = [*BATCH_KEYS, *self.param_keys]
        if "proximal" in rollout.keys():  # supplied by the staleness queue (decoupled mode)
            keys.append("proximal")
        if self.recurrent:
            flat = segments(rollout.select(*keys, STATE_KEY, IS_INIT_KEY), self.config.sequence_steps)
        else:
            flat = rollout.select(*keys).reshape(-1)
        adv = flat.get("advantage")
        faults.update_moments_finite(moments, adv)  # never absorbs a NaN
        if self.config.normalize_advantage:
            flat.set("advantage", moments.normalize(adv))
        return flat

    def __iter__(self):
        self.progress.start_iteration()
        rollouts = self.rollouts()
        flats = [self.prepare(r, st) for r, st in zip(rollouts, self.states)]
        if self.phases is not None:  # PPG: value / policy epochs, then maybe the auxiliary phase
            keys = self.phases.stored_keys
            if self.recurrent:  # the auxiliary phase replays the rollouts from their stored states
                keys = (*keys, *(k for k in (STATE_KEY, IS_INIT_KEY) if k not in keys))
            stored = lambda: torch.stack([r.select(*keys).to("cpu") for r in rollouts])  # noqa: E731  [S, envs, time]
            yield from self.phases.iteration_batches(stored, [st.shuffle_generator for st in self.states],
                                                     lambda e: self._epoch_minibatches(flats, e), self.config)
            return
        yield from self._epoch_minibatches(flats, self.config.update_epochs)

    def _epoch_minibatches(self, flats: list[TensorDictBase], epochs: int):
        """Minibatches of ``epochs`` epochs, ``[S, minibatch_size]`` (S = 1 for a single run); each
        member's epoch shuffle from its own generator. A recurrent network's: ``[S, B, L]``, B segments
        of L steps (``prepare``), the epoch shuffle permuting the segments."""
        n = flats[0].shape[0]
        size = n // self.config.num_minibatches
        for _ in range(epochs):
            # One gather per epoch, then contiguous slices (views): cheaper than a gather per minibatch.
            # CPU generators: the same order anywhere.
            shuffled = stack_members([f[torch.randperm(n, generator=st.shuffle_generator).to(f.device, non_blocking=True)]
                                      for f, st in zip(flats, self.states)])
            for i in range(self.config.num_minibatches):
                yield shuffled[:, i * size:(i + 1) * size]

    def shutdown(self) -> None:
        self.collector.shutdown()

    def resume_state(self) -> dict[str, Any]:
        """What exact resume needs of the source (`ppo_lightning.data.resume_state`): env and carried step."""
        return {"env": resume_state.env_state(self.env), "collector": resume_state.collector_state(self.collector),
                # the observations the network's normalizer merges before the next rollout (network.normalize_observation)
                "pending_observations": None if self._pending_observations is None else self._pending_observations[0]}

    def load_resume_state(self, state: dict[str, Any]) -> None:
        resume_state.set_source_env_state(self, state)
        if state.get("pending_observations") is not None:
            self._pending_observations = [state["pending_observations"]]
