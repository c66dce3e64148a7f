"""Small batches at full speed (issue 18): this project vs a plain-PyTorch PPO loop, MinAtar Breakout.

    python benchmarks/small_batch.py                       # c = 1, 16, 64; S = 1 and 8; 2 interleaved rounds
    python benchmarks/small_batch.py --scales 16 --rounds 3 --iterations 20

For each batch-size factor c (`ppo_lightning/configs/minatar/ppo.yaml --scale c`: 64/c envs x 64 steps,
8 minibatches of 512/c, 3 epochs; c = 64 is 1 env and minibatches of 8) it runs, interleaved in
rounds (project, plain, project, plain, ...: a load change hits both alike), one thread each:

- this project: ``ppo-lightning fit`` in process (no MLflow, no checkpoints), a single run (S = 1) and a
  vectorized group of ``--seeds`` S seeds (``fit --seeds S``; its frames/s count all seeds' frames);
- a plain-PyTorch, CleanRL-style PPO loop written below: the same CNN (conv 16 @ 3x3 + dense 128,
  shared trunk), the same sizes, epochs, clip loss, value and entropy coefficients, Adam, GAE and
  per-batch advantage normalization, on the same MinAtar games stepped in one Python loop (no
  reward normalization: its cost is negligible).

Precision: the project runs ``--precision`` (default ``auto``, what the shipped config runs: on a
CPU with AMX bf16-mixed from minibatches of 128 samples, i.e. at c = 1, and 32-true below; elsewhere
32-true); the printed line and the JSON say which it resolved to. The plain loop is fp32.

Clock: CPU seconds of this process (one thread, so frames/s *per core*); on the shared machine the
wall clock measures the other jobs. The first iteration of every run (warm-up) is left out. The
project's iteration is split into collection (rollout + GAE + minibatch preparation, up to the
first minibatch) and update, giving ``env_step_ms`` (collection per vector env step) and ``step_ms``
(update per gradient step).

Roofline: FLOPs per frame are analytic (the CNN's layer shapes: rollout forward + epochs x (forward
+ backward, 2x forward)); the core's practical peak is a measured fp32 matmul (1024^3, one thread,
CPU clock); the fraction reached is frames/s x FLOPs per frame / peak (benchmarks/README.md).

Prints the figures, then one JSON line ``{"c1_fps", "c16_fps", "c64_fps", "c16_vs_plain",
"c1_vs_plain", "seeds", "step_ms", "env_step_ms", "machine", ...}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

BASE_ENVS, STEPS, MINIBATCHES, EPOCHS = 64, 64, 8, 3
GAME, CHANNELS, ACTIONS = "breakout", 4, 6


def cpu() -> float:
    return time.process_time()


# ---------------------------------------------------------------------------- roofline


def flops_per_frame(epochs: int = EPOCHS) -> float:
    """Rollout forward + epochs x (forward + backward = 2 forward) of the MinAtar CNN, per frame."""
    conv = 2 * 3 * 3 * CHANNELS * 16 * 8 * 8
    dense = 2 * 16 * 8 * 8 * 128
    heads = 2 * 128 * (ACTIONS + 1)
    forward = conv + dense + heads
    return forward * (1 + 3 * epochs)


def matmul_peak_gflops(n: int = 1024, reps: int = 6) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = math.inf
    for _ in range(reps):
        t0 = cpu()
        a @ b
        best = min(best, cpu() - t0)
    return 2 * n**3 / best / 1e9


# ---------------------------------------------------------------------------- this project


def project_run(c: int, iterations: int, seed: int, seeds: int = 1, precision: str = "32-true") -> dict:
    import lightning.pytorch as pl

    from ppo_lightning.run.builder import fit_main

    class Clock(pl.Callback):
        def __init__(self):
            self.rows, self._start, self._first = [], None, None

        def on_train_epoch_start(self, trainer, pl_module):
            self._start, self._first = cpu(), None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if self._first is None:
                self._first = cpu()

        def on_train_epoch_end(self, trainer, pl_module):
            self.rows.append((self._first - self._start, cpu() - self._first, trainer.datamodule.frames))

    clock = Clock()
    frames = BASE_ENVS // c * STEPS * (iterations + 1)
    cli = fit_main(["fit", "--config", str(ROOT / "ppo_lightning/configs/minatar/ppo.yaml"), "--scale", str(c),
              "--data.total_frames", str(frames), "--data.num_threads", "1", "--seed_everything", str(seed),
              "--mlflow.enabled", "false", "--trainer.logger", "false", "--trainer.enable_checkpointing", "false", "--video_every", "null",
              "--trainer.enable_progress_bar", "false", "--run_dir", "/tmp/small_batch_bench", "--seeds", str(seeds),
              "--trainer.precision", precision],
             extra_callbacks=[clock])
    rows = clock.rows[1:]
    collect, update = sum(r[0] for r in rows), sum(r[1] for r in rows)
    n = len(rows)
    frames_per_iter = BASE_ENVS // c * STEPS * seeds  # all seeds' frames
    return {"fps": n * frames_per_iter / (collect + update), "env_step_ms": 1e3 * collect / (n * STEPS),
            "step_ms": 1e3 * update / (n * EPOCHS * MINIBATCHES), "collect_s": collect / n, "update_s": update / n,
            "precision": str(cli.trainer.precision)}  # what auto resolved to


# ---------------------------------------------------------------------------- the plain loop


class PlainNet(nn.Module):
    """The MinAtar paper's CNN with a shared trunk, as `ppo_lightning.nets.minatar_cnn` builds it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(CHANNELS, 16, 3)
        self.dense = nn.Linear(16 * 8 * 8, 128)
        self.pi = nn.Linear(128, ACTIONS)
        self.v = nn.Linear(128, 1)
        for layer, gain in ((self.conv, math.sqrt(2)), (self.dense, math.sqrt(2)), (self.pi, 0.01), (self.v, 1.0)):
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)

    def forward(self, obs):
        x = obs.permute(0, 3, 1, 2).float()
        h = torch.relu(self.dense(torch.relu(self.conv(x)).flatten(1)))
        return self.pi(h), self.v(h).squeeze(-1)


def plain_run(c: int, iterations: int, seed: int) -> dict:
    """CleanRL-style PPO at the project's sizes; CPU seconds per iteration after the first."""
    from ppo_lightning.envs.minatar_env import _minatar

    minatar = _minatar()
    torch.manual_seed(seed)
    n = BASE_ENVS // c
    mb = n * STEPS // MINIBATCHES
    lr, gamma, lam, clip, vf, ent = 5e-4 / math.sqrt(c), 0.99, 0.95, 0.2, 0.5, 0.01
    games = [minatar.Environment(GAME, sticky_action_prob=0.1) for _ in range(n)]
    for i, g in enumerate(games):
        g.seed(seed * 1000 + i)
        g.reset()
    net = PlainNet()
    opt = torch.optim.Adam(net.parameters(), lr=lr, eps=1e-5)
    obs = torch.from_numpy(np.stack([g.state() for g in games]))
    obs_b = torch.empty((STEPS, n, 10, 10, CHANNELS), dtype=torch.bool)
    act_b, logp_b, val_b = torch.empty((STEPS, n), dtype=torch.long), torch.empty((STEPS, n)), torch.empty((STEPS, n))
    rew_b, done_b = torch.empty((STEPS, n)), torch.empty((STEPS, n))
    times = []
    for _ in range(iterations + 1):
        t0 = cpu()
        with torch.no_grad():
            for t in range(STEPS):
                logits, value = net(obs)
                dist = torch.distributions.Categorical(logits=logits)
                a = dist.sample()
                obs_b[t], act_b[t], logp_b[t], val_b[t] = obs, a, dist.log_prob(a), value
                rewards, dones = np.zeros(n, np.float32), np.zeros(n, np.float32)
                for i, (g, ai) in enumerate(zip(games, a.tolist())):
                    r, d = g.act(ai)
                    rewards[i], dones[i] = r, d
                    if d:
                        g.reset()
                rew_b[t], done_b[t] = torch.from_numpy(rewards), torch.from_numpy(dones)
                obs = torch.from_numpy(np.stack([g.state() for g in games]))
            _, next_value = net(obs)
            adv = torch.zeros_like(rew_b)
            last = torch.zeros(n)
            for t in reversed(range(STEPS)):
                nv = next_value if t == STEPS - 1 else val_b[t + 1]
                nonterm = 1.0 - done_b[t]
                delta = rew_b[t] + gamma * nv * nonterm - val_b[t]
                last = delta + gamma * lam * nonterm * last
                adv[t] = last
            ret = adv + val_b
        t_mid = cpu()
        b_obs, b_act, b_logp = obs_b.reshape(-1, 10, 10, CHANNELS), act_b.reshape(-1), logp_b.reshape(-1)
        b_adv, b_ret = adv.reshape(-1), ret.reshape(-1)
        for _ in range(EPOCHS):
            order = torch.randperm(n * STEPS)
            for k in range(MINIBATCHES):
                idx = order[k * mb:(k + 1) * mb]
                logits, value = net(b_obs[idx])
                dist = torch.distributions.Categorical(logits=logits)
                logp = dist.log_prob(b_act[idx])
                ratio = (logp - b_logp[idx]).exp()
                a_mb = b_adv[idx]
                a_mb = (a_mb - a_mb.mean()) / (a_mb.std() + 1e-8) if mb > 1 else a_mb
                pg = torch.max(-a_mb * ratio, -a_mb * ratio.clamp(1 - clip, 1 + clip)).mean()
                loss = pg + vf * ((value - b_ret[idx]) ** 2).mean() - ent * dist.entropy().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        times.append((t_mid - t0, cpu() - t_mid))
    collect, update = sum(t[0] for t in times[1:]), sum(t[1] for t in times[1:])
    return {"fps": n * STEPS * iterations / (collect + update), "env_step_ms": 1e3 * collect / (iterations * STEPS),
            "step_ms": 1e3 * update / (iterations * EPOCHS * MINIBATCHES)}


# ---------------------------------------------------------------------------- main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scales", default="1,16,64", help="comma list of c")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--iterations", type=int, default=0, help="timed iterations per run (0: --frames per seed, at least 3)")
    p.add_argument("--frames", type=int, default=4096, help="timed frames per seed and run (with --iterations 0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=8, help="S of the vectorized-seed runs (also run: S = 1); 1: single runs only")
    p.add_argument("--precision", default="auto", help="the project's trainer.precision (auto: the shipped config's; "
                   "32-true, bf16-mixed); the plain loop is fp32")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    import os

    from ppo_lightning.core.hardware import machine_info, machine_line

    info = machine_info()
    info["load_avg_1min_at_start"] = os.getloadavg()[0]
    print(machine_line(info) + f"; load average {info['load_avg_1min_at_start']:.1f}; project precision {a.precision}", flush=True)
    peak = matmul_peak_gflops()
    fpf = flops_per_frame()
    print(f"FLOPs per frame {fpf / 1e6:.2f} M (rollout forward + {EPOCHS} x (forward + backward)); "
          f"fp32 matmul peak {peak:.0f} GFLOP/s per core (CPU clock) -> compute limit {peak * 1e9 / fpf:,.0f} frames/s per core")
    scales = [int(x) for x in a.scales.split(",")]
    res: dict[int, dict[str, list]] = {c: {"project": [], "plain": [], "group": []} for c in scales}
    for r in range(a.rounds):
        for c in scales:
            iters = a.iterations or max(3, a.frames // (BASE_ENVS // c * STEPS))
            proj = project_run(c, iters, a.seed, precision=a.precision)
            plain = plain_run(c, iters, a.seed)
            res[c]["project"].append(proj)
            res[c]["plain"].append(plain)
            line = (f"round {r + 1} c = {c:2d}: project ({proj['precision']}) {proj['fps']:8,.0f} frames/s (collect {proj['env_step_ms']:.2f} ms per "
                    f"env step, update {proj['step_ms']:.2f} ms per gradient step), plain loop {plain['fps']:8,.0f} "
                    f"({plain['env_step_ms']:.2f} / {plain['step_ms']:.2f} ms)")
            if a.seeds > 1:
                group = project_run(c, iters, a.seed, a.seeds, a.precision)
                res[c]["group"].append(group)
                line += f", project S = {a.seeds}: {group['fps']:8,.0f} (all seeds' frames)"
            print(line, flush=True)
    out: dict = {}
    print(f"\n{'c':>3} {'envs':>5} {'mb':>4} {'S=1 fps':>9} {'plain fps':>10} {'ratio':>6} {'S=' + str(a.seeds) + ' fps':>9} "
          f"{'ratio':>6} {'roofline':>9} {'env step ms':>12} {'grad step ms':>13}")
    for c in scales:
        fps = statistics.median(x["fps"] for x in res[c]["project"])
        pfps = statistics.median(x["fps"] for x in res[c]["plain"])
        env_ms = statistics.median(x["env_step_ms"] for x in res[c]["project"])
        step_ms = statistics.median(x["step_ms"] for x in res[c]["project"])
        gfps = statistics.median(x["fps"] for x in res[c]["group"]) if res[c]["group"] else fps
        roof = gfps * fpf / (peak * 1e9)
        print(f"{c:>3} {BASE_ENVS // c:>5} {BASE_ENVS * STEPS // c // MINIBATCHES:>4} {fps:>9,.0f} {pfps:>10,.0f} "
              f"{fps / pfps:>6.2f} {gfps:>9,.0f} {gfps / pfps:>6.2f} {roof:>9.2%} {env_ms:>12.2f} {step_ms:>13.2f}")
        out[f"c{c}_fps"] = round(gfps, 1)  # with S seeds (all seeds' frames per core)
        out[f"c{c}_s1_fps"] = round(fps, 1)
        out[f"c{c}_plain_fps"] = round(pfps, 1)
        out[f"c{c}_vs_plain"] = round(gfps / pfps, 3)
        out[f"c{c}_s1_vs_plain"] = round(fps / pfps, 3)
        out[f"c{c}_roofline"] = round(roof, 5)
        out[f"c{c}_env_step_ms"], out[f"c{c}_step_ms"] = round(env_ms, 3), round(step_ms, 3)
        out[f"c{c}_precision"] = res[c]["project"][0]["precision"]
    summary = {k: out.get(k) for k in ("c1_fps", "c16_fps", "c64_fps", "c16_vs_plain", "c1_vs_plain")}
    summary.update({"seeds": a.seeds, "step_ms": out.get("c16_step_ms"), "env_step_ms": out.get("c16_env_step_ms"),
                    "clock": "cpu, 1 thread (per core)", "rounds": a.rounds, "precision": a.precision, "flops_per_frame": fpf,
                    "matmul_peak_gflops": round(peak, 1), **out, "machine": info})
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
