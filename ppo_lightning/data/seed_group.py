"""The data side of a vectorized seed group (``data.num_seeds`` S > 1): S independent runs in lockstep.

Seed k of a group with ``data.seed`` s is the run a single ``fit`` with seed ``s + k`` would be:
its envs are seeded ``s + k`` (`ppo_lightning.envs.make_env`, as a single run seeds them), its
actions are sampled from its own generator that starts where a single run's global generator
stands when its first rollout begins (after the network's initialization; the module hands these
states over, `ppo_lightning.training.seed_group`), and it has its own reward normalizer, advantage
moments, minibatch shuffling generator and episode window. Rollouts, GAE and minibatches are
per seed, stacked on a leading seed dimension: a minibatch is ``[S, minibatch_size]``.

The policy forward of the collection runs for all seeds at once (the stacked network,
`ppo_lightning.nets.seed_stack`; the loop is `ppo_lightning.data.batched_rollout.BatchedRollout`'s,
a single MinAtar run's too). The collection's bookkeeping (episodes, reward normalization, V(next
observation), GAE), advantage normalization, shuffles and minibatches are
`ppo_lightning.data.source.RolloutSource`'s over the seeds' states. Random numbers are drawn per seed, on the seed's own generators;
statistics are kept per seed with the single run's code (`next_values`, `EpisodeStats`, the
normalizers' moments). What is elementwise over envs runs once on the seed-major tensors with
each seed's values those of its own call: the sampling's division and argmax (`sample_per_seed`),
the reward normalizers' running returns (`RewardNormalizer.normalize_stacked`) and GAE.

Envs: every family, each member's built and seeded as its single run builds its own, all members
stepped in lockstep by one forward of the stacked network per time step. MinAtar's games step as one
batch (`ppo_lightning.data.batched_rollout`); a gymnasium id (classic control, MuJoCo) is one
gymnasium vector env per member, stepped directly by the same loop
(`ppo_lightning.data.lockstep.VectorGames`); ``procgen:<game>`` (or any env with
``data.batched_rollout: false``) is one TorchRL env per member (`ppo_lightning.data.lockstep.LockstepRollout`).
Observation normalization (inside the network) is per member: member k's normalizer merges its own
rollouts' observations, as alone.

Members with their own hyperparameters (``data.member_seeds``, ``data.member_hparams``): member k
is the single run with seed ``seeds[k]`` and the values ``member_hparams[name][k]``; a seed may
repeat (the same seed under several settings: common random numbers across the settings). The
data side keeps each member's own advantage-normalization span; the model takes the rest
(`ppo_lightning.training.seed_group`).
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from ppo_lightning.adapters.torchrl import carried_step
from ppo_lightning.algos.advantages import make_gae
from ppo_lightning.core import faults
from ppo_lightning.data import resume_state
from ppo_lightning.data.batched_rollout import BatchedRollout, sample_per_seed, supports_batched_rollout  # noqa: F401
from ppo_lightning.data.lockstep import LockstepRollout, vector_games
from ppo_lightning.data.source import RolloutSource, recurrent_value
from ppo_lightning.data.devices import device_env_kwargs
from ppo_lightning.envs import make_env
from ppo_lightning.nets.models import OBS_KEY
from ppo_lightning.nets.obs_norm import update_member_observation_norms



def check_group_trainer(trainer, num_seeds: int, model_seeds: list[int], data_seeds: list[int]) -> None:
    """One-line errors for a seed group on a trainer it cannot run on."""
    if trainer.world_size > 1:
        raise ValueError(f"data.num_seeds={num_seeds} (vectorized seeds) runs on one device; got {trainer.world_size} "
                         f"processes (use one device, or run the seeds as separate data-parallel jobs)")
    if trainer.strategy.root_device.type != "cpu":
        raise ValueError(f"data.num_seeds > 1 (vectorized seeds) runs on the CPU for now, got {trainer.strategy.root_device}")
    if list(model_seeds) != list(data_seeds):
        raise ValueError(f"model.seeds {model_seeds} differ from the data's seeds {data_seeds} (data.seed, data.num_seeds)")


CARRIER_NAMES = {OBS_KEY: "obs"}  # the carried step's entries as a group's resume state names them


class SeedGroupSource(RolloutSource):
    """`RolloutSource` for S seeds: every pass is one iteration of every seed. Its own: what it builds
    (each member's envs, state and action generator, one collector for all), what is per member in
    the collection (a member's value function and observation normalizers) and the seeds' resume
    state; the collection and the iteration are `RolloutSource`'s over ``states`` (each with its
    action generator set)."""

    @property
    def seeds(self) -> list[int]:
        return [st.seed for st in self.states]

    def placement(self, trainer) -> tuple[int, int]:
        return 0, 1  # a group is one process (data parallelism is refused at configuration)

    def make_envs(self) -> list:
        return [self.make_member_env(s) for s in self.seeds]

    def make_collector(self):
        """One rollout of all members' envs, each member's actions on its own generator: MinAtar's games
        stepped as one batch, any other env (gymnasium, MuJoCo, Procgen) as one TorchRL env per member."""
        data = self.config
        generators = [st.action_generator for st in self.states]
        args = (self.envs, self.network, data.action_space, data.frames_per_iteration, generators)
        if data.batched_rollout and supports_batched_rollout(self.env, self.device):  # MinAtar
            return BatchedRollout(*args)
        if data.batched_rollout and vector_games(self.env) is not None:  # gymnasium, stepped without TorchRL's wrapper
            return BatchedRollout(*args, games=vector_games)
        return LockstepRollout(*args)  # Procgen (or data.batched_rollout false): TorchRL's env step per member

    def make_member_env(self, seed: int):
        """A member's envs, built and seeded as its single run's (`ppo_lightning.data.source.RolloutSource`)."""
        data = self.config
        return make_env(data.env_id, data.num_envs, seed, device_env_kwargs(data.env_id, data.env_kwargs, self.device),
                        timeout_s=data.env_timeout_s)

    def refill(self, k: int) -> None:
        """Member k starts again as the single run of its new state ``states[k]`` (its seed, fresh
        statistics and action generator, set by the data module) with its settings in
        ``data.member_hparams`` (a tuning group's refilled slot; the module side:
        `ppo_lightning.training.seed_group.SeedGroup.refill`): fresh envs seeded and reset as that
        run's; GAE takes the members' gammas and lambdas again."""
        rollout, st = self.collector, self.states[k]
        try:
            self.envs[k].close()
        except Exception:  # noqa: BLE001 - an env that cannot close is dropped all the same
            pass
        self.envs[k] = self.make_member_env(st.seed)
        self.env = self.envs[0]
        rollout.reset_member(k, self.envs[k], st.action_generator)  # the carried step of a fresh run
        if self._pending_observations is not None:  # a fresh run's normalizer has seen nothing yet
            self._pending_observations[k] = self._pending_observations[k][:0]
        self.gae = self.make_gae()

    def make_gae(self):
        """GAE for the stacked ``[S, envs, time, 1]`` tensors: members with their own gamma or lambda get
        them as ``[S, 1, 1, 1]`` tensors (elementwise: each member's values those of its own GAE)."""
        gamma, lmbda = self.config.member_values("gamma"), self.config.member_values("gae_lambda")
        if len(set(gamma)) == 1 and len(set(lmbda)) == 1:
            return make_gae(gamma[0], lmbda[0], self.device)
        return make_gae(torch.tensor(gamma).view(-1, 1, 1, 1), torch.tensor(lmbda).view(-1, 1, 1, 1), self.device)

    # ---------------------------------------------------------------- per member (the collection: RolloutSource.rollouts)
    def collect_members(self) -> list[TensorDictBase]:
        return self.collector.rollouts()

    def member_value(self, k: int):
        if self.recurrent:  # member k's network alone, one step (`ppo_lightning.data.source.recurrent_value`)
            return recurrent_value(lambda *x: self.network.call_seed(k, "step", *x))
        return lambda x: self.network.value_of_seed(k, x)

    def update_observation_norms(self, observations: list[torch.Tensor]) -> None:
        update_member_observation_norms(self.network, observations)

    # ---------------------------------------------------------------- state
    def resume_state(self) -> dict[str, Any]:
        envs = [resume_state.env_state(env) for env in self.envs]
        carrier = carried_step(self.collector)  # [S, n]: each seed's carried step (its observation saved as "obs")
        carriers = [{CARRIER_NAMES.get(k, k): v[s].clone() for k, v in carrier.items()} for s in range(len(self.envs))]
        return {"seed_group": {"seeds": [st.state_dict() for st in self.states], "envs": envs, "carriers": carriers,
                               # each member's observations its normalizer merges before the next rollout
                               "pending_observations": self._pending_observations}}

    def load_resume_state(self, state: dict[str, Any]) -> None:
        state = state.get("seed_group")
        if state is None:
            return
        if len(state["seeds"]) != len(self.states):
            raise faults.CheckpointError(f"the checkpoint holds a group of {len(state['seeds'])} seeds; the config has "
                                         f"data.num_seeds={len(self.states)}")
        for st, s in zip(self.states, state["seeds"]):
            st.load_state_dict(s)
        if state.get("pending_observations") is not None:
            self._pending_observations = list(state["pending_observations"])
        if all(e["restorable"] for e in state["envs"]):
            for env, e in zip(self.envs, state["envs"]):
                resume_state.set_env_state(env, e)
            carrier = carried_step(self.collector)
            for s, saved in enumerate(state["carriers"]):
                for k, v in saved.items():
                    carrier.get(OBS_KEY if k == "obs" else k)[s] = v
