"""The data side: collector -> (staleness queue) -> GAE + normalization -> minibatches.

One Lightning *epoch* is one PPO *iteration*: Lightning calls ``iter()`` on the `RolloutSource` at the
start of every epoch, after the previous iteration's last optimizer step, so every rollout is
collected by the current policy. Each yielded minibatch is one training step (one optimizer step),
which every callback sees.

The data side borrows the module's network for collection (a TorchRL `ProbabilisticActor` over its
``forward``, which also records the value for GAE) and nothing else.
"""

from __future__ import annotations

import math
import time
from typing import Any

import lightning.pytorch as pl
import torch
from tensordict import TensorDictBase
from torchrl.collectors import Collector

from ppo_lightning.core import faults
from ppo_lightning.data import resume_state
from ppo_lightning.data.parallel import raise_together
from ppo_lightning.data.batched_rollout import BatchedRollout, supports_batched_rollout
from ppo_lightning.algos.advantages import AdvantageMoments, RewardNormalizer, make_gae, next_values
from ppo_lightning.data.devices import collector_devices, device_env_kwargs, network_device, rollout_precision
from ppo_lightning.envs import PROCGEN_PREFIX, check_env_id, env_spaces, is_procgen, make_env
from ppo_lightning.nets.obs_norm import RunningObservationNorm, update_observation_norm
from ppo_lightning.nets.models import OBS_KEY, VALUE_KEY, dist_param_keys, make_policy_operator
from ppo_lightning.algos.staleness import StalenessQueue, relabel, validate_staleness
from ppo_lightning.core.threads import configure_threads
from ppo_lightning.envs import is_minatar
from ppo_lightning.data.episodes import BATCH_KEYS, EpisodeStats  # noqa: F401  (EpisodeStats: also read from here)
from ppo_lightning.data.seed_group import SeedGroupSource, check_group_trainer, validate_member_hparams

RANK_SEED_STRIDE = 1_000_003  # env seeds of different ranks never overlap for up to 1M envs


def rank_seed(seed: int, rank: int) -> int:
    """Env seed of a data-parallel rank (rank 0 keeps ``seed``)."""
    return seed + RANK_SEED_STRIDE * rank


class RolloutSource:
    """An iterable whose every pass is one PPO iteration: collect, GAE, normalize, yield minibatches."""

    def __init__(self, data: "RolloutDataModule", network: torch.nn.Module) -> None:
        self.data = data
        self.network = network
        # Data-parallel ranks (DDP, FSDP) each collect their own rollout: distinct env seeds, and
        # every rank's frames count towards data.frames / total_frames (all ranks collect alike).
        trainer = getattr(data, "trainer", None)
        self.rank, self.world_size = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        # Envs on the CPU; policy, rollout, GAE and minibatches on the network's device (ppo_lightning.data.devices).
        self.device = network_device(network)
        env_kwargs = device_env_kwargs(data.env_id, data.env_kwargs, self.device)
        self.env = make_env(data.env_id, data.num_envs, rank_seed(data.seed, self.rank), env_kwargs,
                            timeout_s=data.env_timeout_s)
        self.policy = make_policy_operator(network, data.action_space, with_value=True)
        if data.batched_rollout and supports_batched_rollout(self.env, self.device):  # MinAtar: same rollouts, no per-step collector cost
            self.collector = BatchedRollout(self.env, network, data.action_space, data.frames_per_iteration)
        else:
            self.collector = Collector(
                self.env,
                self.policy,
                frames_per_batch=data.frames_per_iteration,
                total_frames=-1,
                auto_register_policy_transforms=False,
                trust_policy=True,
                **collector_devices(self.device),
            )
        self._iterator = iter(self.collector)
        self.gae = make_gae(data.gamma, data.gae_lambda, self.device)
        self.last_timing: dict[str, float] = {}
        if self.world_size > 1:  # normalization statistics over all ranks' samples (ppo_lightning.data.parallel)
            from ppo_lightning.data.parallel import all_reduce_moments

            data.advantage_moments.reduce_moments = all_reduce_moments
            if data.reward_normalizer is not None:
                data.reward_normalizer.reduce_moments = all_reduce_moments
        # Artificial staleness (ppo_lightning.algos.staleness): train on the rollout of k iterations ago.
        self.stale = StalenessQueue(data.staleness, data.staleness_mode) if data.staleness else None
        self.phases = None  # PPG: the module's ppo_lightning.algos.ppg.PPGPhases (set by train_dataloader)
        self._normalizes_observations = any(isinstance(m, RunningObservationNorm) for m in network.modules())
        self._pending_observations = None

    def __len__(self) -> int:
        if self.phases is not None:  # an upper bound: the iteration that ends a PPG phase is longer
            return self.phases.max_batches_per_iteration(self.data)
        return self.data.update_epochs * self.data.num_minibatches

    @torch.no_grad()
    def _next_rollout(self, count: bool = True) -> TensorDictBase:
        """The collector's next rollout by the current policy: counted (unless ``count`` is False:
        a stale run's start-up rollouts, see `ppo_lightning.algos.staleness`), rewards normalized."""
        data = self.data
        was_training = self.network.training
        self.network.eval()
        if self._pending_observations is not None:  # normalizer stats from the previous rollout
            update_observation_norm(self.network, self._pending_observations)
        fault = None
        try:
            rollout = next(self._iterator)
        except faults.EnvFault as err:  # name the iteration too
            err.iteration = data.iteration
            fault = err
        # before any other collective: a fault on one data-parallel rank stops all of them
        raise_together(fault, self.rank, self.world_size)
        self._pending_observations = rollout.get(OBS_KEY) if self._normalizes_observations else None
        self.network.train(was_training)
        data.episodes.add_rollout(rollout)
        if count:
            data.frames += rollout.numel() * self.world_size
        if data.reward_normalizer is not None:
            rollout.set(
                ("next", "reward"),
                faults.normalize_rewards_finite(data.reward_normalizer, rollout.get(("next", "reward")),
                                                rollout.get(("next", "done"))),
            )
        return rollout

    def precision_context(self):
        """The Trainer's precision for the rollout forwards, as Lightning applies it to the training
        step (``bf16-mixed``: bf16 autocast; ``32-true``: nothing); networks return float32, so GAE
        and the normalizers stay float32. Autocast's weight cache is on (`rollout_precision`)."""
        return rollout_precision(getattr(self.data, "trainer", None))

    @torch.no_grad()
    def collect(self) -> TensorDictBase:
        """One rollout shaped [envs, time] with advantages and value targets."""
        data = self.data
        t0 = time.perf_counter()
        with self.precision_context():  # the network's forwards; GAE below runs in float32
            rollout = self._next_rollout()
            if self.stale is not None:  # delayed rollout: collection-time values, policy roles by mode
                rollout = self.stale.delay(rollout, data.iteration - 1, lambda: self._next_rollout(count=False))
                relabel(rollout, self.network, data.staleness_mode, data.action_space)
            t1 = time.perf_counter()
            rollout.set(("next", VALUE_KEY), next_values(rollout, self.network.value))
        self.gae(rollout)
        t2 = time.perf_counter()
        self.last_timing = {"time/rollout_s": t1 - t0, "time/gae_s": t2 - t1}
        if self.stale is not None:
            self.last_timing["staleness/lag"] = float(self.stale.last_lag)
        return rollout

    def prepare(self, rollout: TensorDictBase) -> TensorDictBase:
        """Flatten to [envs*time], keep the keys the loss reads, normalize advantages."""
        keys = [*BATCH_KEYS, *dist_param_keys(self.data.action_space)]
        if "proximal" in rollout.keys():  # supplied by the staleness queue (decoupled mode)
            keys.append("proximal")
        flat = rollout.select(*keys).reshape(-1)
        adv = flat.get("advantage")
        faults.update_moments_finite(self.data.advantage_moments, adv)  # never absorbs a NaN
        if self.data.normalize_advantage:
            flat.set("advantage", self.data.advantage_moments.normalize(adv))
        return flat

    def __iter__(self):
        self.data.iteration_started()
        rollout = self.collect()
        flat = self.prepare(rollout)
        if self.phases is not None:  # PPG: value / policy epochs, then maybe the auxiliary phase
            stored = lambda: rollout.select(*self.phases.stored_keys).to("cpu").clone()  # noqa: E731
            yield from self.phases.iteration_batches(stored, [self.data.shuffle_generator],
                                                     lambda e: self._epoch_minibatches(flat, e), self.data)
            return
        yield from self._epoch_minibatches(flat, self.data.update_epochs)

    def _epoch_minibatches(self, flat: TensorDictBase, epochs: int):
        n = flat.shape[0]
        size = n // self.data.num_minibatches
        for _ in range(epochs):
            # One gather per epoch, then contiguous slices (views): cheaper than a gather per minibatch.
            order = torch.randperm(n, generator=self.data.shuffle_generator)  # CPU generator: same order anywhere
            shuffled = flat[order.to(flat.device, non_blocking=True)]
            for i in range(self.data.num_minibatches):
                yield shuffled[i * size : (i + 1) * size]


class RolloutDataModule(pl.LightningDataModule):
    """Environment and rollout configuration, and the per-run data state (frames, normalizers).

    Args:
        env_id: gymnasium id (e.g. ``CartPole-v1``) or ``procgen:<game>``.
        env_kwargs: keyword arguments for the env factory.
        num_envs, rollout_steps: a rollout is ``num_envs x rollout_steps`` frames.
        num_minibatches, update_epochs: each iteration makes ``update_epochs * num_minibatches``
            gradient steps on minibatches of ``num_envs * rollout_steps / num_minibatches``.
        total_frames: training stops at the end of the iteration that reaches it.
        gamma, gae_lambda: GAE parameters.
        normalize_advantage: normalize advantages by EWMA moments over iterations ...
        advantage_norm_span: ... with this span in iterations (1 = per batch).
        normalize_reward: divide rewards by the running std of the discounted return, clip to +-10.
        staleness: train on each rollout this many iterations after its collection (0: off).
        staleness_mode: "behavior", "proximal" or "decoupled": which policy plays the old policy
            on stale data (see `ppo_lightning.algos.staleness`).
        seed: seeds the envs and the minibatch shuffling; None (default): 0, or with the CLI the
            config's ``seed_everything``. With several data-parallel ranks (DDP,
            FSDP) rank r seeds its envs with ``rank_seed(seed, r)``, and ``frames`` /
            ``total_frames`` count the frames of all ranks (the paper's 4 workers x 64 envs = 4 ranks
            with ``num_envs: 64``). Advantage and reward normalization statistics are pooled over
            the ranks (`ppo_lightning.data.parallel`).
        num_threads: torch intra-op threads (None: 1 for MLP policies; see `ppo_lightning.core.threads`).
        env_timeout_s: a gymnasium env step or reset that takes longer stops training with an
            error naming the env (`ppo_lightning.core.faults`); 0: no limit.
        batched_rollout: collect from envs that step as one batch (MinAtar) with
            `ppo_lightning.data.batched_rollout` instead of TorchRL's collector: the same rollouts,
            bitwise, without the collector's per-step cost. False: always the collector.
        num_seeds: train this many independent seeds in one process, vectorized: seed k is the run
            with seed ``seed + k`` (`ppo_lightning.data.seed_group`, `ppo_lightning.training.seed_group`);
            ``frames`` and ``total_frames`` count each seed's own frames. 1: a single run.
        member_seeds: the seeds of a group's members in order, repeats allowed (instead of ``seed + k``;
            sets ``num_seeds``): with ``member_hparams``, the same seed under several settings.
        member_hparams: per-member hyperparameters of a group, ``{name: [one value per member]}`` for
            names in `ppo_lightning.data.seed_group.MEMBER_HPARAMS` (``lr``, ``adam_betas``,
            ``proximal_com``, ``advantage_norm_span``, ``clip_eps``, ``entropy_coef``, ``value_coef``, ``kl_beta``,
            ``gamma``, ``gae_lambda``): member k trains as the single run with seed ``seeds[k]`` and
            these values would (PureJaxRL-style sweeps of seeds x settings in one process). The
            model takes its own (linked by the CLI); the data side uses ``advantage_norm_span``, ``gamma``
            and ``gae_lambda``.
    """

    def __init__(
        self,
        env_id: str = "CartPole-v1",
        env_kwargs: dict[str, Any] | None = None,
        num_envs: int = 8,
        rollout_steps: int = 32,
        num_minibatches: int = 4,
        update_epochs: int = 10,
        total_frames: int = 100_000,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        normalize_advantage: bool = True,
        advantage_norm_span: float = 1.0,
        normalize_reward: bool = False,
        seed: int | None = None,
        num_threads: int | None = None,
        staleness: int = 0,
        staleness_mode: str = "decoupled",
        env_timeout_s: float = faults.DEFAULT_ENV_TIMEOUT_S,
        batched_rollout: bool = True,
        num_seeds: int = 1,
        member_seeds: list[int] | None = None,
        member_hparams: dict[str, list] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.num_envs, self.rollout_steps = num_envs, rollout_steps
        self.num_minibatches, self.update_epochs = num_minibatches, update_epochs
        self.total_frames = total_frames
        self.gamma, self.gae_lambda = gamma, gae_lambda
        self.normalize_advantage, self.advantage_norm_span = normalize_advantage, advantage_norm_span
        self.normalize_reward = normalize_reward
        self.seed = 0 if seed is None else seed  # the CLI fills None with seed_everything
        self.num_threads = num_threads
        self.staleness, self.staleness_mode = staleness, staleness_mode
        self.env_timeout_s = env_timeout_s
        self.batched_rollout = bool(batched_rollout)
        self.member_seeds = None if member_seeds is None else [int(x) for x in member_seeds]
        if self.member_seeds is not None and num_seeds == 1:
            num_seeds = len(self.member_seeds)  # member_seeds says how many
        self.num_seeds = num_seeds
        self.member_hparams = None if member_hparams is None else {k: list(v) for k, v in dict(member_hparams).items()}
        self.validate()
        self.observation_space, self.action_space = env_spaces(env_id, self.env_kwargs)
        self.frames = 0
        self.iteration = 0
        self.episodes = EpisodeStats()
        self.advantage_moments = AdvantageMoments(advantage_norm_span)
        self.reward_normalizer = RewardNormalizer(num_envs, gamma) if normalize_reward else None
        self.shuffle_generator = torch.Generator().manual_seed(self.seed)
        self.source: RolloutSource | None = None
        self._pending_queue_state: dict | None = None  # a checkpoint's staleness queue, until the source exists
        # Exact resume (ppo_lightning.data.resume_state): RNGs, env and collector state, until the source exists;
        # other per-rank state (e.g. an algorithm's phase buffer) registers here by name.
        self._pending_resume: dict | None = None
        self.resume_providers: dict[str, resume_state.Stateful] = {}
        self.elastic_resume: dict[str, int] | None = None  # a --rescale resume (ppo_lightning.training.rescale)
        self._iteration_t0 = None

    @property
    def seeds(self) -> list[int]:
        """The seeds of this run: ``[seed]``, or ``seed, seed + 1, ...`` for a seed group (or ``member_seeds``)."""
        if self.member_seeds is not None:
            return list(self.member_seeds)
        return [self.seed + k for k in range(self.num_seeds)]

    def member_advantage_norm_spans(self) -> list[float]:
        """Each group member's advantage-normalization span (``member_hparams`` or ``advantage_norm_span``)."""
        spans = (self.member_hparams or {}).get("advantage_norm_span")
        return [float(x) for x in spans] if spans is not None else [float(self.advantage_norm_span)] * self.num_seeds

    @property
    def frames_per_iteration(self) -> int:
        return self.num_envs * self.rollout_steps

    @property
    def minibatch_size(self) -> int:
        return self.frames_per_iteration // self.num_minibatches

    @property
    def finished(self) -> bool:
        return self.frames >= self.total_frames

    def validate(self) -> None:
        """Fail before training, naming the field."""
        check_env_id(self.env_id)
        for name in ("num_envs", "rollout_steps", "num_minibatches", "update_epochs", "total_frames"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"data.{name} must be a positive integer, got {value!r}")
        if self.frames_per_iteration % self.num_minibatches:
            raise ValueError(
                f"data.num_minibatches={self.num_minibatches} does not split a batch of "
                f"num_envs*rollout_steps={self.frames_per_iteration} frames into equal minibatches"
            )
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"data.gamma must lie in [0, 1], got {self.gamma}")
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError(f"data.gae_lambda must lie in [0, 1], got {self.gae_lambda}")
        if self.advantage_norm_span < 1:
            raise ValueError(f"data.advantage_norm_span must be >= 1, got {self.advantage_norm_span}")
        if self.num_threads is not None and self.num_threads <= 0:
            raise ValueError(f"data.num_threads must be positive, got {self.num_threads}")
        validate_staleness(self.staleness, self.staleness_mode)
        if not isinstance(self.num_seeds, int) or isinstance(self.num_seeds, bool) or self.num_seeds < 1:
            raise ValueError(f"data.num_seeds must be a positive integer, got {self.num_seeds!r}")
        if self.num_seeds > 1:
            if not is_minatar(self.env_id):
                raise ValueError(f"data.num_seeds > 1 (vectorized seeds) needs an env that steps as one batch "
                                 f"(minatar:<game>), got {self.env_id!r}")
            if self.staleness:
                raise ValueError("data.num_seeds > 1 does not support data.staleness yet")
        if self.member_seeds is not None and len(self.member_seeds) != self.num_seeds:
            raise ValueError(f"data.member_seeds has {len(self.member_seeds)} seeds but data.num_seeds (--seeds) is "
                             f"{self.num_seeds}: give one of them, or make them agree")
        if self.member_seeds is not None and self.num_seeds < 2:
            raise ValueError("data.member_seeds needs at least two members (a single run takes data.seed)")
        if self.member_hparams is not None:
            validate_member_hparams(self.member_hparams, self.num_seeds)
        if not (isinstance(self.env_timeout_s, (int, float)) and self.env_timeout_s >= 0):
            raise ValueError(f"data.env_timeout_s must be a number of seconds >= 0 (0: no limit), got {self.env_timeout_s!r}")

    def setup(self, stage: str) -> None:
        configure_threads(self.num_threads, self.env_id)

    def train_dataloader(self) -> RolloutSource:
        if self.source is None:
            h = self.trainer.lightning_module.hparams
            validate_staleness(self.staleness, self.staleness_mode, decoupled=h.get("decoupled"),
                               proximal_com=h.get("proximal_com"))
            module = self.trainer.lightning_module
            group = getattr(module, "seed_group", None)
            if group is not None:  # vectorized seeds (ppo_lightning.data.seed_group)
                check_group_trainer(self.trainer, self.num_seeds, group.seeds, self.seeds)
                self.source = SeedGroupSource(self, module.network, group.seeds, group.action_rng_states)
                self.group_states = self.source.states  # kept after teardown (results, after_fit)
            else:
                self.source = RolloutSource(self, module.network)
            self.source.phases = getattr(self.trainer.lightning_module, "ppg_phases", None)
            if self.source.phases is not None:  # a small phase buffer joins this rank's resume state
                self.source.phases.attach(self)
            self._apply_pending_queue()
            self._apply_pending_resume()
        return self.source

    def iteration_started(self) -> None:
        self.iteration += 1
        self._iteration_t0 = time.perf_counter()

    def iteration_metrics(self) -> dict[str, float]:
        """Per-iteration figures for logging (called at the end of the iteration)."""
        out = {
            "frames": float(self.frames),
            "iteration": float(self.iteration),
            "episodes": float(self.episodes.count),
            "episode/return_mean20": self.episodes.mean_return(20),
            "episode/length_mean20": self.episodes.mean_length(20),
            "advantage/std_estimate": self.advantage_moments.std,
        }
        if is_procgen(self.env_id):  # Procgen's per-game normalized return next to the raw one
            from ppo_lightning.envs.procgen_scores import normalized_return

            game, mode = self.env_id[len(PROCGEN_PREFIX):], self.env_kwargs.get("distribution_mode", "hard")
            out["episode/normalized_return_mean20"] = normalized_return(game, mode, out["episode/return_mean20"])
        if self.source is not None:
            out.update(self.source.last_timing)
        if self._iteration_t0 is not None:
            out["time/iteration_s"] = time.perf_counter() - self._iteration_t0
            # Everything that is not collection or GAE: minibatch forward/backward/step, callbacks.
            out["time/update_s"] = out["time/iteration_s"] - sum(
                out.get(k, 0.0) for k in ("time/rollout_s", "time/gae_s")
            )
        return {k: v for k, v in out.items() if not math.isnan(v)}

    def state_dict(self) -> dict[str, Any]:
        """Rank 0's state, plus every rank's own under ``per_rank`` (gathered: all ranks call this)."""
        local = self._local_state_dict()
        shared = {k: local[k] for k in ("frames", "iteration")}  # the same on every rank
        return {**shared, "per_rank": resume_state.gather_rank_states(local)}

    def _local_state_dict(self) -> dict[str, Any]:
        return {
            "frames": self.frames,
            "iteration": self.iteration,
            "episodes": self.episodes.state_dict(),
            "advantage_moments": self.advantage_moments.state_dict(),
            "reward_normalizer": None if self.reward_normalizer is None else self.reward_normalizer.state_dict(),
            "shuffle_generator": self.shuffle_generator.get_state(),
            "staleness_queue": self.source.stale.state_dict()
            if self.source is not None and self.source.stale is not None
            else self._pending_queue_state,
            "resume": resume_state.capture(self),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "per_rank" in state:  # this rank's own normalizers, queue, envs and RNGs
            trainer = getattr(self, "trainer", None)
            state = resume_state.select_rank_state(state["per_rank"], trainer.global_rank if trainer else 0,
                                                   self.elastic_resume)
        self.frames, self.iteration = state["frames"], state["iteration"]
        self.episodes.load_state_dict(state["episodes"])
        self.advantage_moments.load_state_dict(state["advantage_moments"])
        if self.reward_normalizer is not None and state["reward_normalizer"] is not None:
            self.reward_normalizer.load_state_dict(state["reward_normalizer"])
        self.shuffle_generator.set_state(state["shuffle_generator"])
        queue = state.get("staleness_queue")
        if queue is not None and self.staleness == 0:
            raise faults.CheckpointError(f"checkpoint has a staleness queue (data.staleness={queue['staleness']}); the config has data.staleness=0")
        self._pending_queue_state = queue  # applied now, or when the rollout source is built
        self._apply_pending_queue()
        self._pending_resume = state.get("resume")
        self._apply_pending_resume()

    def _apply_pending_resume(self) -> None:
        if self._pending_resume is not None and self.source is not None:
            resume_state.apply(self, self._pending_resume)
            self._pending_resume = None

    def _apply_pending_queue(self) -> None:
        if self._pending_queue_state is not None and self.source is not None and self.source.stale is not None:
            self.source.stale.load_state_dict(self._pending_queue_state)
            self._pending_queue_state = None

    def teardown(self, stage: str) -> None:
        if self.source is not None:
            self.source.collector.shutdown()
            self.source = None
