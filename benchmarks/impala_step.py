"""One IMPALA-CNN training step on CPU, by micro-batch size; and what the EWMA's proximal forward adds.

For a 2048-sample minibatch (the paper config's), prints the seconds of:
- a forward+backward pass over the minibatch in chunks of 32 ... 2048 (``model.micro_batch_size``),
- the proximal forward (no autograd) of the minibatch, one call as in the module, by the network's
  ``inference_chunk`` (16 ... 256), fp32 and bf16 autocast, and with a bf16 copy of the weights
  (what ``--trainer.precision bf16-mixed`` runs for the anchor); next to the same forward with autograd on in
  chunks of 64 (the training path: ``F.max_pool2d``, no in-place sums), to show what the
  no-autograd path gains,
- the first stack's 3x3/2 max-pool alone: ``F.max_pool2d`` vs the separable ``max_pool_3x3_s2``,
- a PPO-EWMA step (the proximal forward, then training in micro-batches of 64), fp32 and bf16 anchor,
- with ``--layouts channels_last,nchw``: training (micro-batches of 128) and the fp32 proximal forward
  with NCHW-contiguous activations next to the default channels_last (the layout oneDNN picks from
  the uint8 NHWC observations), to see which layout is faster on this CPU.
The machine (CPU model, cores, ISA flags, torch threads; `ppo_lightning.core.hardware`) is printed first
and goes into the JSON line as ``"machine"``; emulate an AVX2-only CPU with
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`` (the JSON then says so).
All timed variants run round-robin, ``--repeats`` rounds after one warm-up round, and each figure is
the best round, so that load changes on a shared machine hit all of them alike. The last line is
one JSON object.

    python benchmarks/impala_step.py
    python benchmarks/impala_step.py --threads 1
    python benchmarks/impala_step.py --threads 1 --clock cpu   # on a loaded machine: CPU seconds, not wall
"""

from __future__ import annotations

import argparse
import copy
import json
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--chunks", default="32,64,128,256,512,2048", help="training micro-batch sizes")
    p.add_argument("--inference-chunks", default="16,32,64,128,256", help="no-autograd chunk sizes")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--layouts", default="channels_last", help="channels_last and/or nchw (see above)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: time by this process's CPU seconds (needs --threads 1; robust to other load)")
    p.add_argument("--precisions", default="fp32,bf16",
                   help="proximal forward precisions timed per inference chunk (bf16: autocast and bf16 weights)")
    args = p.parse_args()

    import torch
    import torch.nn.functional as F

    from ppo_lightning.nets.impala import ImpalaActorCritic, max_pool_3x3_s2

    from ppo_lightning.core.hardware import machine_info, machine_line

    if args.clock == "cpu" and args.threads != 1:
        p.error("--clock cpu needs --threads 1 (CPU seconds of several threads include OpenMP spinning)")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    torch.set_num_threads(args.threads)
    machine = machine_info()
    print(machine_line(machine), flush=True)
    torch.manual_seed(0)
    obs_space, act_space = {"shape": [64, 64, 3], "dtype": "uint8"}, {"type": "discrete", "n": 15}
    net = ImpalaActorCritic(obs_space, act_space)
    prox = copy.deepcopy(net).requires_grad_(False)
    prox_bf16 = copy.deepcopy(prox).to(torch.bfloat16)  # bf16 weights, run without autocast
    obs = torch.randint(0, 256, (args.batch, 64, 64, 3), dtype=torch.uint8)

    def train(o):
        logits, value = net(o)
        (logits.logsumexp(-1).mean() + value.mean()).mul(o.shape[0] / args.batch).backward()

    def proximal(module, precision, chunk, autograd=False):
        # precision "bf16": under bf16 autocast (what --trainer.precision bf16-mixed runs)
        def run():
            module.inference_chunk = chunk
            with torch.set_grad_enabled(autograd), torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
                for o in obs.split(chunk) if autograd else [obs]:
                    module.policy(o)
        return run

    variants: dict = {}
    for c in [int(x) for x in args.chunks.split(",")]:
        variants[("train_s", c)] = lambda c=c: [train(o) for o in obs.split(c)]
    for c in [int(x) for x in args.inference_chunks.split(",")]:
        variants[("proximal_fp32_s", c)] = proximal(prox, "fp32", c)
        if "bf16" in args.precisions.split(","):
            variants[("proximal_bf16_autocast_s", c)] = proximal(prox, "bf16", c)
            variants[("proximal_bf16_weights_s", c)] = proximal(prox_bf16, "fp32", c)
    grad_prox = copy.deepcopy(net)  # parameters that require grad: the training path's forward
    variants[("forward_with_autograd_fp32_s", 64)] = proximal(grad_prox, "fp32", 64, autograd=True)
    variants[("forward_with_autograd_bf16_s", 64)] = proximal(grad_prox, "bf16", 64, autograd=True)
    first = torch.randn(64, 16, 64, 64).contiguous(memory_format=torch.channels_last)
    for dtype in ("fp32", "bf16"):
        x = first if dtype == "fp32" else first.bfloat16()
        variants[(f"first_pool_{dtype}_ms", "max_pool2d")] = lambda x=x: [F.max_pool2d(x, 3, 2, 1) for _ in range(32)]
        variants[(f"first_pool_{dtype}_ms", "separable")] = lambda x=x: [max_pool_3x3_s2(x) for _ in range(32)]

    if "nchw" in args.layouts.split(","):
        # The same observations as a view whose NCHW permutation is contiguous: every activation
        # then stays NCHW-contiguous (oneDNN's plain layout) instead of channels_last.
        obs_nchw = obs.permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1)
        variants[("train_layout_s", "channels_last")] = lambda: [train(o) for o in obs.split(128)]
        variants[("train_layout_s", "nchw")] = lambda: [train(o) for o in obs_nchw.split(128)]

        def prox_layout(o):
            def run():
                prox.inference_chunk = 64
                with torch.no_grad():
                    prox.policy(o)
            return run

        variants[("proximal_fp32_layout_s", "channels_last")] = prox_layout(obs)
        variants[("proximal_fp32_layout_s", "nchw")] = prox_layout(obs_nchw)

    def ewma_step(module, precision):
        def run():
            module.inference_chunk = 64
            with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
                module.policy(obs)
            for o in obs.split(64):
                train(o)
        return run

    variants[("ewma_step_s", "fp32_anchor")] = ewma_step(prox, "fp32")
    variants[("ewma_step_s", "bf16_anchor")] = ewma_step(prox_bf16, "fp32")

    times: dict = {k: [] for k in variants}
    for rnd in range(args.repeats + 1):  # round 0 is the warm-up
        for key, fn in variants.items():
            t = clock()
            with torch.no_grad() if key[0].startswith("first_pool") else torch.enable_grad():
                fn()
            if rnd:
                times[key].append(clock() - t)
        print(f"round {rnd} done", flush=True)
    result: dict = {"threads": args.threads, "batch": args.batch, "clock": args.clock}
    for (name, sub), ts in times.items():
        best = min(ts) * (1000 / 32 if name.startswith("first_pool") else 1)  # pools: ms per call
        result.setdefault(name, {})[str(sub)] = round(best, 3)
    for name, row in result.items():
        if isinstance(row, dict):
            print(f"{name:30s} " + "  ".join(f"{k}: {v:.3f}" for k, v in row.items()))
    if result.get("train_s"):
        best_train = min(result["train_s"].values())
        result["proximal_share_of_train_step"] = {
            name: round(min(result[name].values()) / best_train, 3)
            for name in ("proximal_fp32_s", "proximal_bf16_autocast_s", "proximal_bf16_weights_s") if name in result}
        print("best proximal forward / best training step:", result["proximal_share_of_train_step"])
    result["machine"] = machine
    print(json.dumps(result))


if __name__ == "__main__":
    main()
