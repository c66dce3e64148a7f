"""Issue 62, item 3: image observations from any env get a CNN chosen for their size.

The choice (`ppo_lightning.nets.pixel_cnn.choose_network`) against the shapes it must recognize; the
Nature CNN against the DQN paper's layer sizes (parameter counts worked out by hand); uint8 scaled
to [0, 1]; and a registered env of this file's own with 40x40x3 / 12x12x3 uint8 images trained
through the command line, the choice printed and written into config.yaml, ``model.network.name``
overriding it.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml

from ppo_lightning.nets.models import build_network
from ppo_lightning.nets.pixel_cnn import NatureActorCritic, choose_network, image_layout, resolve_network
from ppo_lightning.run.builder import fit_main

DISCRETE = {"type": "discrete", "n": 3}


class ColorPick(gym.Env):
    """An image of one of 3 colours; reward 1 for the action that names the colour; 8 steps."""

    def __init__(self, size: int = 40):
        self.observation_space = gym.spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self.size = size

    def _obs(self):
        obs = np.zeros((self.size, self.size, 3), np.uint8)
        obs[..., self.colour] = 200
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.colour, self.t = int(self.np_random.integers(3)), 0
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == self.colour)
        self.colour, self.t = int(self.np_random.integers(3)), self.t + 1
        return self._obs(), reward, False, self.t >= 8, {}


for _size in (40, 12):
    if f"ColorPick{_size}-v0" not in gym.registry:
        gym.register(f"ColorPick{_size}-v0", entry_point=ColorPick, kwargs={"size": _size})


@pytest.mark.parametrize("shape, dtype, layout, name", [
    ([84, 84, 4], "uint8", "hwc", "nature_cnn"),
    ([4, 84, 84], "uint8", "chw", "nature_cnn"),  # ale-py's stacked frames
    ([64, 64, 3], "uint8", "hwc", "nature_cnn"),  # Procgen-sized RGB
    ([3, 64, 64], "float32", "chw", "nature_cnn"),
    ([36, 36, 3], "float32", "hwc", "nature_cnn"),  # the smallest side the Nature CNN reduces to 1x1
    ([35, 35, 3], "uint8", "hwc", "small_cnn"),
    ([10, 10, 4], "bool", "hwc", "small_cnn"),  # MinAtar
    ([84, 84], "uint8", "hw", "nature_cnn"),  # one grayscale frame
    ([84, 84], "float32", None, "mlp"),  # a float matrix is not taken for an image
    ([17], "float32", None, "mlp"),
    ([3, 2, 5], "float32", None, "mlp"),  # too small a side for an image
])
def test_the_choice_by_shape(shape, dtype, layout, name):
    assert image_layout(shape, dtype) == layout
    assert choose_network({"shape": shape, "dtype": dtype}) == name


def test_auto_keeps_the_chosen_kinds_settings_and_names_the_others():
    obs = {"shape": [64, 64, 3], "dtype": "uint8"}
    net, line = resolve_network(obs, {"name": "auto", "hidden_sizes": [64, 64], "activation": "tanh", "arch": "dual"})
    assert net == {"name": "nature_cnn", "arch": "dual", "layout": "hwc"}
    assert "nature_cnn" in line and "[64, 64, 3]" in line and "scaled to [0, 1]" in line
    assert "activation, hidden_sizes: an mlp's, unused" in line
    vec, line = resolve_network({"shape": [4], "dtype": "float32"}, {"name": "auto", "hidden_sizes": [8]})
    assert vec == {"name": "mlp", "hidden_sizes": [8]} and line is None
    named = {"name": "mlp", "hidden_sizes": [8]}
    assert resolve_network(obs, named) == (named, None)  # a name overrides the choice


def test_nature_cnn_is_the_dqn_papers_network():
    """Mnih et al. 2015: 32 8x8/4, 64 4x4/2, 64 3x3/1, dense 512 over 84x84x4: 3136 inputs to the dense
    layer; weights + biases counted by hand."""
    net = NatureActorCritic({"shape": [4, 84, 84], "dtype": "uint8"}, {"type": "discrete", "n": 6})
    counts = [p.numel() for p in net.policy_body.parameters()]
    assert counts == [4 * 32 * 8 * 8, 32, 32 * 64 * 4 * 4, 64, 64 * 64 * 3 * 3, 64, 3136 * 512, 512]
    assert net.value_body is None  # one trunk, as the PPO paper's Atari network
    obs = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    logits, value = net(obs)
    assert logits.shape == (5, 6) and value.shape == (5, 1)
    # uint8 is scaled to [0, 1]: the same outputs as floats divided by 255
    ref_logits, ref_value = net(obs.float() / 255.0)
    torch.testing.assert_close(logits, ref_logits)
    torch.testing.assert_close(value, ref_value)


def test_layouts_see_the_same_image():
    """One image in HWC and in CHW gives the same outputs from the same weights."""
    hwc = build_network({"shape": [40, 40, 3], "dtype": "uint8"}, DISCRETE, {"name": "nature_cnn"})
    chw = build_network({"shape": [3, 40, 40], "dtype": "uint8"}, DISCRETE, {"name": "nature_cnn"})
    chw.load_state_dict(hwc.state_dict())
    img = torch.randint(0, 256, (2, 40, 40, 3), dtype=torch.uint8)
    torch.testing.assert_close(hwc(img), chw(img.permute(0, 3, 1, 2).contiguous()))


def test_box_actions_get_a_gaussian():
    net = build_network({"shape": [12, 12, 3], "dtype": "uint8"}, {"type": "continuous", "shape": [2]},
                        {"name": "auto"})
    loc, scale, value = net(torch.zeros(7, 12, 12, 3, dtype=torch.uint8))
    assert type(net).__name__ == "SmallActorCritic"
    assert loc.shape == scale.shape == (7, 2) and value.shape == (7, 1)


def test_nature_cnn_refuses_a_small_image():
    with pytest.raises(ValueError, match="at least 36x36"):
        build_network({"shape": [20, 20, 3], "dtype": "uint8"}, DISCRETE, {"name": "nature_cnn"})


def fit(tmp_path, env_id, *extra):
    return fit_main(["fit", "--config", "cartpole/ppo", "--data.env_id", env_id, "--mlflow.enabled", "false",
                     "--run_dir", str(tmp_path), "--trainer.enable_progress_bar", "false", "--trainer.precision",
                     "32-true", "--data.num_envs", "2", "--data.rollout_steps", "8", "--data.num_minibatches", "2",
                     "--data.update_epochs", "1", "--data.total_frames", "32", *extra])


@pytest.mark.parametrize("env_id, name, cls", [("ColorPick40-v0", "nature_cnn", "NatureActorCritic"),
                                               ("ColorPick12-v0", "small_cnn", "SmallActorCritic")])
def test_a_pixel_env_trains_a_cnn_chosen_printed_and_recorded(tmp_path, capsys, env_id, name, cls):
    """The shipped CartPole config (``name: auto``) on an image env: the CNN for the image's size, one
    line saying so, and config.yaml and the checkpoint's hyperparameters naming it."""
    cli = fit(tmp_path, env_id)
    out = capsys.readouterr().out
    assert type(cli.model.network).__name__ == cls
    assert out.count(f"model.network: {name} for image observations") == 1
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["model"]["init_args"]["network"] == {"name": name, "layout": "hwc"}
    assert cli.model.hparams.network == {"name": name, "layout": "hwc"}
    assert cli.datamodule.frames == 32


def test_a_named_network_overrides_the_choice(tmp_path, capsys):
    cli = fit(tmp_path, "ColorPick12-v0", "--model.network", "{name: mlp, hidden_sizes: [8]}")
    assert type(cli.model.network).__name__ == "ActorCritic"
    assert "model.network:" not in capsys.readouterr().out


def test_an_exported_cnn_policy_loads_with_automodel(tmp_path):
    """The chosen network travels in the exported folder: AutoModel rebuilds it and gives the same outputs."""
    from transformers import AutoModel

    from ppo_lightning.interop.export import export_hf

    cli = fit(tmp_path / "run", "ColorPick40-v0")
    folder = export_hf(tmp_path / "run" / "checkpoints" / "last.ckpt", tmp_path / "hf")
    hf = AutoModel.from_pretrained(folder, trust_remote_code=True)
    obs = torch.randint(0, 256, (3, 40, 40, 3), dtype=torch.uint8)
    with torch.no_grad():
        for got, want in zip(hf(obs), cli.model.network(obs)):
            torch.testing.assert_close(got, want)
