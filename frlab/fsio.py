"""Durable-write helper shared by checkpoints, sharded checkpoints and weight snapshots
(stdlib only, so the rollout server can import it without Lightning)."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: str | os.PathLike[str] | Path) -> None:
    """fsync a file, or a folder to persist a rename (a no-op where it cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
