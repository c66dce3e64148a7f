"""docs/guides/memory.md, run: every ``ppo-lightning fit`` command of its bash blocks trains one iteration
as printed (a recurrent network in the checkpoint it writes; the ``--data.sequence_length`` one in
segments of that length), a command followed by a ``text`` block exits 2 with that line, and the
yaml block's ``model.network`` builds a recurrent network that steps and unrolls."""

from __future__ import annotations

import contextlib
import io
import shlex
from pathlib import Path

import pytest
import torch
import yaml

from guide_helpers import blocks
from ppo_lightning.cli.main import main
from ppo_lightning.nets.models import build_network
from ppo_lightning.nets.recurrent import is_recurrent
from ppo_lightning.run.builder import fit_main

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs/guides/memory.md"
ONE_ITERATION = ["--trainer.max_epochs", "1", "--mlflow.enabled", "false", "--trainer.enable_progress_bar", "false",
                 "--video_every", "null"]


def commands() -> list[tuple[list[str], str | None]]:
    """(the fit command's arguments after ``ppo-lightning``, the error line of the ``text`` block after it or None)."""
    page_blocks, out = blocks(GUIDE.read_text()), []
    for i, (lang, text) in enumerate(page_blocks):
        if lang != "bash":
            continue
        error = page_blocks[i + 1][1].strip() if i + 1 < len(page_blocks) and page_blocks[i + 1][0] == "text" else None
        for line in text.splitlines():
            if line.startswith("ppo-lightning fit"):
                out.append((shlex.split(line.split("  #")[0])[1:], error))
    return out


def test_the_guide_has_its_commands():
    found = commands()
    assert len(found) == 6 and sum(error is not None for _, error in found) == 1


@pytest.mark.parametrize("args,error", commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_each_command_runs_as_printed(args, error, tmp_path, capsys):
    if error is not None:
        code = main([*args, *ONE_ITERATION, "--run_dir", str(tmp_path)])  # the command line's own handling
        assert code == 2
        assert error in capsys.readouterr().err
        return
    with contextlib.redirect_stdout(io.StringIO()):
        fit_main([*args, *ONE_ITERATION, "--run_dir", str(tmp_path)])
    ckpt = torch.load(tmp_path / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["hyper_parameters"]["network"]["core"] in ("lstm", "gru")
    if "--data.sequence_length" in args:
        assert ckpt["datamodule_hyper_parameters"]["sequence_length"] == int(args[args.index("--data.sequence_length") + 1])


def test_the_yaml_block_builds_a_recurrent_network():
    (text,) = [text for lang, text in blocks(GUIDE.read_text()) if lang == "yaml"]
    network = yaml.safe_load(text)["model"]["network"]
    net = build_network({"shape": [2], "dtype": "float32"}, {"type": "discrete", "n": 2}, network)
    assert is_recurrent(net) and net.state_size == 4 * network["core_size"]  # dual: two LSTM cores, h and c each
    obs, state = torch.randn(3, 5, 2), net.initial_state(3)
    is_init = torch.zeros(3, 5, dtype=torch.bool)
    is_init[:, 0] = True
    logits, value = net(obs, state, is_init)
    assert logits.shape == (3, 5, 2) and value.shape == (3, 5, 1)
    step_logits, _, _ = net.step(obs[:, 0], state, is_init[:, 0])
    torch.testing.assert_close(step_logits, logits[:, 0])
