"""docs/guides/extending.md, run: its Python blocks are the user's module, its commands and YAML run as
printed (on tiny frame budgets), and the four variants of issue 49 behave as the page says."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from ppo_lightning.algos.loss import LOSS_SETTINGS, PPOFamilyLoss
from ppo_lightning.algos.registry import SurrogateInputs
from ppo_lightning.run import builder
from ppo_lightning.cli.fit import main
from ppo_lightning.run.builder import fit_main
from ppo_lightning.training.module import PPOLightningModule

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs/guides/extending.md"
CARTPOLE = str(ROOT / "ppo_lightning/configs/cartpole/ppo.yaml")


def guide_blocks() -> list[tuple[str, str]]:
    """The guide's fenced code blocks, in order, as (language, code)."""
    return re.findall(r"```(\w+)\n(.*?)```", GUIDE.read_text(), re.S)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """The guide's Python blocks as ``my_variants.py`` in the current folder, importable."""
    code = "\n\n".join(code for lang, code in guide_blocks() if lang == "python")
    (tmp_path / "my_variants.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_variants", None)
    import my_variants

    yield my_variants
    sys.modules.pop("my_variants", None)


def test_each_python_block_of_the_guide_is_at_most_15_lines():
    blocks = [code for lang, code in guide_blocks() if lang == "python"]
    assert len(blocks) >= 5
    for code in blocks:
        assert len(re.findall(r"\S.*", code)) <= 15, code


# ---------------------------------------------------------------------- the page's commands, as printed
TINY = ["--mlflow.enabled", "false", "--trainer.enable_progress_bar", "false", "--data.num_envs", "4",
        "--data.rollout_steps", "16", "--data.num_minibatches", "2", "--data.update_epochs", "1", "--checkpoint_every", "1",
        "--video_every", "null"]


def tiny(argv: list[str], i: int) -> list[str]:
    """A guide command on a tiny budget: 64 frames (a resume keeps its checkpoint's), small MinAtar nets."""
    out = []
    for j, token in enumerate(argv):
        if token == "--data.total_frames" or (j and argv[j - 1] == "--data.total_frames"):
            continue
        out.append(token)
    out += TINY
    if "--ckpt_path" not in out:
        out += ["--data.total_frames", "64"]
    if "--run_dir" not in out:
        out += ["--run_dir", f"run{i}"]
    if any("minatar/" in t for t in out):
        out += ["--model.network.hidden", "16", "--data.num_threads", "1"]
    return out


def expected_output(blocks: list[tuple[str, str]], k: int) -> str | None:
    """The ``text`` block right after block ``k`` (what the command prints), if any."""
    return blocks[k + 1][1].strip() if k + 1 < len(blocks) and blocks[k + 1][0] == "text" else None


def test_every_code_block_of_the_guide_runs_as_printed(user_module, capsys):
    """Python blocks import (the fixture); each ``bash`` command runs through the CLI as printed, with
    the exit code its ``text`` block implies (``error: ...``: 2) and that text's fragments (split at
    "...") in its output; each ``yaml`` block trains as a config over cartpole/ppo."""
    blocks = guide_blocks()
    ran = {"bash": 0, "yaml": 0}
    for k, (lang, code) in enumerate(blocks):
        if lang == "yaml":
            (Path.cwd() / f"block{k}.yaml").write_text(code)
            assert main(["fit", "--config", CARTPOLE, "--config", f"block{k}.yaml", *tiny([], k)]) == 0, code
            ran["yaml"] += 1
        if lang != "bash":
            continue
        for line in code.strip().splitlines():
            argv = shlex.split(line)
            assert argv[:2] == ["PYTHONPATH=.", "ppo-lightning"], line  # how the page runs a module of the current folder
            text = expected_output(blocks, k)
            capsys.readouterr()
            code_ = main(tiny(argv[2:], k))
            out = capsys.readouterr()
            expected_code = 2 if text and text.startswith("error:") else 0
            assert code_ == expected_code, (line, out.err[-3000:])
            if text and line == code.strip().splitlines()[-1]:
                for fragment in filter(None, (f.strip(" ,") for f in text.split("..."))):
                    assert fragment in out.out + out.err, (fragment, out.out[-2000:], out.err[-2000:])
            ran["bash"] += 1
    assert ran["bash"] >= 10 and ran["yaml"] >= 3


def test_the_console_script_finds_the_module_with_pythonpath_dot(user_module):
    """extending.md: the console script does not look in the current folder; ``PYTHONPATH=.`` makes it."""
    script = Path(sys.executable).parent / "ppo-lightning"
    if not script.exists():
        pytest.skip("no ppo-lightning console script beside this Python")
    argv = [str(script), "fit", "--config", "cartpole/ppo", "--model.objective", "my_variants.clip_higher",
            *tiny([], 0)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = subprocess.run(argv, env={**env, "PYTHONPATH": os.pathsep.join([".", str(ROOT)])},
                           capture_output=True, text=True, timeout=300)
    assert found.returncode == 0, found.stderr[-2000:]
    missing = subprocess.run(argv, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and "model.objective 'my_variants.clip_higher': cannot import it" in missing.stderr


# ---------------------------------------------------------------------- the four variants
def batch_and_net(decoupled: bool, far: bool = False):
    from tensordict import TensorDict

    from ppo_lightning.nets.models import build_network

    torch.manual_seed(0)
    net = build_network({"shape": [4], "dtype": "float32"}, {"type": "discrete", "n": 3}, {"name": "mlp", "hidden_sizes": [8]})
    n = 64
    behavior = -torch.rand(n) - 0.5
    if far:  # half the samples far from the behavior policy: ratios of ~50
        behavior[::2] = -5.0
    data = {"observation": torch.randn(n, 4), "action": torch.randint(0, 3, (n,)), "action_log_prob": behavior,
            "logits": torch.randn(n, 3), "advantage": torch.randn(n), "value_target": torch.randn(n),
            "state_value": torch.randn(n)}
    batch = TensorDict(data, batch_size=[n])
    if decoupled:
        batch.set("proximal", TensorDict({"logits": torch.randn(n, 3)}, batch_size=[n]))
    return net, batch


def same_loss_and_gradient(net, a, b) -> bool:
    ga = torch.autograd.grad(a["loss_objective"], list(net.parameters()), allow_unused=True)
    gb = torch.autograd.grad(b["loss_objective"], list(net.parameters()), allow_unused=True)
    return torch.equal(a["loss_objective"], b["loss_objective"]) and all(
        (x is None and y is None) or torch.equal(x, y) for x, y in zip(ga, gb))


ACT = {"type": "discrete", "n": 3}


@pytest.mark.parametrize("decoupled", [False, True])
def test_clip_higher_at_eps_high_equal_to_clip_eps_is_clip_to_the_bit(user_module, decoupled):
    net, batch = batch_and_net(decoupled)
    kwargs = dict(decoupled=decoupled, max_importance_ratio=1.5)
    ours = PPOFamilyLoss(net, ACT, objective="my_variants.clip_higher", objective_args={"eps_high": 0.2}, **kwargs)
    clip = PPOFamilyLoss(net, ACT, objective="clip", **kwargs)
    assert same_loss_and_gradient(net, ours(batch.clone()), clip(batch.clone()))
    wider = PPOFamilyLoss(net, ACT, objective="my_variants.clip_higher", objective_args={"eps_high": 0.5}, **kwargs)
    assert not torch.equal(wider(batch.clone())["loss_objective"], clip(batch.clone())["loss_objective"])


@pytest.mark.parametrize("decoupled", [False, True])
def test_dual_clip_bounds_negative_advantages_at_c_times_a_and_is_clip_for_a_large_c(user_module, decoupled):
    net, batch = batch_and_net(decoupled, far=True)
    clip = PPOFamilyLoss(net, ACT, objective="clip", decoupled=decoupled)
    huge = PPOFamilyLoss(net, ACT, objective="my_variants.dual_clip", objective_args={"c": 1e9}, decoupled=decoupled)
    assert same_loss_and_gradient(net, huge(batch.clone()), clip(batch.clone()))
    # the function itself, on inputs where r A < 3 A for negative A
    lp, blp = torch.full((4,), -0.1), torch.tensor([-5.0, -5.0, -0.1, -0.1])
    adv = torch.tensor([-1.0, 1.0, -1.0, 1.0])
    x = SurrogateInputs(lp, blp, adv, None, torch.zeros(4), torch.tensor(1.0), 0.2, None)
    out = user_module.dual_clip(x, c=3.0)
    ratio = torch.exp(lp - blp)
    assert out[0] == -3.0 and out[1] == 1.2 and out[2] == -1.0 and out[3] == 1.0 and ratio[0] > 3
    three = PPOFamilyLoss(net, ACT, objective="my_variants.dual_clip", objective_args={"c": 3}, decoupled=decoupled)
    assert three.objective_args == {"c": 3.0} and not torch.equal(three(batch.clone())["loss_objective"],
                                                                   clip(batch.clone())["loss_objective"])


def test_huber_value_loss_through_the_hook_is_the_builtin_huber(user_module):
    net, batch = batch_and_net(False)
    batch["value_target"] = batch["value_target"] * 3  # errors on both sides of delta
    mine = PPOFamilyLoss(net, ACT, value_loss="my_variants.my_huber", value_loss_args={"delta": 0.5}, value_coef=0.5)
    builtin = PPOFamilyLoss(net, ACT, value_loss="huber", value_loss_args={"delta": 0.5}, value_coef=0.5)
    mse = PPOFamilyLoss(net, ACT, value_coef=0.5)
    a, b, c = mine(batch.clone())["loss_critic"], builtin(batch.clone())["loss_critic"], mse(batch.clone())["loss_critic"]
    torch.testing.assert_close(a, b)
    value = net(batch["observation"])[-1].reshape(-1).detach()
    err = (value - batch["value_target"]).abs()
    assert (err > 0.5).any() and (err <= 0.5).any()
    torch.testing.assert_close(a, 0.5 * torch.where(err <= 0.5, 0.5 * err**2, 0.5 * (err - 0.25)).mean())
    assert not torch.allclose(a, c)
    with pytest.raises(ValueError, match=r"model.value_loss_args.delta of value loss 'my_variants.my_huber' must be > 0, got 0"):
        PPOFamilyLoss(net, ACT, value_loss="my_variants.my_huber", value_loss_args={"delta": 0})


class Coefficients(Callback):
    """The loss's entropy coefficient at each iteration's first step, and the frames before it."""

    def __init__(self):
        self.seen: list[tuple[int, torch.Tensor]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == 0:
            dm = trainer.datamodule
            self.seen.append((dm.frames - dm.frames_per_iteration, torch.as_tensor(pl_module.loss_module.entropy_coef).clone()))


GROUP = ["--config", str(ROOT / "ppo_lightning/configs/minatar/ppo.yaml"), *TINY, "--seeds", "2", "--model.network.hidden", "16",
         "--data.num_threads", "1"]


def test_annealed_entropy_scales_a_groups_member_values_and_keeps_their_ratio(tmp_path):
    seen = Coefficients()
    fit_main(["fit", *GROUP, "--data.member_hparams", "{entropy_coef: [0.01, 0.05]}", "--model.schedules.entropy_coef", "linear",
              "--data.total_frames", "256", "--run_dir", str(tmp_path / "run")], extra_callbacks=[seen])
    assert len(seen.seen) == 4
    for frames, coef in seen.seen:
        factor = 1 - frames / 256
        assert coef.shape == (2,)
        torch.testing.assert_close(coef, torch.tensor([0.01, 0.05]) * factor)
        assert coef[1] / coef[0] == pytest.approx(5.0, rel=1e-5)
    assert seen.seen[-1][1][0] < seen.seen[0][1][0]


def test_eps_high_minus_one_is_refused_before_training(user_module, capsys):
    code = main(["fit", "--config", CARTPOLE, *tiny([], 0), "--model.objective", "my_variants.clip_higher",
                 "--model.objective_args", "{eps_high: -1}"])
    err = capsys.readouterr().err
    assert code == 2 and "error: model.objective_args.eps_high of objective 'my_variants.clip_higher' must be > 0, got -1" in err
    assert "Traceback" not in err and not builder._TRAINING_STARTED and not (Path("run0") / "checkpoints").exists()


def test_a_typo_in_a_loss_subclass_setting_is_one_line_naming_the_class(user_module, capsys):
    loss = "{class_path: my_variants.ClippedAdvantageLoss, init_args: {adv_clp: 2}}"
    assert main(["fit", "--config", CARTPOLE, *tiny([], 0), "--model.loss", loss]) == 2
    err = capsys.readouterr().err
    assert ("error: model.loss.init_args: 'adv_clp' is not a setting of my_variants.ClippedAdvantageLoss (its settings: "
            "adv_clip); did you mean 'adv_clip'?") in err and "Traceback" not in err
    assert main(["fit", "--config", CARTPOLE, *tiny([], 1), "--model.loss", "{class_path: my_variants.ClippedAdvantageLoss}",
                 "--model.loss.init_args.adv_clip", "-1"]) == 2
    assert "model.loss.init_args.adv_clip of my_variants.ClippedAdvantageLoss must be > 0, got -1" in capsys.readouterr().err
    first = fit_main(["fit", "--config", CARTPOLE, *tiny([], 2), "--model.loss",
                      "{class_path: my_variants.ClippedAdvantageLoss, init_args: {adv_clip: 2.0}}", "--model.loss.init_args.adv_clip", "1.5"])
    assert first.model.loss_module.adv_clip == 1.5 and first.model.hparams.loss["class_path"] == "my_variants.ClippedAdvantageLoss"


# ---------------------------------------------------------------------- resume
def test_resume_refuses_a_changed_setting_allows_declared_ones_and_restores_total_frames(user_module, capsys):
    base = ["fit", "--config", CARTPOLE, *TINY, "--run_dir", "run"]
    ckpt = ["--ckpt_path", "run/checkpoints/last.ckpt", "--trust-code"]  # its class paths: the user's own code
    fit_main(base + ["--model", "my_variants.ClipWatch", "--model.objective", "my_variants.dual_clip",
                     "--model.objective_args.c", "2.5", "--model.schedules.entropy_coef", "linear",
                     "--model.entropy_coef", "0.01", "--data.total_frames", "128"])
    capsys.readouterr()
    # refused: the checkpoint's c is 2.5
    assert main(base + ckpt + ["--model.objective_args", "{c: 2.0}"]) == 2
    err = capsys.readouterr().err
    assert ("error: --model.objective_args {c: 2.0} differs from the checkpoint's {c: 2.5}: a resumed run keeps its "
            "settings; add --resume_override model.objective_args") in err
    # restored: total_frames (the config says 100000), the class, the objective and its settings, the schedule
    resumed = fit_main(base + ckpt)
    out = capsys.readouterr().out
    model, dm = resumed.model, resumed.datamodule
    assert dm.total_frames == 128 and type(model).__name__ == "ClipWatch"
    assert model.loss_module.objective_args == {"c": 2.5} and model.hparams.schedules == {"entropy_coef": "linear"}
    assert model.loss_module.entropy_coef == pytest.approx(0.01 * (1 - 128 / 128))  # the schedule continued on 128
    line = next(line for line in out.splitlines() if line.startswith("resume from"))
    assert "(128 frames)" in line and "data.total_frames=128" in line and "model.objective=my_variants.dual_clip" in line
    # allowed: named with --resume_override (dotted: on the checkpoint's dict), and a subclass's resume_safe setting
    resumed = fit_main(base + ckpt + ["--model.objective_args.c", "2.0", "--resume_override", "model.objective_args",
                                      "--model.max_clip_fraction", "0.1", "--data.total_frames", "256"])
    out = capsys.readouterr().out
    assert resumed.model.loss_module.objective_args == {"c": 2.0} and resumed.model.hparams.max_clip_fraction == 0.1
    assert resumed.datamodule.total_frames == 256
    assert ("changed on the command line: model.objective_args {c: 2.5} -> {c: 2.0}, model.max_clip_fraction 0.3 -> 0.1, "
            "data.total_frames 128 -> 256") in out
    # the optimizer's state holds the lr: no change on resume, even when asked
    assert main(base + ckpt + ["--model.lr", "0.1", "--resume_override", "model.lr"]) == 2
    assert "--model.lr: the optimizer's state, restored from the checkpoint, holds it" in capsys.readouterr().err
    # the same rules for a run handed as values (`ppo_lightning.run.train`): the checkpoint's class (its own
    # setting parses), a dotted entry on the checkpoint's dict, the names given
    from ppo_lightning.run import RunSpec, train

    spec = RunSpec.from_settings([CARTPOLE], {
        "mlflow.enabled": False, "trainer.enable_progress_bar": False, "data.num_envs": 4, "data.rollout_steps": 16,
        "data.num_minibatches": 2, "data.update_epochs": 1, "checkpoint_every": 1, "video_every": None, "run_dir": "run",
        "trust_code": True, "model.objective_args.c": 3.0, "resume_override": "model.objective_args",
        "model.max_clip_fraction": 0.2, "data.total_frames": 320})
    with pytest.raises(ValueError, match="^--model.lr 0.1 differs from the checkpoint's"):
        train(spec.with_settings({"model.lr": 0.1}), ckpt_path="run/checkpoints/last.ckpt")
    resumed = train(spec, ckpt_path="run/checkpoints/last.ckpt").model
    assert type(resumed).__name__ == "ClipWatch" and resumed.loss_module.objective_args == {"c": 3.0}
    assert ("changed on the command line: model.objective_args {c: 2.0} -> {c: 3.0}, model.max_clip_fraction 0.1 -> 0.2, "
            "data.total_frames 256 -> 320") in capsys.readouterr().out


def test_a_checkpoint_from_before_the_registry_resumes(tmp_path):
    """Checkpoints written before ``objective_args``, ``loss``, class paths, hooks and saved data settings
    (hyperparameters without them) resume with the defaults and the config's data settings."""
    base = ["fit", "--config", CARTPOLE, *TINY, "--run_dir", str(tmp_path)]
    fit_main(base + ["--data.total_frames", "128"])
    ckpt = torch.load(tmp_path / "checkpoints/last.ckpt", weights_only=True)
    for key in ("objective_args", "loss", "_class_path", "schedules", "value_loss", "value_loss_args", "aux_terms"):
        ckpt["hyper_parameters"].pop(key, None)
    for key in ("datamodule_hyper_parameters", "datamodule_hparams_name"):
        ckpt.pop(key)
    torch.save(ckpt, tmp_path / "old.ckpt")
    resumed = fit_main(base + ["--data.total_frames", "192", "--ckpt_path", str(tmp_path / "old.ckpt")])
    assert type(resumed.model) is PPOLightningModule and resumed.model.loss_module.objective == "clip"
    assert resumed.model.hparams.objective_args is None and resumed.datamodule.frames == 192


# ---------------------------------------------------------------------- names and settings
@pytest.mark.parametrize("override,message", [
    (["--model.objective", "clip_hgher"], "model.objective must be one of ('clip', 'kl', 'adaptive_kl'"),
    (["--model.objective_args", "{eps: 1}"], "model.objective_args: 'eps' is not a setting of objective 'clip'"),
    (["--model.loss", "{class_path: nowhere.Loss}"], "model.loss.class_path 'nowhere.Loss': cannot import it"),
    (["--model.value_loss", "hubber"], "model.value_loss must be one of ('mse', 'clipped', 'huber'"),
    (["--model.schedules.entropy", "linear"], "model.schedules: 'entropy' is not a schedulable coefficient"),
    (["--model.schedules.entropy_coef", "{name: linear, end: -1}"],
     "model.schedules.entropy_coef.end of schedule 'linear' must be >= 0, got -1"),
    (["--data.total_frame", "64"], "--data.total_frame: RolloutDataModule has no setting 'total_frame'; did you mean "
                                   "--data.total_frames?"),
    (["--model.entrpy_coef", "0.1"], "--model.entrpy_coef: ppo_lightning.training.module.PPOLightningModule has no setting "
                                      "'entrpy_coef'; did you mean --model.entropy_coef?"),
])
def test_unknown_names_and_bad_settings_are_one_line_errors(tmp_path, capsys, override, message):
    code = main(["fit", "--config", CARTPOLE, "--run_dir", str(tmp_path), "--mlflow.enabled", "false", *override])
    err = capsys.readouterr().err
    assert code == 2 and f"error: {message}" in err and "Traceback" not in err, err[-2000:]


def test_loss_settings_are_the_modules_by_name_and_default():
    """Declared once (`LossSettings`): the command line's parser takes each as ``--model.<name>`` with its
    default (through the module's ``**loss_settings``), the hyperparameters hold every one, the loss gets them."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(PPOLightningModule, "model")
    cfg = parser.parse_args(["--model", "PPOLightningModule", "--model.clip_eps", "0.1"]).model.init_args
    model = PPOLightningModule({"shape": [4], "dtype": "float32"}, {"type": "discrete", "n": 2}, clip_eps=0.1)
    for name, default in LOSS_SETTINGS.items():
        expected = 0.1 if name == "clip_eps" else default
        assert cfg[name] == expected and model.hparams[name] == expected, name
    assert model.loss_module.clip_eps == 0.1 and model.loss_module.kl_form == LOSS_SETTINGS["kl_form"]
    with pytest.raises(ValueError, match="model.clip_eps must be > 0"):
        PPOLightningModule({"shape": [4], "dtype": "float32"}, {"type": "discrete", "n": 2}, clip_eps=-1.0)


class LearningRates(Callback):
    def __init__(self):
        self.seen: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == 0:
            self.seen.append(trainer.optimizers[0].param_groups[0]["lr"])


def test_an_lr_schedule_by_frames_scales_the_optimizers_lr(tmp_path):
    seen = LearningRates()
    cli = fit_main(["fit", "--config", CARTPOLE, *TINY, "--model.lr", "0.001", "--model.schedules.lr", "{name: linear, end: 0.5}",
                    "--data.total_frames", "256", "--run_dir", str(tmp_path / "run")], extra_callbacks=[seen])
    assert seen.seen == pytest.approx([0.001 * (1 - 0.5 * f / 256) for f in (0, 64, 128, 192)])
    assert cli.model.hparams.schedules == {"lr": {"name": "linear", "end": 0.5}}


def test_an_auxiliary_term_is_an_entry_of_the_loss_and_joins_the_minimized_sum():
    _, batch = batch_and_net(False)
    model = PPOLightningModule({"shape": [4], "dtype": "float32"}, ACT, network={"name": "mlp", "hidden_sizes": [8]},
                               aux_terms={"logit_l2": {"coef": 0.1}})
    loss, stats = model.loss_and_stats(batch)
    out = model.loss_module(batch)
    logits = model.network(batch["observation"])[0]
    torch.testing.assert_close(out["loss_aux_logit_l2"], 0.1 * (0.5 * logits.pow(2).mean(-1)).mean())
    torch.testing.assert_close(loss, sum(out[k] for k in ("loss_objective", "loss_critic", "loss_entropy", "loss_aux_logit_l2")))
    assert "loss_aux_logit_l2" in stats
    with pytest.raises(ValueError, match="model.aux_terms.logit_l2.coef must be a number >= 0, got -1"):
        PPOLightningModule({"shape": [4], "dtype": "float32"}, ACT, aux_terms={"logit_l2": {"coef": -1}})


# ---------------------------------------------------------------------- the values used, and settings that do nothing (issue 65)
def _metrics_csv(path: Path) -> list[dict[str, float]]:
    import csv

    with open(path, newline="") as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def test_a_run_without_mlflow_logs_the_lr_and_the_scheduled_coefficients_values_by_frames(tmp_path):
    """MLflow off: metrics.csv in the run folder holds, at every iteration (step = frames), the lr the
    optimizer stepped with and the entropy coefficient the loss used: the configured values times the
    schedules' factors at the frames trained before the iteration (independent of the code's own
    factors: linear 1 - f / total, cosine (1 + cos(pi f / total)) / 2)."""
    import math

    run = tmp_path / "run"
    fit_main(["fit", "--config", CARTPOLE, *TINY, "--model.lr", "0.001", "--model.entropy_coef", "0.02",
              "--model.schedules", "{lr: cosine, entropy_coef: linear}", "--data.total_frames", "256", "--run_dir", str(run)])
    rows = _metrics_csv(run / "metrics.csv")
    assert [r["step"] for r in rows] == [64, 128, 192, 256]
    for r in rows:
        before = r["frames"] - 64
        assert r["setting/lr"] == pytest.approx(0.001 * (1 + math.cos(math.pi * before / 256)) / 2)
        assert r["setting/entropy_coef"] == pytest.approx(0.02 * (1 - before / 256))
        assert r["schedule/entropy_coef_factor"] == pytest.approx(1 - before / 256)


def test_a_groups_members_log_their_own_lrs_and_settings(tmp_path):
    """Members with their own lr and clip range: each member's value as used (an lr schedule's factor on
    its own lr), under seed<k>/, and the members' mean unprefixed."""
    run = tmp_path / "run"
    fit_main(["fit", *GROUP, "--data.member_hparams", "{lr: [0.001, 0.004], clip_eps: [0.1, 0.3]}",
              "--model.schedules.lr", "linear", "--data.total_frames", "128", "--run_dir", str(run)])
    rows = _metrics_csv(run / "metrics.csv")
    assert len(rows) == 2
    for r in rows:
        factor = 1 - (r["frames"] - 64) / 128
        assert (r["seed0/setting/lr"], r["seed1/setting/lr"]) == (pytest.approx(0.001 * factor), pytest.approx(0.004 * factor))
        assert (r["seed0/setting/clip_eps"], r["seed1/setting/clip_eps"]) == (pytest.approx(0.1), pytest.approx(0.3))
        assert r["setting/lr"] == pytest.approx(0.0025 * factor)


def test_the_clip_fraction_is_the_objectives_own_range(user_module):
    """clip_both's clip fraction counts the ratios outside [1 - eps_low, 1 + eps_high] (counted here by
    hand), whatever clip_eps; the KL objectives clip nothing and report no clip fraction."""
    net, batch = batch_and_net(False, far=True)
    loss = PPOFamilyLoss(net, ACT, objective="my_variants.clip_both", objective_args={"eps_low": 0.05, "eps_high": 0.5})
    out = loss(batch.clone())
    log_prob = torch.distributions.Categorical(logits=net(batch["observation"])[0]).log_prob(batch["action"]).detach()
    ratio = torch.exp(log_prob - batch["action_log_prob"])
    expected = ((ratio < 1 - 0.05) | (ratio > 1 + 0.5)).float().mean()
    assert 0 < expected < 1 and out["clip_fraction"] == pytest.approx(float(expected))
    symmetric = PPOFamilyLoss(net, ACT, objective="clip", clip_eps=0.05)(batch.clone())["clip_fraction"]
    assert symmetric != pytest.approx(float(expected))
    assert "clip_fraction" not in PPOFamilyLoss(net, ACT, objective="kl")(batch.clone()).keys()


@pytest.mark.parametrize("override,message", [
    (["--model.schedules.entropy_coef", "linear"],
     "model.schedules.entropy_coef scales model.entropy_coef, which is 0: the schedule would change nothing"),
    (["--seeds", "2", "--data.member_hparams", "{value_coef: [0.0, 0.0]}", "--model.schedules.value_coef", "linear"],
     "model.schedules.value_coef scales data.member_hparams.value_coef, which are all 0"),
    (["--model.objective", "kl", "--model.schedules.clip_eps", "linear"],
     "model.objective 'kl' ignores model.schedules.clip_eps (it uses kl_beta, kl_form, max_importance_ratio)"),
    (["--model.objective", "my_variants.clip_both", "--model.clip_eps", "0.3"],
     "model.objective 'my_variants.clip_both' ignores model.clip_eps 0.3 (it uses max_importance_ratio)"),
    (["--model.objective", "my_variants.clip_both", "--seeds", "2", "--data.member_hparams", "{clip_eps: [0.1, 0.3]}"],
     "model.objective 'my_variants.clip_both' ignores data.member_hparams.clip_eps"),
    (["--model.kl_target", "0.02"], "model.objective 'clip' ignores model.kl_target 0.02 (it uses clip_eps, max_importance_ratio)"),
])
def test_a_schedule_of_zero_and_a_setting_the_objective_ignores_are_refused(user_module, capsys, override, message):
    config = str(ROOT / "ppo_lightning/configs/minatar/ppo.yaml") if "--seeds" in override else CARTPOLE
    code = main(["fit", "--config", config, *tiny([], 0), *override])
    err = capsys.readouterr().err
    assert code == 2 and f"error: {message}" in err and "Traceback" not in err, err[-2000:]
    assert not (Path("run0") / "checkpoints" / "last.ckpt").exists()


def test_the_objectives_settings_at_their_defaults_train(user_module):
    """A config's clip_eps at its default (every shipped config writes 0.2) is not a setting given to a KL
    objective: it trains; so does clip_both with it."""
    for objective in ("kl", "my_variants.clip_both"):
        assert main(["fit", "--config", CARTPOLE, *tiny([], 0), "--model.objective", objective, "--run_dir", objective]) == 0
