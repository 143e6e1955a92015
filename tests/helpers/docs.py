"""The repository's documentation files and the Markdown reading that the doc checks
(test_docs.py) and the repository-hygiene checks (test_repo_hygiene.py) share."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMAND_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED_DOCS = [*COMMAND_DOCS, *sorted((ROOT / "experiments").glob("**/README.md"))]
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def split_fences(text: str) -> tuple[list[str], list[tuple[int, str, list[str]]]]:
    """The prose lines (fenced blocks blanked, so line numbers hold) and the fenced blocks."""
    prose, blocks, current = [], [], None
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if current is None and fence:
            current = (number, fence.group(2).lower(), [], fence.group(1))
            prose.append("")
        elif (
            current is not None
            and line.strip().startswith(current[3])
            and not line.strip(current[3][0]).strip()
        ):
            blocks.append(current[:3])
            current = None
            prose.append("")
        elif current is not None:
            current[2].append(line)
            prose.append("")
        else:
            prose.append(line)
    assert current is None, f"a fenced block opened at line {current[0]} is never closed"
    return prose, blocks


def without_code_spans(line: str) -> str:
    return re.sub(r"``.*?``|`[^`]*`", "", line)
