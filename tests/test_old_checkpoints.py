"""Checkpoints written by an older ppo_lightning resume under today's code, bitwise.

`tests/fixtures/old_checkpoints/` holds, for PPO and PPG-EWMA on CartPole and a MinAtar group of 2
seeds, the checkpoint of iteration 2 of a 4-iteration run made by the commit in ``COMMIT``, and the
final network, optimizer and EWMA tensors of that run uninterrupted (``make.sh COMMIT`` writes them).
Resumed from iteration 2 here, each run must end on exactly those tensors: a change to the checkpoint's
contents, to what a resume restores, or to the math of an iteration fails this test.
Bitwise on the CPU type that wrote them (``CPU``: EPYC-AVX512); on another type (MKL picks its kernels
by vendor, torch by ISA) the same run rounds otherwise, so there each tensor must agree within
``CROSS_CPU_RTOL`` of its largest value (measured on a Xeon-AVX512: at most 2e-5, PPG-EWMA's Adam
moments; a resume that misses a state, e.g. an RNG, moves tensors by orders of magnitude more).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from ppo_lightning.core.hardware import cpu_type

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "old_checkpoints"
CROSS_CPU_RTOL = 1e-3
TINY = ["--mlflow.enabled", "false", "--trainer.enable_progress_bar", "false", "--checkpoint_every", "1",
        "--data.num_envs", "4", "--data.rollout_steps", "16", "--data.num_minibatches", "2", "--data.update_epochs", "2",
        "--data.normalize_reward", "true", "--data.advantage_norm_span", "4", "--data.total_frames", "256"]
RUNS = {  # as make.sh ran them
    "ppo": ["--config", "cartpole/ppo"],
    "ppg_ewma": ["--config", "cartpole/ppg_ewma", "--model.ppg.n_pi", "2"],
    "group": ["--config", "minatar/ppo_ewma", "--seeds", "2", "--model.network.hidden", "16", "--data.num_threads", "1"],
}


def _tensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def _final(ckpt: dict) -> dict[str, torch.Tensor]:
    """The tensors make.sh keeps, from a checkpoint of today's run."""
    out = {f"param/{k}": v for k, v in ckpt["state_dict"].items()}
    out |= {f"optimizer/{i}/{k}/{n}": v for i, o in enumerate(ckpt["optimizer_states"])
            for k, s in o["state"].items() for n, v in s.items() if torch.is_tensor(v)}
    out |= {f"ewma/{k}": v for k, v in (ckpt.get("proximal_ewma") or {}).get("proximal", {}).items()}
    return out


@pytest.mark.parametrize("name", list(RUNS))
def test_an_old_checkpoint_resumes_to_the_old_runs_end_bitwise(name, tmp_path):
    from ppo_lightning.run.builder import fit_main

    assert (FIXTURES / "COMMIT").read_text().strip(), "the fixtures name the commit that wrote them"
    cli = fit_main(["fit", *RUNS[name], *TINY, "--run_dir", str(tmp_path),
                    "--ckpt_path", str(FIXTURES / name / "iteration-00002.ckpt")])
    assert cli.datamodule.iteration == 4
    want, meta = _tensors(FIXTURES / name / "final.safetensors")
    got = _final(torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True))
    assert sorted(got) == sorted(want), set(got) ^ set(want)
    differ = [k for k in want if not torch.equal(got[k], want[k])]
    if cpu_type() == (FIXTURES / "CPU").read_text().strip():
        assert not differ, f"{len(differ)} of {len(want)} tensors differ from the old run's end, e.g. {differ[:3]}"
    else:
        rel = {k: ((got[k].double() - want[k].double()).abs().max() / want[k].double().abs().max().clamp_min(1e-12)).item()
               for k in differ}
        far = {k: v for k, v in rel.items() if v > CROSS_CPU_RTOL}
        assert not far, f"{len(far)} of {len(want)} tensors differ from the old run's end beyond rounding, e.g. {list(far.items())[:3]}"
    assert int(meta["frames"]) == torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)[
        "RolloutDataModule"]["frames"]
