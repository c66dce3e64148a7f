"""Members on every env family (issue 46): member-frames per core-second of a group against one run per process.

    python benchmarks/members.py                               # hopper, cartpole, minatar; 16 members
    python benchmarks/members.py --envs cartpole --iterations 4 --rounds 2

For each env, at the shipped config (32-true, one thread):

- ``hopper``: ``mujoco/ppo_hopper`` (4 envs x 512 steps, 10 epochs x 32 minibatches of 64, observation
  and reward normalization);
- ``cartpole``: ``cartpole/ppo`` (8 envs x 32 steps, 5 epochs x 8 minibatches of 32);
- ``minatar``: ``minatar/ppo --scale 16`` (Breakout, 4 envs x 64 steps, 3 epochs x 8 minibatches of 32),
  and the CleanRL-style plain-PyTorch loop of ``benchmarks/small_batch.py`` at the same sizes;

it runs a group of ``--members`` S (``fit --seeds S``) and a single run (S = 1: what one run per
process trains), interleaved in ``--rounds`` (group, single, group, single...: a load change hits both).
Figure: member-frames per core-second, all members' frames over the CPU seconds of this process
(time.process_time: the other jobs on a shared machine do not count) for the iterations after the
first (warm-up). A process's start-up (imports, env and network construction, ~5-10 s of CPU) is
left out of both: it would only add to one run per process. Targets (issue 46): the group >= 3x the
single run on Hopper, >= 4x on CartPole; MinAtar c = 16 >= 5x the plain loop.

For MinAtar it also prints the group's network floor (`network_floor`): the CPU time of the stacked
network alone per member-frame - its rollout forwards (no grad, ``num_envs`` rows per member) and its
update's forward + backward (minibatch rows per member, ``update_epochs`` passes over each frame) -
timed on this CPU at the group's shapes. No group can train faster than that floor (it leaves out the
envs, the loss, Adam and the loop), so ``floor / plain loop`` bounds the ratio a group can reach here.

Prints the machine (``ppo_lightning.core.hardware.machine_line``), one line per env, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# this folder's minatar.py must not shadow the minatar package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

CONFIGS = {"hopper": ("mujoco/ppo_hopper", []), "cartpole": ("cartpole/ppo", []),
           "minatar": ("minatar/ppo", ["--scale", "16"])}
TARGETS = {"hopper": ("single", 3.0), "cartpole": ("single", 4.0), "minatar": ("plain", 5.0)}


def cpu() -> float:
    return time.process_time()


def project_run(env: str, members: int, iterations: int, seed: int = 0) -> float:
    """Member-frames per core-second of ``fit`` with ``members`` seeds, iterations after the first."""
    import lightning.pytorch as pl

    from ppo_lightning.run.builder import fit_main

    class Clock(pl.Callback):
        def __init__(self):
            self.rows, self._start = [], None

        def on_train_epoch_start(self, trainer, pl_module):
            self._start, self._frames = cpu(), trainer.datamodule.frames

        def on_train_epoch_end(self, trainer, pl_module):
            self.rows.append((cpu() - self._start, trainer.datamodule.frames - self._frames))

    config, extra = CONFIGS[env]
    clock = Clock()
    args = ["fit", "--config", config, *extra, "--data.num_threads", "1", "--seed_everything", str(seed),
            "--mlflow.enabled", "false", "--trainer.logger", "false", "--trainer.enable_checkpointing", "false", "--video_every", "null",
            "--trainer.enable_progress_bar", "false", "--run_dir", f"/tmp/members_bench_{env}_{members}",
            "--seeds", str(members), "--trainer.precision", "32-true"]
    cli = fit_main([*args, "--data.total_frames", str(10**12), "--trainer.max_epochs", str(iterations + 1)],
             extra_callbacks=[clock])
    per_iter = cli.datamodule.frames_per_iteration
    rows = clock.rows[1:]
    cpu_s = sum(r[0] for r in rows)
    return len(rows) * per_iter * members / cpu_s


def plain_run(iterations: int, seed: int = 0) -> float:
    """The CleanRL-style loop of benchmarks/small_batch.py at c = 16 (loaded by path: ``benchmarks/minatar.py``
    must not shadow the ``minatar`` package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("small_batch", ROOT / "benchmarks" / "small_batch.py")
    small_batch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(small_batch)
    out = small_batch.plain_run(16, iterations, seed)
    return out["fps"]


def network_floor(members: int, reps: int = 30) -> dict:
    """The MinAtar c = 16 group's network alone: member-frames per core-second it allows (see the module
    docstring), with the matmul rate it reaches in the update."""
    import torch

    from ppo_lightning.envs import env_spaces
    from ppo_lightning.nets.models import build_network
    from ppo_lightning.nets.seed_stack import SeedStack

    envs, steps, minibatches, epochs = 4, 64, 8, 3  # minatar/ppo --scale 16
    rows = envs * steps // minibatches
    obs_space, act_space = env_spaces("minatar:breakout")
    torch.manual_seed(0)
    net = SeedStack([build_network(obs_space, act_space, {"name": "minatar_cnn", "channels": 16, "hidden": 128})
                     for _ in range(members)])
    shape = tuple(obs_space["shape"])
    act = torch.rand((members, envs, *shape)) < 0.1
    upd = torch.rand((members, rows, *shape)) < 0.1

    def timed(fn) -> float:
        fn()
        t0 = cpu()
        for _ in range(reps):
            fn()
        return (cpu() - t0) / reps

    def rollout_forward():
        with torch.no_grad():
            net(act)

    def update_step():
        logits, value = net(upd)
        (logits.logsumexp(-1).sum() + value.sum()).backward()

    big = torch.randn(1024, 1024)
    t_act, t_upd, t_gemm = timed(rollout_forward), timed(update_step), timed(lambda: big @ big)
    # per member-frame: one rollout forward per env step; each frame is in `epochs` update minibatches
    per_frame = t_act / (members * envs) + t_upd * epochs / (members * rows)
    p = {n: t[0] for n, t in net.inner.named_parameters()}
    conv, dense = p["policy_body.conv.weight"], p["policy_body.dense.weight"]
    hw = dense.shape[1] // conv.shape[0]
    fwd = 2 * (conv.numel() * hw + dense.numel() + p["policy_head.weight"].numel() + p["value_head.weight"].numel())
    bwd = 2 * (conv.numel() * hw + 2 * dense.numel() + 2 * (p["policy_head.weight"].numel() + p["value_head.weight"].numel()))
    return {"floor": 1.0 / per_frame, "rollout_forward_ms": t_act * 1e3, "update_step_ms": t_upd * 1e3,
            "update_gflops": members * rows * (fwd + bwd) / t_upd / 1e9,
            "sgemm_1024_gflops": 2 * 1024**3 / t_gemm / 1e9}  # this core's matmul rate at a large size, for scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", default="hopper,cartpole,minatar")
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=3, help="measured iterations per run (after a warm-up one)")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    import torch

    torch.set_num_threads(1)
    from ppo_lightning.core.hardware import machine_line

    print(machine_line(), flush=True)
    results = {}
    for env in args.envs.split(","):
        group, single, plain = [], [], []
        for _ in range(args.rounds):
            group.append(project_run(env, args.members, args.iterations))
            single.append(project_run(env, 1, args.iterations))
            if env == "minatar":
                plain.append(plain_run(args.iterations))
        g, s = statistics.median(group), statistics.median(single)
        row = {"group": g, "single": s, "group_vs_single": g / s}
        line = (f"{env}: group of {args.members} {g:,.0f} member-frames per core-s, one run {s:,.0f}: "
                f"{g / s:.2f}x")
        if plain:
            p = statistics.median(plain)
            row.update(plain=p, group_vs_plain=g / p)
            line += f"; CleanRL-style loop {p:,.0f}: {g / p:.2f}x"
            floor = network_floor(args.members)
            row.update(network_floor=floor)
            line += (f"; the group's network alone allows {floor['floor']:,.0f} ({floor['floor'] / p:.2f}x the loop: "
                     f"rollout forward {floor['rollout_forward_ms']:.2f} ms, update forward + backward "
                     f"{floor['update_step_ms']:.2f} ms at {floor['update_gflops']:.0f} GFLOP/s; a 1024^3 sgemm "
                     f"{floor['sgemm_1024_gflops']:.0f} GFLOP/s)")
        kind, target = TARGETS[env]
        line += f" (target >= {target}x the {'single run' if kind == 'single' else 'plain loop'})"
        print(line, flush=True)
        results[env] = row
    print(json.dumps({"members": args.members, "iterations": args.iterations, "rounds": args.rounds,
                      "machine": machine_line(), **results}))


if __name__ == "__main__":
    main()
