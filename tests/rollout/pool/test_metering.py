"""Generation metering, pinned work and closed admission in the rollout pool.

The meter is checked against a scripted clock (the union of in-flight intervals, exactly);
the pool's per-batch window, its pinned jobs (a weight update waits for them) and
`close_admission` (the last planned batch stops new rollouts) with the gated fakes of
helpers.pool_fakes.
"""

from __future__ import annotations

import threading
import time

import pytest
from helpers.pool_fakes import Board, make_pool, wait_for
from helpers.pool_fakes import board as board  # noqa: F401 - the fixture

from frlab.rollout.callbacks import rollout_metrics
from frlab.rollout.pool.metering import (
    BATCH_WAIT_S,
    GENERATION_S,
    LAG_WAIT_S,
    TOKENS_PER_S,
    GenerationMeter,
)
from frlab.rollout.pool.pinning import WeightPins


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_busy_time_is_the_union_of_in_flight_intervals() -> None:
    clock = Clock()
    meter = GenerationMeter(clock)
    clock.now = 1.0
    meter.started()  # A: 1 -> 4
    clock.now = 2.0
    meter.started()  # B: 2 -> 3 (inside A: counts once)
    clock.now = 3.0
    meter.finished(5)
    clock.now = 4.0
    meter.finished(7)
    clock.now = 6.0
    meter.started()  # C: 6 -> 7, then idle until the window closes at 9
    clock.now = 7.0
    meter.finished(3)
    clock.now = 9.0
    window = meter.take_window(wait_s=0.5, lag_wait_s=0.25)
    assert window == {
        GENERATION_S: 4.0,
        TOKENS_PER_S: 15 / 4.0,
        BATCH_WAIT_S: 0.5,
        LAG_WAIT_S: 0.25,
    }


def test_a_call_spanning_two_windows_is_split_between_them() -> None:
    clock = Clock()
    meter = GenerationMeter(clock)
    meter.started()  # 0 -> 5, window closes at 2
    clock.now = 2.0
    assert meter.take_window(0.0)[GENERATION_S] == 2.0
    assert meter.take_window(0.0)[TOKENS_PER_S] == 0.0  # nothing returned yet
    clock.now = 5.0
    meter.finished(10)
    window = meter.take_window(0.0)
    assert window[GENERATION_S] == 3.0 and window[TOKENS_PER_S] == 10 / 3.0


def test_each_batch_reports_its_generation_window_as_metrics(board: Board) -> None:
    pool, engine = make_pool(board, batch_size=2, max_in_flight=2)
    board.open_all()
    pool.start()
    try:
        pool.next_batch(timeout=10)
        generation = pool.stats()["generation"]
        # the fake engine returns 3 tokens per call, and both rollouts of the batch finished
        assert generation[GENERATION_S] > 0.0 and generation[BATCH_WAIT_S] >= 0.0
        assert generation[TOKENS_PER_S] * generation[GENERATION_S] >= 6 - 1e-9
        metrics = rollout_metrics(pool.stats())
        assert {GENERATION_S, TOKENS_PER_S, BATCH_WAIT_S, LAG_WAIT_S} <= set(metrics)
    finally:
        pool.stop()


def batch_after(pool, board: Board, gates: tuple[int, ...], delay_s: float) -> list:
    """`next_batch` while the gates of `gates` open `delay_s` seconds after the call."""
    timer = threading.Timer(delay_s, board.open, gates)
    timer.start()
    try:
        return pool.next_batch(timeout=10)
    finally:
        timer.join()


def test_the_wait_for_rollouts_the_lag_bound_requires_is_reported_apart(board: Board) -> None:
    pool, engine = make_pool(board, batch_size=2, max_in_flight=8, max_policy_lag=1)
    pool.start()
    try:
        wait_for(lambda: pool.stats()["started"] == 4)
        batch_after(pool, board, (0, 1), 0.3)  # nothing finished: generation, not the bound
        first = pool.stats()["generation"]
        assert first[BATCH_WAIT_S] >= 0.25 and first[LAG_WAIT_S] == 0.0
        pool.update_weights({}, 1)
        wait_for(lambda: pool.stats()["started"] == 6)
        board.open(4, 5)  # B newer rollouts ready while 2 and 3 (due now) still run
        wait_for(lambda: pool.stats()["queued"] == 2)
        assert sorted(t.info["env"]["n"] for t in batch_after(pool, board, (2, 3), 0.3)) == [2, 3]
        second = pool.stats()["generation"]
        assert 0.25 <= second[LAG_WAIT_S] <= second[BATCH_WAIT_S]
    finally:
        board.open_all()
        pool.stop()


def test_a_weight_update_waits_for_pinned_work(board: Board) -> None:
    pool, engine = make_pool(board)
    pool.start()
    release, started = threading.Event(), threading.Event()

    def evaluation() -> str:
        started.set()
        assert release.wait(20)
        return "done"

    try:
        job = pool.run_pinned(evaluation)
        assert started.wait(10)
        pushed = threading.Event()
        pusher = threading.Thread(target=lambda: (pool.update_weights({}, 1), pushed.set()))
        pusher.start()
        assert not pushed.wait(0.3)  # blocked behind the job (no timing claim: it never ends)
        assert engine.version == 0
        release.set()
        pusher.join(10)
        assert pushed.is_set() and engine.version == 1 and job.result() == "done"
    finally:
        release.set()
        board.open_all()
        pool.stop()


def test_pinned_work_that_never_ends_times_the_update_out() -> None:
    pins, release = WeightPins(timeout_s=0.05), threading.Event()
    pins.run(release.wait, 20)
    try:
        with pytest.raises(TimeoutError, match="pinned job"):
            pins.wait()
    finally:
        release.set()
        pins.shutdown()
    with pytest.raises(ValueError, match="timeout_s"):
        WeightPins(timeout_s=0)


def test_shutdown_waits_for_a_pinned_job_only_until_its_deadline() -> None:
    """A pinned job (an evaluation) that never returns must not hold the run's stop: shutdown
    gives up on it after its deadline (its thread is a daemon: process exit does not wait)."""
    pins, release = WeightPins(timeout_s=30), threading.Event()
    future = pins.run(release.wait)
    try:
        started = time.monotonic()
        assert pins.shutdown(timeout_s=0.2) is False
        assert time.monotonic() - started < 5 and not future.done()
    finally:
        release.set()
    assert future.result(timeout=5) is True
    assert pins.shutdown(timeout_s=1) is True


def test_closed_admission_starts_nothing_and_cancels_unconsumed_rollouts(board: Board) -> None:
    pool, engine = make_pool(board, batch_size=2, max_in_flight=4)
    pool.start()
    try:
        wait_for(lambda: pool.stats()["in_flight"] == 4)
        board.open(0, 1)
        pool.next_batch(timeout=10)
        pool.close_admission()
        board.open_all()
        started = pool.stats()["started"]
        # 2 and 3 were cancelled: they never finish, and nothing new starts
        wait_for(lambda: pool.stats()["finished"] == 2 or pool.stats()["started"] > started)
        assert pool.stats()["started"] == started and pool.stats()["finished"] == 2
        pending = {p["prompt_id"] for p in pool.state_dict()["pending"]}
        assert {2, 3} <= pending  # kept in the cursor: rerun on resume
    finally:
        pool.stop()
