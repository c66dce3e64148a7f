"""Roofline of the IMPALA CNN on this CPU, and where a training step's time goes.

1. FLOPs per frame, analytic, from the network's layer shapes (forward hooks on one sample):
   forward F; backward = 2F less the input gradient of the first conv (nothing needs it); a PPO
   iteration per frame = rollout forward + epochs x (forward + backward); PPO-EWMA adds epochs x a
   proximal forward (the heads and GAE are negligible and left out).
2. Sustained GFLOP/s, measured: every distinct conv shape of the network alone (channels_last fp32,
   a batch of ``--batch`` = the micro-batch), forward without autograd and forward+backward, and a
   large fp32 matmul as the machine's practical peak; with ``--dtypes fp32,bf16`` the same in bf16
   (the kernels of ``--trainer.precision bf16-mixed``; AMX tiles where the CPU has them), keys ``*_bf16``.
3. The limit: the seconds per frame if the convolutions ran at their measured rates and everything
   else (pool, ReLU, adds, Adam, env, data movement) were free; the frames/s figures of
   benchmarks/throughput.py are then compared against it (``--ppo-fps``/``--ewma-fps``).
4. A torch.profiler split of one 2048-sample training step (micro-batches of ``--batch``) and of the
   no-autograd proximal forward of the same minibatch, per stage: conv, pool, ReLU, adds, linear,
   Adam, data movement, other.

Clocks: ``--clock wall`` (default) times with the wall clock; on a shared, oversubscribed machine
wall time measures the load more than the kernels, so ``--clock cpu --threads 1`` times each call
by the CPU seconds this process used (one thread: every kernel runs in the calling thread, no
OpenMP spinning counted). Its GFLOP/s are per core; 2x is then the 2-core limit (an upper bound:
it assumes perfect scaling over the two cores). Other processes still share the caches.

The machine is printed first and goes into the JSON line. Emulate an AVX2-only CPU with
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`` (the last one for MKL:
the matmul peak and the linear layers).

    python benchmarks/roofline.py
    python benchmarks/roofline.py --clock cpu --threads 1        # on a loaded machine
    python benchmarks/roofline.py --clock cpu --threads 1 --dtypes fp32,bf16 --no-profile   # + bf16 / AMX
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python benchmarks/roofline.py --clock cpu --threads 1
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch
from torch import nn

STAGES = {  # profiler op name (substring) -> stage; first match wins
    "conv": ("convolution", "conv2d", "mkldnn_conv"),
    "pool": ("max_pool", "maximum"),
    "relu": ("relu", "threshold", "clamp_min"),
    "linear": ("addmm", "aten::mm", "aten::linear", "aten::t"),
    "adds": ("aten::add", "aten::add_"),
    "adam": ("adam", "_foreach"),
    "data movement": ("copy_", "aten::to", "_to_copy", "contiguous", "aten::cat", "clone", "aten::split",
                      "aten::mul", "aten::div", "permute", "reshape", "view", "empty", "zero_", "fill_"),
}


def layer_flops(net: nn.Module, obs_shape) -> list[tuple[str, nn.Module, tuple, int]]:
    """(name, module, output shape, forward FLOPs per sample) of every conv and linear layer."""
    rows, hooks = [], []
    for name, m in net.named_modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            def hook(mod, inp, out, name=name):
                if isinstance(mod, nn.Conv2d):
                    _, c_out, h, w = out.shape
                    k = mod.kernel_size[0] * mod.kernel_size[1]
                    flops = 2 * mod.in_channels * c_out * k * h * w
                    rows.append((name, mod, (mod.in_channels, *inp[0].shape[-2:]), flops))
                else:
                    rows.append((name, mod, (mod.in_features,), 2 * mod.in_features * mod.out_features))
            hooks.append(m.register_forward_hook(hook))
    with torch.no_grad():
        net(torch.zeros(1, *obs_shape, dtype=torch.uint8))
    for h in hooks:
        h.remove()
    return rows


CLOCK = time.perf_counter  # or time.process_time (--clock cpu)


def best_of(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = CLOCK()
        fn()
        best = min(best, CLOCK() - t)
    return best


def stage_of(op: str) -> str:
    low = op.lower()
    for stage, keys in STAGES.items():
        if any(k.lower() in low for k in keys):
            return stage
    return "other"


def profile_split(fn) -> dict[str, float]:
    """Self CPU seconds per stage of one call of ``fn`` (after one untimed call)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = CLOCK()
        fn()
        wall = CLOCK() - t
    split: dict[str, float] = {}
    other: dict[str, float] = {}
    for e in prof.key_averages():
        if e.key.startswith("ProfilerStep"):
            continue
        s = stage_of(e.key)
        split[s] = split.get(s, 0.0) + e.self_cpu_time_total / 1e6
        if s == "other":
            other[e.key] = e.self_cpu_time_total / 1e6
    total = sum(split.values())
    out = {k: round(v, 3) for k, v in sorted(split.items(), key=lambda kv: -kv[1])}
    out["total_profiled_s"], out["wall_s"] = round(total, 3), round(wall, 3)
    out["share"] = {k: round(v / total, 3) for k, v in split.items()}
    out["other_top"] = {k: round(v, 3) for k, v in sorted(other.items(), key=lambda kv: -kv[1])[:6]}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=128, help="micro-batch size (the Procgen configs' 128)")
    p.add_argument("--minibatch", type=int, default=2048)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--ppo-fps", type=float, default=None, help="measured PPO frames/s to place on the roofline")
    p.add_argument("--ewma-fps", type=float, default=None, help="measured PPO-EWMA frames/s")
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--dtypes", default="fp32", help="comma list: fp32, bf16 (the bf16/AMX rates and peak)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="see the module docstring")
    args = p.parse_args()
    global CLOCK
    if args.clock == "cpu":
        if args.threads != 1:
            p.error("--clock cpu needs --threads 1 (CPU seconds of several threads include OpenMP spinning)")
        CLOCK = time.process_time

    from ppo_lightning.core.hardware import machine_info, machine_line
    from ppo_lightning.nets.impala import ImpalaActorCritic

    torch.set_num_threads(args.threads)
    machine = machine_info()
    print(machine_line(machine), flush=True)
    torch.manual_seed(0)
    obs_shape = (64, 64, 3)
    net = ImpalaActorCritic({"shape": list(obs_shape), "dtype": "uint8"}, {"type": "discrete", "n": 15})
    rows = layer_flops(net, obs_shape)
    fwd = sum(r[3] for r in rows)
    first = rows[0][3]  # the first conv: no input gradient in the backward pass
    bwd = 2 * fwd - first
    ppo = fwd + args.epochs * (fwd + bwd)
    ewma = ppo + args.epochs * fwd
    print(f"FLOPs per frame: forward {fwd / 1e6:.1f} M, backward {bwd / 1e6:.1f} M; PPO iteration "
          f"{ppo / 1e6:.1f} M (rollout forward + {args.epochs} x forward+backward), PPO-EWMA {ewma / 1e6:.1f} M "
          f"(+{args.epochs} proximal forwards: +{ewma / ppo - 1:.1%})")

    # Measured rates per distinct conv / linear shape, channels_last, batch args.batch, per dtype
    # (bf16: module and input cast to bf16, the kernels Lightning's bf16-mixed autocast calls).
    shapes: dict = {}
    for name, mod, in_shape, flops in rows:
        key = (type(mod).__name__, in_shape, getattr(mod, "out_channels", getattr(mod, "out_features", None)))
        shapes.setdefault(key, {"layers": [], "flops": flops, "mod": mod, "in_shape": in_shape})["layers"].append(name)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    result = {"flops_per_frame": {"forward": fwd, "backward": bwd, "ppo_iteration": ppo, "ppo_ewma_iteration": ewma},
              "batch": args.batch, "clock": args.clock, "threads": args.threads}
    for dname in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
        if dname not in dtypes:
            p.error(f"--dtypes: a comma list of {', '.join(dtypes)}; got {args.dtypes!r}")
        dtype, tag = dtypes[dname], "" if dname == "fp32" else f"_{dname}"
        rates = {}
        for key, s in shapes.items():
            mod = copy.deepcopy(s["mod"]).to(dtype)
            x = torch.randn(args.batch, *s["in_shape"]).to(dtype)
            if x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            with torch.no_grad():
                t_f = best_of(lambda: mod(x), args.repeats)
            xg = x.clone().requires_grad_(True)

            def fb():
                mod.zero_grad(set_to_none=True)
                mod(xg).sum().backward()

            t_fb = best_of(fb, args.repeats)
            n = args.batch * s["flops"]
            label = f"{key[0]} {key[1]}->{key[2]}"
            rates[label] = {"layers": len(s["layers"]), "mflops_per_sample": round(s["flops"] / 1e6, 2),
                            "fwd_gflops": round(n / t_f / 1e9, 1), "fwd_bwd_gflops": round(3 * n / t_fb / 1e9, 1),
                            "fwd_s": t_f, "fwd_bwd_s": t_fb}
            print(f"{dname} {label:36s} x{len(s['layers'])}: {s['flops'] / 1e6:6.2f} MFLOP/sample; forward "
                  f"{rates[label]['fwd_gflops']:6.1f} GFLOP/s, forward+backward {rates[label]['fwd_bwd_gflops']:6.1f} GFLOP/s",
                  flush=True)
        a = torch.randn(2048, 2048).to(dtype)
        t_mm = best_of(lambda: a @ a, args.repeats)
        mm = 2 * 2048**3 / t_mm / 1e9
        # A large conv (256 -> 256 channels, 3x3, 32x32, batch 32) as a second probe of the peak:
        # for bf16 on AMX, oneDNN reaches more with it than with the matmul.
        big = nn.Conv2d(256, 256, 3, padding=1).to(dtype)
        xb = torch.randn(32, 256, 32, 32).to(dtype).contiguous(memory_format=torch.channels_last)
        with torch.no_grad():
            t_big = best_of(lambda: big(xb), args.repeats)
        conv_peak = 2 * 256 * 256 * 9 * 32 * 32 * 32 / t_big / 1e9
        peak = max(mm, conv_peak)
        print(f"{dname} matmul 2048^3: {mm:.1f} GFLOP/s, conv 256->256 3x3 @32x32: {conv_peak:.1f} GFLOP/s "
              f"(practical peak: {peak:.1f})")

        # Conv-bound limit: seconds per frame if only the conv/linear kernels ran, at the rates above.
        t_fwd = sum(r["fwd_s"] * r["layers"] for r in rates.values()) / args.batch
        t_fb = sum(r["fwd_bwd_s"] * r["layers"] for r in rates.values()) / args.batch
        t_ppo = t_fwd + args.epochs * t_fb
        t_ewma = t_ppo + args.epochs * t_fwd
        limit = {"ppo_fps": round(1 / t_ppo, 1), "ppo_ewma_fps": round(1 / t_ewma, 1),
                 "ewma_overhead_at_limit": round(t_ewma / t_ppo - 1, 3),
                 "ppo_fps_at_peak": round(peak * 1e9 / ppo, 1)}
        print(f"{dname} limit (conv/linear kernels only, at their measured rates): PPO {limit['ppo_fps']} frames/s, "
              f"PPO-EWMA {limit['ppo_ewma_fps']} (+{limit['ewma_overhead_at_limit']:.1%}); at the peak "
              f"PPO {limit['ppo_fps_at_peak']} frames/s")
        result[f"rates{tag}"] = {k: {kk: vv for kk, vv in v.items() if not kk.endswith("_s")} for k, v in rates.items()}
        result[f"matmul_gflops{tag}"], result[f"large_conv_gflops{tag}"] = round(mm, 1), round(conv_peak, 1)
        result[f"peak_gflops{tag}"] = round(peak, 1)
        result[f"limit{tag}"] = limit
        for name, fps, flops in (("ppo", args.ppo_fps, ppo), ("ppo_ewma", args.ewma_fps, ewma)):
            if fps:
                result[f"{name}_measured{tag}"] = {"fps": fps, "gflops": round(fps * flops / 1e9, 1),
                                                   "share_of_conv_limit": round(fps / limit[f"{name}_fps"], 3),
                                                   "share_of_peak": round(fps * flops / 1e9 / peak, 3)}
                print(f"{name} measured {fps} frames/s = {fps * flops / 1e9:.1f} GFLOP/s: "
                      f"{fps / limit[f'{name}_fps']:.0%} of the {dname} conv limit, "
                      f"{fps * flops / 1e9 / peak:.0%} of the {dname} peak")

    if not args.no_profile:
        obs = torch.randint(0, 256, (args.minibatch, *obs_shape), dtype=torch.uint8)
        opt = torch.optim.Adam(net.parameters(), lr=5e-4, eps=1e-5, fused=True)
        prox = copy.deepcopy(net).requires_grad_(False)

        def train_step():
            opt.zero_grad()
            for o in obs.split(args.batch):
                logits, value = net(o)
                (logits.logsumexp(-1).mean() + value.mean()).mul(o.shape[0] / args.minibatch).backward()
            opt.step()

        def proximal():
            with torch.no_grad():
                prox.policy(obs)

        result["profile_train_step"] = profile_split(train_step)
        result["profile_proximal_forward"] = profile_split(proximal)
        step, prox_s = best_of(train_step, 2), best_of(proximal, 2)
        result["train_step_s"], result["proximal_forward_s"] = round(step, 3), round(prox_s, 3)
        result["train_step_gflops"] = round(args.minibatch * (fwd + bwd) / step / 1e9, 1)
        result["proximal_forward_gflops"] = round(args.minibatch * fwd / prox_s / 1e9, 1)
        result["proximal_share_of_train_step"] = round(prox_s / step, 3)
        print(f"training step ({args.minibatch} samples, micro-batches of {args.batch}): {step:.2f} s = "
              f"{result['train_step_gflops']} GFLOP/s; proximal forward {prox_s:.2f} s = "
              f"{result['proximal_forward_gflops']} GFLOP/s ({prox_s / step:.1%} of the step)", flush=True)
        for k in ("profile_train_step", "profile_proximal_forward"):
            r = result[k]
            print(f"{k}: wall {r['wall_s']} s; " + ", ".join(f"{s} {v:.0%}" for s, v in
                                                             sorted(r["share"].items(), key=lambda kv: -kv[1])))
    result["machine"] = machine
    print(json.dumps(result))


if __name__ == "__main__":
    main()
