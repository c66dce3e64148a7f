"""A few iterations of ``fit`` with an LSTM on CartPole for every objective (clip, decoupled, PPO-EWMA,
KL, adaptive KL), PPG and ``--scale``, end to end: collection (the data side) stores each step's
state, training recomputes the segments from their stored start states. Checked: the first gradient
step of a run sees the policy that collected the data exactly (ratio 1, approximate KL 0: the
recomputation is the collection's), as does the first auxiliary step of PPG (KL to the old policy
0); a group's member k trains as seed k alone, bitwise; PPG resumes mid-phase bitwise."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback

from ppo_lightning.run.builder import fit_main

BASE = ["--mlflow.enabled", "false", "--trainer.enable_progress_bar", "false", "--video_every", "null",
        "--trainer.enable_checkpointing", "false", "--data.num_envs", "4", "--data.rollout_steps", "16",
        "--data.sequence_length", "8", "--data.num_minibatches", "2", "--data.update_epochs", "2",
        "--data.total_frames", "128", "--model.network", "{name: mlp, hidden_sizes: [16], core: lstm, core_size: 8}"]


class FirstSteps(Callback):
    """The loss's diagnostics of the first gradient step, and the first auxiliary step's."""

    def __init__(self) -> None:
        self.first: dict | None = None
        self.first_aux: dict | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        phase = outputs.get("ppg_phase") if isinstance(outputs, dict) else None
        if phase == "aux":
            if self.first_aux is None:
                self.first_aux = {k: float(v) for k, v in pl_module.ppg_phases.aux_stats[0].items()}
        elif self.first is None:
            self.first = {k: float(v) for k, v in pl_module.step_stats[0].items()}


RUNS = {  # (config, settings after it)
    "clip": ("cartpole/ppo", []),
    "decoupled": ("cartpole/ppo", ["--model.decoupled", "true"]),
    "ewma": ("cartpole/ppo_ewma", ["--model.micro_batch_size", "16"]),  # micro-batches of 2 segments
    "kl": ("cartpole/ppo", ["--model.objective", "kl"]),
    "adaptive_kl": ("cartpole/ppo", ["--model.objective", "adaptive_kl"]),
    "ppg": ("cartpole/ppg", ["--model.ppg.n_pi", "2", "--model.ppg.n_aux_epochs", "1", "--model.ppg.aux_mbsize", "2"]),
    "scale": ("cartpole/ppo_ewma", ["--scale", "2"]),  # 4 segments of 8 steps per minibatch -> 2
}


@pytest.mark.parametrize("name", list(RUNS))
def test_a_few_iterations_with_an_lstm(name, tmp_path):
    steps = FirstSteps()
    config, settings = RUNS[name]
    cli = fit_main(["fit", "--config", config, *BASE, *settings, "--run_dir", str(tmp_path)], extra_callbacks=[steps])
    dm = cli.datamodule
    assert dm.frames == 128 and dm.sequence_steps == 8
    if name == "scale":
        assert (dm.num_envs, dm.rollout_steps, dm.minibatch_size) == (2, 16, 16)
    first = steps.first
    assert first["approx_kl_behavior"] == pytest.approx(0.0, abs=1e-9)
    assert first["importance_ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert first["approx_kl_proximal"] == pytest.approx(0.0, abs=1e-9)  # the EWMA starts as the network
    if name == "ppg":
        assert steps.first_aux["pol_distance"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("name", ["ewma", "ppg"])
def test_member_k_of_a_group_trains_as_seed_k_alone_with_an_lstm(name, tmp_path):
    """A group of 2 (seeds 1, 2) against seed 2 alone, PPO-EWMA with micro-batches and PPG with its
    auxiliary phase: member 1's weights equal the single run's bitwise."""
    config, settings = RUNS[name]
    if name == "ewma":
        settings = ["--model.micro_batch_size", "8"]
    common = ["fit", "--config", config, *BASE, *settings]
    group = fit_main([*common, "--data.seed", "1", "--data.num_seeds", "2", "--run_dir", str(tmp_path / "group")]).model
    alone = fit_main([*common, "--seed_everything", "2", "--data.seed", "2", "--run_dir", str(tmp_path / "alone")]).model
    ref, got = alone.network.state_dict(), group.network.seed_state_dict(1)
    assert ref.keys() == got.keys()
    for key in ref:
        assert torch.equal(got[key], ref[key]), key


def test_ppg_resumes_in_the_middle_of_a_policy_phase_bitwise_with_an_lstm(tmp_path):
    """The phase buffer keeps the stored states (in the checkpoint): a PPG run resumed after the first of
    its two policy iterations ends on the uninterrupted run's weights, bitwise."""
    config, settings = RUNS["ppg"]
    i = BASE.index("--trainer.enable_checkpointing")
    common = ["fit", "--config", config, *BASE[:i], *BASE[i + 2:], *settings, "--checkpoint_every", "1",
              "--data.total_frames", "256"]
    full = fit_main([*common, "--run_dir", str(tmp_path / "full")]).model
    ckpt = tmp_path / "full" / "checkpoints" / "iteration-00001.ckpt"
    saved = torch.load(ckpt, weights_only=False)
    assert saved["ppg"]["phase_iteration"] == 1 and saved["ppg"]["buffer_in_checkpoint"]
    resumed = fit_main([*common, "--run_dir", str(tmp_path / "resumed"), "--ckpt_path", str(ckpt)]).model
    ref, got = full.network.state_dict(), resumed.network.state_dict()
    for key in ref:
        assert torch.equal(got[key], ref[key]), key
