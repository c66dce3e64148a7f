"""MkDocs hook: lists written as GitHub renders them also render as lists here.

GitHub starts a list right after a paragraph line ("...two CPU types:" then "- Xeon ..."); Python-
Markdown needs a blank line before it and otherwise runs the items into the paragraph. The text
moved from the READMEs (and the config folders' READMEs shown as pages) is written the GitHub way,
so a blank line is put before every list that follows a paragraph line (outside code blocks).
"""

from __future__ import annotations

import re

_ITEM = re.compile(r"^(?:[-*+]|\d+[.)]) \S")
_START = re.compile(r"^(?:[-*+]|1[.)]) \S")  # CommonMark: only "1." starts a list inside a paragraph
_FENCE = re.compile(r"^\s*(```|~~~)")


def blank_line_before_lists(markdown: str) -> str:
    out: list[str] = []
    fence = None
    previous = ""
    for line in markdown.split("\n"):
        found = _FENCE.match(line)
        if found:
            fence = None if fence == found.group(1) else (fence or found.group(1))
        elif fence is None and _START.match(line) and previous.strip() and not _ITEM.match(previous) \
                and not previous.startswith((" ", "\t", "|", "#", ">")):
            out.append("")
        out.append(line)
        previous = line
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return blank_line_before_lists(markdown)
