"""Scoring a policy: `evaluate_policy` (N complete episodes, the ``ppo-lightning evaluate`` figures)
and `HeldOutEvaluation`, the training-time generalization check on held-out Procgen levels, logged
next to the training levels (Cobbe et al. 2020: train on ``num_levels`` levels, test on the full
distribution).

`evaluate_policy(policy, env_id, episodes=10, ...)` runs ``episodes`` whole episodes over
``num_envs`` envs; like Stable-Baselines3's ``evaluate_policy``, env i contributes exactly
``(episodes + i) // num_envs`` episodes, so short episodes are not over-represented. It returns the
mean, std (population), min and max return, the mean length, the returns themselves and, for
Procgen, the normalized return; ``video=PATH`` also records env 0's episodes as an MP4.

A recurrent policy (`ppo_lightning.nets.recurrent`) carries one state per env: zeros before the
first step, ``network.step(obs, state, is_init)`` at every step, ``is_init`` True for the envs whose
episode starts at this step (every env at the first step, then each env after its ``done``, as in
collection), so the state is zeroed there before the step (`StepState`).

`HeldOutEvaluation` keeps its own env(s), separate from the training rollout, and every
``every_n_iterations`` PPO iterations runs ``num_steps`` steps of the current network, sampling
actions (as the papers do; ``deterministic=True`` takes the mode). The envs persist between
evaluations, so an episode that is still running carries on at the next evaluation and long
episodes are not dropped in favour of short ones. Logged per evaluation, for the episodes that ended
during it (nothing is logged for a split where none did):

    eval/test/return_mean, eval/test/normalized_return_mean, eval/test/length_mean, eval/test/episodes
    eval/train/...  (the same on the training levels, when ``train_levels=True``)

The test levels default to the full distribution (``num_levels=0``) starting at a level seed past the
training ones (``start_level = train start_level + train num_levels``), hence disjoint from them
whenever training uses a finite set. ``history`` keeps every evaluation's figures (with ``frames``).
A recurrent network's state per env persists between evaluations with the envs (and in the callback's
checkpoint state).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from lightning.pytorch import Callback
from tensordict import TensorDict

from ppo_lightning.data.episodes import episode_keys
from ppo_lightning.data.resume_state import env_state, set_env_state
from ppo_lightning.envs import PROCGEN_PREFIX, check_env_id, env_spaces, is_procgen, make_env, make_recordable_env
from ppo_lightning.envs.procgen_scores import normalized_return
from ppo_lightning.interop.video import VideoWriter
from ppo_lightning.nets.models import make_distribution
from ppo_lightning.nets.recurrent import is_recurrent

LEVEL_SPLITS = ("train", "test")


class StepState:
    """The recurrent state of ``num_envs`` envs between steps of ``network.step``.

    ``state`` ``[num_envs, D]`` is the state after the last step (zeros before the first);
    ``is_init`` ``[num_envs]`` bool marks the envs whose next step is an episode's first (all at
    the start; `after` sets it from the step's ``done``), where ``network.step`` zeroes the state
    before the step. A feed-forward network has none (`for_network` returns None)."""

    def __init__(self, state: torch.Tensor, is_init: torch.Tensor) -> None:
        self.state, self.is_init = state, is_init

    @classmethod
    def for_network(cls, network, num_envs: int, device=None) -> "StepState | None":
        if not is_recurrent(network):
            return None
        state = network.initial_state(num_envs, device=device)
        return cls(state, torch.ones(num_envs, dtype=torch.bool, device=device))

    def step(self, network, obs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``network.step`` on ``obs [num_envs, ...]``: the distribution parameters (the value and the
        new state stay here)."""
        *params, _value, self.state = network.step(obs, self.state, self.is_init.to(obs.device))
        return tuple(params)

    def after(self, done: torch.Tensor) -> None:
        """The step's ``done`` (any shape with ``num_envs`` elements): those envs start an episode next."""
        self.is_init = done.reshape(-1).to(self.state.device, torch.bool)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"state": self.state.cpu(), "is_init": self.is_init.cpu()}

    @classmethod
    def from_state_dict(cls, saved: dict[str, torch.Tensor], device=None) -> "StepState":
        return cls(saved["state"].to(device), saved["is_init"].to(device))


def policy_params(network, obs: torch.Tensor, carried: StepState | None) -> tuple[torch.Tensor, ...]:
    """The distribution parameters of ``network`` on ``obs``: ``network.policy(obs)``, or one
    ``network.step`` carrying the recurrent state ``carried``."""
    return network.policy(obs) if carried is None else carried.step(network, obs)


def procgen_level_kwargs(train_kwargs: dict[str, Any], split: str) -> dict[str, Any]:
    """Procgen env kwargs of a level split: ``train`` = the training levels; ``test`` = the full
    distribution (``num_levels=0``) from the first level seed past the training ones."""
    if split not in LEVEL_SPLITS:
        raise ValueError(f"levels must be one of {LEVEL_SPLITS}, got {split!r}")
    out = dict(train_kwargs)
    if split == "test":
        out.update({"num_levels": 0, "start_level": int(train_kwargs.get("start_level", 0)) + int(train_kwargs.get("num_levels", 0))})
    return out


class HeldOutEvaluation(Callback):
    """Evaluate the policy on held-out levels (and, optionally, the training levels) periodically.

    Args:
        every_n_iterations: evaluate after every n-th PPO iteration (and after the first one).
        num_envs, num_steps: each evaluation steps ``num_envs`` envs ``num_steps`` times.
        env_kwargs: test env keyword arguments; merged over the training ``env_kwargs`` with
            ``num_levels=0`` and a ``start_level`` past the training levels (see module doc).
        train_levels: also evaluate, with the same protocol, on the training levels.
        deterministic: act with the distribution's mode instead of sampling.
        seed: seed of the evaluation envs (offset from the data seed by default).
    """

    def __init__(
        self,
        every_n_iterations: int = 10,
        num_envs: int = 64,
        num_steps: int = 256,
        env_kwargs: dict[str, Any] | None = None,
        train_levels: bool = True,
        deterministic: bool = False,
        seed: int | None = None,
    ) -> None:
        if every_n_iterations <= 0 or num_envs <= 0 or num_steps <= 0:
            raise ValueError("HeldOutEvaluation: every_n_iterations, num_envs and num_steps must be positive")
        self.every_n_iterations = every_n_iterations
        self.num_envs, self.num_steps = num_envs, num_steps
        self.env_kwargs = dict(env_kwargs or {})
        self.train_levels = train_levels
        self.deterministic = deterministic
        self.seed = seed
        self.envs: dict[str, Any] = {}
        self._tds: dict[str, Any] = {}
        self._states: dict[str, StepState] = {}  # a recurrent network's state per env, by split
        self.history: list[dict[str, float]] = []

    # ------------------------------------------------------------------ env specs
    def split_kwargs(self, dm) -> dict[str, dict[str, Any]]:
        """Env keyword arguments of each split ("test", and "train" when enabled)."""
        train = dict(dm.env_kwargs)
        # other envs than Procgen: the same env, other seeds (plus self.env_kwargs)
        test = procgen_level_kwargs(train, "test") if is_procgen(dm.env_id) else dict(train)
        test.update(self.env_kwargs)
        if is_procgen(dm.env_id) and train.get("num_levels", 0) and test.get("num_levels", 0) == 0:
            lo, hi = int(train.get("start_level", 0)), int(train.get("start_level", 0)) + int(train["num_levels"])
            if lo <= int(test["start_level"]) < hi:
                raise ValueError(
                    f"HeldOutEvaluation: test start_level {test['start_level']} lies inside the training levels [{lo}, {hi})"
                )
        splits = {"test": test}
        if self.train_levels:
            splits["train"] = train
        return splits

    def setup(self, trainer, pl_module, stage: str) -> None:
        dm = trainer.datamodule
        if dm is None or stage != "fit" or self.envs:
            return
        base_seed = (self.seed if self.seed is not None else dm.seed + 10_000) + 1_000 * trainer.global_rank
        for i, (name, kwargs) in enumerate(self.split_kwargs(dm).items()):
            self.envs[name] = make_env(dm.env_id, self.num_envs, base_seed + i, kwargs)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """The evaluation envs' own state and carried steps (`ppo_lightning.data.resume_state`), so that a
        resumed run evaluates on the same episodes as the uninterrupted one (rank 0's, as every callback
        state; other ranks' evaluation envs restart)."""
        return {"envs": {name: env_state(env) for name, env in self.envs.items()},
                "tds": {name: {"data": td.to_dict(), "batch_size": list(td.batch_size)} for name, td in self._tds.items()},
                "states": {name: carried.state_dict() for name, carried in self._states.items()},
                "history": [dict(h) for h in self.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = [dict(h) for h in state.get("history", [])]
        for name, env in self.envs.items():  # built in setup, before Lightning restores callbacks
            saved = state.get("envs", {}).get(name)
            if saved is None or not saved["restorable"]:
                continue
            set_env_state(env, saved)
            if name in state.get("tds", {}):
                td = state["tds"][name]
                self._tds[name] = TensorDict(td["data"], batch_size=td["batch_size"])
            if name in state.get("states", {}):
                self._states[name] = StepState.from_state_dict(state["states"][name])

    def teardown(self, trainer, pl_module, stage: str) -> None:
        for env in self.envs.values():
            env.close()
        self.envs, self._tds, self._states = {}, {}, {}

    # ------------------------------------------------------------------ evaluation
    @torch.inference_mode()
    def run_split(self, name: str, network: torch.nn.Module, action_space: dict) -> dict[str, float]:
        """Step one split's envs ``num_steps`` times; returns statistics of the episodes that ended."""
        env = self.envs[name]
        device = next(network.parameters()).device
        td = self._tds.get(name)
        carried = self._states.get(name)
        if td is None:
            td, carried = env.reset(), None
        if carried is None:  # zeros, every env starting an episode
            carried = StepState.for_network(network, td.batch_size.numel(), device)
        else:
            carried = StepState(carried.state.to(device), carried.is_init.to(device))
        returns, lengths = [], []
        for _ in range(self.num_steps):
            obs = td.get("observation").to(device, non_blocking=True)  # envs on the CPU, network anywhere
            dist = make_distribution(action_space, *policy_params(network, obs, carried))
            td.set("action", (dist.mode if self.deterministic else dist.sample()).cpu())
            out, td = env.step_and_maybe_reset(td)
            if carried is not None:
                carried.after(out.get(("next", "done")))
            ended, ret_key, len_key = episode_keys(out.get("next"))  # whole games for Atari
            done = out.get(("next", ended)).reshape(-1)
            if done.any():
                returns += out.get(("next", ret_key)).reshape(-1)[done].tolist()
                lengths += out.get(("next", len_key)).reshape(-1)[done].tolist()
        self._tds[name] = td
        if carried is not None:
            self._states[name] = carried
        if not returns:
            return {"episodes": 0.0}
        return {
            "episodes": float(len(returns)),
            "return_mean": sum(returns) / len(returns),
            "length_mean": sum(lengths) / len(lengths),
        }

    def evaluate(self, trainer, pl_module) -> dict[str, float]:
        """Run every split now; returns the metrics (``eval/<split>/<name>``)."""
        dm = trainer.datamodule
        network = pl_module.network
        was_training = network.training
        network.eval()
        t0 = time.perf_counter()
        metrics: dict[str, float] = {}
        try:
            for name, kwargs in self.split_kwargs(dm).items():
                stats = self.run_split(name, network, dm.action_space)
                if "return_mean" in stats and is_procgen(dm.env_id):
                    game = dm.env_id[len(PROCGEN_PREFIX):]
                    stats["normalized_return_mean"] = normalized_return(
                        game, kwargs.get("distribution_mode", "hard"), stats["return_mean"]
                    )
                metrics.update({f"eval/{name}/{k}": v for k, v in stats.items()})
        finally:
            network.train(was_training)
        metrics["time/eval_s"] = time.perf_counter() - t0
        return metrics

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        dm = trainer.datamodule
        if dm is None or not self.envs:
            return
        if dm.iteration != 1 and dm.iteration % self.every_n_iterations:
            return
        metrics = self.evaluate(trainer, pl_module)
        self.history.append({"iteration": float(dm.iteration), "frames": float(dm.frames), **metrics})
        metrics = {k: v for k, v in metrics.items() if not math.isnan(v)}
        if hasattr(pl_module, "record_metrics"):  # published with the iteration's other metrics
            pl_module.record_metrics(metrics)
        else:
            pl_module.log_dict(metrics, on_step=False, on_epoch=True)


# ---------------------------------------------------------------------------------------- evaluate_policy
def resolve_env(training_env: dict[str, Any], env_id: str | None, levels: str) -> tuple[str, dict[str, Any]]:
    """(env id, env kwargs) to evaluate on: the training env (or ``env_id``), Procgen levels split."""
    train_id = training_env.get("env_id")
    target = env_id or train_id
    if not target:
        raise ValueError("the source does not name its training environment: pass --env ID")
    # the training env's settings; for another Procgen game too (mode, level split)
    same_family = target == train_id or (is_procgen(target) and is_procgen(str(train_id or "")))
    kwargs = dict(training_env.get("env_kwargs") or {}) if same_family else {}
    check_env_id(target)
    if is_procgen(target):
        kwargs = procgen_level_kwargs(kwargs, levels)
    return target, kwargs


class GroupMember:
    """Member ``k`` of a group's stacked recurrent network (`ppo_lightning.nets.seed_stack.SeedStack`,
    whose inputs carry a leading members dimension) as one network: ``step``, ``policy`` and the state
    of that member alone (``call_seed``). A recurrent group's training video plays member 0."""

    recurrent = True

    def __init__(self, stack: torch.nn.Module, k: int = 0) -> None:
        self.stack, self.k = stack, k
        self.action_space = getattr(stack, "action_space", None)
        self.state_size = stack.state_size

    def initial_state(self, *batch_shape: int, device=None) -> torch.Tensor:
        return torch.zeros((*batch_shape, self.state_size), dtype=torch.float32, device=device)

    def step(self, obs: torch.Tensor, state: torch.Tensor, is_init: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.stack.call_seed(self.k, "step", obs, state, is_init)

    @property
    def training(self) -> bool:
        return self.stack.training

    def eval(self) -> "GroupMember":
        self.stack.eval()
        return self

    def train(self, mode: bool = True) -> "GroupMember":
        self.stack.train(mode)
        return self


def _policy_parts(policy) -> tuple[Any, dict | None]:
    """(object with ``.policy(obs)`` (``.step`` if recurrent) or a plain callable, action space or None)
    of anything we accept: a `PPOLightningModule`, an actor-critic network, an exported Hugging Face
    model, or a callable ``obs -> action``. A group's stacked recurrent network: its member 0
    (`GroupMember`)."""
    network = getattr(policy, "network", None)
    if isinstance(network, torch.nn.Module) and hasattr(network, "policy"):  # the LightningModule
        hparams = getattr(policy, "hparams", {}) or {}
        space = hparams.get("action_space") or getattr(network, "action_space", None)
        return (GroupMember(network) if _stacked_recurrent(network) else network), space
    if _stacked_recurrent(policy):
        return GroupMember(policy), dict(policy.action_space)
    config = getattr(policy, "config", None)
    if hasattr(policy, "policy") and getattr(config, "action_space", None) is not None:  # transformers model
        return policy, dict(config.action_space)
    if hasattr(policy, "policy") and getattr(policy, "action_space", None) is not None:
        return policy, dict(policy.action_space)
    if callable(policy):
        return policy, None
    raise TypeError(f"evaluate_policy: cannot act with a {type(policy).__name__} (give a network, a module or a callable obs -> action)")


def _stacked_recurrent(network) -> bool:
    return is_recurrent(network) and hasattr(network, "call_seed")


def _check_action_space(env_id: str, net_space: dict | None, env_space: dict) -> None:
    if net_space is None:
        return
    if net_space.get("type") != env_space.get("type") or (
        net_space.get("type") == "discrete" and int(net_space["n"]) != int(env_space["n"])
    ) or (net_space.get("type") == "continuous" and list(net_space["shape"]) != list(env_space["shape"])) or (
        net_space.get("type") == "composite" and net_space.get("space") != env_space.get("space")
    ):
        raise ValueError(f"env {env_id} has action space {env_space}, the policy acts in {net_space}")


def evaluate_policy(
    policy,
    env_id: str,
    episodes: int = 10,
    deterministic: bool = False,
    env_kwargs: dict[str, Any] | None = None,
    seed: int = 0,
    num_envs: int | None = None,
    video: str | None = None,
    video_episodes: int = 1,
    fps: int = 30,
) -> dict[str, Any]:
    """Run ``episodes`` complete episodes of ``policy`` on ``env_id``; returns their figures.

    ``policy``: a `PPOLightningModule`, an actor-critic (``load_pretrained``), an exported model
    (``AutoModel.from_pretrained``) or a callable ``obs -> action``; a recurrent one carries its state
    per env, reset where an episode ends (`StepState`). ``deterministic`` acts with the
    distribution's mode. ``num_envs`` (default ``min(episodes, 16)``) envs run in one vector env
    seeded with ``seed``, which also seeds the action sampling (the same seed gives the same
    figures). ``video``: an MP4 path; env 0's first ``video_episodes`` episodes are recorded
    (rendered frames; Procgen: the observations). Raises ValueError with one line for bad input
    (no episodes, an env whose spaces do not fit the policy).
    """
    if not isinstance(episodes, int) or episodes <= 0:
        raise ValueError(f"episodes must be a positive integer, got {episodes!r}")
    num_envs = min(episodes, 16) if num_envs is None else num_envs
    if not isinstance(num_envs, int) or num_envs <= 0:
        raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
    if video is not None and video_episodes <= 0:
        raise ValueError(f"video_episodes must be a positive integer, got {video_episodes!r}")
    actor, action_space = _policy_parts(policy)
    env_kwargs = dict(env_kwargs or {})
    env_obs_space, env_action_space = env_spaces(env_id, env_kwargs)
    _check_action_space(env_id, action_space, env_action_space)
    if video is not None:
        env, frame_fn = make_recordable_env(env_id, num_envs, seed, env_kwargs)
    else:
        env, frame_fn = make_env(env_id, num_envs, seed, env_kwargs), None
    targets = [(episodes + i) // num_envs for i in range(num_envs)]
    counts = [0] * num_envs
    returns: list[float] = []
    lengths: list[int] = []
    writer = None
    if video is not None:
        writer = VideoWriter(video, fps=fps)
    recording, video_done = video is not None, 0
    was_training = getattr(actor, "training", None)
    if was_training:
        actor.eval()

    def record(td) -> None:
        writer.write(frame_fn() if frame_fn is not None else td.get("observation")[0].cpu().numpy())

    try:
        # sampled actions reproducible for a given seed, without touching the caller's RNG
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            torch.manual_seed(seed)
            td = env.reset()
            carried = None if action_space is None else StepState.for_network(actor, num_envs)
            if recording:
                record(td)
            while any(c < t for c, t in zip(counts, targets)):
                obs = td.get("observation")
                try:
                    if action_space is None:
                        action = actor(obs)
                    else:
                        params = [p.float() for p in policy_params(actor, obs, carried)]
                        dist = make_distribution(action_space, *params)
                        action = dist.mode if deterministic else dist.sample()
                except RuntimeError as err:
                    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                    raise ValueError(
                        f"env {env_id} gives observations of shape {list(env_obs_space['shape'])} that the policy "
                        f"cannot read ({first})"
                    ) from None
                td.set("action", action)
                out, td = env.step_and_maybe_reset(td)
                if carried is not None:  # the training episodes' ends (Atari: a life lost), as in collection
                    carried.after(out.get(("next", "done")))
                ended, ret_key, len_key = episode_keys(out.get("next"))  # whole games for Atari
                done = out.get(("next", ended)).reshape(-1).tolist()
                if any(done):
                    ep_ret = out.get(("next", ret_key)).reshape(-1).tolist()
                    ep_len = out.get(("next", len_key)).reshape(-1).tolist()
                    for i, d in enumerate(done):
                        if d and counts[i] < targets[i]:
                            counts[i] += 1
                            returns.append(float(ep_ret[i]))
                            lengths.append(int(ep_len[i]))
                    video_done += int(done[0])
                    if recording and video_done >= video_episodes:
                        recording = False
                if recording:
                    record(td)
    finally:
        env.close()
        if writer is not None:
            writer.close()
        if was_training:
            actor.train()
    n = len(returns)
    mean = sum(returns) / n
    result: dict[str, Any] = {
        "env_id": env_id,
        "episodes": n,
        "mean_return": mean,
        "std_return": math.sqrt(sum((r - mean) ** 2 for r in returns) / n),
        "min_return": min(returns),
        "max_return": max(returns),
        "mean_length": sum(lengths) / n,
        "deterministic": bool(deterministic),
        "seed": seed,
        "num_envs": num_envs,
        "returns": returns,
        "lengths": lengths,
    }
    if is_procgen(env_id):
        game, mode = env_id[len(PROCGEN_PREFIX):], env_kwargs.get("distribution_mode", "hard")
        result["normalized_return_mean"] = normalized_return(game, mode, mean)
    if writer is not None and writer.frames:
        result["video"] = str(writer.path)
        result["video_frames"] = writer.frames
    return result


def format_result(result: dict[str, Any]) -> str:
    """One readable line per figure, as ``ppo-lightning evaluate`` prints them."""
    lines = [
        f"{result['env_id']}: {result['episodes']} episodes ({'deterministic' if result['deterministic'] else 'sampled'} actions, seed {result['seed']})",
        f"  return  mean {result['mean_return']:.2f}  std {result['std_return']:.2f}  "
        f"min {result['min_return']:.2f}  max {result['max_return']:.2f}",
        f"  length  mean {result['mean_length']:.1f}",
    ]
    if "normalized_return_mean" in result:
        lines.append(f"  normalized return  mean {result['normalized_return_mean']:.3f}")
    if "video" in result:
        lines.append(f"  video: {result['video']} ({result['video_frames']} frames)")
    return "\n".join(lines)
