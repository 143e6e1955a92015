"""RolloutPool failures: counted by reason without stopping the run, a sync group with a failed
sample replaced, hung env steps failed at their deadline, and stop() joining every thread."""

from __future__ import annotations

import threading

import pytest
from helpers.pool_fakes import Board, make_pool, task_ids, wait_for
from helpers.pool_fakes import board as board  # noqa: F401 - the fixture


def test_sync_group_with_a_failed_sample_is_replaced_and_counted() -> None:
    board = Board(open_by_default=True, plan={0: "flaky"})
    pool, _ = make_pool(board, mode="sync", batch_size=2, samples_per_prompt=2, max_in_flight=2)
    pool.start()
    try:
        batch = pool.next_batch(timeout=10)
        stats = pool.stats()
    finally:
        pool.stop()
    assert [t.prompt_id for t in batch] == [1, 1]
    assert stats["failed_by_reason"] == {"env_step": 1}
    assert stats["rejected_by_reason"] == {"incomplete_group": 1}


def test_failures_are_counted_by_reason_and_do_not_stop_the_run() -> None:
    board = Board(open_by_default=True, plan={0: "env_fail", 1: "engine_fail", 2: "zero"})
    pool, _ = make_pool(board, batch_size=3, max_in_flight=3)
    pool.start()
    try:
        batch = pool.next_batch(timeout=10)
        stats = pool.stats()
    finally:
        pool.stop()
    assert not {0, 1, 2} & set(task_ids(batch))
    assert stats["failed_by_reason"] == {"env_step": 1, "engine": 1}
    assert stats["rejected_by_reason"] == {"zero_action_tokens": 1}
    assert stats["failed"] == 2 and stats["rejected"] == 1


def test_stop_joins_every_thread_even_after_an_exception(board: Board) -> None:
    before = set(threading.enumerate())
    pool, engine = make_pool(board, max_in_flight=4)
    pool.start()
    blocked_error: list[BaseException] = []

    def consumer() -> None:
        try:
            pool.next_batch(timeout=30)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            blocked_error.append(exc)

    waiter = threading.Thread(target=consumer)
    waiter.start()
    with pytest.raises(KeyError):
        try:
            wait_for(lambda: pool.stats()["in_flight"] == 4)
            pool.stats()["no such counter"]  # noqa: B018 - the training loop fails mid-run
        finally:
            board.open_all()
            pool.stop()
    waiter.join(timeout=10)
    pool.stop()  # idempotent
    assert engine.shut_down
    assert isinstance(blocked_error[0], RuntimeError)
    # no thread of this pool is left (one an earlier test abandoned may end meanwhile)
    assert set(threading.enumerate()) <= before
    with pytest.raises(RuntimeError, match="not running"):
        pool.next_batch(timeout=1)


def test_hung_env_steps_fail_their_rollouts_at_the_deadline_and_the_pool_moves_on() -> None:
    """Before deadlines, one step that never returned held its batch back forever and pool.stop()
    joined the hung thread (SIGINT/SIGTERM could not end the process)."""
    board = Board(open_by_default=True, plan={0: "hang", 3: "hang"})
    pool, _ = make_pool(board, env_timeout_s=0.2, batch_size=2, max_in_flight=4, num_env_workers=2)
    pool.start()
    try:
        batches = [pool.next_batch(timeout=60) for _ in range(4)]
        stats = pool.stats()
        stopper = threading.Thread(target=pool.stop)
        stopper.start()
        stopper.join(60)  # a hang detector, not a timing bound
        assert not stopper.is_alive(), "pool.stop() waited for the hung environment threads"
    finally:
        board.release.set()
        pool.stop()
    assert not {0, 3} & {n for b in batches for n in task_ids(b)}
    assert stats["failed_by_reason"] == {"env_step_timeout": 2}
    assert stats["consumed"] == 8
