"""The data side of a vectorized seed group (``data.num_seeds`` S > 1): S independent runs in lockstep.

Seed k of a group with ``data.seed`` s is the run a single ``fit`` with seed ``s + k`` would be:
its envs are seeded ``s + k`` (`ppo_lightning.envs.make_env`, as a single run seeds them), its
actions are sampled from its own generator that starts where a single run's global generator
stands when its first rollout begins (after the network's initialization; the module hands these
states over, `ppo_lightning.training.seed_group`), and it has its own reward normalizer, advantage
moments, minibatch shuffling generator and episode window. Rollouts, GAE and minibatches are
per seed, stacked on a leading seed dimension: a minibatch is ``[S, minibatch_size]``.

The policy forward of the collection runs for all seeds at once (the stacked network,
`ppo_lightning.nets.seed_stack`). Random numbers are drawn per seed, on the seed's own generators;
statistics are kept per seed with the single run's code (`next_values`, `EpisodeStats`, the
normalizers' moments). What is elementwise over envs runs once on the seed-major tensors with
each seed's values those of its own call: the sampling's division and argmax (`sample_per_seed`),
the reward normalizers' running returns (`RewardNormalizer.normalize_stacked`) and GAE.

Envs: those that step as one batch (MinAtar; `ppo_lightning.data.batched_rollout`).

Members with their own hyperparameters (``data.member_seeds``, ``data.member_hparams``): member k
is the single run with seed ``seeds[k]`` and the values ``member_hparams[name][k]``; a seed may
repeat (the same seed under several settings: common random numbers across the settings). The
data side keeps each member's own advantage-normalization span; the model takes the rest
(`ppo_lightning.training.seed_group`).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from ppo_lightning.algos.advantages import AdvantageMoments, RewardNormalizer, make_gae, next_values
from ppo_lightning.core import faults
from ppo_lightning.data import resume_state
from ppo_lightning.data.batched_rollout import supports_batched_rollout
from ppo_lightning.data.devices import rollout_precision
from ppo_lightning.data.episodes import BATCH_KEYS, EpisodeStats
from ppo_lightning.envs import make_env
from ppo_lightning.nets.models import OBS_KEY, VALUE_KEY, dist_param_keys, make_distribution


# Per-member hyperparameters a group can carry: the scalars in which Table 5's ablations of Hilton et
# al. (2021) differ at one batch size (the lr, the EWMA's center of mass - None: the behavior policy
# is the anchor, i.e. PPO - and the advantage-normalization span), Adam's betas (their optional
# scaling rule), and the loss's and the returns' scalars a search usually tunes (clip range, entropy
# and value coefficients, the KL beta's start, gamma and GAE lambda). Everything else is shared.
MEMBER_HPARAMS = ("lr", "proximal_com", "advantage_norm_span", "adam_betas",
                  "clip_eps", "entropy_coef", "value_coef", "kl_beta", "gamma", "gae_lambda")
# the data side's (the rest are the model's): each member's returns and advantages
DATA_MEMBER_HPARAMS = ("advantage_norm_span", "gamma", "gae_lambda")
# a scalar member setting's valid range: (test, what it must be)
_MEMBER_RANGES = {
    "lr": (lambda v: v > 0, "> 0"),
    "proximal_com": (lambda v: v >= 0, ">= 0 or null (the behavior policy as anchor: PPO)"),
    "advantage_norm_span": (lambda v: v >= 1, ">= 1"),
    "clip_eps": (lambda v: v > 0, "> 0"),
    "entropy_coef": (lambda v: v >= 0, ">= 0"),
    "value_coef": (lambda v: v >= 0, ">= 0"),
    "kl_beta": (lambda v: v >= 0, ">= 0"),
    "gamma": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "gae_lambda": (lambda v: 0 <= v <= 1, "in [0, 1]"),
}


def validate_member_hparams(member_hparams: dict[str, list], num_seeds: int) -> None:
    """One-line errors for ``member_hparams`` (``{name: [one value per member]}``)."""
    if num_seeds < 2:
        raise ValueError("member_hparams needs a seed group (data.num_seeds > 1, --seeds, or data.member_seeds)")
    for name, values in member_hparams.items():
        if name not in MEMBER_HPARAMS:
            raise ValueError(f"member_hparams: {name!r} cannot differ between members; choose from {list(MEMBER_HPARAMS)}")
        if not isinstance(values, (list, tuple)) or len(values) != num_seeds:
            raise ValueError(f"member_hparams.{name} needs one value per member ({num_seeds}), got {values!r}")
        for v in values:
            if name == "adam_betas":
                if not (isinstance(v, (list, tuple)) and len(v) == 2 and all(
                        isinstance(b, (int, float)) and not isinstance(b, bool) and 0.0 <= b < 1.0 for b in v)):
                    raise ValueError(f"member_hparams.adam_betas values must be two numbers in [0, 1), got {v!r}")
                continue
            ok = v is None if name == "proximal_com" and v is None else (
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
            test, need = _MEMBER_RANGES[name]
            if not ok or (v is not None and not test(v)):
                raise ValueError(f"member_hparams.{name} values must be {need}, got {v!r}")


def member_values(data, name: str) -> list[float]:
    """Each member's value of a data-side setting (``DATA_MEMBER_HPARAMS``): ``data.member_hparams[name]``,
    else the data module's own value for every member."""
    values = (data.member_hparams or {}).get(name)
    return [float(x) for x in values] if values is not None else [float(getattr(data, name))] * data.num_seeds


def check_group_trainer(trainer, num_seeds: int, model_seeds: list[int], data_seeds: list[int]) -> None:
    """One-line errors for a seed group on a trainer it cannot run on."""
    if trainer.world_size > 1:
        raise ValueError(f"data.num_seeds={num_seeds} (vectorized seeds) runs on one device; got {trainer.world_size} "
                         f"processes (use one device, or run the seeds as separate data-parallel jobs)")
    if trainer.strategy.root_device.type != "cpu":
        raise ValueError(f"data.num_seeds > 1 (vectorized seeds) runs on the CPU for now, got {trainer.strategy.root_device}")
    if trainer.accumulate_grad_batches != 1:
        raise ValueError("data.num_seeds > 1 does not support trainer.accumulate_grad_batches yet")
    if list(model_seeds) != list(data_seeds):
        raise ValueError(f"model.seeds {model_seeds} differ from the data's seeds {data_seeds} (data.seed, data.num_seeds)")


def sample_per_seed(probs: torch.Tensor, generators: list[torch.Generator], noise: torch.Tensor) -> torch.Tensor:
    """``torch.multinomial(probs[k], 1, True, generator=generators[k])`` (what ``Categorical.sample``
    draws) for every seed k at once: actions ``[S, n]`` from probabilities ``[S, n, A]``.

    For one sample, ATen's ``multinomial`` draws ``q ~ Exp(1)`` shaped like the probabilities with
    ``exponential_`` on the generator and takes ``argmax(p / q)`` (Gumbel-max; ``Distributions.cpp``).
    Drawing each seed's ``q`` on its own generator into ``noise`` and dividing and taking the argmax
    once gives the same actions and leaves every generator where the per-seed call leaves it
    (`tests/test_seed_group.py`), at one kernel per seed instead of one multinomial's validation,
    allocation and reductions per seed. Invalid probabilities raise as ``multinomial`` does."""
    if not bool(((probs.max() < float("inf")) & (probs.min() >= 0)).item()):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if bool((probs.sum(-1) == 0).any()):
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    for q, g in zip(noise, generators):
        q.exponential_(1, generator=g)
    return torch.div(probs, noise, out=noise).argmax(-1)


class SeedState:
    """What a single run keeps on its data side, for one seed of a group."""

    def __init__(self, data, seed: int, advantage_norm_span: float | None = None, gamma: float | None = None) -> None:
        self.seed = seed
        self.episodes = EpisodeStats()
        self.advantage_moments = AdvantageMoments(data.advantage_norm_span if advantage_norm_span is None else advantage_norm_span)
        gamma = data.gamma if gamma is None else gamma
        self.reward_normalizer = RewardNormalizer(data.num_envs, gamma) if data.normalize_reward else None
        self.shuffle_generator = torch.Generator().manual_seed(seed)
        self.action_generator = torch.Generator()  # its state comes from the module (set_action_rng_states)

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "episodes": self.episodes.state_dict(),
                "advantage_moments": self.advantage_moments.state_dict(),
                "reward_normalizer": None if self.reward_normalizer is None else self.reward_normalizer.state_dict(),
                "shuffle_generator": self.shuffle_generator.get_state(),
                "action_generator": self.action_generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["seed"] != self.seed:
            raise faults.CheckpointError(f"the checkpoint's seed group has seed {state['seed']} where the config has {self.seed}")
        self.episodes.load_state_dict(state["episodes"])
        self.advantage_moments.load_state_dict(state["advantage_moments"])
        if self.reward_normalizer is not None and state["reward_normalizer"] is not None:
            self.reward_normalizer.load_state_dict(state["reward_normalizer"])
        self.shuffle_generator.set_state(state["shuffle_generator"])
        self.action_generator.set_state(state["action_generator"])


class SeedGroupSource:
    """`RolloutSource` for S seeds: every pass is one iteration of every seed."""

    def __init__(self, data, network: torch.nn.Module, seeds: list[int], action_rng_states: list[torch.Tensor]) -> None:
        self.data, self.network, self.seeds = data, network, list(seeds)
        self.rank, self.world_size = 0, 1
        self.device = torch.device("cpu")
        self.envs = [make_env(data.env_id, data.num_envs, s, data.env_kwargs) for s in self.seeds]
        if not supports_batched_rollout(self.envs[0], self.device):
            raise ValueError(f"data.num_seeds > 1 needs envs that step as one batch (minatar:<game>), got {data.env_id!r}")
        self.env = self.envs[0]
        self.states = [SeedState(data, s, span, g) for s, span, g in
                       zip(self.seeds, member_values(data, "advantage_norm_span"), member_values(data, "gamma"))]
        for st, rng in zip(self.states, action_rng_states):
            st.action_generator.set_state(rng)
        self.param_keys = dist_param_keys(data.action_space)
        self.gae = self.make_gae()
        self.steps = data.rollout_steps
        # The carried step of every seed's envs (as BatchedRollout / the collector keep it).
        self._carriers = []
        for env in self.envs:
            first = env.reset()
            self._carriers.append({"obs": first.get(OBS_KEY).clone(),
                                   "episode_reward": torch.zeros((data.num_envs, 1)),
                                   "step_count": torch.zeros((data.num_envs, 1), dtype=torch.int64)})
        self.last_timing: dict[str, float] = {}
        self.stale = None
        self.phases = None
        self.collector = self  # the data module shuts the source's collector down
        self.is_seed_group = True

    def refill(self, k: int, seed: int, action_rng_state: torch.Tensor) -> None:
        """Member k starts again as the single run with ``seed`` and its settings in
        ``data.member_hparams`` (a tuning group's refilled slot; the module side:
        `ppo_lightning.training.seed_group.SeedGroup.refill`): fresh envs seeded and reset as that run's,
        its reward normalizer, advantage moments, shuffle generator and episode statistics new, its
        action generator at ``action_rng_state``; GAE takes the members' gammas and lambdas again."""
        data = self.data
        self.seeds[k] = seed
        try:
            self.envs[k].close()
        except Exception:  # noqa: BLE001 - an env that cannot close is dropped all the same
            pass
        self.envs[k] = make_env(data.env_id, data.num_envs, seed, data.env_kwargs)
        self.env = self.envs[0]
        st = SeedState(data, seed, member_values(data, "advantage_norm_span")[k], member_values(data, "gamma")[k])
        st.action_generator.set_state(action_rng_state)
        self.states[k] = st  # in place: the data module's group_states is this list
        first = self.envs[k].reset()
        self._carriers[k] = {"obs": first.get(OBS_KEY).clone(), "episode_reward": torch.zeros((data.num_envs, 1)),
                             "step_count": torch.zeros((data.num_envs, 1), dtype=torch.int64)}
        self.gae = self.make_gae()

    def make_gae(self):
        """GAE for the stacked ``[S, envs, time, 1]`` tensors: members with their own gamma or lambda get
        them as ``[S, 1, 1, 1]`` tensors (elementwise: each member's values those of its own GAE)."""
        gamma, lmbda = member_values(self.data, "gamma"), member_values(self.data, "gae_lambda")
        if len(set(gamma)) == 1 and len(set(lmbda)) == 1:
            return make_gae(gamma[0], lmbda[0], self.device)
        return make_gae(torch.tensor(gamma).view(-1, 1, 1, 1), torch.tensor(lmbda).view(-1, 1, 1, 1), self.device)

    def shutdown(self) -> None:
        pass

    def __len__(self) -> int:
        if self.phases is not None:  # PPG: an upper bound, as for a single run
            return self.phases.max_batches_per_iteration(self.data)
        return self.data.update_epochs * self.data.num_minibatches

    # ---------------------------------------------------------------- collection
    @torch.no_grad()
    def _rollouts(self) -> list[TensorDictBase]:
        """One rollout per seed (the batched rollout's keys and values), the policy run for all at once.

        Per time step: one policy forward for all S x n envs, the actions of all seeds at once with
        each seed's noise drawn on its own generator (`sample_per_seed`: as `Categorical.sample` draws),
        the games stepped seed after seed, and the step's records
        written into preallocated time-major buffers (numpy where the data comes from the games);
        episode sums and counters in numpy (the same float32 and int64 arithmetic as the single
        run's torch ops)."""
        S, n, T = len(self.seeds), self.data.num_envs, self.steps
        bases = [env.base_env for env in self.envs]
        obs_np = np.empty((T + 1, S, n, *bases[0].obs_shape), dtype=bool)  # obs_np[t + 1]: after step t's resets
        next_np = np.empty((T, S, n, *bases[0].obs_shape), dtype=bool)  # before them
        reward_np = np.empty((T, S, n), dtype=np.float32)
        term_np, trunc_np = np.empty((T, S, n), dtype=bool), np.empty((T, S, n), dtype=bool)
        ep_np, sc_np = np.empty((T + 1, S, n), dtype=np.float32), np.empty((T + 1, S, n), dtype=np.int64)
        next_ep_np, next_sc_np = np.empty((T, S, n), dtype=np.float32), np.empty((T, S, n), dtype=np.int64)
        obs_np[0] = np.stack([c["obs"].numpy() for c in self._carriers])
        ep_np[0] = np.stack([c["episode_reward"].numpy()[:, 0] for c in self._carriers])
        sc_np[0] = np.stack([c["step_count"].numpy()[:, 0] for c in self._carriers])
        obs_t = torch.from_numpy(obs_np)
        action_buf = torch.empty((T, S, n), dtype=torch.int64)
        logp_buf, value_buf = torch.empty((T, S, n)), torch.empty((T, S, n, 1))
        param_bufs = None
        space, gens = self.data.action_space, [st.action_generator for st in self.states]
        noise = torch.empty((S, n, space["n"])) if space["type"] == "discrete" else None
        for t in range(T):
            *params, value = self.network(obs_t[t])
            if param_bufs is None:
                param_bufs = [torch.empty((T, S, n, *p.shape[2:]), dtype=p.dtype) for p in params]
            for buf, p in zip(param_bufs, params):
                buf[t] = p
            value_buf[t] = value
            dist = make_distribution(space, *params)  # all seeds' distributions [S, n]
            action = sample_per_seed(dist.probs, gens, noise)  # Categorical.sample, each seed on its own generator
            action_buf[t] = action
            logp_buf[t] = dist.log_prob(action)
            for k, (actions, base) in enumerate(zip(action.tolist(), bases)):
                reward_np[t, k], term_np[t, k], trunc_np[t, k] = base.step_games(actions)
                next_np[t, k] = base._obs
            done = term_np[t] | trunc_np[t]
            ep, sc = ep_np[t] + reward_np[t], sc_np[t] + 1  # RewardSum, StepCounter
            next_ep_np[t], next_sc_np[t] = ep, sc
            if done.any():  # partial resets, as the collector asks for them
                for k in np.flatnonzero(done.any(1)):
                    bases[k].reset_games(done[k])
                ep[done], sc[done] = 0.0, 0
                obs_np[t + 1] = np.stack([base._obs for base in bases])
            else:
                obs_np[t + 1] = next_np[t]
            ep_np[t + 1], sc_np[t + 1] = ep, sc
        for k, c in enumerate(self._carriers):
            c.update(obs=torch.from_numpy(obs_np[T, k].copy()), episode_reward=torch.from_numpy(ep_np[T, k, :, None].copy()),
                     step_count=torch.from_numpy(sc_np[T, k, :, None].copy()))

        def seed_major(x, trailing_one=False):  # [T, S, n, ...] -> [S, n, T, ...] contiguous
            x = torch.as_tensor(x)
            x = x.movedim(0, 2).contiguous()
            return x.unsqueeze(-1) if trailing_one else x

        obs_b, next_b = seed_major(obs_np[:T]), seed_major(next_np)
        action_b, logp_b, value_b = seed_major(action_buf), seed_major(logp_buf), seed_major(value_buf)
        params_b = [seed_major(b) for b in param_bufs]
        reward_b, term_b, trunc_b = (seed_major(x, True) for x in (reward_np, term_np, trunc_np))
        ep_b, sc_b = seed_major(ep_np[:T], True), seed_major(sc_np[:T], True)
        next_ep_b, next_sc_b = seed_major(next_ep_np, True), seed_major(next_sc_np, True)
        done_b = term_b | trunc_b
        self._stacked = {"reward": reward_b, "done": done_b, "terminated": term_b, VALUE_KEY: value_b}
        out = []
        for k in range(S):
            zeros = torch.zeros((n, T, 1), dtype=torch.bool)
            out.append(TensorDict(
                {OBS_KEY: obs_b[k], "action": action_b[k], "action_log_prob": logp_b[k], VALUE_KEY: value_b[k],
                 **{key: b[k] for key, b in zip(self.param_keys, params_b)},
                 "done": zeros, "terminated": zeros.clone(), "truncated": zeros.clone(),
                 "episode_reward": ep_b[k], "step_count": sc_b[k],
                 "next": TensorDict({OBS_KEY: next_b[k], "reward": reward_b[k], "done": done_b[k],
                                     "terminated": term_b[k], "truncated": trunc_b[k],
                                     "episode_reward": next_ep_b[k], "step_count": next_sc_b[k]}, batch_size=[n, T])},
                batch_size=[n, T]))
        return out

    @torch.no_grad()
    def collect(self) -> list[TensorDictBase]:
        """Every seed's rollout ``[envs, time]`` with advantages and value targets."""
        data = self.data
        t0 = time.perf_counter()
        was_training = self.network.training
        self.network.eval()
        trainer = getattr(data, "trainer", None)  # the Trainer's precision (bf16-mixed: autocast), as a single run's
        with rollout_precision(trainer):
            rollouts = self._rollouts()
        self.network.train(was_training)
        data.frames += rollouts[0].numel()  # per seed: each seed counts its own frames, as alone
        t1 = time.perf_counter()
        # Per seed as a single run does it: episodes, then reward normalization, then V(next obs), then
        # GAE. The normalizers' time loop and GAE are elementwise over envs, so they run once for all
        # seeds on the seed-major tensors (each seed's values are those of its own call).
        stacked = self._stacked
        for st, rollout in zip(self.states, rollouts):
            st.episodes.add_rollout(rollout)
        if self.states[0].reward_normalizer is not None:
            normalizers = [st.reward_normalizer for st in self.states]
            stacked["reward"] = faults.normalize_rewards_finite(
                lambda r, d: RewardNormalizer.normalize_stacked(normalizers, r, d), stacked["reward"], stacked["done"])
            for k, rollout in enumerate(rollouts):
                rollout.set(("next", "reward"), stacked["reward"][k])
        nxt = []
        for k, rollout in enumerate(rollouts):
            with rollout_precision(trainer):
                nxt.append(next_values(rollout, lambda x, k=k: self.network.value_of_seed(k, x)))
            rollout.set(("next", VALUE_KEY), nxt[k])
        n, T = rollouts[0].shape
        group = TensorDict({VALUE_KEY: stacked[VALUE_KEY],
                            "next": TensorDict({"reward": stacked["reward"], "done": stacked["done"],
                                                "terminated": stacked["terminated"], VALUE_KEY: torch.stack(nxt)},
                                               batch_size=[len(rollouts), n, T])},
                           batch_size=[len(rollouts), n, T])
        self.gae(group)
        for key in (self.gae.tensor_keys.advantage, self.gae.tensor_keys.value_target):
            values = group.get(key)
            for k, rollout in enumerate(rollouts):
                rollout.set(key, values[k])
        t2 = time.perf_counter()
        self.last_timing = {"time/rollout_s": t1 - t0, "time/gae_s": t2 - t1}
        return rollouts

    def prepare(self, rollout: TensorDictBase, st: SeedState) -> TensorDictBase:
        flat = rollout.select(*BATCH_KEYS, *self.param_keys).reshape(-1)
        adv = flat.get("advantage")
        faults.update_moments_finite(st.advantage_moments, adv)
        if self.data.normalize_advantage:
            flat.set("advantage", st.advantage_moments.normalize(adv))
        return flat

    def __iter__(self):
        self.data.iteration_started()
        rollouts = self.collect()
        flats = [self.prepare(r, st) for r, st in zip(rollouts, self.states)]
        if self.phases is not None:  # PPG: value / policy epochs, then maybe the auxiliary phase
            keys = self.phases.stored_keys
            stored = lambda: torch.stack([r.select(*keys).to("cpu") for r in rollouts]).clone()  # noqa: E731
            yield from self.phases.iteration_batches(stored, [st.shuffle_generator for st in self.states],
                                                     lambda e: self._epoch_minibatches(flats, e), self.data)
            return
        yield from self._epoch_minibatches(flats, self.data.update_epochs)

    def _epoch_minibatches(self, flats: list[TensorDictBase], epochs: int):
        """``[S, B]`` minibatches; each seed's epoch shuffle from its own generator, as alone."""
        n = flats[0].shape[0]
        size = n // self.data.num_minibatches
        for _ in range(epochs):
            shuffled = torch.stack([f[torch.randperm(n, generator=st.shuffle_generator)] for f, st in zip(flats, self.states)])
            for i in range(self.data.num_minibatches):
                yield shuffled[:, i * size:(i + 1) * size]

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        envs = [resume_state.env_state(env) for env in self.envs]
        return {"seeds": [st.state_dict() for st in self.states], "envs": envs,
                "carriers": [{k: v.clone() for k, v in c.items()} for c in self._carriers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["seeds"]) != len(self.states):
            raise faults.CheckpointError(f"the checkpoint holds a group of {len(state['seeds'])} seeds; the config has "
                                         f"data.num_seeds={len(self.states)}")
        for st, s in zip(self.states, state["seeds"]):
            st.load_state_dict(s)
        if all(e["restorable"] for e in state["envs"]):
            for env, e in zip(self.envs, state["envs"]):
                resume_state.set_env_state(env, e)
            for c, saved in zip(self._carriers, state["carriers"]):
                c.update({k: v.clone() for k, v in saved.items()})

    def iteration_metrics(self) -> list[dict[str, float]]:
        return [{"episode/return_mean20": st.episodes.mean_return(20),
                 "episode/length_mean20": st.episodes.mean_length(20),
                 "episodes": float(st.episodes.count),
                 "advantage/std_estimate": st.advantage_moments.std} for st in self.states]
