"""Versioned safetensors weight snapshots: how the learner hands full weights to vLLM's workers
(frlab's worker extension loads them by path: the in-process engine's workers, and each server
of a fleet; frlab.serve reads them too).

`write_snapshot` writes `<snapshot_dir>/v<version>/model.safetensors` atomically (a temporary
folder in the same directory, fsync, then one `rename`), so a worker never reads a partial
file; it returns the path and the fingerprint
(`frlab.rollout.vllm.worker_extension.weights_fingerprint`) that a load acknowledgement must
match. `prune_snapshots` keeps the newest few. Tensors that share storage (tied embeddings)
are copied, since safetensors refuses shared storage.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from frlab.fsio import fsync_path
from frlab.rollout.vllm.worker_extension import weights_fingerprint

SNAPSHOT_FILE = "model.safetensors"
_VERSION_DIR = re.compile(r"^v(\d+)$")


def snapshot_path(snapshot_dir: str | os.PathLike[str], version: int) -> Path:
    """Where version `version`'s snapshot lives."""
    return Path(snapshot_dir) / f"v{int(version)}" / SNAPSHOT_FILE


def _cpu_tensors(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, none sharing storage with another."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in state_dict.items():
        t = tensor.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out[str(name)] = t
    return out


def write_snapshot(
    state_dict: Mapping[str, torch.Tensor], snapshot_dir: str | os.PathLike[str], version: int
) -> tuple[Path, dict[str, Any]]:
    """Write the snapshot of `version` atomically; return (path, fingerprint)."""
    if int(version) < 0:
        raise ValueError(f"snapshot version must be >= 0, got {version}")
    tensors = _cpu_tensors(state_dict)
    if not tensors:
        raise ValueError("write_snapshot got an empty state_dict")
    root = Path(snapshot_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = snapshot_path(root, version)
    tmp = root / f".tmp-v{int(version)}-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        save_file(tensors, str(tmp / SNAPSHOT_FILE), metadata={"frlab_version": str(version)})
        fsync_path(tmp / SNAPSHOT_FILE)
        if final.parent.exists():  # a rewrite of the same version (e.g. a resumed run)
            shutil.rmtree(final.parent, ignore_errors=True)
        try:
            os.rename(tmp, final.parent)
        except OSError:
            if not final.is_file():  # not a concurrent writer of the same version: a real error
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final, weights_fingerprint(list(tensors.items()))


def read_snapshot(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The tensors of a snapshot file (FileNotFoundError naming the path if absent)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"weight snapshot {p} does not exist")
    return load_file(str(p))


def prune_snapshots(snapshot_dir: str | os.PathLike[str], keep: int = 2) -> list[Path]:
    """Delete all but the `keep` newest version folders; return the deleted ones."""
    root = Path(snapshot_dir)
    if not root.is_dir():
        return []
    found = sorted(
        (int(m.group(1)), p)
        for p in root.iterdir()
        if p.is_dir() and (m := _VERSION_DIR.match(p.name))
    )
    doomed = [p for _, p in found[: max(0, len(found) - int(keep))]]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed
