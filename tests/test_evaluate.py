"""Issue 12: score, watch and share a trained agent (``evaluate``, videos, self-contained HF folders)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from ppo_lightning.interop.evaluation import evaluate_policy
from ppo_lightning.cli.main import main
from ppo_lightning.nets.models import build_network
from ppo_lightning.interop.video import read_mp4

CARTPOLE_OBS = {"shape": [4], "dtype": "float32"}
CARTPOLE_ACT = {"type": "discrete", "n": 2}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """Two PPO iterations on CartPole-v1 with a real Trainer, saved as ``last.ckpt``."""
    import lightning.pytorch as pl

    from ppo_lightning.data.datamodule import RolloutDataModule
    from ppo_lightning.training.module import PPOLightningModule

    root = tmp_path_factory.mktemp("train")
    torch.manual_seed(0)
    dm = RolloutDataModule(env_id="CartPole-v1", num_envs=4, rollout_steps=32, num_minibatches=2, update_epochs=2,
                           total_frames=256, seed=0)
    model = PPOLightningModule(dm.observation_space, dm.action_space)
    trainer = pl.Trainer(max_epochs=-1, logger=False, default_root_dir=root, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(model, dm)
    trainer.save_checkpoint(root / "last.ckpt")
    return root / "last.ckpt"


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(cmd in out for cmd in ("fit", "export-hf", "evaluate"))


def test_evaluate_policy_counts_whole_episodes_and_is_reproducible():
    torch.manual_seed(1)
    net = build_network(CARTPOLE_OBS, CARTPOLE_ACT, {"name": "mlp"})
    a = evaluate_policy(net, "CartPole-v1", episodes=7, num_envs=3, seed=5)
    b = evaluate_policy(net, "CartPole-v1", episodes=7, num_envs=3, seed=5)
    assert a == b and a["episodes"] == len(a["returns"]) == 7
    returns = torch.tensor(a["returns"], dtype=torch.float64)
    assert a["mean_return"] == pytest.approx(returns.mean().item())
    assert a["std_return"] == pytest.approx(returns.std(unbiased=False).item())
    assert (a["min_return"], a["max_return"]) == (min(a["returns"]), max(a["returns"]))
    assert a["mean_return"] == pytest.approx(a["mean_length"])  # CartPole: +1 per step
    # a callable obs -> action is a policy too: always pushing left ends episodes within ~10 steps
    left = evaluate_policy(lambda obs: torch.zeros(obs.shape[0], dtype=torch.long), "CartPole-v1", episodes=4)
    assert left["max_return"] < 20


def test_evaluate_command_checkpoint_and_hf_folder_agree(ckpt, tmp_path, capsys):
    from ppo_lightning.interop.export import export_hf

    out = tmp_path / "score.json"
    assert main(["evaluate", str(ckpt), "--episodes", "6", "--deterministic", "--seed", "3", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    figures = json.loads(out.read_text())
    assert {"mean_return", "std_return", "episodes", "mean_length", "min_return", "max_return"} <= figures.keys()
    assert figures["episodes"] == 6 and figures["env_id"] == "CartPole-v1"
    assert f"mean {figures['mean_return']:.2f}" in printed
    folder = export_hf(ckpt, tmp_path / "hf", evaluate=0)
    assert not (folder / "replay.mp4").exists()
    assert main(["evaluate", str(folder), "--episodes", "6", "--deterministic", "--seed", "3", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["returns"] == figures["returns"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing.ckpt"], "not found"),
        (["CKPT", "--episodes", "0"], "--episodes must be a positive integer"),
        (["CKPT", "--env", "Acrobot-v1"], "observations of shape [6], the network reads [4]"),
        (["CKPT", "--env", "NoSuchEnv-v9"], "unknown gymnasium environment"),
    ],
)
def test_evaluate_bad_input_one_line(ckpt, args, message, capsys):
    args = [str(ckpt) if a == "CKPT" else a for a in args]
    assert main(["evaluate", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_wrong_spaces_are_refused(ckpt, capsys):
    from ppo_lightning.cli.evaluate import check_observations

    with pytest.raises(ValueError, match=r"observations of shape \[2\], the network reads \[4\]"):
        check_observations("MountainCar-v0", {}, CARTPOLE_OBS)
    net = build_network({"shape": [3], "dtype": "float32"}, CARTPOLE_ACT, {"name": "mlp"})
    with pytest.raises(ValueError, match="env Pendulum-v1 has action space .*continuous.* the policy acts in .*discrete"):
        evaluate_policy(net, "Pendulum-v1", episodes=1)


def test_video_classic_control_frame_count_and_size(tmp_path):
    net = build_network(CARTPOLE_OBS, CARTPOLE_ACT, {"name": "mlp"})
    path = tmp_path / "cartpole.mp4"
    result = evaluate_policy(net, "CartPole-v1", episodes=1, num_envs=1, video=str(path))
    frames = read_mp4(path)
    # the reset frame and one per step, up to the step that ends the episode
    assert frames.shape == (result["lengths"][0], 400, 600, 3) == (result["video_frames"], 400, 600, 3)
    assert frames.std() > 1  # a picture, not a blank


def test_video_procgen_observations_enlarged(tmp_path):
    obs, act = {"shape": [64, 64, 3], "dtype": "uint8"}, {"type": "discrete", "n": 15}
    net = build_network(obs, act, {"name": "impala_cnn", "channels": [4], "dense": 16, "nblock": 1})
    path = tmp_path / "procgen.mp4"
    result = evaluate_policy(net, "procgen:bigfish", episodes=1, num_envs=1, env_kwargs={"distribution_mode": "easy"},
                             video=str(path))
    frames = read_mp4(path)
    assert frames.shape == (result["video_frames"], 256, 256, 3)
    assert "normalized_return_mean" in result


def test_video_minatar_state_drawn_as_coloured_cells(tmp_path):
    from ppo_lightning.envs import env_spaces
    from ppo_lightning.envs.minatar_env import render_state

    obs, act = env_spaces("minatar:breakout")
    net = build_network(obs, act, {"name": "minatar_cnn"})
    path = tmp_path / "breakout.mp4"
    result = evaluate_policy(net, "minatar:breakout", episodes=1, num_envs=1, video=str(path))
    frames = read_mp4(path)
    assert frames.shape == (result["video_frames"], 320, 320, 3) and result["video_frames"] > 1
    state = np.zeros((10, 10, 4), dtype=bool)
    state[2, 3, 1] = state[2, 3, 3] = state[9, 0, 0] = True
    img = render_state(state, scale=16)
    assert img.shape == (160, 160, 3) and img[:32, :48].max() == 0  # empty cells are black
    cell = lambda r, c: img[16 * r + 8, 16 * c + 8]  # noqa: E731
    assert (cell(2, 3) != cell(9, 0)).any() and cell(2, 3).max() > 0  # the last active channel's colour


# ------------------------------------------------------------------------------- self-contained HF code
def _networks():
    impala_obs = {"shape": [64, 64, 3], "dtype": "uint8"}
    return [
        (CARTPOLE_OBS, CARTPOLE_ACT, {"name": "mlp", "shared_trunk": True}),
        ({"shape": [3], "dtype": "float32"}, {"type": "continuous", "shape": [2]},
         {"name": "mlp", "normalize_observation": True, "activation": "relu"}),
        (impala_obs, {"type": "discrete", "n": 15}, {"name": "impala_cnn", "channels": [4, 8], "dense": 16}),
    ]


@pytest.mark.parametrize("spaces", _networks(), ids=["mlp-shared", "mlp-obsnorm-continuous", "impala"])
def test_generated_network_code_equals_training_network(spaces):
    """The folder's network code is generated from the training definitions: same outputs."""
    from ppo_lightning.interop.hf.bundle import network_source

    obs_space, act_space, cfg = spaces
    torch.manual_seed(0)
    trained = build_network(obs_space, act_space, cfg).eval()
    if cfg.get("normalize_observation"):
        trained.obs_norm.update(torch.randn(100, 3) * 5 + 2)
    namespace: dict = {"__name__": "networks_ppo_lightning"}
    exec(compile(network_source(), "networks_ppo_lightning.py", "exec"), namespace)
    copy = namespace["build_network"](obs_space, act_space, cfg).eval()
    assert type(copy).__module__ == "networks_ppo_lightning"
    copy.load_state_dict(trained.state_dict(), strict=True)
    obs = torch.randint(0, 255, (5, *obs_space["shape"]), dtype=torch.uint8) if cfg["name"] == "impala_cnn" \
        else torch.randn(5, *obs_space["shape"])
    with torch.no_grad():
        for a, b in zip(trained(obs), copy(obs)):
            torch.testing.assert_close(b, a, rtol=0, atol=0)


# The start of a script that runs where this package and the training stack cannot be imported (torch,
# transformers and the standard library only): test_recurrent_export.py's isolated runs start with it too.
ISOLATED_PREAMBLE = textwrap.dedent(
    """
    import importlib.abc, json, sys
    BLOCKED = ("ppo_lightning", "lightning", "pytorch_lightning", "torchrl", "tensordict")

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"blocked in this test: {name}")

    sys.meta_path.insert(0, Blocker())
    import torch
    from transformers import AutoModel
    """
)

_ISOLATED = ISOLATED_PREAMBLE + textwrap.dedent(
    """

    model = AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True)
    obs = torch.tensor(json.loads(sys.argv[2]))
    out = [t.tolist() for t in model(obs)] + [model.act(obs, deterministic=True).tolist()]
    loaded = sorted(k for k in sys.modules if k.split(".")[0] in BLOCKED)
    print(json.dumps({"out": out, "blocked_modules_loaded": loaded}))
    """
)


def test_automodel_loads_without_ppo_lightning(ckpt, tmp_path):
    """AutoModel.from_pretrained(..., trust_remote_code=True) with ppo_lightning, lightning, torchrl
    and tensordict unimportable (a meta-path blocker; the worktree off the import path)."""
    from ppo_lightning.interop.checkpoint_io import load_network
    from ppo_lightning.interop.export import export_hf, load_pretrained

    folder = export_hf(ckpt, tmp_path / "hf", evaluate=0)
    obs = [[0.0, 0.1, -0.2, 0.3], [1.0, -1.0, 0.5, 0.05]]
    script = tmp_path / "isolated.py"
    script.write_text(_ISOLATED)
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, str(script), str(folder), json.dumps(obs)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["blocked_modules_loaded"] == []
    net, _ = load_network(ckpt)
    with torch.no_grad():
        logits, value = net(torch.tensor(obs))
    assert got["out"][0] == logits.tolist() and got["out"][1] == value.tolist()
    assert got["out"][2] == logits.argmax(-1).tolist()
    # ppo_lightning's own loaders still work on the same folder
    assert type(load_pretrained(folder)) is type(net)


def test_bundle_refuses_code_that_needs_more_than_torch(tmp_path, monkeypatch):
    from ppo_lightning.interop.hf.bundle import BundleError, network_source

    (tmp_path / "fake_arch.py").write_text(
        "import torch\nfrom tensordict.nn import TensorDictModule\n\n"
        "def helper(x):\n    return torch.relu(x)\n\n"
        "def build(x):\n    return TensorDictModule(helper(x), in_keys=['a'], out_keys=['b'])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "def helper" in network_source((("fake_arch", "helper"),))
    with pytest.raises(BundleError, match="would import tensordict.nn .*build -> TensorDictModule"):
        network_source((("fake_arch", "build"),))


def test_procgen_level_split_of_the_training_config():
    from ppo_lightning.cli.evaluate import resolve_env

    training = {"env_id": "procgen:coinrun", "env_kwargs": {"num_levels": 200, "start_level": 5, "distribution_mode": "easy"}}
    assert resolve_env(training, None, "train") == ("procgen:coinrun", training["env_kwargs"])
    env_id, test = resolve_env(training, None, "test")
    assert test == {"num_levels": 0, "start_level": 205, "distribution_mode": "easy"}  # past the training levels
    assert resolve_env(training, "procgen:bigfish", "test") == ("procgen:bigfish", test)  # another game, same split
    assert resolve_env(training, "CartPole-v1", "test") == ("CartPole-v1", {})
