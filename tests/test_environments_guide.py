"""docs/guides/environments.md, run. Spaces, masks, your own env: its Python blocks are the user's ``my_envs.py`` (and ``my_encoders.py``,
the block that starts with that name), each ``bash`` command runs through the CLI as printed (fit on a
tiny frame budget), with exit code 2 and the fragments of its ``text`` block where that block is an error.
Pixels and Atari: each python block is executed, and each ``ppo-lightning fit`` command of their bash blocks is
parsed and validated by the CLI (``--print_config``: nothing trains)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import sys
from pathlib import Path

import pytest
import torch

from ppo_lightning.cli.main import main
from ppo_lightning.nets import encoders

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs/guides/environments.md"
TINY_FIT = ["--mlflow.enabled", "false", "--trainer.enable_progress_bar", "false", "--data.num_envs", "4",
            "--data.rollout_steps", "16", "--data.num_minibatches", "2", "--data.update_epochs", "1",
            "--video_every", "null", "--data.total_frames", "128"]


def guide_blocks() -> list[tuple[str, str]]:
    """The blocks of every section but Pixels and Atari (`section_blocks` runs theirs)."""
    page = re.sub(r"\n## (Pixels|Atari)\n.*?(?=\n## )", "\n", GUIDE.read_text(), flags=re.S)
    return re.findall(r"^```(\w+)\n(.*?)^```", page, re.S | re.M)


def _has_box2d() -> bool:
    try:
        import Box2D  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    """The guide's Python blocks as ``my_envs.py`` and ``my_encoders.py`` in the current folder, importable."""
    blocks = [code for lang, code in guide_blocks() if lang == "python"]
    encoder = [code for code in blocks if code.startswith("# my_encoders.py")]
    (tmp_path / "my_envs.py").write_text("\n\n".join(code for code in blocks if code not in encoder))
    (tmp_path / "my_encoders.py").write_text("\n\n".join(encoder))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("my_envs", "my_encoders"):
        sys.modules.pop(name, None)
    saved = dict(encoders.ENCODERS)
    yield tmp_path
    encoders.ENCODERS.clear()
    encoders.ENCODERS.update(saved)
    for name in ("my_envs", "my_encoders"):
        sys.modules.pop(name, None)


def test_every_command_of_the_guide_runs_as_printed(user_folder, capsys):
    blocks = guide_blocks()
    ran = 0
    for k, (lang, code) in enumerate(blocks):
        if lang != "bash":
            continue
        text = blocks[k + 1][1].strip() if k + 1 < len(blocks) and blocks[k + 1][0] == "text" else None
        for line in code.strip().splitlines():
            argv = shlex.split(line)
            if argv[0] == "PYTHONPATH=.":
                argv = argv[1:]
            assert argv[0] == "ppo-lightning", line
            args = argv[1:]
            if "LunarLander-v3" in args and _has_box2d():
                continue  # the line of a missing Box2D, where it is installed
            if args[0] == "fit" and text is None:
                args = args + TINY_FIT
            capsys.readouterr()
            code_ = main(args)
            out = capsys.readouterr()
            expected = 2 if text and text.startswith("error:") else 0
            assert code_ == expected, (line, out.err[-3000:])
            if text:
                for fragment in filter(None, (f.strip(" ,") for f in text.split("..."))):
                    assert fragment in out.out + out.err, (fragment, out.err[-2000:])
            ran += 1
    assert ran >= 5
    assert (user_folder / "grid-hf" / "config.json").exists()


def test_the_encoder_block_replaces_the_discrete_encoder(user_folder):
    from ppo_lightning.nets.models import build_network

    obs = {"shape": [2], "dtype": "float32", "space": {"type": "tuple", "parts": [
        {"type": "discrete", "n": 5}, {"type": "box", "shape": [1], "dtype": "float32"}]}}
    import my_encoders

    net = build_network(obs, {"type": "discrete", "n": 3}, {"name": "mlp", "hidden_sizes": [8]})
    assert isinstance(net.encoder.parts[0], my_encoders.Embedding) and net.encoder.out_dim == 8 + 1
    logits, value = net(torch.tensor([[4.0, 0.5], [0.0, -1.0]]))
    assert logits.shape == (2, 3) and value.shape == (2, 1)


def section_blocks(title: str) -> list[tuple[str, str]]:
    page = GUIDE.read_text()
    body = page.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```(\w*)\n(.*?)^```", body, re.S | re.M)


@pytest.mark.parametrize("title", ["Pixels", "Atari"])
def test_python_blocks_run(title):
    for lang, text in section_blocks(title):
        if lang == "python":
            exec(compile(text, f"{GUIDE.name}:{title}", "exec"), {})


def test_atari_commands_parse():
    pytest.importorskip("ale_py")
    from ppo_lightning.run.builder import fit_main

    commands = [line.split("#")[0].strip() for lang, text in section_blocks("Atari") if lang == "bash"
                for line in text.splitlines() if line.startswith("ppo-lightning fit")]
    assert len(commands) == 3
    for command in commands:
        args = shlex.split(command)[1:]
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
            fit_main([*args, "--print_config"])
        assert stop.value.code in (0, None)
        assert "env_id: ALE/" in out.getvalue()
