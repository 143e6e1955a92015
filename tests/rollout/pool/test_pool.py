"""RolloutPool scheduling: first-B-finishers, carry-over, admission control under the lag bound,
sync groups, the stall without weights and the settings it refuses (fakes: helpers.pool_fakes)."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pytest
from helpers.pool_fakes import Board, make_pool, task_ids, wait_for
from helpers.pool_fakes import board as board  # noqa: F401 - the fixture

from frlab.rollout.pool import admission_feasible, required_early


def test_first_b_finishers_are_handed_out_and_the_rest_carry_over(board: Board) -> None:
    pool, _ = make_pool(board, batch_size=2, max_in_flight=4)
    pool.start()
    try:
        wait_for(lambda: pool.stats()["in_flight"] == 4)
        board.open(2, 3)
        first = pool.next_batch(timeout=10)
        assert task_ids(first) == [2, 3]
        assert sorted(t.prompt_id for t in first) == [2, 3]
        wait_for(lambda: pool.stats()["started"] == 6)  # refilled to 4 in flight: 0, 1, 4, 5
        board.open(5, 0)
        assert task_ids(pool.next_batch(timeout=10)) == [0, 5]
        wait_for(lambda: pool.stats()["started"] == 8)
        stats = pool.stats()
        assert stats["in_flight"] == 4 and stats["consumed"] == 4  # 1, 4, 6, 7 running
        board.open(1, 6, 7)
        third = pool.next_batch(timeout=10)
        board.open(4)
        fourth = pool.next_batch(timeout=10)
        # the slow ones (1 and 4) finished late but were not dropped
        assert {1, 4} <= set(task_ids(third) + task_ids(fourth))
    finally:
        board.open_all()
        pool.stop()


def test_admission_pauses_at_the_lag_bound_and_batches_wait_for_due_rollouts(board: Board) -> None:
    pool, engine = make_pool(board, batch_size=2, max_in_flight=8, max_policy_lag=1)
    pool.start()
    try:
        wait_for(lambda: pool.stats()["lag_paused"] and engine.calls == 4)
        stats = pool.stats()
        assert stats["started"] == 4 and stats["paused_for_lag"] == 1  # (lag + 1) * B, not 8
        board.open(0, 1)
        assert task_ids(pool.next_batch(timeout=10)) == [0, 1]
        pool.update_weights({}, 1)
        wait_for(lambda: pool.stats()["started"] == 6)
        board.open(4, 5)  # newer rollouts finish while 2 and 3 (due at version 1) still run
        wait_for(lambda: pool.stats()["queued"] == 2)
        with pytest.raises(TimeoutError):
            pool.next_batch(timeout=0.2)  # FIFO would hand out 4, 5 and let 2, 3 go stale
        board.open(2, 3)
        second = pool.next_batch(timeout=10)
        assert task_ids(second) == [2, 3]
        assert [t.info["policy_lag_max"] for t in second] == [1, 1], [t.info for t in second]
        pool.update_weights({}, 2)
        assert task_ids(pool.next_batch(timeout=10)) == [4, 5]
    finally:
        board.open_all()
        pool.stop()


def test_lag_never_exceeds_the_bound_and_nothing_finished_is_dropped() -> None:
    board = Board(open_by_default=False)
    rng = random.Random(1)
    stop = threading.Event()

    def opener() -> None:  # finish rollouts in a shuffled, heavy-tailed order
        while not stop.is_set():
            with board.lock:
                waiting = [
                    n
                    for n in range(board.count)
                    if n not in board.gates or not board.gates[n].is_set()
                ]
            if waiting:
                board.open(rng.choice(waiting[:8]))
            time.sleep(0.001)

    pool, _ = make_pool(board, batch_size=3, max_in_flight=12, max_policy_lag=2)
    thread = threading.Thread(target=opener)
    pool.start()
    thread.start()
    lags, seen = [], []
    try:
        for version in range(15):
            batch = pool.next_batch(timeout=20)
            lags += [t.info["policy_lag_max"] for t in batch]
            seen += [t.prompt_id for t in batch]
            pool.update_weights({}, version + 1)
        stats = pool.stats()
    finally:
        stop.set()
        thread.join()
        board.open_all()
        pool.stop()
    assert max(lags) <= 2 and stats["lag_violations"] == 0
    assert len(seen) == len(set(seen)) == 45
    assert stats["failed"] == stats["rejected"] == 0
    assert stats["finished"] == stats["consumed"] + stats["queued"]


def test_sync_mode_collects_b_over_g_prompts_times_g_and_waits_for_the_next_request() -> None:
    board = Board(open_by_default=True)
    pool, _ = make_pool(board, mode="sync", batch_size=4, samples_per_prompt=2, max_in_flight=8)
    pool.start()
    try:
        first = pool.next_batch(timeout=10)
        assert Counter(t.prompt_id for t in first) == {0: 2, 1: 2}
        time.sleep(0.05)
        assert pool.stats()["started"] == 4  # nothing starts until the next request
        second = pool.next_batch(timeout=10)
        assert Counter(t.prompt_id for t in second) == {2: 2, 3: 2}
    finally:
        pool.stop()


def test_stall_is_reported_when_the_engine_never_receives_weights() -> None:
    board = Board(open_by_default=True)
    pool, _ = make_pool(board, batch_size=1, max_in_flight=4, max_policy_lag=0)
    pool.start()
    try:
        pool.next_batch(timeout=10)
        with pytest.raises(RuntimeError, match="max_policy_lag"):
            pool.next_batch(timeout=10)
        pool.update_weights({}, 1)
        assert len(pool.next_batch(timeout=10)) == 1
    finally:
        pool.stop()


def test_admission_and_deadline_arithmetic() -> None:
    # L=0, B=2, outstanding due at 2: capacity up to version 2 is 3 batches = 6 rollouts
    assert admission_feasible([2] * 5, 2, 1, 0, 2)
    assert not admission_feasible([2] * 6, 2, 1, 0, 2)
    assert not admission_feasible([], 0, 1, 1, 2)  # due before the learner version
    # work due later may start while earlier deadlines are full, within the total budget
    assert admission_feasible([1, 1, 1, 1], 3, 1, 0, 2)
    assert not admission_feasible([1, 1, 1, 1, 3, 3, 3, 3], 3, 1, 0, 2)
    assert admission_feasible([1, 1, 1, 1, 3, 3, 3], 3, 1, 0, 2)
    assert required_early([0, 0, 1, 1, 1, 1], 0, 2) == {0: 2, 1: 4}
    assert required_early([3, 3], 0, 2) == {}
