"""One IMPALA-CNN training step on CPU, by micro-batch size; and what the EWMA's proximal forward adds.

For a 2048-sample minibatch (the paper config's), prints the seconds of:
- a forward+backward pass over the minibatch in chunks of 128 ... 2048 (``model.micro_batch_size``),
- a no-grad policy forward (the proximal forward) in the same chunks, fp32 and bf16 autocast,
- a step with the proximal forward interleaved per chunk vs all proximal forwards first.
Each figure is the best of ``--repeats`` runs after one warm-up. The last line is one JSON object.

    python benchmarks/impala_step.py
    python benchmarks/impala_step.py --threads 1
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
    p.add_argument("--chunks", default="128,256,512,1024,2048")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    import torch

    from ppo_lightning.impala import ImpalaActorCritic

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    obs_space, act_space = {"shape": [64, 64, 3], "dtype": "uint8"}, {"type": "discrete", "n": 15}
    net = ImpalaActorCritic(obs_space, act_space)
    prox = copy.deepcopy(net).requires_grad_(False)
    obs = torch.randint(0, 256, (args.batch, 64, 64, 3), dtype=torch.uint8)

    def train(o):
        logits, value = net(o)
        (logits.logsumexp(-1).mean() + value.mean()).mul(o.shape[0] / args.batch).backward()

    def proximal(o, precision):
        prox.precision = precision
        with torch.no_grad():
            prox.policy(o)

    def best(fn) -> float:
        fn()  # warm-up
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return round(min(times), 3)

    result: dict = {"threads": args.threads, "batch": args.batch, "train_s": {}, "proximal_fp32_s": {},
                    "proximal_bf16_s": {}}
    for c in [int(x) for x in args.chunks.split(",")]:
        chunks = obs.split(c)
        result["train_s"][c] = best(lambda: [train(o) for o in chunks])
        result["proximal_fp32_s"][c] = best(lambda: [proximal(o, "fp32") for o in chunks])
        result["proximal_bf16_s"][c] = best(lambda: [proximal(o, "bf16") for o in chunks])
        print(f"chunk {c:5d}: train step {result['train_s'][c]:.3f} s, proximal forward fp32 "
              f"{result['proximal_fp32_s'][c]:.3f} s, bf16 {result['proximal_bf16_s'][c]:.3f} s", flush=True)
    chunks = obs.split(256)

    def interleaved():
        for o in chunks:
            proximal(o, "fp32")
            train(o)

    def grouped():
        for o in chunks:
            proximal(o, "fp32")
        for o in chunks:
            train(o)

    result["ewma_step_256_interleaved_s"] = best(interleaved)
    result["ewma_step_256_grouped_s"] = best(grouped)
    result["proximal_share_of_train_step_256"] = round(result["proximal_fp32_s"].get(256, float("nan"))
                                                       / result["train_s"].get(256, float("nan")), 3)
    print(f"EWMA step, chunks of 256: proximal forward interleaved {result['ewma_step_256_interleaved_s']:.3f} s, "
          f"grouped first {result['ewma_step_256_grouped_s']:.3f} s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
