"""Versioned safetensors snapshots (frlab.rollout.vllm.snapshot) and their load by frlab's vLLM
worker extension (frlab.rollout.vllm.worker_extension) on a fake worker."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.vllm_worker import FakeWorker

from frlab.rollout.vllm.snapshot import (
    prune_snapshots,
    read_snapshot,
    snapshot_path,
    write_snapshot,
)
from frlab.rollout.vllm.worker_extension import check_acks


def test_snapshots_are_written_whole_tied_tensors_included_and_pruned(tmp_path: Path) -> None:
    emb = torch.arange(6.0).reshape(2, 3)
    state = {"embed.weight": emb, "lm_head.weight": emb, "b": torch.ones(2)}  # tied storage
    for version in (1, 2, 3):
        path, fingerprint = write_snapshot(state, tmp_path, version)
        assert (
            path == snapshot_path(tmp_path, version) == tmp_path / f"v{version}/model.safetensors"
        )
    assert fingerprint == {"tensors": 3, "numel": 14, "sum": 2 * 15.0 + 2.0}
    loaded = read_snapshot(path)
    assert set(loaded) == set(state) and torch.equal(loaded["lm_head.weight"], emb)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1", "v2", "v3"]  # no temp folder
    assert [p.name for p in prune_snapshots(tmp_path, keep=2)] == ["v1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v2", "v3"]
    with pytest.raises(FileNotFoundError, match="v1"):
        read_snapshot(snapshot_path(tmp_path, 1))


def test_the_vllm_worker_extension_loads_a_snapshot_and_acks_its_fingerprint(
    tmp_path: Path,
) -> None:
    """the load goes through the worker's documented reload path,
    `Worker.reload_weights(weights_iterator=..., is_checkpoint_format=True)`
    (vllm/v1/worker/gpu_worker.py), which runs vLLM's post-load processing."""
    worker = FakeWorker()
    path, fingerprint = write_snapshot(
        {"w": torch.full((3,), 2.0), "v": torch.ones(1)}, tmp_path, 4
    )
    ack = worker.frlab_load_snapshot(str(path), 4)
    check_acks([ack], 4, fingerprint)
    assert worker.reloads == [True]  # is_checkpoint_format=True
    assert sorted(worker.get_model().params) == ["v", "w"]
    assert worker.frlab_weight_version() == {"version": 4}
    with pytest.raises(FileNotFoundError):
        worker.frlab_load_snapshot(str(tmp_path / "v9/model.safetensors"), 9)
    assert worker.frlab_weight_version() == {"version": 4}  # nothing started: still v4
