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

from ppo_lightning.algos.staleness import validate_staleness
from ppo_lightning.core import faults
from ppo_lightning.core.members import PerMember
from ppo_lightning.core.threads import configure_threads
from ppo_lightning.data import resume_state
from ppo_lightning.data.config import RolloutConfig
from ppo_lightning.data.episodes import BATCH_KEYS, EpisodeStats  # noqa: F401  (BATCH_KEYS: also read from here)
from ppo_lightning.data.seed_group import SeedGroupSource, check_group_trainer
from ppo_lightning.data.seed_state import RolloutProgress, SeedState
from ppo_lightning.data.source import RANK_SEED_STRIDE, RolloutSource, rank_seed  # noqa: F401  (read from here too)
from ppo_lightning.envs import PROCGEN_PREFIX, is_procgen


class RolloutDataModule(pl.LightningDataModule):
    """The Lightning face of the data side: it holds the run's `RolloutConfig` (``config``, whose
    fields and properties read and write as the data module's own: ``dm.num_envs`` is ``dm.config.num_envs``),
    one `SeedState` per seed (``states``: episodes, normalizers, shuffling; one for a single run) and
    the run's `RolloutProgress` (``frames``, ``iteration``), and builds the rollout source from them.

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
            names in `ppo_lightning.core.members.MEMBER_SETTINGS` (``lr``, ``adam_betas``,
            ``proximal_com``, ``advantage_norm_span``, ``clip_eps``, ``entropy_coef``, ``value_coef``, ``kl_beta``,
            ``gamma``, ``gae_lambda``): member k trains as the single run with seed ``seeds[k]`` and
            these values would (PureJaxRL-style sweeps of seeds x settings in one process). The
            model takes its own (linked by the CLI); the data side uses ``advantage_norm_span``, ``gamma``
            and ``gae_lambda``.
        sequence_length: a recurrent network (``model.network.core``) trains on sequences of this
            many consecutive steps of one env, each from the state stored at its first step; null:
            the whole rollout (``rollout_steps``). It divides ``rollout_steps``, and the rollout's
            ``num_envs * rollout_steps / sequence_length`` sequences split into ``num_minibatches``
            equal minibatches; a feed-forward network refuses it.
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
        sequence_length: int | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.config = RolloutConfig(  # the CLI fills seed None with seed_everything
            env_id=env_id, env_kwargs=env_kwargs, num_envs=num_envs, rollout_steps=rollout_steps,
            num_minibatches=num_minibatches, update_epochs=update_epochs, total_frames=total_frames, gamma=gamma,
            gae_lambda=gae_lambda, normalize_advantage=normalize_advantage, advantage_norm_span=advantage_norm_span,
            normalize_reward=normalize_reward, seed=seed, num_threads=num_threads, staleness=staleness,
            staleness_mode=staleness_mode, env_timeout_s=env_timeout_s, batched_rollout=batched_rollout,
            num_seeds=num_seeds, member_seeds=member_seeds, member_hparams=member_hparams,
            sequence_length=sequence_length)
        self.progress = RolloutProgress()
        self.states = SeedState.of_members(self.config)  # what each seed keeps on the data side
        self.source: RolloutSource | None = None
        self._pending_queue_state: dict | None = None  # a checkpoint's staleness queue, until the source exists
        # Exact resume (ppo_lightning.data.resume_state): RNGs, env and collector state, until the source exists;
        # other per-rank state (e.g. an algorithm's phase buffer) registers here by name.
        self._pending_resume: dict | None = None
        self.resume_providers: dict[str, resume_state.Stateful] = {}
        self.elastic_resume: dict[str, int] | None = None  # a --rescale resume (ppo_lightning.training.rescale)

    def __getattr__(self, name: str) -> Any:
        config = self.__dict__.get("config")  # the config's fields and properties read as the data module's own
        if config is None or name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(config, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in RolloutConfig.__dataclass_fields__ and "config" in self.__dict__:  # a setting: the config's
            setattr(self.config, name, value)
        else:
            super().__setattr__(name, value)

    @property
    def frames(self) -> int:
        """Frames trained so far, per seed, all ranks (`RolloutProgress`)."""
        return self.progress.frames

    @property
    def iteration(self) -> int:
        """Iterations started so far (`RolloutProgress`)."""
        return self.progress.iteration

    @property
    def finished(self) -> bool:
        return self.frames >= self.config.total_frames

    def reset_member(self, k: int, seed: int, member_hparams: dict[str, list], action_rng_state: torch.Tensor) -> None:
        """Member k of a group starts again as the single run with ``seed`` and its values in
        ``member_hparams`` (a refilled slot): the settings recorded in the config, a fresh `SeedState`
        (normalizers, moments, shuffle generator, episode statistics) with its action generator at
        ``action_rng_state``, then fresh envs on the source (`SeedGroupSource.refill`)."""
        config = self.config
        seeds = config.seeds
        seeds[k] = seed
        config.member_hparams = {n: list(v) for n, v in member_hparams.items()}
        config.member_seeds = seeds
        state = SeedState(config, seed, config.member_values("advantage_norm_span")[k], config.member_values("gamma")[k])
        state.set_action_rng_state(action_rng_state)
        self.states[k] = state  # in place: the source reads this list
        self.source.refill(k)

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
                for state, rng in zip(self.states, group.action_rng_states):
                    if state.action_generator is None:  # where the module's generator stands for this seed
                        state.set_action_rng_state(rng)
            elif self.members > 1:
                raise ValueError(f"data.num_seeds={self.members} needs a model of as many seeds (model.seeds {self.seeds})")
            self.source = self.make_source(module.network, self.trainer)
            self.source.phases = getattr(self.trainer.lightning_module, "ppg_phases", None)
            if self.source.phases is not None:  # a small phase buffer joins this rank's resume state
                self.source.phases.attach(self)
            self._apply_pending_queue()
            self._apply_pending_resume()
        return self.source

    def make_source(self, network: torch.nn.Module, trainer=None) -> RolloutSource:
        """A rollout source over this data module's config, states and progress (a group's when
        ``data.num_seeds`` > 1; `train_dataloader` builds the Trainer's, with its placement)."""
        kind = SeedGroupSource if self.config.members > 1 else RolloutSource
        return kind(self.config, self.states, network, self.progress, trainer)

    def iteration_metrics(self) -> dict[str, float]:
        """Per-iteration figures for logging (called at the end of the iteration); the episode and
        advantage figures are each member's own (`PerMember`)."""
        out = {"frames": float(self.frames), "iteration": float(self.iteration)}
        states = self.states
        out.update({"episodes": PerMember(float(st.episodes.count) for st in states),
                    "episode/return_mean20": PerMember(st.episodes.mean_return(20) for st in states),
                    "episode/return_mean100": PerMember(st.episodes.mean_return(100) for st in states),  # the PPO paper's score
                    "episode/length_mean20": PerMember(st.episodes.mean_length(20) for st in states),
                    "advantage/std_estimate": PerMember(st.advantage_moments.std for st in states)})
        if is_procgen(self.env_id):  # Procgen's per-game normalized return next to the raw one
            from ppo_lightning.envs.procgen_scores import normalized_return

            game, mode = self.env_id[len(PROCGEN_PREFIX):], self.env_kwargs.get("distribution_mode", "hard")
            out["episode/normalized_return_mean20"] = PerMember(
                normalized_return(game, mode, r) for r in out["episode/return_mean20"])
        if self.source is not None:
            out.update(self.source.last_timing)
        if self.progress.started is not None:
            out["time/iteration_s"] = time.perf_counter() - self.progress.started
            # Everything that is not collection or GAE: minibatch forward/backward/step, callbacks.
            out["time/update_s"] = out["time/iteration_s"] - sum(
                out.get(k, 0.0) for k in ("time/rollout_s", "time/gae_s")
            )
        return {k: v for k, v in out.items() if isinstance(v, PerMember) or not math.isnan(v)}  # NaN members: `name_members`

    def state_dict(self) -> dict[str, Any]:
        """Rank 0's state, plus every rank's own under ``per_rank`` (gathered: all ranks call this)."""
        local = self._local_state_dict()
        shared = {k: local[k] for k in ("frames", "iteration")}  # the same on every rank
        return {**shared, "per_rank": resume_state.gather_rank_states(local)}

    def _local_state_dict(self) -> dict[str, Any]:
        return {
            "frames": self.frames,
            "iteration": self.iteration,
            **self.states[0].run_state_dict(),  # a group's members: under resume["seed_group"]
            "staleness_queue": self.source.stale.state_dict()
            if self.source is not None and self.source.stale is not None
            else self._pending_queue_state,
            "resume": resume_state.capture(self.source, self.resume_providers, self._pending_resume),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "per_rank" in state:  # this rank's own normalizers, queue, envs and RNGs
            trainer = getattr(self, "trainer", None)
            state = resume_state.select_rank_state(state["per_rank"], trainer.global_rank if trainer else 0,
                                                   self.elastic_resume)
        self.progress.frames, self.progress.iteration = state["frames"], state["iteration"]
        self.states[0].load_run_state_dict(state)  # a group's members: by the source, from resume["seed_group"]
        queue = state.get("staleness_queue")
        if queue is not None and self.staleness == 0:
            raise faults.CheckpointError(f"checkpoint has a staleness queue (data.staleness={queue['staleness']}); the config has data.staleness=0")
        self._pending_queue_state = queue  # applied now, or when the rollout source is built
        self._apply_pending_queue()
        self._pending_resume = state.get("resume")
        self._apply_pending_resume()

    def _apply_pending_resume(self) -> None:
        if self._pending_resume is not None and self.source is not None:
            resume_state.apply(self.source, self.resume_providers, self._pending_resume)
            self._pending_resume = None

    def _apply_pending_queue(self) -> None:
        if self._pending_queue_state is not None and self.source is not None and self.source.stale is not None:
            self.source.stale.load_state_dict(self._pending_queue_state)
            self._pending_queue_state = None

    def teardown(self, stage: str) -> None:
        if self.source is not None:
            self.source.shutdown()
            self.source = None
