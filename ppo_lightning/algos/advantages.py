"""Advantages: GAE (TorchRL's), advantage normalization and reward normalization.

Values are computed once, at collection, by the same forward that samples the action (one trunk
pass); GAE then needs V(next obs) only where the next observation is not the following step's
observation: after an episode end (the final observation, bootstrapped on truncation) and at the
last step of the rollout. `next_values` fills exactly those, so TorchRL's `GAE` runs without a
value network and no observation is evaluated twice.
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDictBase
from torch import Tensor
from torchrl.objectives.value import GAE

from ppo_lightning.nets.recurrent import STATE_KEY


def make_gae(gamma: float | Tensor, gae_lambda: float | Tensor, device: torch.device | str = "cpu") -> GAE:
    """TorchRL's GAE on precomputed values; ``done`` cuts the trace, only ``terminated`` drops the
    bootstrap (so truncated episodes bootstrap from V(final observation)). ``gamma`` and ``gae_lambda``
    may be tensors that broadcast to the values (one per member of a group, ``[S, 1, 1, 1]``). The time loop on the CPU
    (faster there for long rollouts), the vectorized form on a GPU (one kernel instead of one per step)."""
    vectorized = torch.device(device).type == "cuda"
    return GAE(gamma=gamma, lmbda=gae_lambda, value_network=None, average_gae=False, vectorized=vectorized)


NEXT_STATE_KEY = ("next", STATE_KEY)  # a recurrent network's state after each step


@torch.no_grad()
def next_values(rollout: TensorDictBase, value_fn, value_key: str = "state_value") -> Tensor:
    """V(next observation) for a rollout shaped [envs, time], reusing the next step's value.

    ``value_fn(obs) -> [..., 1]`` is called on the final observations of ended episodes and of the
    rollout's last step only. A recurrent network's rollout carries the state after every step
    (``("next", "recurrent_state")``): ``value_fn(obs, state)`` then gets the state after the step
    that led to each of those observations (the episode's own, never the reset one).
    """
    value = rollout.get(value_key)
    done = rollout.get(("next", "done")).squeeze(-1)
    nxt = torch.empty_like(value)
    nxt[:, :-1] = value[:, 1:]
    need = done.clone()
    need[:, -1] = True
    next_obs = rollout.get(("next", "observation"))
    if need.any():
        inputs = (next_obs[need],)
        if NEXT_STATE_KEY in rollout.keys(include_nested=True):
            inputs += (rollout.get(NEXT_STATE_KEY)[need],)
        nxt[need] = value_fn(*inputs).to(nxt.dtype)
    return nxt


def ewma_beta_from_span(span: float) -> float:
    """Decay of the advantage-moment EWMA whose window is ``span`` iterations: ``beta = 1 - 1/span``.

    With equal batches, iteration ``t - j`` gets weight ``beta**j`` and the weights sum to
    ``1 / (1 - beta) = span`` iterations' worth of samples: span 1 (beta 0) is per-batch
    normalization, and the paper's rule "multiply the number of iterations over which the advantage
    moments are estimated by c" is ``span -> span * c`` (Hilton et al. 2021, section 4; the
    reference code's ``adv_ewma_decay`` is this beta, 0 = per batch). Not the pandas "span"
    (``beta = 1 - 2/(span + 1)``), whose window is ``(span + 1) / 2`` iterations.
    """
    if span < 1:
        raise ValueError(f"advantage normalization span must be >= 1, got {span}")
    return 1.0 - 1.0 / span


class AdvantageMoments:
    """Advantage mean and variance as EWMA moments over iterations, weighted by sample count.

    Hilton et al. (2021), reference code: ``w = b w + n; s = b s + n mu; q = b q + n (var + mu^2);
    mean = s / w; var = q / w - mean^2``. Span 1 (b = 0) is plain per-batch normalization.
    """

    def __init__(self, span: float = 1.0, eps: float = 1e-8) -> None:
        self.span = float(span)
        self.beta = ewma_beta_from_span(span)
        self.eps = eps
        self.w = self.s = self.q = 0.0
        self.history: list[float] = []  # std estimate per iteration (small-batch diagnostic)
        # (n, mean, var) -> the same over all data-parallel ranks (ppo_lightning.data.parallel); None: this rank's
        self.reduce_moments = None

    def update(self, advantage: Tensor) -> None:
        n = advantage.numel()
        mu = advantage.mean().item() if n else 0.0
        var = advantage.var(unbiased=False).item() if n else 0.0
        if self.reduce_moments is not None:
            n, mu, var = self.reduce_moments(n, mu, var)
        if n == 0:  # nothing to learn from (e.g. no finite advantage)
            return
        b = self.beta
        self.w = b * self.w + n
        self.s = b * self.s + n * mu
        self.q = b * self.q + n * (var + mu * mu)
        self.history.append(self.std)
        del self.history[:-64]

    @property
    def mean(self) -> float:
        return self.s / self.w

    @property
    def var(self) -> float:
        return max(self.q / self.w - self.mean**2, 0.0)

    @property
    def std(self) -> float:
        return math.sqrt(self.var)

    def normalize(self, advantage: Tensor) -> Tensor:
        return (advantage - self.mean) / (self.std + self.eps)

    def state_dict(self) -> dict:
        return {"span": self.span, "w": self.w, "s": self.s, "q": self.q, "history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.w, self.s, self.q, self.history = state["w"], state["s"], state["q"], list(state["history"])


def running_returns(ret: Tensor, reward: Tensor, done: Tensor, gamma: float | Tensor) -> tuple[Tensor, Tensor]:
    """The discounted return of every env along a rollout: ``ret = gamma ret + r_t``, restarting
    after each episode end. ``reward``/``done`` are ``[..., envs, time]``, ``ret`` the returns carried
    in, ``[..., envs]``; ``gamma`` a number or a tensor that broadcasts to ``ret`` (one per seed of a
    group, ``[S, 1]``); returns (the returns at every step, the returns carried out)."""
    returns = torch.empty_like(reward)
    for t in range(reward.shape[-1]):
        ret = ret * gamma + reward[..., t]
        returns[..., t] = ret
        ret = torch.where(done[..., t], torch.zeros_like(ret), ret)
    return returns, ret


class RewardNormalizer:
    """Divide rewards by the running std of the per-env discounted return, then clip.

    As OpenAI baselines' VecNormalize (used by the Procgen / PPG / PPO-EWMA code): per env
    ``ret = gamma ret + r``; the running variance of ``ret`` over all env steps scales the reward;
    ``ret`` restarts at episode ends.
    """

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0, eps: float = 1e-8) -> None:
        self.gamma, self.clip, self.eps = gamma, clip, eps
        self.ret = torch.zeros(num_envs, dtype=torch.float64)
        self.count, self.mean, self.m2 = 1e-4, 0.0, 0.0  # Welford / Chan, as baselines' RunningMeanStd
        self.reduce_moments = None  # as AdvantageMoments.reduce_moments

    @property
    def var(self) -> float:
        return self.m2 / self.count

    def _update_stats(self, x: Tensor) -> None:
        n = x.numel()
        mu, var = x.mean().item(), x.var(unbiased=False).item()
        if self.reduce_moments is not None:
            n, mu, var = self.reduce_moments(n, mu, var)
        delta = mu - self.mean
        total = self.count + n
        self.mean += delta * n / total
        self.m2 += var * n + delta**2 * self.count * n / total
        self.count = total

    @torch.no_grad()
    def __call__(self, reward: Tensor, done: Tensor) -> Tensor:
        """Normalize a rollout's rewards shaped [envs, time, 1] (done likewise); returns a new tensor."""
        r = reward.squeeze(-1).double()
        if self.ret.device != r.device:  # rollouts on a GPU: keep the running return there
            self.ret = self.ret.to(r.device)
        returns, self.ret = running_returns(self.ret, r, done.squeeze(-1), self.gamma)
        self._update_stats(returns)
        return self._scale(r).to(reward.dtype).unsqueeze(-1)

    def _scale(self, r: Tensor) -> Tensor:
        return (r / math.sqrt(self.var + self.eps)).clamp(-self.clip, self.clip)

    @staticmethod
    @torch.no_grad()
    def normalize_stacked(normalizers: list["RewardNormalizer"], reward: Tensor, done: Tensor) -> Tensor:
        """``normalizers[k](reward[k], done[k])`` for every k (the seeds of a vectorized group,
        rewards ``[S, envs, time, 1]``), with one time loop for all: the running returns are
        elementwise, so each seed's values, statistics and output are those of its own call."""
        r = reward.squeeze(-1).double()
        ret0 = torch.stack([nm.ret.to(r.device) for nm in normalizers])
        gammas = [nm.gamma for nm in normalizers]  # members with their own gamma: [S, 1], float64 as each one's
        gamma = gammas[0] if len(set(gammas)) == 1 else torch.tensor(gammas, dtype=torch.float64, device=r.device)[:, None]
        returns, ret = running_returns(ret0, r, done.squeeze(-1), gamma)
        out = torch.empty_like(r)
        for k, nm in enumerate(normalizers):
            nm.ret = ret[k].clone()
            nm._update_stats(returns[k])
            out[k] = nm._scale(r[k])
        return out.to(reward.dtype).unsqueeze(-1)

    def state_dict(self) -> dict:
        return {"ret": self.ret.cpu().clone(), "count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict) -> None:
        self.ret = state["ret"].clone()
        self.count, self.mean, self.m2 = state["count"], state["mean"], state["m2"]
