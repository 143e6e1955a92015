"""Durable-write helpers shared by checkpoints, sharded checkpoints, weight snapshots and run
files (stdlib only, so the rollout server can import it without Lightning): fsync, and a
disk-full error that names the device's folder instead of the writer's internal message (torch
reports ENOSPC as `RuntimeError: [enforce fail at inline_container.cc:...]`)."""

from __future__ import annotations

import errno
import os
from pathlib import Path


class DiskFullError(OSError):
    """No space left on the device holding a folder frlab writes to (errno ENOSPC)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.errno = errno.ENOSPC


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` or an exception it chains from is an out-of-space error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(current) or "Disk quota exceeded" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def disk_full_error(folder: str | os.PathLike[str], what: str) -> DiskFullError:
    """The error to raise when writing `what` into `folder` ran out of space."""
    return DiskFullError(
        f"no space left on the device holding {folder} (while writing {what}); the previous "
        "files there are intact: free space, or point the run (hydra.run.dir) or its "
        "checkpoints (callbacks.model_checkpoint.dirpath) at another device, then resume",
    )


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


def write_text_atomic(path: str | os.PathLike[str] | Path, text: str) -> None:
    """Write `text` to `path` through a temp file beside it (`.<name>.*.tmp`, which the run
    folder's partial-write cleanup recognises) and one rename: a reader sees the old text or
    the new, never part of it."""
    import tempfile

    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        umask = os.umask(0)  # the mode a plain write would give (mkstemp makes it 0600)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
