"""A seed group in the MinAtar figure driver's configuration (SpaceInvaders, PPO-EWMA, the noise-scale
callback, importance-ratio cap, --scale c), timed by the process's CPU clock: collection vs update per
iteration (session 12, docs/benchmarks/small-batch.md "Sixth look").

    python benchmarks/results/probes/driver_group_step.py split 8 16       # c = 16, 8 iterations
    SEEDS=32 PREC=32-true python ... split 8 64                             # S and precision
    python ... compile 1 16                                                # the group's loss, eager vs torch.compile
    MIX=1 SEEDS=8 python ... split 8 64      # Table 5's four ablations x 8 seeds as one mixed group of 32 (session 13)
"""
import json, os, sys, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
import torch
import lightning.pytorch as pl
from ppo_lightning.cli.fit import fit_main


def cpu():
    return time.process_time()


class Clock(pl.Callback):
    def __init__(self):
        self.rows, self._start, self._first, self.batch, self.module = [], None, None, None, None

    def on_train_epoch_start(self, t, m):
        self._start, self._first = cpu(), None

    def on_train_batch_start(self, t, m, b, i):
        if self._first is None:
            self._first = cpu()
        if self.batch is None:
            self.batch, self.module = b.clone(), m

    def on_train_epoch_end(self, t, m):
        self.rows.append((self._first - self._start, cpu() - self._first))


def mixed_args(c, seeds):
    """Table 5's four ablations at scale c (the figure driver's arms) x ``seeds`` as one group's member options."""
    sys.path.insert(0, str(ROOT / "experiments"))
    import minatar_figures as mf

    specs = [mf.member_spec(v)[1] for v in mf._scaled_arms(c, mf.LR500K, kinds=mf.ABLATIONS).values()]
    members = [(spec, s) for spec in specs for s in range(seeds)]
    hp = {k: [spec[k] for spec, _ in members] for k in ("lr", "proximal_com", "advantage_norm_span")}
    return ["--scale_rules", "none", "--data.member_seeds", json.dumps([s for _, s in members]),
            "--data.member_hparams", json.dumps(hp)], len(members)


def run(iters, c, seeds, prec, extra=()):
    clock = Clock()
    frames = 64 // c * 64 * (iters + 1)
    fit_main(["fit", "--config", str(ROOT / "experiments/minatar/ppo.yaml"), "--data.env_id", "minatar:space_invaders",
              "--scale", str(c), "--data.total_frames", str(frames), "--data.num_threads", "1", "--seed_everything", "0",
              "--mlflow.enabled", "false", "--trainer.enable_checkpointing", "false", "--video_every", "null",
              "--trainer.enable_progress_bar", "false", "--run_dir", "/tmp/driver_group_step", "--seeds", str(seeds),
              "--trainer.precision", prec, "--model.max_importance_ratio", "100",
              "--trainer.callbacks+=ppo_lightning.training.noise_scale.GradientNoiseScale",
              "--model.decoupled", "true", "--model.proximal_com", "8", "--model.lr", "0.004", *extra], extra_callbacks=[clock])
    return clock


def main():
    what, iters, c = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    seeds, prec = int(os.environ.get("SEEDS", 8)), os.environ.get("PREC", "bf16-mixed")
    torch.set_num_threads(1)
    if what == "split":
        extra, members = mixed_args(c, seeds) if os.environ.get("MIX") else ((), seeds)
        rows = run(iters, c, members, prec, extra).rows[1:]  # the first iteration is warm-up
        col, upd = (sum(r[k] for r in rows) / len(rows) for k in (0, 1))
        print(json.dumps({"c": c, "S": members, "mixed": bool(extra), "precision": prec, "fps": round(64 // c * 64 * members / (col + upd)),
                          "collect_ms": round(1e3 * col, 1), "update_ms": round(1e3 * upd, 1)}))
        return
    clock = run(1, c, seeds, "32-true")
    m, batch = clock.module, clock.batch
    lm = m.loss_module

    def step(loss_module):
        out = loss_module(m.add_proximal(batch.clone()))
        sum(out[k] for k in ("loss_objective", "loss_critic", "loss_entropy")).sum().backward()
        for p in m.network.parameters():
            p.grad = None

    def per_step_ms(fn, n=60):
        for _ in range(5):
            fn()
        t = cpu()
        for _ in range(n):
            fn()
        return 1e3 * (cpu() - t) / n

    eager = per_step_ms(lambda: step(lm))
    compiled = torch.compile(lm, dynamic=False)
    t0 = time.time()
    step(compiled)
    compile_s = time.time() - t0
    print(json.dumps({"c": c, "S": seeds, "eager_ms": round(eager, 2), "compiled_ms": round(per_step_ms(lambda: step(compiled)), 2),
                      "eager_again_ms": round(per_step_ms(lambda: step(lm)), 2), "compile_s": round(compile_s, 1)}))


if __name__ == "__main__":
    main()
