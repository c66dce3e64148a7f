"""How much does a bf16 proximal forward change PPO-EWMA's update? (``--trainer.precision bf16-mixed``)

Trains PPO-EWMA with the exact (fp32) proximal policy on the short-budget Procgen config
(`ppo_lightning/configs/procgen/ppo_easy_short.yaml`, decoupled, COM 8) and, at every gradient step, also
evaluates the proximal policy in bf16 on the same minibatch. Per step it measures, against the
exact anchor:

- ``|d log pi_prox|`` of the taken actions (mean and max);
- the fraction of samples whose clipping decision flips (the gradient of the decoupled clipped
  surrogate flows through a sample or not);
- the cosine similarity and relative norm difference of the policy-loss gradients.

The training itself always uses the exact anchor, so the numbers describe the error of one step,
not an accumulated drift. The bf16 anchor is what ``--trainer.precision bf16-mixed`` computes: the
float32 average under bf16 autocast (the same values as its bf16 weight copy). Prints the machine,
one line per iteration and, last, one JSON object.

    python benchmarks/proximal_precision.py                  # 30 iterations (61k frames)
    python benchmarks/proximal_precision.py --iterations 5
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--com", type=float, default=8.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: ppo_lightning.core.threads)")
    args = p.parse_args()
    warnings.filterwarnings("ignore")

    import lightning.pytorch as pl
    import torch
    import yaml

    from ppo_lightning.algos import objectives as F
    from ppo_lightning.core.hardware import machine_info, machine_line
    from ppo_lightning.data.datamodule import RolloutDataModule
    from ppo_lightning.nets.models import make_distribution
    from ppo_lightning.training.module import PPOLightningModule

    machine = machine_info()
    print(machine_line(machine), flush=True)
    cfg = yaml.safe_load((ROOT / "ppo_lightning/configs/procgen/ppo_easy_short.yaml").read_text())
    data = {**cfg["data"], "seed": args.seed, "num_threads": args.threads}
    data["total_frames"] = data["num_envs"] * data["rollout_steps"] * args.iterations
    pl.seed_everything(args.seed)
    dm = RolloutDataModule(**data)
    model_cfg = {**cfg["model"], "decoupled": True, "proximal_com": args.com}
    model = PPOLightningModule(dm.observation_space, dm.action_space, **model_cfg)
    keys = model.loss_module.tensor_keys
    eps = model.hparams.clip_eps

    class AnchorPrecision(pl.Callback):
        def __init__(self) -> None:
            self.steps: list[dict] = []
            self.iteration: list[dict] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            prox = pl_module.proximal_source.proximal
            obs, action = batch.get(keys.observation), batch.get(keys.action)
            behavior_lp = batch.get(keys.behavior_log_prob)
            adv = batch.get(keys.advantage).reshape(behavior_lp.shape)
            with torch.no_grad():
                lp_anchor = {}
                for precision in ("fp32", "bf16"):
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                        lp_anchor[precision] = make_distribution(pl_module.hparams.action_space,
                                                                 *prox.policy(obs)).log_prob(action)
            params = [q for q in pl_module.network.parameters() if q.requires_grad]
            with torch.enable_grad():
                lp = make_distribution(pl_module.hparams.action_space, *pl_module.network.policy(obs)).log_prob(action)
                grads, active = {}, {}
                for precision, anchor in lp_anchor.items():
                    surrogate = F.clipped_surrogate(lp, behavior_lp, adv, eps, anchor)
                    g = torch.autograd.grad(-surrogate.mean(), params, retain_graph=True, allow_unused=True)
                    grads[precision] = torch.cat([(x if x is not None else torch.zeros_like(q)).flatten()
                                                  for x, q in zip(g, params)])
                    ratio = torch.exp(lp.detach() - anchor)
                    active[precision] = ratio * adv <= ratio.clamp(1 - eps, 1 + eps) * adv
            d = (lp_anchor["fp32"] - lp_anchor["bf16"]).abs()
            g32, g16 = grads["fp32"], grads["bf16"]
            self.steps.append({
                "dlogp_mean": d.mean().item(),
                "dlogp_max": d.max().item(),
                "clip_flip_fraction": (active["fp32"] != active["bf16"]).float().mean().item(),
                "clip_fraction": 1.0 - active["fp32"].float().mean().item(),
                "grad_cosine": torch.nn.functional.cosine_similarity(g32, g16, dim=0).item(),
                "grad_rel_diff": ((g32 - g16).norm() / g32.norm().clamp_min(1e-12)).item(),
            })

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            n = dm.num_minibatches * dm.update_epochs
            last = self.steps[-n:]
            row = {k: (max if k.endswith("max") else (min if k == "grad_cosine" else _mean))([s[k] for s in last])
                   for k in last[0]}
            ret = trainer.callback_metrics.get("episode/return_mean20")
            row.update({"iteration": dm.iteration, "frames": dm.frames,
                        "return_mean20": float(ret) if ret is not None else float("nan")})
            self.iteration.append(row)
            print(f"iter {dm.iteration:3d} frames {dm.frames:6d} return {row['return_mean20']:.2f} | "
                  f"|dlogp| mean {row['dlogp_mean']:.4f} max {row['dlogp_max']:.4f} | clip flips "
                  f"{row['clip_flip_fraction']:.4f} (clip fraction {row['clip_fraction']:.3f}) | grad cos min "
                  f"{row['grad_cosine']:.5f} rel diff {row['grad_rel_diff']:.4f}", flush=True)

    probe = AnchorPrecision()
    from ppo_lightning.training.callbacks import quiet_library_notices

    quiet_library_notices()  # Lightning's litlogger tip
    trainer = pl.Trainer(max_epochs=-1, logger=False, enable_checkpointing=False, enable_model_summary=False,
                         enable_progress_bar=False, callbacks=[probe])
    trainer.fit(model, dm)
    s = probe.steps
    result = {
        "steps": len(s),
        "dlogp_mean": round(_mean([x["dlogp_mean"] for x in s]), 5),
        "dlogp_max": round(max(x["dlogp_max"] for x in s), 5),
        "clip_flip_fraction_mean": round(_mean([x["clip_flip_fraction"] for x in s]), 5),
        "clip_flip_fraction_max": round(max(x["clip_flip_fraction"] for x in s), 5),
        "clip_fraction_mean": round(_mean([x["clip_fraction"] for x in s]), 4),
        "grad_cosine_mean": round(_mean([x["grad_cosine"] for x in s]), 6),
        "grad_cosine_min": round(min(x["grad_cosine"] for x in s), 6),
        "grad_rel_diff_mean": round(_mean([x["grad_rel_diff"] for x in s]), 5),
        "final_return_mean20": probe.iteration[-1]["return_mean20"],
        "machine": machine,
    }
    print(json.dumps(result))


def _mean(xs) -> float:
    return sum(xs) / len(xs)


if __name__ == "__main__":
    main()
