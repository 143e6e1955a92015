"""The documentation's pages and links hold in this checkout: README.md, docs/*.md and the
experiments write-ups.

- The docs pages exist and the README links each of them.
- Every relative link `[text](path)` / `[text](path#anchor)` (images too) resolves to an
  existing file, and an anchor into a Markdown file to one of its headings (GitHub's slugs).
  External http(s) links are not fetched.

The commands the docs show are checked in test_docs_commands.py; the repository-hygiene checks
(no internal issue numbers, config comments name real paths) in test_repo_hygiene.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.docs import HEADING, LINKED_DOCS, ROOT, split_fences, without_code_spans

DOC_PAGES = (
    "concepts",
    "configuration",
    "engines",
    "experiments",
    "extending",
    "benchmarks",
    "reliability",
    "gpu",
    "README",
)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


# --- Markdown links -------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed (but `-`
    and `_`), each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).lower()
    kept = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor, duplicates numbered as GitHub numbers them (`x`, `x-1`, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for line in split_fences(text)[0]:
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(text: str, here: Path) -> list[str]:
    """The relative links of Markdown `text` (a file in folder `here`) that do not resolve."""
    broken = []
    own = None
    for number, line in enumerate(split_fences(text)[0], 1):
        for target in LINK.findall(without_code_spans(line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http(s), mailto: not fetched
                continue
            path_part, _, anchor = target.partition("#")
            path = (here / path_part).resolve() if path_part else None
            if path is not None and not path.exists():
                broken.append(f"line {number}: {target} (no such file)")
                continue
            if not anchor:
                continue
            if path is None:
                own = anchors(text) if own is None else own
                names = own
            elif path.suffix == ".md" and path.is_file():
                names = anchors(path.read_text())
            else:
                continue
            if anchor not in names:
                broken.append(f"line {number}: {target} (no heading with that anchor)")
    return broken


# --- tests: links ---------------------------------------------------------------------------


def test_the_docs_pages_exist() -> None:
    for page in DOC_PAGES:
        assert (ROOT / "docs" / f"{page}.md").is_file(), page
    readme = (ROOT / "README.md").read_text()
    for page in DOC_PAGES[:-1]:
        assert f"(docs/{page}.md)" in readme, f"the README links docs/{page}.md"


def test_the_link_checker_flags_broken_links(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text(
        "# Other page\n\n## A `code` heading: yes\n\n## Twice\n\n## Twice\n"
    )
    (tmp_path / "pic.png").write_bytes(b"")
    good = (
        "# Here\n[a](other.md) [b](other.md#a-code-heading-yes) [c](#here) ![d](pic.png)\n"
        "[e](other.md#twice-1) [f](https://example.invalid/x#y) `[g](missing.md)`\n"
        "```\n[h](missing.md)\n```\n"
    )
    assert broken_links(good, tmp_path) == []
    bad = "[a](missing.md) [b](other.md#nowhere) [c](#not-here) ![d](gone.png)\n"
    found = broken_links(bad, tmp_path)
    assert len(found) == 4, found
    assert "missing.md (no such file)" in found[0] and "other.md#nowhere" in found[1]


@pytest.mark.parametrize("path", LINKED_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    broken = broken_links(path.read_text(), path.parent)
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


PAPER_URL = "https://github.com/yifanzhang-pro/FlashREINFORCE"
REFERENCE_URL = "https://github.com/NVIDIA-NeMo/labs-molt"
# "the paper presets / settings" name frlab's presets; every other "the paper" cites it
CITES_PAPER = re.compile(r"\b(?:the|FlashREINFORCE) paper(?! presets?\b| settings?\b)", re.I)
CITES_REFERENCE = re.compile(r"\breference implementation\b|\bthe reference(?:'s)?\b")
CITING_DOCS = sorted(
    [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "experiments").rglob("*.md")]
)


@pytest.mark.parametrize("path", CITING_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_that_cites_the_paper_or_the_reference_links_them(path: Path) -> None:
    """The FlashREINFORCE paper (its repository holds the PDF) and its reference
    implementation are linked wherever a page cites them."""
    text = path.read_text()
    if CITES_PAPER.search(text):
        assert PAPER_URL in text, f"{path.name} cites the paper without linking {PAPER_URL}"
    if CITES_REFERENCE.search(text):
        assert REFERENCE_URL in text, f"{path.name} cites the reference without {REFERENCE_URL}"
