"""The NCCL rpcs of frlab's vLLM worker extension (frlab.rollout.vllm.worker_extension), on a fake
worker:
join a group by token, begin (tap `load_weights`, forget the held version), commit only what
was loaded when it matches the learner's fingerprint."""

from __future__ import annotations

import pytest
import torch
from helpers.vllm_worker import FakeModel, fake_worker

from frlab.rollout.vllm.snapshot import write_snapshot
from frlab.rollout.vllm.worker_extension import check_acks, weights_fingerprint

SENT = [("a", torch.tensor([1.0, 2.0])), ("b", torch.tensor([[0.5], [-4.0]]))]
FP = weights_fingerprint(SENT)


def receive(worker, pairs) -> None:  # noqa: ANN001
    """What vLLM's NCCL engine does on the worker: load the broadcast tensors, in batches."""
    model = worker.weight_transfer_engine.model
    for pair in pairs:
        model.load_weights([pair])


def test_a_matching_receive_commits_the_version_and_restores_load_weights() -> None:
    worker = fake_worker()
    model = worker.weight_transfer_engine.model
    assert worker.frlab_nccl_join("g1") == {"group": "g1"}
    assert worker.frlab_nccl_begin("g1") == {"ready": True}
    assert "load_weights" in vars(model)  # the tap shadows the method
    receive(worker, SENT)
    ack = worker.frlab_commit_version(5, FP)
    assert ack == {"version": 5, "tensors": 2, "numel": 4, "sum": -0.5}
    check_acks([ack], 5, FP)
    assert worker.frlab_weight_version() == {"version": 5}
    assert "load_weights" not in vars(model)  # back to the class method
    assert torch.equal(model.params["b"], SENT[1][1])


def test_a_mismatch_is_acknowledged_but_not_committed() -> None:
    worker = fake_worker()
    worker.frlab_nccl_join("g1")
    worker.frlab_nccl_begin("g1")
    receive(worker, [SENT[0], ("b", SENT[1][1] + 1)])  # corrupted in transport
    ack = worker.frlab_commit_version(5, FP)
    assert ack["version"] == 5 and ack["sum"] == pytest.approx(FP["sum"] + 2)
    with pytest.raises(RuntimeError, match="different weights"):
        check_acks([ack], 5, FP)
    assert worker.frlab_weight_version()["version"] is None


def test_a_missing_tensor_is_a_mismatch() -> None:
    worker = fake_worker()
    worker.frlab_nccl_join("g1")
    worker.frlab_nccl_begin("g1")
    receive(worker, SENT[:1])
    worker.frlab_commit_version(5, FP)
    assert worker.frlab_weight_version()["version"] is None


def test_begin_with_another_token_changes_nothing(tmp_path) -> None:  # noqa: ANN001
    worker = fake_worker()
    worker.frlab_load_snapshot(str(write_snapshot(dict(SENT), tmp_path, 3)[0]), 3)  # holds v3
    assert worker.frlab_nccl_begin("g1") == {"ready": False}  # never joined (a restarted server)
    worker.frlab_nccl_join("g1")
    assert worker.frlab_nccl_begin("g2") == {"ready": False}
    assert worker.frlab_weight_version() == {"version": 3}
    assert "load_weights" not in vars(worker.weight_transfer_engine.model)


def test_begin_forgets_the_held_version_and_commit_needs_a_begin(tmp_path) -> None:  # noqa: ANN001
    worker = fake_worker()
    worker.frlab_load_snapshot(str(write_snapshot(dict(SENT), tmp_path, 3)[0]), 3)
    with pytest.raises(RuntimeError, match="frlab_nccl_begin"):
        worker.frlab_commit_version(4, FP)
    worker.frlab_nccl_join("g1")
    worker.frlab_nccl_begin("g1")
    assert worker.frlab_weight_version()["version"] is None  # the weights are about to change
    worker.frlab_nccl_begin("g1")  # a second begin replaces the first tap
    receive(worker, SENT)
    assert worker.frlab_commit_version(4, FP)["tensors"] == 2
    assert worker.frlab_weight_version() == {"version": 4}


def test_without_a_transfer_engine_the_served_model_is_tapped() -> None:
    worker = fake_worker()
    del worker.weight_transfer_engine
    model: FakeModel = worker.get_model()
    worker.frlab_nccl_join("g")
    worker.frlab_nccl_begin("g")
    model.load_weights(SENT)
    assert worker.frlab_commit_version(1, FP)["version"] == 1
    assert worker.frlab_weight_version() == {"version": 1}
