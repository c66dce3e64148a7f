"""Phasic Policy Gradient: phase bookkeeping, EWMA during the phases, resume, scaling, memory, networks."""

import math
import warnings

import lightning.pytorch as pl
import pytest
import torch

from ppo_lightning.data.datamodule import RolloutDataModule
from ppo_lightning.training.module import PPOLightningModule

ENVS, STEPS, MB = 4, 16, 2


def vec(params):
    return torch.nn.utils.parameters_to_vector(list(params)).detach().clone()


class StepLog(pl.Callback):
    """Per training step: its phase, the index batch size, the EWMA copy, the weights, the aux KL."""

    def __init__(self):
        self.rows = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        src, phases = pl_module.proximal_source, pl_module.ppg_phases
        self.rows.append({
            "phase": outputs["ppg_phase"],
            "iteration": trainer.datamodule.iteration,
            "rows": batch.shape[-2] if outputs["ppg_phase"] == "aux" else batch.shape[-1],  # aux: [S, k, 2] indices; else [S, B]
            "prox": None if src is None else vec(src.proximal.parameters()),
            "ewma_weight": None if src is None else src.weight,
            "net": vec(pl_module.network.parameters()),
            "aux_kl": float(phases.aux_stats[-1]["pol_distance"]) if outputs["ppg_phase"] == "aux" else None,
        })


def make(total_iterations, ppg=None, ewma=True, arch="dual", **data_kw):
    kw = dict(env_id="CartPole-v1", num_envs=ENVS, rollout_steps=STEPS, num_minibatches=MB, update_epochs=1, seed=0)
    kw.update(data_kw)
    kw["total_frames"] = total_iterations * kw["num_envs"] * kw["rollout_steps"]
    dm = RolloutDataModule(**kw)
    cfg = {"n_pi": 2, "n_aux_epochs": 2, "aux_mbsize": 3, "aux_lr": 1e-2, **(ppg or {})}
    model = PPOLightningModule(dm.observation_space, dm.action_space,
                               network={"name": "mlp", "hidden_sizes": [16], "arch": arch},
                               decoupled=ewma, proximal_com=3.0 if ewma else None, lr=1e-2, ppg=cfg)
    return dm, model


def trainer(tmp_path, callbacks=(), **kw):
    return pl.Trainer(max_epochs=-1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=kw.pop("enable_checkpointing", False), callbacks=list(callbacks),
                      default_root_dir=tmp_path, **kw)


def test_aux_phase_every_n_pi_iterations_and_ewma_untouched_by_aux_steps(tmp_path):
    dm, model = make(5)
    log = StepLog()
    trainer(tmp_path, [log]).fit(model, dm)
    rows = log.rows
    # Aux phase after iterations 2 and 4 only: n_aux_epochs * ceil(n_pi * envs / aux_mbsize) = 2 * 3 steps,
    # each on aux_mbsize whole trajectories (the last one of an epoch on the remaining 2 of 8).
    aux_per_phase = 2 * math.ceil(2 * ENVS / 3)
    for it in range(1, 6):
        phases = [r["phase"] for r in rows if r["iteration"] == it]
        assert phases == ["joint"] * MB + (["aux"] * aux_per_phase if it in (2, 4) else [])
    sizes = [r["rows"] for r in rows if r["phase"] == "aux"]
    assert sizes == [3, 3, 2] * 4
    assert model.ppg_phases.phase == 2 and model.ppg_phases.phase_iteration == 1
    assert len(model.ppg_phases.buffer) == 1  # iteration 5's rollout, kept for the next phase
    src = model.proximal_source
    assert src.num_updates == 5 * MB and src.num_resets == 2  # one update per policy step only
    prev = None
    for i, r in enumerate(rows):
        if r["phase"] == "aux":
            # The old policy's outputs were computed after the last policy step: KL 0 at the first aux step.
            if prev["phase"] != "aux":
                assert r["aux_kl"] == pytest.approx(0.0, abs=1e-7)
            if i == len(rows) - 1 or rows[i + 1]["phase"] != "aux":  # the phase's last step: reset
                torch.testing.assert_close(r["prox"], r["net"])
                assert r["ewma_weight"] == 1.0
            elif prev["phase"] == "aux":  # the EWMA copy does not move while the weights do
                assert torch.equal(r["prox"], prev["prox"]) and not torch.equal(r["net"], prev["net"])
        prev = r


def test_separate_value_epochs_use_two_optimizers_and_ewma_follows_policy_steps(tmp_path):
    dm, model = make(2, ppg={"epochs_value": 2, "n_aux_epochs": 1, "aux_mbsize": 8})
    log = StepLog()
    t = trainer(tmp_path, [log])
    t.fit(model, dm)
    assert [r["phase"] for r in log.rows if r["iteration"] == 2] == ["value"] * 4 + ["policy"] * 2 + ["aux"]
    assert len(t.optimizers) == 3 and model._ppg_optimizer_index == {"policy": 0, "value": 1, "aux": 2, "joint": 0}
    assert model.proximal_source.num_updates == 2 * MB
    # each optimizer stepped its own phase's steps
    assert [len(o.state) > 0 for o in t.optimizers] == [True, True, True]
    assert t.global_step == len(log.rows) == 2 * 6 + 1


@pytest.mark.parametrize("arch", ["dual", "shared", "detach"])
def test_architectures_and_gradient_paths(arch):
    from ppo_lightning.nets.models import build_network

    net = build_network({"shape": [4], "dtype": "float32"}, {"type": "discrete", "n": 2},
                        {"name": "mlp", "hidden_sizes": [8], "arch": arch, "aux_value_head": True})
    obs = torch.randn(5, 4)
    logits, value, aux = net.forward_aux(obs)
    value.sum().backward(retain_graph=True)  # the true value's loss
    enc = [p.grad for p in net.policy_body.parameters()]
    # dual: the value has its own encoder; detach: the policy encoder gets no value gradient; shared: it does
    assert all(g is None for g in enc) == (arch != "shared")
    net.zero_grad(set_to_none=True)
    aux.sum().backward()  # the aux head always trains the policy encoder
    assert all(g is not None for g in [p.grad for p in net.policy_body.parameters()])
    torch.testing.assert_close(net(obs)[0], logits)


def test_ppg_impala_arch_dual_has_two_trunks():
    from ppo_lightning.nets.models import build_network

    obs_space, act = {"shape": [64, 64, 3], "dtype": "uint8"}, {"type": "discrete", "n": 15}
    nets = {a: build_network(obs_space, act, {"name": "impala_cnn", "channels": [4, 4], "dense": 16, "arch": a})
            for a in ("dual", "shared")}
    n = {a: sum(p.numel() for p in net.parameters()) for a, net in nets.items()}
    trunk = n["shared"] - (16 * 15 + 15) - 2 * (16 + 1)  # minus the policy, value and aux heads
    assert n["dual"] - n["shared"] == trunk
    x = torch.randint(0, 256, (2, 64, 64, 3), dtype=torch.uint8)
    logits, value, aux = nets["dual"].forward_aux(x)
    assert logits.shape == (2, 15) and value.shape == aux.shape == (2, 1)
    with torch.no_grad():
        torch.testing.assert_close(nets["dual"].value(x), value.detach())


def test_resume_mid_phase_restarts_the_phase_and_at_a_boundary_is_exact(tmp_path):
    from ppo_lightning.interop.export import export_hf, load_pretrained

    no_buffer = {"checkpoint_buffer_mib": 0}  # a phase buffer too large for checkpoints
    dm, model = make(3, no_buffer)
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="it{epoch}",
                                        auto_insert_metric_name=False)
    trainer(tmp_path, [ckpt], enable_checkpointing=True).fit(model, dm)
    boundary, middle = tmp_path / "it1.ckpt", tmp_path / "it2.ckpt"  # after iterations 2 (aux ran) and 3
    saved = torch.load(boundary, weights_only=True)
    assert saved["ppg"] == {"phase": 1, "phase_iteration": 0, "n_pi": 2, "buffer_in_checkpoint": False}
    assert "ppg_buffer" not in saved["RolloutDataModule"]["per_rank"][0]["resume"]["extra"]
    assert torch.load(middle, weights_only=True)["ppg"]["phase_iteration"] == 1

    class AtStart(pl.Callback):  # the state the first resumed training step sees
        state = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if self.state is not None:
                return
            src = pl_module.proximal_source
            self.state = {"prox": vec(src.proximal.parameters()), "weight": src.weight,
                          "net": vec(pl_module.network.parameters()), "phase": pl_module.ppg_phases.phase,
                          "phase_iteration": pl_module.ppg_phases.phase_iteration,
                          "aux_adam": trainer.optimizers[1].state_dict()["state"][0]["exp_avg"].clone()}

    # At a phase boundary: exact (EWMA state, phase counters, the aux Adam's moments).
    dm2, model2 = make(4, no_buffer)
    cap, log = AtStart(), StepLog()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(tmp_path, [cap, log]).fit(model2, dm2, ckpt_path=boundary)
    assert not [w for w in caught if "middle of a PPG" in str(w.message)]
    assert cap.state["phase"] == 1 and cap.state["phase_iteration"] == 1 and cap.state["weight"] == 1.0
    torch.testing.assert_close(cap.state["prox"], vec(saved["proximal_ewma"]["proximal"].values()))
    torch.testing.assert_close(cap.state["aux_adam"], saved["optimizer_states"][1]["state"][0]["exp_avg"])
    assert [r["phase"] for r in log.rows].count("aux") == 6  # iterations 3, 4 = one more phase

    # In the middle: a new phase (counter 0, empty buffer), the EWMA reset to the resumed weights.
    dm3, model3 = make(5, no_buffer)
    cap, log = AtStart(), StepLog()
    with pytest.warns(UserWarning, match="middle of a PPG policy phase"):
        trainer(tmp_path, [cap, log]).fit(model3, dm3, ckpt_path=middle)
    assert cap.state["phase_iteration"] == 1 and cap.state["weight"] == 1.0  # iteration 4 opens a new phase
    torch.testing.assert_close(cap.state["prox"], cap.state["net"])
    assert [r["iteration"] for r in log.rows if r["phase"] == "aux"] == [5] * 6  # 4 and 5 form the phase

    # Export keeps working and carries the auxiliary head (config + weights).
    out = export_hf(str(middle), str(tmp_path / "hf"))
    net = load_pretrained(out)
    assert net.aux_value_head is not None and net.arch == "dual"
    x = torch.randn(3, 4)
    with torch.no_grad():  # the first run ended on the weights of its last (mid-phase) checkpoint
        for a, b in zip(net.forward_aux(x), model.network.forward_aux(x)):
            torch.testing.assert_close(a, b)


def test_small_phase_buffer_is_checkpointed_and_mid_phase_resume_is_exact(tmp_path):
    """With the phase buffer in the checkpoint (small: CartPole), resuming after iteration 3 (in the
    middle of the second policy phase) ends bitwise where the uninterrupted 4-iteration run ends."""
    runs = {}
    for name, iterations, ckpt_path in (("a", 4, None), ("b", 3, None), ("c", 4, tmp_path / "b/it2.ckpt")):
        pl.seed_everything(0)
        dm, model = make(iterations)
        ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / name, every_n_epochs=1, save_top_k=-1,
                                            filename="it{epoch}", auto_insert_metric_name=False)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # no "middle of a PPG policy phase" restart
            warnings.filterwarnings("ignore", message=".*(transfer_batch_to_device|ckpt_path|Checkpoint directory|dirpath has changed|The `srun` command is available).*")
            trainer(tmp_path / name, [ckpt], enable_checkpointing=True).fit(model, dm, ckpt_path=ckpt_path)
        runs[name] = model
    saved = torch.load(tmp_path / "b/it2.ckpt", weights_only=True)
    assert saved["ppg"]["phase_iteration"] == 1 and saved["ppg"]["buffer_in_checkpoint"]
    stored = saved["RolloutDataModule"]["per_rank"][0]["resume"]["extra"]["ppg_buffer"]
    assert len(stored["rollouts"]) == 1 and stored["rollouts"][0]["data"]["observation"].shape[:3] == (1, ENVS, STEPS)
    a, c = runs["a"], runs["c"]
    assert torch.equal(vec(a.network.parameters()), vec(c.network.parameters()))
    assert torch.equal(vec(a.proximal_source.proximal.parameters()), vec(c.proximal_source.proximal.parameters()))
    assert a.ppg_phases.phase == c.ppg_phases.phase == 2


def test_scale_multiplies_n_pi():
    from jsonargparse import Namespace

    from ppo_lightning.algos.scaling import apply_scale, format_scale_table, scale_params

    def cfg(ppg):
        return Namespace(data=Namespace(num_envs=8, rollout_steps=32, num_minibatches=4, advantage_norm_span=1.0),
                         model=Namespace(lr=1e-3, proximal_com=8.0, optimizer="adam", ppg=ppg))

    c = cfg({"n_pi": 8, "n_aux_epochs": 6})
    report = apply_scale(c, 4)
    assert c.model.ppg == {"n_pi": 32, "n_aux_epochs": 6} and report["model.ppg.n_pi"] == {"from": 8, "to": 32}
    assert "model.ppg.n_pi" in format_scale_table(4, ("ppg_n_pi",), report)
    assert scale_params(4, ("ppg_n_pi",), report)["scaled/model.ppg.n_pi"] == 32
    c = cfg({})  # the default n_pi (32)
    apply_scale(c, 0.5)
    assert c.model.ppg["n_pi"] == 16
    c = cfg({"n_pi": 8})
    apply_scale(c, 4, "lr,com,adv_span")  # rule ablated
    assert c.model.ppg["n_pi"] == 8
    c = cfg(None)  # PPO: nothing to scale
    assert "model.ppg.n_pi" not in apply_scale(c, 4)


def test_phase_buffer_memory_check_names_the_fields():
    from ppo_lightning.algos.ppg import check_phase_buffer_memory, frame_bytes, phase_buffer_bytes

    obs, act = {"shape": [64, 64, 3], "dtype": "uint8"}, {"type": "discrete", "n": 15}
    assert frame_bytes(obs, act) == 64 * 64 * 3 + 4 + 4 * 15  # uint8 frame, value target, old logits
    need = phase_buffer_bytes(obs, act, 64, 256, 32)
    assert need == 32 * 64 * 256 * 12352  # 6.5 GB per 64-env rank at the paper's n_pi
    data = type("D", (), {"observation_space": obs, "action_space": act, "num_envs": 64, "rollout_steps": 256})()
    hp = {"ppg": {"n_pi": 32}}
    assert check_phase_buffer_memory(hp, data, available=2 * need) == need
    with pytest.raises(ValueError, match=r"model.ppg.n_pi=32 x data.num_envs=64 x data.rollout_steps=256.*lower"):
        check_phase_buffer_memory(hp, data, processes=4, available=2 * need)
    assert check_phase_buffer_memory({"ppg": {"n_aux_epochs": 0}}, data, available=1) == 0


def test_bad_ppg_config_fails_before_training():
    dm = RolloutDataModule(num_envs=2, rollout_steps=8, num_minibatches=2)
    for bad, match in [({"n_pi": 0}, "n_pi"), ({"aux_mbsize": 1.5}, "aux_mbsize"), ({"n_pi_typo": 3}, "unknown"),
                       ({"aux_betas": [0.9, 1.0]}, "aux_betas"), ({"epochs_value": 0}, "epochs_value")]:
        with pytest.raises(ValueError, match=match):
            PPOLightningModule(dm.observation_space, dm.action_space, ppg=bad)
    with pytest.raises(ValueError, match="aux_value_head"):
        PPOLightningModule(dm.observation_space, dm.action_space, network={"name": "mlp", "aux_value_head": False},
                           ppg={})


def test_ppg_ewma_learns_cartpole_quickly(tmp_path):
    torch.manual_seed(0)  # the network's initialization too: the outcome must not depend on earlier tests
    dm, model = make(24, ppg={"n_pi": 4, "n_aux_epochs": 3, "aux_mbsize": 4, "aux_lr": 2e-3},
                     num_envs=8, rollout_steps=32, num_minibatches=4, update_epochs=3)
    torch.manual_seed(0)
    trainer(tmp_path).fit(model, dm)
    assert model.ppg_phases.phase == 6
    assert dm.states[0].episodes.mean_return(20) > 100, dm.states[0].episodes.mean_return(20)  # random play: ~22


@pytest.mark.parametrize("config", ["ppg_hard.yaml", "ppg_ewma_hard.yaml"])
def test_procgen_ppg_configs_train_a_policy_and_an_auxiliary_phase(config, tmp_path):
    """The shipped Procgen PPG configs, model settings intact (full dual IMPALA CNN, micro-batches), on a
    small rollout with n_pi 1 and one auxiliary epoch, so that both phases run."""
    import json
    from pathlib import Path

    import yaml

    from ppo_lightning.run.builder import fit_main

    path = Path(__file__).resolve().parents[1] / "ppo_lightning/configs/procgen" / config
    ppg = {**yaml.safe_load(path.read_text())["model"]["ppg"], "n_pi": 1, "n_aux_epochs": 1}
    cli = fit_main(["fit", "--config", str(path), "--mlflow.enabled", "false", "--run_dir", str(tmp_path),
                    "--trainer.enable_progress_bar", "false", "--data.num_envs", "2", "--data.rollout_steps", "128",
                    "--data.num_minibatches", "2", "--data.total_frames", "256", "--data.num_threads", "1",
                    "--model.ppg", json.dumps(ppg), "--trainer.callbacks", "[]"])  # no held-out evaluation (38 s)
    h = cli.model.hparams
    assert h.network["arch"] == "dual" and h.network["channels"] == [16, 32, 32] and h.micro_batch_size == 128
    assert h.ppg["n_aux_epochs"] == 1 and h.ppg["aux_mbsize"] == 4 and cli.datamodule.update_epochs == 1
    # 2 policy steps, then one auxiliary step on both env trajectories; the phase closed.
    assert cli.trainer.global_step == 3 and cli.model.ppg_phases.phase == 1
    if "ewma" in config:
        assert h.proximal_com == 8.0 and cli.model.proximal_source.num_updates == 2
        assert cli.model.proximal_source.num_resets == 1


def test_fit_without_the_cli_also_checks_the_phase_buffer(tmp_path, monkeypatch):
    monkeypatch.setattr("ppo_lightning.algos.ppg.available_memory_bytes", lambda: 1000)
    dm, model = make(2)
    with pytest.raises(ValueError, match="model.ppg.n_pi=2 x data.num_envs=4"):
        trainer(tmp_path).fit(model, dm)


class LrLog(pl.Callback):
    """Each step's phase and the lr of every optimizer when it ran."""

    def __init__(self):
        self.rows = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rows.append((trainer.datamodule.iteration, outputs["ppg_phase"],
                          [o.param_groups[0]["lr"] for o in trainer.optimizers]))


@pytest.mark.parametrize("schedule", [{"lr_schedule": "linear"}, {"schedules": {"lr": "linear"}}])
def test_ppg_anneals_the_policy_lr_per_iteration_and_keeps_the_aux_lr(schedule, tmp_path):
    """PPG with an lr schedule (``model.lr_schedule`` or ``model.schedules.lr``): iteration k's policy steps
    run at lr x (1 - (k - 1) / N), as PPO's; the auxiliary phase keeps ``ppg.aux_lr``; a resume continues
    the schedule from the checkpoint's scheduler."""
    def build(iterations):
        dm = RolloutDataModule(env_id="CartPole-v1", num_envs=ENVS, rollout_steps=STEPS, num_minibatches=MB,
                               update_epochs=1, seed=0, total_frames=iterations * ENVS * STEPS)
        model = PPOLightningModule(dm.observation_space, dm.action_space, network={"name": "mlp", "hidden_sizes": [16]},
                                   lr=1e-2, ppg={"n_pi": 2, "n_aux_epochs": 1, "aux_mbsize": 8, "aux_lr": 3e-3},
                                   **schedule)
        return dm, model

    dm, model = build(4)
    log = LrLog()
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="it{epoch}",
                                        auto_insert_metric_name=False)
    trainer(tmp_path, [log, ckpt], enable_checkpointing=True).fit(model, dm)
    for it, phase, (policy_lr, aux_lr) in log.rows:
        if phase == "aux":
            assert aux_lr == pytest.approx(3e-3)
        else:
            assert policy_lr == pytest.approx(1e-2 * (1 - (it - 1) / 4)), (it, phase)
    assert {it for it, phase, _ in log.rows if phase == "joint"} == {1, 2, 3, 4}
    dm2, model2 = build(4)
    resumed = LrLog()
    trainer(tmp_path, [resumed]).fit(model2, dm2, ckpt_path=tmp_path / "it1.ckpt")  # after iteration 2
    assert [r for r in log.rows if r[0] > 2] == resumed.rows


def test_trainer_gradient_clip_val_clips_ppg_as_ppo(tmp_path):
    """``trainer.gradient_clip_val`` is the one clipping setting: on a PPG model it becomes the clip of
    PPG's manual step (``model.ppg.max_grad_norm``), so a run with it ends bitwise as one with the PPG
    setting, and apart from one without clipping; conflicting settings are one line before training."""
    from ppo_lightning.run.builder import fit_main

    base = ["fit", "--config", "ppo_lightning/configs/cartpole/ppg.yaml", "--mlflow.enabled", "false",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_checkpointing", "false", "--video_every", "null",
            "--data.total_frames", "1024", "--data.num_threads", "1", "--model.ppg.n_pi", "2", "--model.ppg.n_aux_epochs", "1",
            "--trainer.gradient_clip_val", "null"]  # the config's 0.5 off: each case sets its own

    def weights(*extra, name):
        cli = fit_main([*base, "--run_dir", str(tmp_path / name), *extra])
        assert cli.trainer.gradient_clip_val is None
        return cli.model.hparams.ppg["max_grad_norm"], torch.nn.utils.parameters_to_vector(cli.model.network.parameters())

    clip_trainer, w_trainer = weights("--trainer.gradient_clip_val", "0.05", name="t")
    clip_ppg, w_ppg = weights("--model.ppg.max_grad_norm", "0.05", name="p")
    none, w_none = weights("--model.ppg.max_grad_norm", "null", name="n")  # a dotted null is None, not "None"
    assert clip_trainer == clip_ppg == 0.05 and none is None
    assert torch.equal(w_trainer, w_ppg) and not torch.equal(w_trainer, w_none)
    for extra, match in [(["--trainer.gradient_clip_val", "0.1", "--model.ppg.max_grad_norm", "0.05"],
                          "differ: set trainer.gradient_clip_val alone"),
                         (["--trainer.gradient_clip_val", "0.5", "--trainer.gradient_clip_algorithm", "value"],
                          "PPG clips the gradient norm only")]:
        with pytest.raises(ValueError, match=match):
            fit_main([*base, "--run_dir", str(tmp_path / "bad"), *extra])


def test_a_library_trainers_gradient_clip_val_clips_ppg_steps(tmp_path):
    """PPO and PPG take one step path (`ppo_lightning.training.update.Update`), which takes the Trainer's
    ``gradient_clip_val`` when Lightning attaches the module: ``pl.Trainer(gradient_clip_val=g)`` on a PPG
    model ends bitwise as ``model.ppg.max_grad_norm: g``, and apart from no clipping."""
    def weights(clip=None, **ppg):
        torch.manual_seed(0)
        dm, model = make(3, ppg=ppg)
        trainer(tmp_path, gradient_clip_val=clip).fit(model, dm)
        assert model.updater.clip_val == (clip or ppg.get("max_grad_norm"))
        return vec(model.network.parameters())

    by_trainer, by_ppg, none = weights(clip=0.01), weights(max_grad_norm=0.01), weights()
    assert torch.equal(by_trainer, by_ppg) and not torch.equal(by_trainer, none)
