"""The floor of a vectorized seed group's iteration in eager PyTorch on this core (small batches).

    python benchmarks/eager_floor.py [--seeds 8] [--rounds 3]

What any eager-PyTorch implementation of `benchmarks/small_batch.py`'s configuration must at least
spend per iteration, measured with nothing of this project's framework around it:

- update: the stacked MinAtar CNN for S seeds (`ppo_lightning.nets.minatar_stacked`, the fastest
  layout measured), a bare PPO loss (log-softmax, ratio, clipped surrogate, value MSE, entropy;
  no advantage normalization, diagnostics, guard, EWMA or Lightning), backward, fused Adam, on
  random minibatches already in memory: 24 gradient steps (3 epochs x 8 minibatches);
- rollout: 64 vector steps of the S x 64/c MinAtar Breakout games stepped in one Python loop (the
  games' own ``act`` and ``state`` only) plus the stacked policy's forward and a categorical sample
  per step; no GAE, normalizers or buffers.

frames/s at the floor = S x 4096 frames / (rollout + update), CPU clock, one thread. A target
above it cannot be reached by cutting overhead: the remaining time is the games and the
arithmetic as eager PyTorch dispatches it. Prints one JSON line per (c, round).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# the repository root first; not this folder, whose minatar.py (a benchmark) would shadow the minatar package
sys.path[:] = [str(HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() != HERE]
import numpy as np  # noqa: E402
import torch  # noqa: E402

from ppo_lightning.envs.minatar_env import _minatar  # noqa: E402
from ppo_lightning.nets.minatar_cnn import MinAtarActorCritic  # noqa: E402
from ppo_lightning.nets.seed_stack import SeedStack  # noqa: E402

STEPS, EPOCHS, MINIBATCHES, BASE_ENVS = 64, 3, 8, 64


def cpu() -> float:
    return time.process_time()


def cpu_ms_per_call(fn, calls: int, warmup: int = 5) -> float:
    """CPU milliseconds per call of ``fn`` after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    t0 = cpu()
    for _ in range(calls):
        fn()
    return 1e3 * (cpu() - t0) / calls


def make_net(S: int, channels: int, actions: int) -> SeedStack:
    nets = []
    for s in range(S):
        torch.manual_seed(s)
        nets.append(MinAtarActorCritic({"shape": [10, 10, channels]}, {"type": "discrete", "n": actions}))
    return SeedStack(nets)


def update_ms(net: SeedStack, S: int, B: int, channels: int, actions: int, steps: int) -> float:
    """CPU ms per bare gradient step of S seeds x B samples."""
    opt = torch.optim.Adam(net.parameters(), lr=1e-4, eps=1e-5, fused=True)
    obs = torch.rand(S, B, 10, 10, channels) < 0.1
    act = torch.randint(actions, (S, B))
    old_logp = torch.full((S, B), -math.log(actions))
    adv, ret = torch.randn(S, B), torch.randn(S, B)

    def step():
        logits, value = net(obs)
        logp_all = torch.log_softmax(logits, -1)
        logp = logp_all.gather(-1, act.unsqueeze(-1)).squeeze(-1)
        ratio = (logp - old_logp).exp()
        pg = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1).mean(-1)
        loss = (pg + 0.5 * ((value.squeeze(-1) - ret) ** 2).mean(-1) - 0.01 * entropy).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return cpu_ms_per_call(step, steps)


def rollout_ms(net: SeedStack, S: int, n: int, channels: int) -> float:
    """CPU ms per bare vector step of S x n Breakout games (policy forward, sample, the games)."""
    minatar = _minatar()
    games = [minatar.Environment("breakout", sticky_action_prob=0.1) for _ in range(S * n)]
    for i, g in enumerate(games):
        g.seed(i)
        g.reset()
    gen = torch.Generator().manual_seed(0)

    def vstep():
        obs = torch.from_numpy(np.stack([g.state() for g in games])).view(S, n, 10, 10, channels)
        with torch.no_grad():
            (logits,) = net.policy(obs)
            a = torch.multinomial(torch.softmax(logits.reshape(S * n, -1), -1), 1, generator=gen).flatten()
        for g, ai in zip(games, a.tolist()):
            _, done = g.act(ai)
            if done:
                g.reset()

    return cpu_ms_per_call(vstep, STEPS)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--scales", default="1,16,64")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    channels, actions = 4, 6  # Breakout's planes; the benchmark's action count
    S = args.seeds
    net = make_net(S, channels, actions)
    from ppo_lightning.core.hardware import machine_info, machine_line  # after the path setup above

    machine = machine_info()
    print(machine_line(machine), flush=True)
    print(f"# load {os.getloadavg()[0]:.2f}, torch {torch.__version__}, S = {S}, fp32, 1 thread", flush=True)
    for r in range(args.rounds):
        for c in (int(x) for x in args.scales.split(",")):
            n = BASE_ENVS // c
            B = n * STEPS // MINIBATCHES
            up = update_ms(net, S, B, channels, actions, steps=24 if c == 1 else 96)
            ro = rollout_ms(net, S, n, channels)
            it_s = (EPOCHS * MINIBATCHES * up + STEPS * ro) / 1e3
            fps = S * n * STEPS / it_s
            upd_only = S * n * STEPS / (EPOCHS * MINIBATCHES * up / 1e3)
            print(json.dumps({"round": r, "c": c, "S": S, "B": B, "step_ms": round(up, 2), "vector_step_ms": round(ro, 2),
                              "floor_fps": round(fps), "update_only_fps": round(upd_only), "machine": machine}), flush=True)


if __name__ == "__main__":
    main()
