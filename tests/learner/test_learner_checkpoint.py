"""Atomic checkpoint writes and RNG state capture/restore."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from frlab.learner import checkpoint as ckpt_mod
from frlab.learner.checkpoint import (
    AtomicCheckpointIO,
    capture_rng_states,
    restore_rng_states,
)


def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_save_then_load_round_trip(tmp_path) -> None:
    io = AtomicCheckpointIO()
    path = tmp_path / "sub" / "last.ckpt"
    state = {"state_dict": {"w": torch.arange(4.0)}, "global_step": 7}
    io.save_checkpoint(state, path)
    loaded = io.load_checkpoint(path, weights_only=True)
    assert loaded["global_step"] == 7
    assert torch.equal(loaded["state_dict"]["w"], torch.arange(4.0))
    # no temp file left behind; the digest sidecar sits next to the checkpoint
    assert sorted(os.listdir(path.parent)) == ["last.ckpt", "last.ckpt.sha256"]


def test_crash_mid_save_keeps_old_checkpoint(tmp_path, monkeypatch) -> None:
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1, "w": torch.ones(64)}, path)
    old_bytes = path.read_bytes()

    def crashing_save(obj, handle, *args, **kwargs):
        handle.write(b"PARTIAL-CHECKPOINT-BYTES")  # half a file reached the disk ...
        raise KeyboardInterrupt("killed mid-save")  # ... then the process dies

    monkeypatch.setattr(ckpt_mod.torch, "save", crashing_save)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"global_step": 2, "w": torch.zeros(64)}, path)
    monkeypatch.undo()

    assert path.read_bytes() == old_bytes
    assert io.load_checkpoint(path)["global_step"] == 1
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt", "last.ckpt.sha256"]


def test_replace_happens_only_after_fsync(tmp_path, monkeypatch) -> None:
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1}, path)
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(ckpt_mod.os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd)))

    def replace(src, dst):
        if str(dst).endswith(".sha256"):  # the digest sidecar (frlab.learner.integrity)
            return real_replace(src, dst)
        calls.append("replace")
        assert os.path.dirname(os.path.abspath(src)) == str(tmp_path)  # same folder: atomic
        assert torch.load(src, weights_only=True)["global_step"] == 2  # complete before rename
        real_replace(src, dst)

    monkeypatch.setattr(ckpt_mod.os, "replace", replace)
    io.save_checkpoint({"global_step": 2}, path)
    assert calls[0] == "fsync" and "replace" in calls
    assert calls.index("replace") > calls.index("fsync")
    assert torch.load(path, weights_only=True)["global_step"] == 2


def test_storage_options_rejected(tmp_path) -> None:
    with pytest.raises(TypeError, match="storage_options"):
        AtomicCheckpointIO().save_checkpoint({}, tmp_path / "x.ckpt", storage_options={"a": 1})


def test_rng_states_round_trip_through_weights_only_load(tmp_path) -> None:
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    states = capture_rng_states()
    expected = _draws()
    path = tmp_path / "rng.ckpt"
    AtomicCheckpointIO().save_checkpoint({"rng_states": states}, path)
    _draws()  # advance every generator
    restore_rng_states(torch.load(path, weights_only=True)["rng_states"])
    assert _draws() == expected


def test_restore_rng_names_missing_generator() -> None:
    states = capture_rng_states()
    del states["numpy"]
    with pytest.raises(ValueError, match="numpy"):
        restore_rng_states(states)
