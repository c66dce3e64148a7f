"""docs/guides/extending.md, run: its code blocks are the user's module, trained through the CLI."""

import re
import sys
from pathlib import Path

import pytest
import torch

from ppo_lightning.algos.loss import LOSS_SETTINGS, PPOFamilyLoss
from ppo_lightning.cli.fit import fit_main, main
from ppo_lightning.training.module import PPOLightningModule

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs/guides/extending.md"


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """The guide's Python blocks as ``my_variants.py``, importable."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(re.findall(r"\S.*", blocks[0])) <= 15  # the new surrogate: at most 15 lines of code
    (tmp_path / "my_variants.py").write_text("\n\n".join(blocks))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_variants", None)
    yield tmp_path
    sys.modules.pop("my_variants", None)


def batch_and_net(decoupled: bool):
    from tensordict import TensorDict

    from ppo_lightning.nets.models import build_network

    torch.manual_seed(0)
    net = build_network({"shape": [4], "dtype": "float32"}, {"type": "discrete", "n": 3}, {"name": "mlp", "hidden_sizes": [8]})
    n = 64
    data = {"observation": torch.randn(n, 4), "action": torch.randint(0, 3, (n,)), "action_log_prob": -torch.rand(n) - 0.5,
            "logits": torch.randn(n, 3), "advantage": torch.randn(n), "value_target": torch.randn(n),
            "state_value": torch.randn(n)}
    batch = TensorDict(data, batch_size=[n])
    if decoupled:
        batch.set("proximal", TensorDict({"logits": torch.randn(n, 3)}, batch_size=[n]))
    return net, batch


@pytest.mark.parametrize("decoupled", [False, True])
def test_guide_objective_at_eps_high_equal_to_clip_eps_is_clip_to_the_bit(user_module, decoupled):
    act = {"type": "discrete", "n": 3}
    net, batch = batch_and_net(decoupled)
    kwargs = dict(decoupled=decoupled, max_importance_ratio=1.5)
    ours = PPOFamilyLoss(net, act, objective="my_variants.clip_higher", objective_args={"eps_high": 0.2}, **kwargs)
    clip = PPOFamilyLoss(net, act, objective="clip", **kwargs)
    a, b = ours(batch.clone()), clip(batch.clone())
    assert torch.equal(a["loss_objective"], b["loss_objective"])
    ga = torch.autograd.grad(a["loss_objective"], list(net.parameters()), allow_unused=True)
    gb = torch.autograd.grad(b["loss_objective"], list(net.parameters()), allow_unused=True)
    assert all((x is None and y is None) or torch.equal(x, y) for x, y in zip(ga, gb))
    wider = PPOFamilyLoss(net, act, objective="my_variants.clip_higher", objective_args={"eps_high": 0.5}, **kwargs)
    assert not torch.equal(wider(batch.clone())["loss_objective"], b["loss_objective"])  # positive control


TINY = ["--mlflow.enabled", "false", "--trainer.enable_progress_bar", "false", "--data.num_envs", "4",
        "--data.rollout_steps", "16", "--data.num_minibatches", "2", "--data.update_epochs", "1", "--checkpoint_every", "1"]


GROUP = ["--config", str(ROOT / "ppo_lightning/configs/cartpole/ppo_ewma.yaml"), *TINY, "--seeds", "2",
         "--data.num_threads", "1", "--video_every", "null"]  # the guide's example: CartPole, a group of 2 seeds


def test_guide_objective_trains_as_ewma_seed_group_and_resumes(user_module):
    base = ["fit", *GROUP, "--model.objective", "my_variants.clip_higher", "--model.objective_args", "{eps_high: 0.3}"]
    first = fit_main(base + ["--data.total_frames", "128", "--run_dir", str(user_module / "run")])
    assert first.model.proximal_source is not None and first.model.seed_group.num_seeds == 2
    assert first.model.loss_module.objective_args == {"eps_high": 0.3}
    ckpt = user_module / "run/checkpoints/last.ckpt"
    assert torch.load(ckpt, weights_only=True)["hyper_parameters"]["objective_args"] == {"eps_high": 0.3}
    resumed = fit_main(["fit", *GROUP, "--data.total_frames", "192", "--run_dir", str(user_module / "run"),
                        "--ckpt_path", str(ckpt)])
    model = resumed.model
    assert model.hparams.objective == "my_variants.clip_higher" and model.loss_module.objective_args == {"eps_high": 0.3}
    assert resumed.datamodule.frames == 192 and resumed.trainer.global_step == 6


def test_model_and_loss_subclasses_from_the_cli_resume_with_their_settings(user_module):
    loss = "{class_path: my_variants.ClippedAdvantageLoss, init_args: {adv_clip: 2.0}}"
    base = ["fit", "--config", str(ROOT / "ppo_lightning/configs/cartpole/ppo.yaml"), *TINY, "--run_dir", str(user_module / "run")]
    first = fit_main(base + ["--model", "my_variants.EntropyDecay", "--model.entropy_decay", "0.5",
                             "--model.entropy_coef", "0.01", "--model.loss", loss, "--data.total_frames", "128"])
    assert type(first.model).__name__ == "EntropyDecay" and first.model.loss_module.adv_clip == 2.0
    assert first.model.loss_module.entropy_coef == pytest.approx(0.01 * 0.5 ** 1)
    resumed = fit_main(base + ["--data.total_frames", "192", "--ckpt_path", str(user_module / "run/checkpoints/last.ckpt")])
    model = resumed.model
    assert type(model).__name__ == "EntropyDecay" and model.hparams.entropy_decay == 0.5
    assert type(model.loss_module).__name__ == "ClippedAdvantageLoss" and model.loss_module.adv_clip == 2.0
    assert model.loss_module.entropy_coef == pytest.approx(0.01 * 0.5 ** 2) and resumed.datamodule.frames == 192


@pytest.mark.parametrize("override,message", [
    (["--model.objective", "clip_hgher"], "model.objective must be one of ('clip', 'kl', 'adaptive_kl'"),
    (["--model.objective_args", "{eps: 1}"], "model.objective_args: 'eps' is not a setting of objective 'clip'"),
    (["--model.loss", "{class_path: nowhere.Loss}"], "model.loss.class_path 'nowhere.Loss': cannot import it"),
])
def test_unknown_objectives_and_settings_are_one_line_errors(tmp_path, capsys, override, message):
    code = main(["fit", "--config", str(ROOT / "ppo_lightning/configs/cartpole/ppo.yaml"), "--run_dir", str(tmp_path),
                 "--mlflow.enabled", "false", *override])
    err = capsys.readouterr().err
    assert code == 2 and f"error: {message}" in err, err[-2000:]


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


def test_a_checkpoint_from_before_the_registry_resumes(tmp_path):
    """Checkpoints written before ``objective_args``, ``loss`` and class paths (hyperparameters without
    them) resume with the defaults."""
    base = ["fit", "--config", str(ROOT / "ppo_lightning/configs/cartpole/ppo.yaml"), *TINY, "--run_dir", str(tmp_path)]
    fit_main(base + ["--data.total_frames", "128"])
    ckpt = torch.load(tmp_path / "checkpoints/last.ckpt", weights_only=True)
    for key in ("objective_args", "loss", "_class_path"):
        ckpt["hyper_parameters"].pop(key, None)
    torch.save(ckpt, tmp_path / "old.ckpt")
    resumed = fit_main(base + ["--data.total_frames", "192", "--ckpt_path", str(tmp_path / "old.ckpt")])
    assert type(resumed.model) is PPOLightningModule and resumed.model.loss_module.objective == "clip"
    assert resumed.model.hparams.objective_args is None and resumed.datamodule.frames == 192
