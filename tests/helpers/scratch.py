"""A scratch copy of parts of the repository, for the tests that carry out a guide's recipe on
it (the copy's files change, this checkout's never)."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def scratch_copy(tmp_path: Path, copied: Iterable[str], skip: Iterable[str] = ()) -> Path:
    """`tmp_path/repo` holding each of `copied` (paths relative to the repository), without
    caches, run folders and the file-name patterns in `skip`."""
    root = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "outputs", *skip)
    for rel in copied:
        source, target = REPO / rel, root / rel
        if source.is_dir():
            shutil.copytree(source, target, ignore=ignore)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return root
