"""RolloutPool state and weights: run counters and the prompt cursor across a resume, weight
pushes the engine must apply, and the callback that pushes them every `sync_every` steps."""

from __future__ import annotations

import io
import random

import pytest
import torch
from helpers.pool_fakes import Board, FakeEngine, make_pool


def test_counters_travel_with_the_state_so_run_totals_survive_a_resume() -> None:
    board = Board(open_by_default=True, plan={1: "env_fail"})
    pool, _ = make_pool(board, batch_size=2, max_in_flight=2)
    pool.start()
    try:
        for _ in range(2):
            pool.next_batch(timeout=10)
        state, before = pool.state_dict(), pool.stats()
    finally:
        pool.stop()
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    resumed, _ = make_pool(Board(open_by_default=True), batch_size=2, max_in_flight=2)
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    resumed.start()
    try:
        resumed.next_batch(timeout=10)
        after = resumed.stats()
    finally:
        resumed.stop()
    assert before["failed_by_reason"] == {"env_step": 1} == after["failed_by_reason"]
    assert (before["consumed"], after["consumed"]) == (4, 6)
    assert (before["batches"], after["batches"]) == (2, 3)
    assert after["started"] >= before["started"] + 2


def test_state_dict_round_trip_resumes_the_prompt_cursor() -> None:
    board = Board(open_by_default=True)
    pool, _ = make_pool(board, batch_size=2, max_in_flight=4)
    pool.start()
    try:
        consumed = [t for _ in range(3) for t in pool.next_batch(timeout=10)]
        state = pool.state_dict()
    finally:
        pool.stop()
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)

    resumed, _ = make_pool(Board(open_by_default=True), batch_size=2, max_in_flight=4)
    resumed.start()  # Lightning restores the datamodule after setup: load into a running pool
    try:
        resumed.load_state_dict(state)
        for _ in range(6):
            consumed += resumed.next_batch(timeout=10)
    finally:
        resumed.stop()
    ids = [t.prompt_id for t in consumed]
    assert len(ids) == len(set(ids))
    assert set(range(state["prompt_counter"])) <= set(ids)  # nothing in flight or queued was lost
    reference = random.Random(0)
    expected_x = [reference.randrange(1000) for _ in range(max(ids) + 1)]
    assert all(t.info["env"]["x"] == expected_x[t.prompt_id] for t in consumed)


def test_update_weights_refuses_an_engine_that_did_not_apply_them() -> None:
    class StuckEngine(FakeEngine):
        def update_weights(self, state_dict, version: int) -> None:
            pass  # silently keeps the old weights and version

    pool, _ = make_pool(Board(open_by_default=True))
    pool.engine = StuckEngine()
    with pytest.raises(RuntimeError, match="not applied"):
        pool.update_weights({}, 1)
    pool.engine.update_weights = FakeEngine.update_weights.__get__(pool.engine)
    pool.update_weights({}, 2)
    with pytest.raises(ValueError, match="version 1"):
        pool.update_weights({}, 1)
    assert pool.stats()["learner_version"] == 2


class RecordingPool:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def update_weights(self, state_dict, version: int) -> None:
        assert set(state_dict) == {"weight", "bias"}
        self.calls.append(("push", version))

    def set_learner_version(self, version: int) -> None:
        self.calls.append(("version", version))


def test_weight_sync_callback_pushes_every_sync_every_optimizer_steps() -> None:
    from types import SimpleNamespace

    from frlab.rollout.callbacks import WeightSyncCallback

    pool = RecordingPool()
    trainer = SimpleNamespace(datamodule=SimpleNamespace(pool=pool))
    module = SimpleNamespace(policy=torch.nn.Linear(2, 2), policy_version=0)
    callback = WeightSyncCallback(sync_every=2)
    callback.on_train_start(trainer, module)
    for version in (1, 1, 2, 3, 4):  # the repeated 1: a batch without an optimizer step
        module.policy_version = version
        callback.on_train_batch_end(trainer, module, None, None, 0)
    assert pool.calls == [("push", 0), ("version", 1), ("push", 2), ("version", 3), ("push", 4)]
    with pytest.raises(ValueError, match="sync_every"):
        WeightSyncCallback(sync_every=0)
    with pytest.raises(RuntimeError, match="no rollout pool"):
        WeightSyncCallback(sync_every=1).on_train_start(SimpleNamespace(datamodule=None), module)
    with pytest.raises(AttributeError, match="policy_version"):
        WeightSyncCallback(1, pool=pool).on_train_start(
            trainer, SimpleNamespace(policy=module.policy)
        )
