"""Crash-safe checkpoint writes and the RNG states a resumed run needs.

`AtomicCheckpointIO` streams the checkpoint to a temporary file in the target's folder, fsyncs
it, then `os.replace()`s it over the target and fsyncs the folder. A crash (or an exception)
mid-save leaves the previous file intact, so `ckpt_path=last` always finds a loadable
`last.ckpt`. The rename is atomic because source and target live on one filesystem. The
SHA-256 of the bytes written goes into a sidecar `<name>.sha256` and is checked before a load
(frlab.learner.integrity); running out of space raises `DiskFullError` naming the folder.

`capture_rng_states` / `restore_rng_states` hold the python, numpy and torch (CPU and CUDA)
generators in a form that `torch.load(weights_only=True)` accepts (tensors, ints, tuples).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO

from frlab.fsio import disk_full_error, fsync_path, is_disk_full
from frlab.learner.integrity import (
    CheckpointCorrupt,
    HashingWriter,
    previous_digest,
    sidecar_of,
    verify_checkpoint,
    write_sidecar,
)

RNG_KEYS = ("python", "numpy", "torch")


def _is_remote(path: _PATH) -> bool:
    text = str(path)
    return "://" in text and not text.startswith("file://")


def atomic_torch_save(obj: Any, path: _PATH) -> None:
    """`torch.save(obj, path)` that never leaves a partial file at `path`, with a SHA-256
    sidecar (frlab.learner.integrity); out of space raises DiskFullError naming the folder."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_verified(obj, target)
    except Exception as exc:
        if is_disk_full(exc):
            raise disk_full_error(target.parent, target.name) from exc
        raise
    fsync_path(target.parent)


def _write_verified(obj: Any, target: Path) -> None:
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            writer = HashingWriter(handle)
            torch.save(obj, writer)
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_name, 0o666 & ~umask)
        digest, old = writer.sha256.hexdigest(), previous_digest(target)
        # Sidecar first, accepting both files: a crash before the rename still verifies.
        write_sidecar(target, [digest] + ([old] if old and old != digest else []), writer.size)
        os.replace(tmp_name, target)
        write_sidecar(target, [digest], writer.size)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning CheckpointIO: temp file in the same folder, fsync, `os.replace`.

    Use as `Trainer(plugins=[AtomicCheckpointIO()])`. Remote (fsspec URL) paths fall back to
    Lightning's own transactional write.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(
                f"{type(self).__name__}.save_checkpoint does not take storage_options, "
                f"got {storage_options!r}"
            )
        if _is_remote(path):
            super().save_checkpoint(checkpoint, path)
            return
        atomic_torch_save(checkpoint, _local(path))

    def load_checkpoint(self, path: _PATH, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Verify the checkpoint's digest first; a damaged file raises CheckpointCorrupt
        (naming the file and the intact checkpoints next to it) instead of a torch error."""
        if _is_remote(path):
            return super().load_checkpoint(path, *args, **kwargs)
        local = _local(path)
        verify_checkpoint(local)
        try:
            return super().load_checkpoint(local, *args, **kwargs)
        except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise CheckpointCorrupt(local, f"torch cannot load it: {exc}") from exc

    def remove_checkpoint(self, path: _PATH) -> None:
        """Remove a checkpoint and its digest sidecar."""
        super().remove_checkpoint(path)
        if not _is_remote(path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(sidecar_of(_local(path)))


def _local(path: _PATH) -> _PATH:
    return str(path)[len("file://") :] if str(path).startswith("file://") else path


def capture_rng_states() -> dict[str, Any]:
    """The python, numpy and torch generator states, safe for `weights_only` loading."""
    py_version, py_state, py_gauss = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    states: dict[str, Any] = {
        "python": {"version": py_version, "state": list(py_state), "gauss_next": py_gauss},
        "numpy": {
            "kind": str(np_kind),
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_gauss),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    """Inverse of `capture_rng_states`; raises ValueError naming a missing generator."""
    missing = [k for k in RNG_KEYS if k not in states]
    if missing:
        raise ValueError(f"checkpoint rng_states lacks {', '.join(missing)}")
    py = states["python"]
    random.setstate((int(py["version"]), tuple(int(x) for x in py["state"]), py["gauss_next"]))
    nps = states["numpy"]
    keys = nps["keys"].cpu().numpy().astype(np.uint32)
    np.random.set_state(
        (nps["kind"], keys, int(nps["pos"]), int(nps["has_gauss"]), float(nps["cached_gaussian"]))
    )
    torch.set_rng_state(states["torch"].cpu())
    if "cuda" in states and torch.cuda.is_available():
        saved = states["cuda"]
        if len(saved) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([s.cpu() for s in saved])
