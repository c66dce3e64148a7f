"""The run API (`ppo_lightning.run`): a `RunSpec` is the same run as its ``ppo-lightning fit`` line,
studies and searches describe their runs as specs, and bad specs fail before anything trains."""

from __future__ import annotations

import shlex

import pytest
import torch

from ppo_lightning.run import Members, RunSpec, train

TINY = {"data.num_envs": 2, "data.rollout_steps": 16, "data.num_minibatches": 2, "data.update_epochs": 1,
        "trainer.precision": "32-true", "trainer.enable_checkpointing": False, "trainer.enable_progress_bar": False,
        "video_every": None, "mlflow.enabled": False}


def test_dotted_settings_land_in_their_sections_and_come_back_in_one_order():
    a = RunSpec.from_settings(["cartpole/ppo"], {"model.lr": 2e-3, "video_every": None, "trainer.precision": "32-true",
                                                 "data.env_id": "CartPole-v1", "seed_everything": 3,
                                                 "data.total_frames": 512, "trainer.callbacks+": "my.Callback"})
    assert (a.env, a.seed, a.frames, a.model, a.trainer, a.options, a.callbacks) == (
        "CartPole-v1", 3, 512, {"lr": 2e-3}, {"precision": "32-true"}, {"video_every": None}, ("my.Callback",))
    # the same settings in another order are the same spec, with the same fit line (group names hash it)
    b = RunSpec(configs=["cartpole/ppo"], env="CartPole-v1", seed=3, frames=512, model={"lr": 2e-3},
                trainer={"precision": "32-true"}, options={"video_every": None}, callbacks=["my.Callback"])
    assert a == b and a.argv() == b.argv() and a.key() == b.key()
    assert shlex.split(a.command())[:4] == ["ppo-lightning", "fit", "--config", "cartpole/ppo"]
    assert "--trainer.callbacks+=my.Callback" in a.argv() and a.argv()[a.argv().index("--data.seed") + 1] == "3"
    assert RunSpec.from_settings([], a.settings()) == a.replace(configs=(), callbacks=())  # round-trips


def test_members_are_checked_where_they_are_made():
    with pytest.raises(ValueError, match="member_hparams.lr needs one value per member"):
        Members([0, 1], {"lr": [1e-3]})
    with pytest.raises(ValueError, match="'horizon' cannot differ between members"):
        Members([0, 1], {"horizon": [1, 2]})
    with pytest.raises(ValueError, match="belongs in the spec's model settings"):
        RunSpec(options={"model.lr": 1e-3})
    spec = RunSpec(members=Members([4, 5], {"lr": [1e-3, 2e-3]}))
    assert spec.settings()["data.member_seeds"] == [4, 5] and spec.settings()["data.member_hparams"] == {"lr": [1e-3, 2e-3]}
    assert "data.member_seeds" not in RunSpec(members=Members([4])).settings()  # one member: a single run


@pytest.mark.timeout(300)
def test_a_spec_trains_as_its_fit_line_and_a_member_as_its_seed_alone(tmp_path, monkeypatch):
    from ppo_lightning.run.builder import fit_main

    monkeypatch.chdir(tmp_path)
    base = RunSpec.from_settings(["cartpole/ppo"], TINY, env="CartPole-v1", seed=7, frames=128)
    group = train(base.with_settings({"run_dir": "group"}).replace(members=Members([7, 8], {"lr": [1e-3, 3e-3]})))
    assert group.exit_code == 0 and group.datamodule.frames == 128 and group.run_id is None
    alone = train(base.with_settings({"run_dir": "alone", "model.lr": 3e-3, "seed_everything": 8}))
    by_line = fit_main(["fit", *base.with_settings({"run_dir": "line"}).argv()])
    plain = train(base.with_settings({"run_dir": "plain"}))
    # the spec and its command line: one run; member 1 of the group: seed 8 with lr 3e-3 alone (within the
    # batched matmul's rounding, tests/test_members_every_env.py)
    assert all(torch.equal(a, b) for a, b in zip(plain.model.state_dict().values(), by_line.model.state_dict().values()))
    ref, got = alone.model.network.state_dict(), group.model.network.seed_state_dict(1)
    assert ref.keys() == got.keys()
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=1e-5)

def test_a_bad_spec_fails_before_training_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception, match="total_frame"):
        train(RunSpec.from_settings(["cartpole/ppo"], {**TINY, "data.total_frame": 10}))
    assert not (tmp_path / "runs").exists()


@pytest.mark.timeout(300)
def test_the_first_run_guides_run_api_block_runs_as_printed(tmp_path, monkeypatch):
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "first-run.md").read_text()
    [block] = [b for b in re.findall(r"^```python\n(.*?)^```", page, re.S | re.M) if "RunSpec(" in b]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(block, "first-run.md", "exec"), namespace)  # noqa: S102 - the page's own example
    run = namespace["run"]
    assert run.exit_code == 0 and run.datamodule.frames == 2048 and run.run_id
    assert run.model.network.seed_state_dict(2).keys() == run.model.network.seed_state_dict(0).keys()  # 3 members
    assert namespace["spec"].command().startswith("ppo-lightning fit --config cartpole/ppo")


def test_a_spec_as_values_parses_to_the_config_of_its_fit_line(tmp_path, monkeypatch):
    import jsonargparse

    from ppo_lightning.core.configs import plain
    from ppo_lightning.run.builder import fit_main
    from ppo_lightning.run.preflight import _check_cli_class
    from ppo_lightning.run.trust import parse_error_line

    monkeypatch.chdir(tmp_path)
    spec = RunSpec.from_settings(
        ["cartpole/ppo", "cartpole/ppo_ewma"], {"model.class_path": "ppo_lightning.training.module.PPOLightningModule"} |
        {**TINY, "model.lr": 1e-3, "model.network": {"name": "auto", "hidden_sizes": [32], "activation": "relu"},
         "model.value_loss": "huber", "model.value_loss_args.delta": 0.5, "model.schedules.lr": "linear", "data.env_kwargs": {"max_episode_steps": 50},
         "trainer.gradient_clip_val": None, "mlflow.experiment": "x", "scale_rules": "lr,com",
         "trainer.callbacks+": ["lightning.pytorch.callbacks.LearningRateMonitor",
                                '{"class_path": "lightning.pytorch.callbacks.Timer", "init_args": {"interval": "epoch"}}'],
         "run_dir": "r"},
        env="CartPole-v1", seed=3, frames=256, members=Members([3, 4], {"lr": [1e-3, 2e-3]}))
    cli = _check_cli_class()
    by_line, by_values = fit_main(["fit", *spec.argv()], cli_class=cli), fit_main({"fit": spec.values()}, cli_class=cli)
    a, b = plain(by_line.config), plain(by_values.config)
    assert a == b
    model = a["fit"]["model"]["init_args"]
    assert model["value_loss_args"] == {"delta": 0.5} and model["schedules"] == {"lr": "linear"} and model["lr"] == 1e-3
    assert [c["class_path"] for c in a["fit"]["trainer"]["callbacks"]] == [
        "lightning.pytorch.callbacks.EarlyStopping", "lightning.pytorch.callbacks.LearningRateMonitor",
        "lightning.pytorch.callbacks.Timer"]
    assert a["fit"]["trainer"]["callbacks"][-1]["init_args"]["interval"] == "epoch"
    # a number that is not finite: refused by name, as the command line's text nan is
    with pytest.raises(jsonargparse.ArgumentError) as err:
        fit_main({"fit": spec.with_settings({"data.gamma": float("nan")}).values()}, cli_class=cli)
    assert parse_error_line(str(err.value)) == "data.gamma: Expected a finite number. Got value: nan"
