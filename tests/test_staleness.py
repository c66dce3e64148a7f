"""Artificial staleness: delay, start-up fill, the three choices of old policy, config errors, diagnostics."""

import copy
import math
import warnings
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from ppo_lightning.cli.fit import main
from ppo_lightning.run.builder import fit_main
from ppo_lightning.data.datamodule import RolloutDataModule
from ppo_lightning.training.diagnostics import (SmallBatchDiagnostics, clip_fraction_problem, std_oscillation,
                                                std_relative_error)
from ppo_lightning.nets.models import ActorCritic, make_distribution
from ppo_lightning.algos.staleness import StalenessQueue, relabel, validate_staleness

ROOT = Path(__file__).resolve().parents[1]
PPO = str(ROOT / "ppo_lightning/configs/cartpole/ppo.yaml")
SPACE = {"type": "discrete", "n": 2}


def test_queue_delays_by_k_and_fills_at_start():
    q = StalenessQueue(2)
    fills = iter(range(100, 200))
    trained, lags = [], []
    for t in range(1, 7):  # iteration t, collected by the policy after t-1 updates
        out = q.delay(f"r{t}", t - 1, collect_more=lambda: f"fill{next(fills)}")
        trained.append(out)
        lags.append(q.last_lag)
    # iteration 1 collects r1 + 2 fill rollouts (initial policy) and trains on r1, the first collected
    assert trained == ["r1", "fill100", "fill101", "r2", "r3", "r4"]
    assert lags == [0, 1, 2, 2, 2, 2]
    assert len(q) == 2 and q.collected == 8


def make_rollout(net, envs=3, steps=5):
    torch.manual_seed(0)
    obs = torch.randn(envs, steps, 4)
    logits = net.policy(obs)[0].detach()
    dist = make_distribution(SPACE, logits)
    action = dist.sample()
    return TensorDict({"observation": obs, "action": action, "logits": logits,
                       "action_log_prob": dist.log_prob(action), "state_value": net.value(obs).detach()},
                      batch_size=[envs, steps])


@pytest.mark.parametrize("mode", ["behavior", "proximal", "decoupled"])
def test_relabel_uses_the_right_policy_in_each_role(mode):
    torch.manual_seed(1)
    stale = ActorCritic({"shape": [4]}, SPACE, hidden_sizes=(8,))
    recent = copy.deepcopy(stale)
    with torch.no_grad():
        for p in recent.parameters():
            p.add_(torch.randn_like(p))
    rollout = make_rollout(stale)
    old = rollout.clone()
    relabel(rollout, recent, mode, SPACE)
    obs, action = rollout["observation"], rollout["action"]
    recent_logits = recent.policy(obs)[0].detach()
    recent_lp = make_distribution(SPACE, recent_logits).log_prob(action)
    # values stay those predicted at collection (reference protocol; only bootstraps are recomputed)
    torch.testing.assert_close(rollout["state_value"], old["state_value"])
    assert not torch.allclose(old["state_value"], recent.value(obs).detach())
    if mode == "behavior":  # stale policy in both roles
        torch.testing.assert_close(rollout["action_log_prob"], old["action_log_prob"])
        torch.testing.assert_close(rollout["logits"], old["logits"])
        assert "proximal" not in rollout.keys()
    elif mode == "proximal":  # recent policy in both roles
        torch.testing.assert_close(rollout["action_log_prob"], recent_lp)
        torch.testing.assert_close(rollout["logits"], recent_logits)
        assert "proximal" not in rollout.keys()
    else:  # stale behavior for importance sampling, recent proximal
        torch.testing.assert_close(rollout["action_log_prob"], old["action_log_prob"])
        torch.testing.assert_close(rollout["proximal", "logits"], recent_logits)
    assert not torch.allclose(recent_lp, old["action_log_prob"])


def test_data_module_trains_on_delayed_rollouts_with_recent_proximal():
    dm = RolloutDataModule(num_envs=2, rollout_steps=8, num_minibatches=2, update_epochs=1, seed=0,
                           staleness=2, staleness_mode="decoupled")
    net = ActorCritic(dm.observation_space, dm.action_space, hidden_sizes=(8,))
    source = dm.make_source(net)
    indices = []
    for t in range(1, 5):
        batches = list(iter(source))
        indices.append(source.stale.last_index)
        mb = batches[0]
        # the proximal policy is the network at the start of this iteration
        torch.testing.assert_close(mb["proximal", "logits"], net.policy(mb["observation"])[0].detach())
        if t >= 2:  # data collected by an earlier policy: behavior log-probs stay stale
            recent_lp = make_distribution(SPACE, mb["proximal", "logits"]).log_prob(mb["action"])
            assert not torch.allclose(mb["action_log_prob"], recent_lp)
        assert source.last_timing["staleness/lag"] == min(t - 1, 2)
        with torch.no_grad():  # "training": move the weights between iterations
            for p in net.parameters():
                p.add_(0.3 * torch.randn_like(p))
    assert indices == [0, 1, 2, 3]
    assert dm.frames == 4 * 16  # the two extra start-up rollouts that fill the queue are not counted
    source.collector.shutdown()


def test_validation_names_fields():
    for args, field in [((-1, "decoupled"), "data.staleness"), ((1, "recent"), "data.staleness_mode")]:
        with pytest.raises(ValueError, match=field):
            validate_staleness(*args)
    with pytest.raises(ValueError, match="model.decoupled"):
        validate_staleness(2, "decoupled", decoupled=False)
    with pytest.raises(ValueError, match="model.proximal_com"):
        validate_staleness(2, "behavior", decoupled=True, proximal_com=8.0)
    validate_staleness(0, "decoupled", decoupled=False, proximal_com=8.0)  # off: nothing to check
    validate_staleness(2, "proximal", decoupled=False)


@pytest.mark.parametrize("override,field", [(["--data.staleness", "2"], "model.decoupled"),
                                            (["--data.staleness", "-1"], "data.staleness"),
                                            (["--data.staleness", "1", "--data.staleness_mode", "x"], "staleness_mode")])
def test_cli_staleness_errors_exit_2(tmp_path, capsys, monkeypatch, override, field):
    monkeypatch.setattr("ppo_lightning.run.builder._TRAINING_STARTED", False)  # an earlier in-process fit set it
    rc = main(["fit", "--config", PPO, "--mlflow.enabled", "false", "--run_dir", str(tmp_path), *override])
    assert rc == 2
    err = capsys.readouterr().err
    assert "error:" in err and field in err


def test_cli_stale_decoupled_run(tmp_path):
    cli = fit_main(["fit", "--config", PPO, "--mlflow.enabled", "false", "--run_dir", str(tmp_path),
                    "--trainer.enable_progress_bar", "false", "--data.total_frames", "1024", "--data.num_envs", "4",
                    "--data.rollout_steps", "16", "--model.decoupled", "true", "--model.max_importance_ratio", "100",
                    "--data.staleness", "2", "--data.staleness_mode", "decoupled"])
    dm = cli.datamodule
    assert dm.frames == 1024 and dm.iteration == 1024 // 64  # start-up rollouts not counted
    assert cli.trainer.callback_metrics["staleness/lag"] == 2
    assert "diagnostics/adv_std_oscillation" in cli.trainer.callback_metrics


def test_diagnostics_thresholds_and_warn_once():
    assert clip_fraction_problem(0.0001, 3) == "low"
    assert clip_fraction_problem(0.15, 1) == "high" and clip_fraction_problem(0.15, 3) is None
    assert clip_fraction_problem(0.25, 3) == "high" and clip_fraction_problem(0.05, 1) is None
    assert std_oscillation([1.0, 5.0, 0.4]) == pytest.approx(12.5) and std_oscillation([2.0]) == 1.0
    # minibatch stds 1 +- 0.5 (sd 0.5 over 4 minibatches): the batch's std is off by 0.5 / sqrt(4) = 25%,
    # an EWMA over 4 iterations halves it
    assert std_relative_error([0.5, 1.5, 0.5, 1.5], 4) == pytest.approx(0.5 / 3**0.5 * 2 / 2)
    assert std_relative_error([0.5, 1.5, 0.5, 1.5], 4, span=4) == pytest.approx(0.5 / 3**0.5 / 2)
    assert math.isnan(std_relative_error([1.0], 4)) and math.isnan(std_relative_error([1.0, 2.0], 1))


class _DM:
    update_epochs, num_minibatches, normalize_advantage, iteration = 1, 4, True, 0

    def __init__(self):
        self.advantage_moments = type("Moments", (), {"history": [], "span": 1.0})()
        self.states = [self]  # the data module's one SeedState, with these moments


class _M:
    hparams = {"objective": "clip"}
    step_stats = [{"clip_fraction": torch.tensor([0.5])}]

    def __init__(self):
        self.logged = {}

    def log_dict(self, d, **kw):
        self.logged.update(d)


def _run_diagnostics(minibatch_size, history, iterations=24, seed=0):
    """Iterations of 4 minibatches of heavy-tailed advantages (Student t, 3 dof) through the callback."""
    g = torch.Generator().manual_seed(seed)
    trainer = type("T", (), {"datamodule": _DM(), "world_size": 1})()
    cb, m = SmallBatchDiagnostics(warmup=2), _M()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(iterations):
            trainer.datamodule.iteration = i + 1
            for b in range(4):
                adv = torch.distributions.StudentT(3.0).sample((minibatch_size, 1))  # as the batch holds it
                cb.on_train_batch_start(trainer, m, {"advantage": adv}, b)
            trainer.datamodule.advantage_moments.history.append(history(i))
            cb.on_train_epoch_end(trainer, m)
    return [str(w.message) for w in caught], m.logged


def test_diagnostics_warn_once_about_a_noisy_small_batch():
    messages, logged = _run_diagnostics(minibatch_size=4, history=lambda i: 1.0)
    assert sum("clip fraction" in s for s in messages) == 1 and sum("advantage-std" in s for s in messages) == 1
    assert logged["diagnostics/adv_std_error"] > 0.25


def test_diagnostics_accept_a_large_batch_whose_advantage_scale_moves():
    """A healthy run (CartPole's default: 256 samples per iteration) whose advantage scale falls 20x
    when the policy first survives a whole rollout: logged as oscillation, no advantage-std warning."""
    messages, logged = _run_diagnostics(minibatch_size=64, history=lambda i: 20.0 if i < 12 else 1.0, iterations=16)
    assert not [s for s in messages if "advantage-std" in s], messages
    assert logged["diagnostics/adv_std_oscillation"] == pytest.approx(20.0)
    assert logged["diagnostics/adv_std_error"] < 0.25


def test_diagnostics_measure_a_real_run(tmp_path):
    """The callback sees the minibatches of a real fit and logs the advantage-std error each iteration."""
    cli = fit_main(["fit", "--config", PPO, "--mlflow.enabled", "false", "--run_dir", str(tmp_path),
                    "--trainer.enable_progress_bar", "false", "--data.total_frames", "1024", "--data.num_envs", "4",
                    "--data.rollout_steps", "16"])
    (diag,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, SmallBatchDiagnostics)]
    assert len(diag.error_history) == 10 and all(0 < e < 1 for e in diag.error_history)
    assert "diagnostics/adv_std_error" in cli.trainer.callback_metrics


@pytest.mark.parametrize("scale", [1, 16, 0.5])
def test_diagnostics_warm_up_over_frames_not_iterations(scale):
    """At ``--scale 16`` an iteration has 1/16 of the frames: the clip-fraction warning waits 160
    iterations (the frames of 10 unscaled ones), not 10 (it fired early in every c = 16 run)."""

    class DM:
        update_epochs, iteration = 3, 0
        states = None

    class M:
        hparams = {"objective": "clip"}
        step_stats = [{"clip_fraction": torch.tensor([0.0])}]  # the clipping never acts

        def log_dict(self, d, **kw):
            pass

    class T:
        datamodule = DM()

    cb, warned_at = SmallBatchDiagnostics(scale=scale), []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(1, 200):
            T.datamodule.iteration = i
            cb.on_train_epoch_end(T(), M())
            warned_at += [i] * len(caught)
            caught.clear()
    assert warned_at == [math.ceil(10 * scale) + 1]
    with pytest.raises(ValueError, match="scale"):
        SmallBatchDiagnostics(scale=0)


def test_queue_survives_a_checkpoint(tmp_path):
    """A resumed stale run trains on the rollouts queued before the checkpoint, not on a refill."""
    import lightning.pytorch as pl

    from ppo_lightning.training.module import PPOLightningModule

    class Lags(pl.Callback):
        def __init__(self):
            self.indices = []

        def on_train_epoch_end(self, trainer, pl_module):
            self.indices.append(trainer.datamodule.source.stale.last_index)

    def fit(total_frames, ckpt_path=None):
        dm = RolloutDataModule(num_envs=2, rollout_steps=8, num_minibatches=2, update_epochs=1, seed=0,
                               total_frames=total_frames, staleness=2, staleness_mode="decoupled")
        model = PPOLightningModule(dm.observation_space, dm.action_space, network={"name": "mlp", "hidden_sizes": [8]},
                                   decoupled=True)
        lags = Lags()
        ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0)
        trainer = pl.Trainer(max_epochs=-1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[lags, ckpt])
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
        return dm, lags.indices

    dm, indices = fit(48)  # iteration 1: 3 rollouts (queue fill, 2 not counted), then one per iteration
    assert indices == [0, 1, 2] and dm.frames == 48
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)["RolloutDataModule"]["per_rank"][0]["staleness_queue"]
    assert [e["index"] for e in saved["queue"]] == [3, 4] and saved["collected"] == 5
    dm, indices = fit(80, ckpt_path=tmp_path / "last.ckpt")
    assert indices == [3, 4] and dm.frames == 80  # no refill: one new rollout per iteration

    bad = StalenessQueue(3, "decoupled")
    with pytest.raises(ValueError, match="staleness"):
        bad.load_state_dict(saved)
