"""The Environments guide's Pixels and Atari sections run as printed: each python block is executed, and each
``ppo-lightning fit`` command of their bash blocks is parsed and validated by the CLI (``--print_config``:
nothing trains)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "environments.md"


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
