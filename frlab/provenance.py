"""Which frlab made a run or a report: the git commit of the checkout frlab is imported from.

Recorded in every run's summary.json (`frlab`, read when the run starts: the code that ran, even
if the checkout moves on while it trains) and in the header of `python -m frlab.report`.
Stdlib only; `git` missing, a checkout without `.git` (an installed wheel) or a slow git give
`commit: null` rather than an error.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import frlab

GIT_TIMEOUT_S = 5.0
WATCHED = ("frlab", "configs", "envs", "experiments")  # what a run's result depends on


def _git(*args: str) -> str | None:
    root = Path(frlab.__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def frlab_provenance() -> dict[str, Any]:
    """`{"version", "commit", "dirty"}`: dirty is whether tracked files under frlab/,
    configs/, envs/ or experiments/ differ from the commit (None when unknown)."""
    commit = _git("rev-parse", "HEAD")
    changes = None
    if commit is not None:
        status = _git("status", "--porcelain", "--untracked-files=no", "--", *WATCHED)
        changes = None if status is None else bool(status)
    return {"version": frlab.__version__, "commit": commit, "dirty": changes}
