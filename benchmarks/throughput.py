"""Throughput on Procgen at the paper's configuration, in one process.

Prints: raw env frames/s (Procgen stepping alone, random actions); training frames/s of PPO and of
PPO-EWMA (same invocation, one untimed warm-up iteration each, then ``--iterations`` timed ones); the
split of an iteration into rollout / GAE / update / proximal-forward seconds; peak RSS. The last
line is one JSON object:

    {"raw_env_fps": .., "ppo_fps": .., "ppo_ewma_fps": .., "ewma_overhead": .., "peak_rss_gib": .., ...}

with ``ewma_overhead = EWMA wall per iteration / PPO wall per iteration - 1`` (and
``ewma_overhead_within_run`` = proximal-forward seconds / the rest of the EWMA iteration, which a
shared machine's load changes between the two runs do not distort).
Precision: ``--precision`` is the Trainer's (``--trainer.precision``), default ``auto`` as the shipped
configs have it; ``auto`` is resolved for each algorithm's run as ``fit`` resolves it
(`ppo_lightning.training.precision.resolve_auto`: the run's own training step timed in both
precisions, cached per machine and workload); the value and its reason are printed per run and go into
the JSON line as ``"<algorithm>_precision"`` (``benchmarks/precision_auto.py`` times a run in both
precisions against the choice). A comma list (``--precision
32-true,bf16-mixed``) runs every algorithm once per precision, interleaved (algorithm by algorithm),
and suffixes the keys of all but the first with the precision (``ppo_bf16-mixed_fps``, ...).
The machine (CPU model, cores, ISA flags, torch threads) is printed first and goes into the JSON
line as ``"machine"`` (`ppo_lightning.core.hardware.machine_info`).
Training runs in micro-batches of 128 (``model.micro_batch_size``, the Procgen configs' setting).

    python benchmarks/throughput.py                       # 64 envs x 256 steps, 8 minibatches, 3 epochs, precision auto
    python benchmarks/throughput.py --precision 32-true,bf16-mixed --only ppo --iterations 1
    python benchmarks/throughput.py --micro-batch-size 0  # whole minibatches: slower, 4.6 GiB
    python benchmarks/throughput.py --iterations 1 --num-envs 16 --rollout-steps 64   # smaller
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python benchmarks/throughput.py  # AVX2-only, emulated

PPG and PPG-EWMA (``ppo_lightning/configs/procgen/ppg*_hard.yaml``: dual IMPALA, E_pi = E_V = 1, 6 auxiliary
epochs of ``--ppg-aux-mbsize`` trajectories) run in the same invocation: one untimed warm-up phase,
then one timed phase of ``--ppg-n-pi`` iterations including its auxiliary phase, so that their
frames/s are per frame over a whole phase (``ppg_fps``, ``ppg_ewma_fps``; ``ppg_ewma_overhead`` =
PPG-EWMA wall per phase / PPG wall per phase - 1, ``ppg_ewma_overhead_within_run`` = proximal-forward
seconds / the rest of the PPG-EWMA phase). The per-frame cost hardly depends on n_pi (both phases
scale with it), so a small ``--ppg-n-pi`` measures the paper's configuration in less time.
``--skip-ppg`` leaves them out.

``--clock cpu`` times by this process's CPU seconds (``time.process_time``: torch's and Procgen's
threads) instead of the wall clock: on a machine other jobs load, the iteration and its parts then
count only this run's work (use it with ``--threads 1``). The rollout is then reported together with
GAE and the rest (``rollout_s`` = the iteration less update, proximal forward and auxiliary phase;
``gae_s`` 0), and frames/s are per CPU second.

``--cleanrl PATH`` runs CleanRL's ``ppo_procgen.py`` (not shipped: how to fetch it and what it needs are in
``benchmarks/cleanrl_lockstep.py``) in a subprocess at this run's sizes (game, hard mode, envs, steps,
epochs, minibatches; ``--threads`` torch threads, the same Procgen threads), one CleanRL iteration after
each timed PPO iteration (its start-up and first iteration are its warm-up), timed by the same clock
(``--clock cpu``: the child's CPU seconds). It prints CleanRL's frames/s next to each PPO run and puts
``cleanrl_fps`` and ``ppo_vs_cleanrl`` (``ppo_<precision>_vs_cleanrl``) into the JSON line:

    python benchmarks/throughput.py --only ppo --precision auto,32-true --iterations 1 --threads 1 --clock cpu \
        --cleanrl ppo_procgen.py --cleanrl-pythonpath gym-0.23.1

``--cleanrl-threads N`` and ``--cleanrl-procgen-threads N`` give the CleanRL process threads of its own
(default: this run's); its script's own defaults are torch's (the core count) and Procgen's 4 workers,
which is how issue 21 measured it (wall clock).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
import warnings

import numpy as np


def raw_env_fps(game: str, num_envs: int, steps: int, num_threads: int | None) -> float:
    from ppo_lightning.envs.procgen_env import ProcgenTorchEnv

    env = ProcgenTorchEnv(game, num_envs, seed=0, distribution_mode="hard", num_threads=num_threads)
    venv = env._venv
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 15, size=(steps, num_envs), dtype=np.int32)
    for a in actions[:10]:
        venv.act(a), venv.observe()
    t0 = time.perf_counter()
    for a in actions:
        venv.act(a)
        venv.observe()
    dt = time.perf_counter() - t0
    env.close()
    return steps * num_envs / dt


def train_run(args, decoupled: bool, precision: str, ppg: bool = False, after_timed_iteration=None) -> dict:
    import lightning.pytorch as pl
    import torch

    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    from ppo_lightning.data.datamodule import RolloutDataModule
    from ppo_lightning.training.module import PPOLightningModule

    class Timer(pl.Callback):
        def __init__(self) -> None:
            self.rows: list[dict] = []
            self.prox_s = 0.0
            self.update_s = 0.0
            self.aux_s = 0.0

        def on_fit_start(self, trainer, pl_module) -> None:
            src = pl_module.proximal_source
            if src is not None:  # time the proximal forward inside the training step
                inner = src.proximal_policy

                def timed(obs):
                    t = clock()
                    out = inner(obs)
                    self.prox_s += clock() - t
                    return out

                src.proximal_policy = timed

        def on_train_epoch_start(self, trainer, pl_module) -> None:
            self.t0 = clock()
            self.prox_s = self.update_s = self.aux_s = 0.0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.tb = clock()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if isinstance(outputs, dict) and outputs.get("ppg_phase") == "aux":
                self.aux_s += clock() - self.tb
            else:
                self.update_s += clock() - self.tb

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            dm = trainer.datamodule
            timing = dm.source.last_timing
            wall = clock() - self.t0
            if args.clock == "cpu":  # the source times the rollout by the wall clock: take the rest instead
                timing = {"time/rollout_s": wall - self.update_s - self.aux_s, "time/gae_s": 0.0}
            self.rows.append(
                {
                    "wall_s": wall,
                    "rollout_s": timing["time/rollout_s"],
                    "gae_s": timing["time/gae_s"],
                    "update_s": self.update_s - self.prox_s,
                    "proximal_forward_s": self.prox_s,
                    "aux_phase_s": self.aux_s,
                    "frames": dm.frames_per_iteration,
                }
            )
            if after_timed_iteration is not None and len(self.rows) > 1:  # not after the warm-up
                after_timed_iteration()  # outside this run's clock: the next iteration starts its own

    fpi = args.num_envs * args.rollout_steps
    n_pi = args.ppg_n_pi if ppg else 1  # PPG: a warm-up phase and a timed phase of n_pi iterations
    dm = RolloutDataModule(
        env_id=f"procgen:{args.game}",
        env_kwargs={"distribution_mode": "hard", "num_levels": 0, "num_threads": args.procgen_threads},
        num_envs=args.num_envs,
        rollout_steps=args.rollout_steps,
        num_minibatches=args.num_minibatches,
        update_epochs=1 if ppg else args.epochs,
        total_frames=fpi * 2 * n_pi if ppg else fpi * (args.iterations + 1),
        gamma=0.999,
        gae_lambda=0.95,
        normalize_reward=True,
        seed=0,
        num_threads=args.threads,
    )
    torch.manual_seed(0)
    model = PPOLightningModule(
        dm.observation_space,
        dm.action_space,
        network={"name": "impala_cnn"},
        lr=5e-4,
        decoupled=decoupled,
        proximal_com=args.ewma_com if decoupled else None,
        micro_batch_size=args.micro_batch_size or None,
        ppg={"n_pi": n_pi, "aux_mbsize": args.ppg_aux_mbsize} if ppg else None,
    )
    reason = "set on the command line"
    if precision == "auto":  # as `fit` resolves it: this run's own step measured (cached per machine and workload)
        from ppo_lightning.training.precision import resolve_auto

        precision, reason = resolve_auto("auto", "cpu", model, dm)
    timer = Timer()
    from ppo_lightning.training.callbacks import quiet_library_notices

    quiet_library_notices()  # Lightning's litlogger tip
    trainer = pl.Trainer(
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        callbacks=[timer],
        precision=precision,
    )
    trainer.fit(model, dm)
    del trainer, model, dm
    import gc

    gc.collect()
    if ppg:  # sums over the timed phase (its n_pi iterations, the last with the auxiliary phase)
        warm, rows = timer.rows[:n_pi], timer.rows[n_pi:]
        mean = {k: sum(r[k] for r in rows) for k in rows[0]}
        mean["fps"] = mean["frames"] / mean["wall_s"]
        mean["warmup_wall_s"] = sum(r["wall_s"] for r in warm)
        mean.update(precision=precision, precision_reason=reason)
        return mean
    warm, rows = timer.rows[0], timer.rows[1:]
    mean = {k: statistics.fmean(r[k] for r in rows) for k in rows[0]}
    mean["fps"] = mean["frames"] / mean["wall_s"]
    mean["warmup_wall_s"] = warm["wall_s"]
    mean.update(precision=precision, precision_reason=reason)
    return mean


def start_cleanrl(args, threads: int, procgen_threads: int, iterations: int):
    """CleanRL's script at this run's sizes, after its start-up and warm-up iteration."""
    from cleanrl_lockstep import CleanRLLockstep  # benchmarks/ is on the path when run as a script

    print(f"cleanrl: {args.cleanrl} at the same sizes (game {args.game}, hard, {args.num_envs} envs x "
          f"{args.rollout_steps} steps, {args.epochs} epochs x {args.num_minibatches} minibatches, fp32, "
          f"{threads} torch thread(s), {procgen_threads} procgen thread(s)); warm-up ...", flush=True)
    c = CleanRLLockstep(args.cleanrl, game=args.game, num_envs=args.num_envs, num_steps=args.rollout_steps,
                        num_minibatches=args.num_minibatches, update_epochs=args.epochs, max_iterations=iterations,
                        threads=threads, procgen_threads=procgen_threads, pythonpath=args.cleanrl_pythonpath)
    key = "cpu_s" if args.clock == "cpu" else "wall_s"
    print(f"cleanrl warm-up (start-up + 1 iteration) {c.warmup[key]:.1f} s", flush=True)
    return c


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=2, help="timed iterations per algorithm (after 1 warm-up)")
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--rollout-steps", type=int, default=256)
    p.add_argument("--num-minibatches", type=int, default=8)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--precision", default="auto",
                   help="--trainer.precision: 32-true, bf16-mixed or auto (the configs'), or a comma list of them "
                        "(every algorithm once per precision, interleaved)")
    p.add_argument("--micro-batch-size", type=int, default=128,
                   help="model.micro_batch_size (0: whole 2048-sample minibatches in one pass)")
    p.add_argument("--game", default="coinrun")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: ppo_lightning.core.threads)")
    p.add_argument("--procgen-threads", type=int, default=None, help="Procgen worker threads (default: auto)")
    p.add_argument("--only", default=None,
                   help="comma list of algorithms to run: ppo, ppo_ewma, ppg, ppg_ewma")
    p.add_argument("--ppg-n-pi", type=int, default=32, help="PPG: policy iterations per phase (timed: one phase)")
    p.add_argument("--ppg-aux-mbsize", type=int, default=4, help="PPG: env trajectories per auxiliary minibatch")
    p.add_argument("--skip-ppg", action="store_true", help="PPO and PPO-EWMA only")
    p.add_argument("--ewma-com", type=float, default=8.0)
    p.add_argument("--proximal-path", choices=("default", "dense"), default="default",
                   help="dense: the bf16 anchor's forward on dense tensors, not oneDNN tensors (the path before; "
                        "for comparison, see benchmarks/proximal_cost.py)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: time by this process's CPU seconds (robust to other jobs' load; see above)")
    p.add_argument("--cleanrl", metavar="PATH", default=None,
                   help="CleanRL's ppo_procgen.py (not shipped; see benchmarks/cleanrl_lockstep.py): run it at the "
                        "same sizes in a subprocess, one iteration after each timed PPO iteration, and report the ratio")
    p.add_argument("--cleanrl-pythonpath", metavar="DIR", default=None,
                   help="a folder put first on the CleanRL process's path (gym 0.23.1, which the script needs)")
    p.add_argument("--cleanrl-threads", type=int, default=None,
                   help="CleanRL's torch threads (default: this run's); the script's own default is the core count")
    p.add_argument("--cleanrl-procgen-threads", type=int, default=None,
                   help="CleanRL's Procgen worker threads (default: this run's); the script's own default is 4")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    if args.cleanrl:  # before anything runs: a missing script or dependency is a one-line error
        from cleanrl_lockstep import requirements_error

        error = requirements_error(args.cleanrl_pythonpath) if os.path.isfile(args.cleanrl) \
            else f"--cleanrl: no such file {args.cleanrl!r}"
        if error:
            p.exit(2, error + "\n")

    import torch

    from ppo_lightning.envs.procgen_env import auto_procgen_threads
    from ppo_lightning.core.threads import configure_threads

    from ppo_lightning.core.hardware import machine_info, machine_line

    threads = configure_threads(args.threads, f"procgen:{args.game}")
    if args.proximal_path == "dense":
        import ppo_lightning.nets.impala as impala

        impala._ONEDNN_BF16 = False
    machine = machine_info()
    print(machine_line(machine), flush=True)
    precisions = [x.strip() for x in args.precision.split(",") if x.strip()]
    if not precisions or any(x not in ("32-true", "bf16-mixed", "auto") for x in precisions):
        p.error(f"--precision: a comma list of 32-true, bf16-mixed, auto; got {args.precision!r}")
    precisions = list(dict.fromkeys(precisions))  # auto is resolved per run, as fit does (train_run)
    pthreads = auto_procgen_threads(args.num_envs) if args.procgen_threads is None else args.procgen_threads
    print(f"torch threads {threads}, procgen threads {pthreads}, precision {','.join(precisions)}, "
          f"micro-batch {args.micro_batch_size or 'none'}, "
          f"{args.num_envs} envs x {args.rollout_steps} steps, {args.epochs} epochs x {args.num_minibatches} minibatches")
    raw = raw_env_fps(args.game, args.num_envs, max(args.rollout_steps, 256), args.procgen_threads)
    print(f"raw env: {raw:,.0f} frames/s")
    result: dict = {"raw_env_fps": round(raw, 1)}
    algos = [("ppo", False, False), ("ppo_ewma", True, False)]
    if not args.skip_ppg:
        algos += [("ppg", False, True), ("ppg_ewma", True, True)]
    only = [x.strip() for x in args.only.split(",")] if args.only else None
    # Interleaved: each algorithm at every precision before the next algorithm.
    plan = [(base, decoupled, ppg, precision) for base, decoupled, ppg in algos if not only or base in only
            for precision in precisions]
    cleanrl = None
    if args.cleanrl:
        if not any(base == "ppo" for base, *_ in plan):
            p.error("--cleanrl compares CleanRL's PPO with ours: include ppo in --only")
        cleanrl = start_cleanrl(args, threads if args.cleanrl_threads is None else args.cleanrl_threads,
                                pthreads if args.cleanrl_procgen_threads is None else args.cleanrl_procgen_threads,
                                len(precisions) * args.iterations)
    runs = {}
    for base, decoupled, ppg, precision in plan:
        name = base if precision == precisions[0] else f"{base}_{precision}"
        ppo_ref = "ppo" if precision == precisions[0] else f"ppo_{precision}"
        ppg_ref = "ppg" if precision == precisions[0] else f"ppg_{precision}"
        step = cleanrl.step if cleanrl is not None and base == "ppo" else None
        first_row = len(cleanrl.rows) if cleanrl is not None else 0
        r = runs[name] = train_run(args, decoupled, precision, ppg, after_timed_iteration=step)
        if step is not None:  # the CleanRL iterations that ran between this run's timed iterations
            rows = cleanrl.rows[first_row:]
            c_s = statistics.fmean(x["cpu_s" if args.clock == "cpu" else "wall_s"] for x in rows)
            r["cleanrl_fps"] = cleanrl.frames_per_iteration / c_s
            r["cleanrl_line"] = (f"{'cleanrl (interleaved)':24s} {r['cleanrl_fps']:7.1f} frames/s  iteration {c_s:.2f} s "
                                 f"({len(rows)} iteration(s) after this run's timed ones)  ->  {name} / cleanrl = "
                                 f"{r['fps'] / r['cleanrl_fps']:.2f}x")
            result[f"{name}_vs_cleanrl"] = round(r["fps"] / r["cleanrl_fps"], 3)
        result[f"{name}_precision"] = r["precision"]
        print(f"{name}: precision {r['precision']} ({r['precision_reason']})", flush=True)
        unit = f"phase of {args.ppg_n_pi} iterations" if ppg else "iteration"
        print(
            f"{name:24s} {r['fps']:7.1f} frames/s  {unit} {r['wall_s']:.2f} s = rollout {r['rollout_s']:.2f} + "
            f"gae {r['gae_s']:.2f} + update {r['update_s']:.2f} + proximal forward {r['proximal_forward_s']:.2f} "
            + (f"+ aux phase {r['aux_phase_s']:.2f} " if ppg else "")
            + f"+ other {r['wall_s'] - r['rollout_s'] - r['gae_s'] - r['update_s'] - r['proximal_forward_s'] - r['aux_phase_s']:.2f}"
            f"  (warm-up {r['warmup_wall_s']:.1f} s)",
            flush=True,
        )
        if "cleanrl_line" in r:
            print(r["cleanrl_line"], flush=True)
        if ppg:
            result[f"{name}_fps"] = round(r["fps"], 1)
            result[f"{name}_split_s"] = {k: round(r[k], 3) for k in
                                         ("wall_s", "rollout_s", "gae_s", "update_s", "proximal_forward_s", "aux_phase_s")}
            if decoupled:
                suffix = name[len("ppg_ewma"):]
                if ppg_ref in runs:
                    result[f"ppg_ewma_overhead{suffix}"] = round(r["wall_s"] / runs[ppg_ref]["wall_s"] - 1.0, 4)
                result[f"ppg_ewma_overhead_within_run{suffix}"] = round(
                    r["proximal_forward_s"] / (r["wall_s"] - r["proximal_forward_s"]), 4)
            continue
        result[f"{name}_fps"] = round(r["fps"], 1)
        result[f"peak_rss_after_{name}_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)
        result[f"{name}_split_s"] = {k: round(r[k], 3) for k in ("wall_s", "rollout_s", "gae_s", "update_s", "proximal_forward_s")}
        if decoupled:
            suffix = name[len("ppo_ewma"):]
            if ppo_ref in runs:
                result[f"ewma_overhead{suffix}"] = round(r["wall_s"] / runs[ppo_ref]["wall_s"] - 1.0, 4)
            # The same ratio inside the EWMA run alone (proximal forward vs the rest of its
            # iteration): insensitive to load changes between runs on a shared machine.
            result[f"ewma_overhead_within_run{suffix}"] = round(
                r["proximal_forward_s"] / (r["wall_s"] - r["proximal_forward_s"]), 4)
    if cleanrl is not None:
        cleanrl.close()
        key = "cpu_s" if args.clock == "cpu" else "wall_s"
        c_s = statistics.fmean(x[key] for x in cleanrl.rows)
        result["cleanrl_fps"] = round(cleanrl.frames_per_iteration / c_s, 1)
        result["cleanrl_iterations_s"] = [round(x[key], 3) for x in cleanrl.rows]
        result["cleanrl_warmup_s"] = round(cleanrl.warmup[key], 3)
        result["cleanrl_script"] = args.cleanrl
    result["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)
    result.update({"precision": precisions if len(precisions) > 1 else precisions[0],
                   "micro_batch_size": args.micro_batch_size or None,
                   "torch_threads": threads, "procgen_threads": pthreads, "clock": args.clock,
                   "proximal_path": args.proximal_path,
                   "num_envs": args.num_envs, "rollout_steps": args.rollout_steps,
                   "ppg_n_pi": None if args.skip_ppg else args.ppg_n_pi})
    result["machine"] = machine
    del torch
    print(json.dumps(result))


if __name__ == "__main__":
    main()
