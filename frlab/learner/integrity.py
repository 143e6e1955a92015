"""Checkpoint integrity: a SHA-256 written with every checkpoint and checked before a resume.

`AtomicCheckpointIO` hashes a checkpoint while writing it and records the digest in a sidecar
`<name>.sha256` (JSON). The sidecar is replaced BEFORE the checkpoint is renamed into place and
lists the new digest and the one of the file it replaces, so a crash between the two renames
leaves a pair that still verifies; after the rename it is rewritten with the new digest only.

`verify_checkpoint` reads the file once and compares; a checkpoint without a sidecar (written
elsewhere) gets a structural check instead (a complete zip archive, torch's format). A damaged
file raises `CheckpointCorrupt`, whose message names the file, what is wrong, and the intact
checkpoints of the same folder to resume from instead (the checkpoint callback keeps the last
few: `callbacks.model_checkpoint.save_top_k`). A sharded checkpoint (a folder) is not checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

SIDECAR_SUFFIX = ".sha256"
_CHUNK = 1 << 22


class CheckpointCorrupt(ValueError):
    """A checkpoint file that cannot be trusted; the message says what to do."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path, self.problem = Path(path), problem
        super().__init__(f"checkpoint {self.path} is damaged ({problem}). {advice(self.path)}")


class HashingWriter:
    """A write-only file wrapper that hashes every byte written (torch.save only writes)."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle, self.sha256, self.size = handle, hashlib.sha256(), 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.sha256.update(view)
        self.size += view.nbytes
        return self.handle.write(view)

    def flush(self) -> None:
        self.handle.flush()


def sidecar_of(path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    return path.with_name(path.name + SIDECAR_SUFFIX)


def file_digest(path: str | os.PathLike[str]) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_CHUNK):
            sha.update(block)
    return sha.hexdigest()


def read_sidecar(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The sidecar record of checkpoint `path`, or None when there is none (or it is unreadable)."""
    try:
        record = json.loads(sidecar_of(path).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(record, dict) and isinstance(record.get("sha256"), list)
    return record if ok else None


def write_sidecar(path: str | os.PathLike[str], digests: list[str], size: int) -> None:
    """Atomically (re)write checkpoint `path`'s sidecar listing the accepted digests."""
    side = sidecar_of(path)
    tmp = side.with_name(f".{side.name}.tmp")
    record = {"file": Path(path).name, "size": int(size), "sha256": digests}
    with open(tmp, "w") as handle:
        json.dump(record, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, side)


def previous_digest(path: str | os.PathLike[str]) -> str | None:
    """The first recorded digest of the checkpoint about to be replaced (None: none)."""
    record = read_sidecar(path) if os.path.isfile(path) else None
    return record["sha256"][0] if record and record["sha256"] else None


def verify_checkpoint(path: str | os.PathLike[str]) -> None:
    """Raise CheckpointCorrupt unless `path` matches its recorded digest (or, without a sidecar,
    is a complete zip archive). Folders (sharded checkpoints) are not checked."""
    path = Path(path)
    if path.is_dir():
        return
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise CheckpointCorrupt(path, f"cannot be read: {exc.strerror or exc}") from exc
    if size == 0:
        raise CheckpointCorrupt(path, "the file is empty")
    record = read_sidecar(path)
    if record is None:
        _check_structure(path)
        return
    if record.get("size") not in (None, size) and len(record["sha256"]) == 1:
        expected = record["size"]
        raise CheckpointCorrupt(
            path, f"{size} bytes, {expected} were written: truncated or changed"
        )
    if file_digest(path) not in record["sha256"]:
        raise CheckpointCorrupt(path, "its SHA-256 does not match the one written with it")


def _check_structure(path: Path) -> None:
    """A checkpoint without a sidecar: at least a complete zip archive (torch's format)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise CheckpointCorrupt(path, f"not a complete torch checkpoint ({exc})") from exc
    if not any(name.endswith("data.pkl") for name in names):
        raise CheckpointCorrupt(path, "a zip archive without torch's data.pkl")


def intact_checkpoints(folder: str | os.PathLike[str], exclude: Path | None = None) -> list[Path]:
    """Checkpoint files of `folder` that verify, newest step first (`last.ckpt` first)."""
    found = []
    for path in sorted(Path(folder).glob("*.ckpt"), key=_order):
        if exclude is not None and path.resolve() == exclude.resolve():
            continue
        try:
            verify_checkpoint(path)
        except CheckpointCorrupt:
            continue
        found.append(path)
    return found


def _order(path: Path) -> tuple[int, int]:
    """Sort key: last.ckpt first, then by the largest number in the name, descending."""
    numbers = [int(n) for n in re.findall(r"\d+", path.stem)]
    return (0 if path.stem == "last" else 1, -max(numbers, default=-1))


def advice(path: Path) -> str:
    """What to do about a damaged checkpoint: the intact ones next to it, or start over."""
    others = intact_checkpoints(path.parent, exclude=path)
    if others:
        listed = ", ".join(str(p) for p in others[:3])
        return (
            f"Resume from an intact earlier one instead: ckpt_path={others[0]} (intact: {listed})"
        )
    return (
        "No intact checkpoint is left in that folder: start over in a new run folder, or pass "
        "ckpt_path=<path of a copy you trust>"
    )
