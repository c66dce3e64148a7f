"""``--trainer.precision auto`` against 32-true and bf16-mixed, per CPU type (issue 50).

    python benchmarks/precision_auto.py                           # Procgen paper config + MinAtar c = 1, 16, 64
    python benchmarks/precision_auto.py --procgen-envs 8 --procgen-steps 32 --procgen-minibatches 2 \\
        --minatar-iterations 1,8,16                               # a few minutes on a 2-core AVX2 EPYC

Every workload runs ``ppo-lightning fit`` in this process (`ppo_lightning.run.builder.fit_main`, no MLflow,
no checkpoints) three times, interleaved (the arms' order turns each round): ``--trainer.precision
auto``, ``32-true`` and ``bf16-mixed``. Workloads: Procgen coinrun PPO and PPO-EWMA
(`ppo_lightning/configs/procgen/ppo_hard.yaml` / ``ppo_ewma_hard.yaml``: IMPALA CNN, micro-batches of
128; ``--procgen-*`` shrink the rollout, the minibatch stays in chunks of 128) and MinAtar Breakout PPO
at ``--scale c`` for c = 1, 16, 64 (minibatches of 512, 32, 8). The first iteration of each run is its
warm-up; frames/s are over the rest, by ``--clock`` (default ``cpu``: this process's CPU seconds, one
torch thread, which other jobs on a shared machine do not distort; ``wall`` for an idle machine).

``auto``'s probe runs in its first run of each workload (a cache file in a temporary folder, so that
it measures here: `ppo_lightning.training.precision_probe`); its choice, step-time ratio (32-true /
bf16-mixed) and duration are printed beside the full runs' ratio (bf16-mixed frames/s / 32-true
frames/s). Targets (issue 50): auto within 3% of the faster of the two, never more than 3% slower than
32-true. The machine line (`ppo_lightning.core.hardware.machine_line`) and its CPU label
(`ppo_lightning.core.hardware.cpu_type`: EPYC-AVX2, EPYC-AVX512, Xeon-AMX, ...) come first; the last
line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

ARMS = ("auto", "32-true", "bf16-mixed")


def run_fit(args: list[str], clock) -> tuple[float, str, dict, object]:
    """One fit: (frames/s over the iterations after the first, the precision that ran, its params, the CLI)."""
    import lightning.pytorch as pl

    from ppo_lightning.run.builder import fit_main

    class Timer(pl.Callback):
        def __init__(self) -> None:
            self.rows: list[tuple[float, int]] = []

        def on_train_epoch_start(self, trainer, pl_module) -> None:
            self.t0, self.f0 = clock(), trainer.datamodule.frames

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            self.rows.append((clock() - self.t0, trainer.datamodule.frames - self.f0))

    timer = Timer()
    cli = fit_main(["fit", *args, "--mlflow.enabled", "false", "--trainer.logger", "false", "--trainer.enable_checkpointing", "false",
                    "--video_every", "null", "--trainer.enable_progress_bar", "false",
                    "--run_dir", tempfile.mkdtemp(prefix="precision_auto_")], extra_callbacks=[timer])
    rows = timer.rows[1:] or timer.rows
    fps = sum(f for _, f in rows) / sum(t for t, _ in rows)
    return fps, str(cli.trainer.precision), dict(getattr(cli, "precision_params", {}) or {}), cli


def probe_entry(cli) -> dict | None:
    """The cache entry ``auto`` measured (or read) for this run's machine and workload."""
    from ppo_lightning.training import precision_probe as pp

    model, dm = cli.model, cli.datamodule
    key = pp.entry_key(pp.machine_key(), pp.workload_key(model.network, dm.observation_space, dm.minibatch_size,
                                                         model.hparams.get("micro_batch_size"),
                                                         model.proximal_source is not None))
    return pp.cached_choice(key)


def workloads(a) -> list[tuple[str, list[str]]]:
    procgen = ["--data.num_envs", str(a.procgen_envs), "--data.rollout_steps", str(a.procgen_steps),
               "--data.num_minibatches", str(a.procgen_minibatches), "--data.num_threads", str(a.threads),
               "--data.total_frames", str(a.procgen_envs * a.procgen_steps * (a.procgen_iterations + 1)),
               "--data.env_kwargs.num_threads", str(a.procgen_threads)]
    out = []
    for algo in a.procgen.split(","):
        if algo:
            out.append((f"procgen_{algo}", ["--config", f"procgen/{algo}_hard", *procgen]))
    iters = [int(x) for x in a.minatar_iterations.split(",")]
    for c, n in zip([int(x) for x in a.minatar_scales.split(",") if x], iters + iters[-1:] * 8):
        frames = 64 // c * 64 * (n + 1)
        out.append((f"minatar_c{c}", ["--config", "minatar/ppo", "--scale", str(c), "--data.total_frames", str(frames),
                                      "--data.num_threads", str(a.threads)]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procgen", default="ppo,ppo_ewma", help="Procgen algorithms (ppo, ppo_ewma; empty: none)")
    p.add_argument("--procgen-envs", type=int, default=64)
    p.add_argument("--procgen-steps", type=int, default=256)
    p.add_argument("--procgen-minibatches", type=int, default=8)
    p.add_argument("--procgen-iterations", type=int, default=1, help="timed iterations per run (after a warm-up one)")
    p.add_argument("--procgen-threads", type=int, default=1, help="Procgen worker threads")
    p.add_argument("--minatar-scales", default="1,16,64")
    p.add_argument("--minatar-iterations", default="2,16,32", help="timed iterations per run, per scale")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds (each arm once per round)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (data.num_threads)")
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    p.add_argument("--probe-s", type=float, default=None,
                   help="the probe's time bound (PPO_LIGHTNING_PRECISION_PROBE_S; default: the library's, 2 s)")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    cache = Path(tempfile.mkdtemp(prefix="precision_cache_")) / "precision.json"
    os.environ["PPO_LIGHTNING_PRECISION_CACHE"] = str(cache)  # auto measures here, once per workload
    os.environ.pop("PPO_LIGHTNING_PRECISION_PROBE_S", None)
    if a.probe_s is not None:
        os.environ["PPO_LIGHTNING_PRECISION_PROBE_S"] = str(a.probe_s)
    clock = time.process_time if a.clock == "cpu" else time.perf_counter

    import torch

    from ppo_lightning.core.hardware import cpu_type, machine_info, machine_line

    torch.set_num_threads(a.threads)
    machine = machine_info()
    label = cpu_type()
    print(f"CPU label: {label}; {machine_line(machine)}; load average {os.getloadavg()[0]:.1f}", flush=True)
    print(f"clock {a.clock}, {a.threads} torch thread(s), {a.rounds} round(s), probe bound "
          f"{a.probe_s if a.probe_s is not None else 'default'} s; Procgen {a.procgen_envs} envs x "
          f"{a.procgen_steps} steps, {a.procgen_minibatches} minibatches (chunks of 128), "
          f"{a.procgen_iterations} timed iteration(s); MinAtar c = {a.minatar_scales}", flush=True)
    result: dict = {"cpu": label, "clock": a.clock, "threads": a.threads, "probe_s_bound": a.probe_s, "machine": machine,
                    "workloads": {}}
    for name, args in workloads(a):
        fps: dict[str, list[float]] = {arm: [] for arm in ARMS}
        auto_ran, probe, reason = None, None, ""
        for r in range(a.rounds):
            order = ARMS[r % 3:] + ARMS[:r % 3]
            for arm in order:
                t0 = time.perf_counter()
                f, ran, params, cli = run_fit([*args, "--trainer.precision", arm], clock)
                fps[arm].append(f)
                if arm == "auto":
                    auto_ran, reason = ran, params.get("precision_reason", "")
                    probe = probe or probe_entry(cli)
                print(f"{name:12s} round {r + 1} {arm:10s} ({ran:10s}) {f:9.1f} frames/s  (fit {time.perf_counter() - t0:.0f} s wall)",
                      flush=True)
                del cli
        best = {arm: max(v) for arm, v in fps.items()}
        faster = max(best["32-true"], best["bf16-mixed"])
        row = {"auto_picks": auto_ran, "fps": {k: round(v, 1) for k, v in best.items()},
               "full_bf16_over_fp32": round(best["bf16-mixed"] / best["32-true"], 3),
               "auto_vs_faster": round(best["auto"] / faster, 3), "auto_vs_32_true": round(best["auto"] / best["32-true"], 3),
               "probe": None if probe is None else {k: probe.get(k) for k in ("choice", "ratio", "probe_s", "rows", "bf16_stopped")},
               "reason": reason}
        result["workloads"][name] = row
        pr = (f"probe ratio {probe['ratio']:.2f}{' (bf16 stopped early: a bound)' if probe['bf16_stopped'] else ''} in "
              f"{probe['probe_s']:.2f} s on {probe['rows']}-sample chunks" if probe else f"no probe answer ({reason})")
        print(f"{name:12s} [{label}] auto -> {auto_ran}: {pr}; full runs bf16/32-true {row['full_bf16_over_fp32']:.2f}; "
              f"auto / faster {row['auto_vs_faster']:.3f}, auto / 32-true {row['auto_vs_32_true']:.3f}", flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
