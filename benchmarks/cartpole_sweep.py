"""Frames to 475 on CartPole-v1 for variants of the project's configs (seeds 1-3 by default).

How ppo_lightning/configs/cartpole/*.yaml were chosen: each variant is a list of CLI overrides applied on
top of the PPO or PPO-EWMA config. Frames are deterministic for a seed; wall time is not reported
here (see benchmarks/cartpole.py).

    python benchmarks/cartpole_sweep.py --algo ppo --variants lr1e-3_mb4_e10 lr2e-3_mb8_e5
    python benchmarks/cartpole_sweep.py --algo ppo_ewma --variants com8 com32_e7
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cartpole import run  # noqa: E402

MB = ["--data.num_minibatches"]
EP = ["--data.update_epochs"]
VARIANTS = {
    # the first CartPole config (Lightning's Fabric example's shape: 4 minibatches of 64, 10 epochs)
    "lr1e-3_mb4_e10": ["--model.lr", "0.001", *MB, "4", *EP, "10"],
    "lr2e-3_mb4_e10": ["--model.lr", "0.002", *MB, "4", *EP, "10"],
    "lr1e-3_4x64_mb4_e10": ["--model.lr", "0.001", *MB, "4", *EP, "10", "--data.num_envs", "4",
                            "--data.rollout_steps", "64"],
    "lr1e-3_mb8_e10": ["--model.lr", "0.001", *MB, "8", *EP, "10"],
    "lr1e-3_mb4_e10_noadvnorm": ["--model.lr", "0.001", *MB, "4", *EP, "10", "--data.normalize_advantage", "false"],
    "lr1e-3_mb8_e5": ["--model.lr", "0.001", *MB, "8", *EP, "5"],
    "lr1e-3_mb8_e7": ["--model.lr", "0.001", *MB, "8", *EP, "7"],
    "lr1e-3_16x16_mb8_e5": ["--model.lr", "0.001", *MB, "8", *EP, "5", "--data.num_envs", "16",
                            "--data.rollout_steps", "16"],
    "lr2e-3_mb8_e5": ["--model.lr", "0.002", *MB, "8", *EP, "5"],
    "lr2e-3_mb8_e3": ["--model.lr", "0.002", *MB, "8", *EP, "3"],
    "lr2e-3_mb8_e2": ["--model.lr", "0.002", *MB, "8", *EP, "2"],
    "lr2e-3_mb8_e7": ["--model.lr", "0.002", *MB, "8", *EP, "7"],
}
for com in (4, 8, 16, 32, 64):
    VARIANTS[f"lr2e-3_mb8_e5_com{com}"] = [*VARIANTS["lr2e-3_mb8_e5"], "--model.proximal_com", str(com)]
VARIANTS["lr2e-3_mb8_e5_com8_clip0.1"] = [*VARIANTS["lr2e-3_mb8_e5_com8"], "--model.clip_eps", "0.1"]
for base in ("lr1e-3_mb4_e10", "lr1e-3_mb8_e10", "lr1e-3_mb8_e5", "lr2e-3_mb8_e3", "lr2e-3_mb8_e2"):
    VARIANTS[f"{base}_com8"] = [*VARIANTS[base], "--model.proximal_com", "8"]
VARIANTS["lr2e-3_mb8_e6"] = ["--model.lr", "0.002", *MB, "8", *EP, "6"]
for com in (24, 32):
    VARIANTS[f"lr2e-3_mb8_e6_com{com}"] = [*VARIANTS["lr2e-3_mb8_e6"], "--model.proximal_com", str(com)]
for com in (24, 48):
    VARIANTS[f"lr2e-3_mb8_e5_com{com}"] = [*VARIANTS["lr2e-3_mb8_e5"], "--model.proximal_com", str(com)]
VARIANTS["lr2e-3_mb8_e7_com32"] = [*VARIANTS["lr2e-3_mb8_e7"], "--model.proximal_com", "32"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=["ppo", "ppo_ewma"], default="ppo")
    parser.add_argument("--variants", nargs="+", default=None, help=f"any of {sorted(VARIANTS)}")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--frames", type=int, default=60_000, help="budget per run (None above it)")
    args = parser.parse_args(argv)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    for name in args.variants or list(VARIANTS):
        with tempfile.TemporaryDirectory() as tmp:
            frames = [run(args.algo, s, Path(tmp), [*VARIANTS[name], "--data.total_frames", str(args.frames)])
                      ["frames_to_475"] for s in args.seeds]
        done = [f for f in frames if f is not None]
        med = statistics.median(done) if len(done) == len(frames) else None
        print(f"{args.algo:8s} {name:28s} frames to 475 per seed {frames}  median {med}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
