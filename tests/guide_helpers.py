"""What the Studies and Tuning guides' tests read from a page: its code blocks and its worked examples."""

from __future__ import annotations

import re
from pathlib import Path

FILE_HEADER = re.compile(r"^# (\S+\.yaml): ")


def blocks(page: str) -> list[tuple[str, str]]:
    """The fenced code blocks of a page: (language, text)."""
    return re.findall(r"^```(\w*)\n(.*?)^```", page, re.S | re.M)


def examples(guide: Path) -> list[tuple[str, str, list[str]]]:
    """(file name, the file's text, the commands of the bash block that follows it) for each yaml block
    that starts with ``# <name>.yaml: ``."""
    out, current = [], None
    for lang, text in blocks(guide.read_text()):
        head = FILE_HEADER.match(text)
        if lang == "yaml" and head:
            current = (head.group(1), text)
        elif lang == "bash" and current is not None:
            out.append((*current, [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]))
            current = None
    return out
