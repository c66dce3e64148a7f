"""Batch-size invariance: the scaling arithmetic, ``fit --scale c`` on a config, a c=1 vs c=4 smoke run."""

import math
from pathlib import Path

import pytest

from ppo_lightning.cli.fit import main
from ppo_lightning.run.builder import fit_main
from ppo_lightning.algos.scaling import apply_scale, batch_size_scaling, format_scale_table, parse_rules, scale_batch

ROOT = Path(__file__).resolve().parents[1]
EWMA = str(ROOT / "ppo_lightning/configs/cartpole/ppo_ewma.yaml")


def test_paper_rules_arithmetic():
    s = batch_size_scaling(256, lr=5e-4, proximal_com=8.0, adv_norm_span=1.0, ppg_n_pi=32)
    assert s["proximal_com"] == 2048.0
    assert s["lr"] == pytest.approx(5e-4 / 16)
    assert s["adv_norm_span"] == 256.0
    assert s["ppg_n_pi"] == 32 * 256
    assert batch_size_scaling(4, lr=5e-4, proximal_com=None, adv_norm_span=1.0)["lr"] == pytest.approx(2.5e-4)
    assert batch_size_scaling(4, lr=5e-4, proximal_com=None, adv_norm_span=1.0)["proximal_com"] is None
    sgd = batch_size_scaling(8, lr=0.1, proximal_com=2.0, adv_norm_span=3.0, optimizer="sgd")
    assert sgd["lr"] == pytest.approx(0.1 / 8) and sgd["adv_norm_span"] == 24.0 and sgd["proximal_com"] == 16.0
    betas = batch_size_scaling(4, lr=1e-3, proximal_com=None, adv_norm_span=1.0, adam_betas=(0.9, 0.999))["adam_betas"]
    assert betas == pytest.approx((0.9 ** 0.25, 0.999 ** 0.25))
    # c < 1 scales up: lr * sqrt(1/c); the span cannot go below 1 (per-batch normalization).
    up = batch_size_scaling(0.25, lr=1e-3, proximal_com=8.0, adv_norm_span=2.0)
    assert up["lr"] == pytest.approx(2e-3) and up["proximal_com"] == 2.0 and up["adv_norm_span"] == 1.0
    # invariance of the composition: scaling by a then b equals scaling by a*b
    a = batch_size_scaling(2, lr=1e-3, proximal_com=4.0, adv_norm_span=1.0, adam_betas=(0.9, 0.99))
    ab = batch_size_scaling(8, lr=a["lr"], proximal_com=a["proximal_com"], adv_norm_span=a["adv_norm_span"],
                            adam_betas=a["adam_betas"])
    direct = batch_size_scaling(16, lr=1e-3, proximal_com=4.0, adv_norm_span=1.0, adam_betas=(0.9, 0.99))
    for k in ("lr", "proximal_com", "adv_norm_span"):
        assert ab[k] == pytest.approx(direct[k])
    assert ab["adam_betas"] == pytest.approx(direct["adam_betas"])


@pytest.mark.parametrize("c", [0, -2, math.inf, math.nan])
def test_invalid_c_names_scale(c):
    with pytest.raises(ValueError, match="scale"):
        batch_size_scaling(c, lr=1e-3, proximal_com=None, adv_norm_span=1.0)


def test_scale_batch_divides_envs_then_steps():
    assert scale_batch(8, 32, 4, 4) == (2, 32)
    assert scale_batch(8, 32, 4, 32) == (1, 8)  # 8 from the envs, 4 from the steps
    assert scale_batch(8, 32, 4, 0.5) == (16, 32)
    for bad in (3, 2.5, 128, 0.3):  # 3 and 2.5 do not divide; 128 leaves 2 frames for 4 minibatches
        with pytest.raises(ValueError, match="scale"):
            scale_batch(8, 32, 4, bad)


def test_rules_parsing_and_ablation():
    assert parse_rules("all") == ("lr", "com", "adv_span", "ppg_n_pi")
    assert parse_rules("lr,com", scale_adam_betas=True) == ("lr", "com", "adam_betas")
    assert parse_rules("none") == ()
    with pytest.raises(ValueError, match="scale_rules"):
        parse_rules("lr,momentum")


def test_apply_scale_on_a_namespace():
    from jsonargparse import Namespace

    cfg = Namespace(data=Namespace(num_envs=8, rollout_steps=32, num_minibatches=4, advantage_norm_span=1.0),
                    model=Namespace(lr=1e-3, proximal_com=8.0, optimizer="adam", adam_betas=[0.9, 0.999]))
    report = apply_scale(cfg, 4, "lr,adv_span", scale_adam_betas=True)  # com ablated
    assert (cfg.data.num_envs, cfg.data.rollout_steps, cfg.data.num_minibatches) == (2, 32, 4)
    assert cfg.model.lr == pytest.approx(5e-4) and cfg.model.proximal_com == 8.0
    assert cfg.data.advantage_norm_span == 4.0 and cfg.model.adam_betas == pytest.approx([0.9**0.25, 0.999**0.25])
    assert report["data.minibatch_size"] == {"from": 64, "to": 16}
    assert "model.lr" in format_scale_table(4, ("lr",), report)


def test_cli_invalid_scale_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("ppo_lightning.run.builder._TRAINING_STARTED", False)  # an earlier in-process fit set it
    for bad in ("3", "0", "-4"):
        rc = main(["fit", "--config", EWMA, "--mlflow.enabled", "false", "--run_dir", str(tmp_path), "--scale", bad])
        assert rc == 2
        err = capsys.readouterr().err
        assert "error:" in err and "scale" in err
    assert not (tmp_path / "checkpoints").exists()


def test_cli_scale_invariance_smoke(tmp_path):
    """c=1 and c=4 on the same frame budget: the namespace, the module and MLflow see the scaled values."""
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    common = ["fit", "--config", EWMA, "--trainer.enable_progress_bar", "false", "--trainer.gradient_clip_val", "null",
              "--data.total_frames", "512", "--data.update_epochs", "2", "--mlflow.tracking_uri", uri,
              "--mlflow.experiment", "scale",
              # explicit base values, so that the test does not follow the config's tuning
              "--model.lr", "0.001", "--model.proximal_com", "8", "--data.num_envs", "8", "--data.rollout_steps", "32",
              "--data.num_minibatches", "4"]
    runs = {}
    for c in (1, 4):
        cli = fit_main([*common, "--scale", str(c), "--run_dir", str(tmp_path / f"c{c}"), "--mlflow.run_name", f"c{c}"])
        runs[c] = cli
        cfg = cli.config.fit
        assert cfg.data.num_envs == 8 // c and cfg.data.num_minibatches == 4
        assert cli.datamodule.minibatch_size == 64 // c
        assert cli.model.hparams.lr == pytest.approx(1e-3 / math.sqrt(c))
        assert cli.model.hparams.proximal_com == 8.0 * c and cli.model.proximal_source.com == 8.0 * c
        assert cli.datamodule.advantage_norm_span == float(c)
        assert cli.datamodule.frames == 512
        # the small-batch diagnostics warm up over the same frames: c times the iterations
        (diag,) = [cb for cb in cli.trainer.callbacks if type(cb).__name__ == "SmallBatchDiagnostics"]
        assert diag.warmup == 10 * c
    # same frames, c times the iterations and gradient steps
    assert runs[4].trainer.global_step == 4 * runs[1].trainer.global_step == 4 * 2 * 2 * 4
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("scale")
    params = {r.info.run_name: r.data.params for r in client.search_runs([exp.experiment_id])}
    p = params["c4"]
    assert float(p["scale"]) == 4.0 and float(p["lr"]) == pytest.approx(5e-4) and float(p["proximal_com"]) == 32.0
    assert float(p["unscaled/model.lr"]) == pytest.approx(1e-3) and p["scale_rules"] == "lr,com,adv_span,ppg_n_pi"
    assert int(p["num_envs"]) == 2


def test_resuming_a_scaled_run_scales_once_and_another_scale_is_refused(tmp_path, capsys):
    """LightningCLI puts the checkpoint's (already scaled) model settings over the config's: a resume
    with the same ``--scale`` must not scale them again (found in a c = 4 sweep resumed at lr / 4)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    common = ["fit", "--config", EWMA, "--trainer.enable_progress_bar", "false", "--mlflow.tracking_uri", uri,
              "--model.lr", "0.001", "--model.proximal_com", "8", "--data.num_envs", "8", "--data.rollout_steps", "32",
              "--data.num_minibatches", "4", "--data.update_epochs", "1", "--checkpoint_every", "1",
              "--run_dir", str(tmp_path / "run")]
    first = fit_main([*common, "--data.total_frames", "256", "--scale", "4"])
    assert first.model.hparams.lr == pytest.approx(5e-4) and first.model.proximal_source.com == 32.0
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert ckpt.exists()
    resumed = fit_main([*common, "--data.total_frames", "512", "--scale", "4", "--ckpt_path", str(ckpt)])
    assert resumed.model.hparams.lr == pytest.approx(5e-4)
    assert resumed.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(5e-4)
    assert resumed.model.proximal_source.com == 32.0 and resumed.datamodule.frames == 512
    capsys.readouterr()
    rc = main([*common, "--data.total_frames", "768", "--scale", "2", "--ckpt_path", str(ckpt)])
    err = capsys.readouterr().err
    assert rc == 2 and "was trained with other scaled settings (model.lr 0.0005 in the checkpoint, 0.0007071 after --scale 2" in err, err[-2000:]
