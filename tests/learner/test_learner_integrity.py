"""Checkpoint integrity: damaged checkpoints (truncated, empty, text, random bytes inside a valid
container) fail before torch loads them, with a message naming the file and the intact
checkpoint to resume from; a crash between the sidecar and the rename still verifies; out of
space names the folder."""

from __future__ import annotations

import errno
import os
import zipfile
from pathlib import Path

import pytest
import torch

from frlab.fsio import DiskFullError
from frlab.learner import checkpoint as ckpt_mod
from frlab.learner.checkpoint import AtomicCheckpointIO
from frlab.learner.integrity import (
    CheckpointCorrupt,
    intact_checkpoints,
    sidecar_of,
    verify_checkpoint,
)

STATE = {"state_dict": {"w": torch.arange(4096.0)}, "global_step": 7}


def _save(folder: Path, name: str, state: dict = STATE) -> Path:
    path = folder / name
    AtomicCheckpointIO().save_checkpoint(state, path)
    return path


def _flip_bytes_inside_a_tensor(path: Path) -> None:
    """Overwrite bytes in the middle of a stored tensor, keeping the zip container valid (torch
    does not check the entries' CRC, so such a file loads and yields garbage weights)."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if "/data/" in i.filename)
    with open(path, "r+b") as handle:
        handle.seek(info.header_offset + 30 + len(info.filename) + len(info.extra) + 64)
        handle.write(os.urandom(64))
    torch.load(path, weights_only=True)  # the container still loads: only the digest can tell


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "truncated"),
        (lambda p: p.write_bytes(b""), "empty"),
        (lambda p: p.write_text("not a checkpoint\n"), "bytes"),
        (_flip_bytes_inside_a_tensor, "SHA-256"),
    ],
    ids=["truncated", "empty", "text", "random-bytes"],
)
def test_a_damaged_checkpoint_names_the_file_and_the_intact_one_to_resume_from(
    tmp_path: Path, damage, problem: str
) -> None:
    earlier = _save(tmp_path, "step000050.ckpt")
    last = _save(tmp_path, "last.ckpt", {**STATE, "global_step": 100})
    damage(last)
    with pytest.raises(CheckpointCorrupt) as info:
        AtomicCheckpointIO().load_checkpoint(last)
    text = str(info.value)
    assert str(last) in text and problem in text
    assert f"ckpt_path={earlier}" in text
    assert intact_checkpoints(tmp_path) == [earlier]


def test_without_an_intact_neighbour_the_message_says_to_start_over(tmp_path: Path) -> None:
    last = _save(tmp_path, "last.ckpt")
    last.write_bytes(b"x" * 10)
    with pytest.raises(CheckpointCorrupt, match="start over"):
        verify_checkpoint(last)


def test_a_checkpoint_without_a_sidecar_gets_a_structural_check(tmp_path: Path) -> None:
    path = tmp_path / "plain.ckpt"
    torch.save(STATE, path)  # written by plain torch: no digest
    verify_checkpoint(path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointCorrupt, match="not a complete torch checkpoint"):
        verify_checkpoint(path)


def test_a_crash_between_the_sidecar_and_the_rename_still_verifies(tmp_path, monkeypatch) -> None:
    last = _save(tmp_path, "last.ckpt")
    old_bytes = last.read_bytes()
    real_replace = os.replace

    def crash_on_checkpoint_rename(src, dst):
        if str(dst).endswith(".ckpt"):
            raise KeyboardInterrupt("killed between the sidecar and the rename")
        return real_replace(src, dst)

    monkeypatch.setattr(ckpt_mod.os, "replace", crash_on_checkpoint_rename)
    with pytest.raises(KeyboardInterrupt):
        AtomicCheckpointIO().save_checkpoint({**STATE, "global_step": 8}, last)
    monkeypatch.undo()
    assert last.read_bytes() == old_bytes
    verify_checkpoint(last)  # the sidecar lists the new digest and the one on disk
    AtomicCheckpointIO().save_checkpoint({**STATE, "global_step": 9}, last)
    verify_checkpoint(last)
    assert AtomicCheckpointIO().load_checkpoint(last)["global_step"] == 9


def test_remove_checkpoint_removes_the_sidecar(tmp_path: Path) -> None:
    path = _save(tmp_path, "step000010.ckpt")
    assert sidecar_of(path).exists()
    AtomicCheckpointIO().remove_checkpoint(path)
    assert os.listdir(tmp_path) == []


def test_out_of_space_names_the_folder_and_keeps_the_previous_file(tmp_path, monkeypatch) -> None:
    """Simulated ENOSPC (the reliability suite fills a real tmpfs): torch reports it as
    `RuntimeError: [enforce fail at inline_container.cc:...]` chained to the OSError."""
    last = _save(tmp_path, "last.ckpt")
    old_bytes = last.read_bytes()

    def full_disk_save(obj, handle, *args, **kwargs):
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise RuntimeError(
                "[enforce fail at inline_container.cc:672] . unexpected pos"
            ) from exc

    monkeypatch.setattr(ckpt_mod.torch, "save", full_disk_save)
    with pytest.raises(DiskFullError) as info:
        AtomicCheckpointIO().save_checkpoint(STATE, last)
    assert f"no space left on the device holding {tmp_path}" in str(info.value)
    assert "inline_container" not in str(info.value)
    assert last.read_bytes() == old_bytes
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt", "last.ckpt.sha256"]
