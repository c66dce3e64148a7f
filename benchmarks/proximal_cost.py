"""What the EWMA anchor adds to a PPO update under bf16-mixed, in one process, by CPU clock.

One minibatch step of the Procgen configuration (IMPALA CNN (16, 32, 32) + dense 256, 64x64x3
uint8 observations, ``--minibatch`` samples in micro-batches of ``--micro-batch``, bf16 autocast as
Lightning's bf16-mixed, fused Adam), timed as:

- ``ppo``: forward + backward of every micro-batch (a stand-in loss: log-prob of the taken action
  times an advantage, plus a value MSE), then the Adam step;
- ``ewma_<path>``: the same step plus what PPO-EWMA adds: the proximal forward of the minibatch
  (``ProximalPolicyEWMA.proximal_policy``, one call as in the module) and the EWMA update after the
  optimizer step (``ProximalPolicyEWMA.update``, with the refresh of its bf16 copy). The proximal
  forward's path:
  ``onednn`` (the bf16 copy on oneDNN tensors, the default where the CPU has native bf16; the
  ReLU after each residual block's first conv fused into that conv as a oneDNN post-op),
  ``onednn_unfused`` (the same with a separate ReLU pass),
  ``dense`` (the bf16 copy on dense channels_last tensors, the path before),
  ``autocast`` (the float32 average under autocast, no bf16 copy).

Every variant runs once per round, ``--rounds`` rounds after one warm-up round (interleaved, so a
shared machine's load hits all alike; the order reverses every round), one thread, CPU seconds of this process
(``time.process_time``). Printed per variant: the median step and the median of its proximal
forward and EWMA update; and the ratio that matters, ``(ewma - ppo) / ppo`` from the medians of
the step times, next to ``proximal forward / ppo``, and each path's proximal forward against the
first path's (median of the per-round ratios). The last line is one JSON object.

    python benchmarks/proximal_cost.py                      # 2048 samples, micro-batches of 128
    python benchmarks/proximal_cost.py --minibatch 512 --rounds 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minibatch", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--paths", default="onednn,dense,autocast", help="proximal forward paths (see above)")
    args = p.parse_args()
    paths = [s for s in args.paths.split(",") if s]
    unknown = set(paths) - {"onednn", "onednn_unfused", "dense", "autocast"}
    if unknown:
        p.error(f"--paths: unknown {sorted(unknown)}; choose from onednn, onednn_unfused, dense, autocast")
    if args.minibatch % args.micro_batch:
        p.error(f"--minibatch {args.minibatch} is not a multiple of --micro-batch {args.micro_batch}")

    import torch

    import ppo_lightning.nets.impala as impala
    from ppo_lightning.algos.proximal import ProximalPolicyEWMA
    from ppo_lightning.core.hardware import machine_info, machine_line

    torch.set_num_threads(1)
    print(machine_line(), flush=True)
    if any(x.startswith("onednn") for x in paths) and not impala.onednn_bf16_inference():
        p.error("--paths onednn: this CPU has no native bf16 (or oneDNN is missing); the path is off here")
    clock = time.process_time
    torch.manual_seed(0)
    net = impala.ImpalaActorCritic({"shape": [64, 64, 3], "dtype": "uint8"}, {"type": "discrete", "n": 15})
    opt = torch.optim.Adam(net.parameters(), lr=5e-4, fused=True)
    obs = torch.randint(0, 256, (args.minibatch, 64, 64, 3), dtype=torch.uint8)
    actions = torch.randint(0, 15, (args.minibatch,))
    adv, ret = torch.randn(args.minibatch), torch.randn(args.minibatch)
    sources = {}
    for path in paths:
        src = ProximalPolicyEWMA(com=8.0, bf16=path != "autocast")
        src.start(net)
        sources[path] = src

    def train_step() -> None:
        opt.zero_grad(set_to_none=True)
        for sl in torch.arange(args.minibatch).split(args.micro_batch):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits, value = net(obs[sl])
            logp = logits.log_softmax(-1).gather(-1, actions[sl, None]).squeeze(-1)
            loss = -(logp * adv[sl]).mean() + 0.5 * (value.squeeze(-1) - ret[sl]).pow(2).mean()
            (loss * (len(sl) / args.minibatch)).backward()
        opt.step()

    def ewma_step(path: str) -> tuple[float, float]:
        src = sources[path]
        impala._ONEDNN_BF16 = path.startswith("onednn")
        impala._FUSE_CONV_RELU = path == "onednn"
        t = clock()
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the training step's context under bf16-mixed
            src.proximal_policy(obs)
        t_prox = clock() - t
        train_step()
        t = clock()
        src.update()
        return t_prox, clock() - t

    variants = ["ppo"] + [f"ewma_{path}" for path in paths]
    times = {v: [] for v in variants}
    parts = {v: ([], []) for v in variants[1:]}
    for r in range(args.rounds + 1):
        for v in variants if r % 2 else variants[::-1]:  # the order alternates: none always runs first
            t = clock()
            if v == "ppo":
                train_step()
            else:
                prox, upd = ewma_step(v[len("ewma_"):])
            dt = clock() - t
            if r:  # round 0 is the warm-up
                times[v].append(dt)
                if v != "ppo":
                    parts[v][0].append(prox)
                    parts[v][1].append(upd)
        if r:
            print(f"round {r}: " + ", ".join(f"{v} {times[v][-1]:.2f}s" + (f" (forward {parts[v][0][-1]:.3f}s)"
                                                if v != "ppo" else "") for v in variants), flush=True)

    med = {v: statistics.median(t) for v, t in times.items()}
    result: dict = {"machine": machine_info(), "clock": "cpu", "threads": 1, "minibatch": args.minibatch,
                    "micro_batch": args.micro_batch, "rounds": args.rounds, "ppo_step_s": round(med["ppo"], 3)}
    print(f"PPO step ({args.minibatch} samples, micro-batches of {args.micro_batch}, bf16 autocast): "
          f"{med['ppo']:.3f} s (median of {args.rounds}, CPU clock, 1 thread)")
    for v in variants[1:]:
        prox, upd = statistics.median(parts[v][0]), statistics.median(parts[v][1])
        extra = med[v] / med["ppo"] - 1
        print(f"{v:15s} step {med[v]:.3f} s  (+{100 * extra:.1f}% over PPO)   proximal forward {prox:.3f} s "
              f"({100 * prox / med['ppo']:.1f}% of a PPO step)   EWMA update {1e3 * upd:.1f} ms")
        result[v] = {"step_s": round(med[v], 3), "overhead": round(extra, 4), "proximal_forward_s": round(prox, 3),
                     "proximal_over_ppo_step": round(prox / med["ppo"], 4), "ewma_update_s": round(upd, 4)}
        if v != variants[1]:  # against the first path, round by round (robust to load that drifts)
            ratio = statistics.median(a / b for a, b in zip(parts[v][0], parts[variants[1]][0]))
            print(f"{'':15s} proximal forward / {variants[1]}'s, median of the rounds' ratios: {ratio:.3f}")
            result[v][f"forward_over_{variants[1]}"] = round(ratio, 4)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
