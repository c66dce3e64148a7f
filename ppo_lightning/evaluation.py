"""Generalization evaluation: the training policy on held-out Procgen levels, logged next to the
training levels (Cobbe et al. 2020: train on ``num_levels`` levels, test on the full distribution).

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
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from lightning.pytorch import Callback

from ppo_lightning.envs import PROCGEN_PREFIX, is_procgen, make_env
from ppo_lightning.models import make_distribution


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
        self.history: list[dict[str, float]] = []

    # ------------------------------------------------------------------ env specs
    def split_kwargs(self, dm) -> dict[str, dict[str, Any]]:
        """Env keyword arguments of each split ("test", and "train" when enabled)."""
        train = dict(dm.env_kwargs)
        test = dict(train)
        if is_procgen(dm.env_id):  # other envs: the same env, other seeds (plus self.env_kwargs)
            test.update({"num_levels": 0, "start_level": int(train.get("start_level", 0)) + int(train.get("num_levels", 0))})
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
        """The evaluation envs' own state and carried steps (`ppo_lightning.resume_state`), so that a
        resumed run evaluates on the same episodes as the uninterrupted one (rank 0's, as every callback
        state; other ranks' evaluation envs restart)."""
        from ppo_lightning.resume_state import env_state

        return {"envs": {name: env_state(env) for name, env in self.envs.items()},
                "tds": {name: {"data": td.to_dict(), "batch_size": list(td.batch_size)} for name, td in self._tds.items()},
                "history": [dict(h) for h in self.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from tensordict import TensorDict

        from ppo_lightning.resume_state import set_env_state

        self.history = [dict(h) for h in state.get("history", [])]
        for name, env in self.envs.items():  # built in setup, before Lightning restores callbacks
            saved = state.get("envs", {}).get(name)
            if saved is None or not saved["restorable"]:
                continue
            set_env_state(env, saved)
            if name in state.get("tds", {}):
                td = state["tds"][name]
                self._tds[name] = TensorDict(td["data"], batch_size=td["batch_size"])

    def teardown(self, trainer, pl_module, stage: str) -> None:
        for env in self.envs.values():
            env.close()
        self.envs, self._tds = {}, {}

    # ------------------------------------------------------------------ evaluation
    @torch.inference_mode()
    def run_split(self, name: str, network: torch.nn.Module, action_space: dict) -> dict[str, float]:
        """Step one split's envs ``num_steps`` times; returns statistics of the episodes that ended."""
        env = self.envs[name]
        td = self._tds.get(name)
        if td is None:
            td = env.reset()
        returns, lengths = [], []
        for _ in range(self.num_steps):
            dist = make_distribution(action_space, *network.policy(td.get("observation")))
            td.set("action", dist.mode if self.deterministic else dist.sample())
            out, td = env.step_and_maybe_reset(td)
            done = out.get(("next", "done")).reshape(-1)
            if done.any():
                returns += out.get(("next", "episode_reward")).reshape(-1)[done].tolist()
                lengths += out.get(("next", "step_count")).reshape(-1)[done].tolist()
        self._tds[name] = td
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
                    from ppo_lightning.envs.procgen_scores import normalized_return

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
