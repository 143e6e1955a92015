"""frlab.rollout.engine_loop: control calls with deadlines and a liveness check, requests
handed over from another loop, and a bounded stop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from frlab.rollout import engine_loop
from frlab.rollout.engine import EngineError
from frlab.rollout.engine_loop import EngineLoop


@pytest.fixture
def runner():
    loop = EngineLoop("TestEngine", "frlab-test-engine")
    loop.start()
    yield loop
    loop.stop()


def test_a_call_runs_on_the_loop_thread_and_returns_its_result(runner: EngineLoop) -> None:
    async def where() -> str:
        return threading.current_thread().name

    assert runner.call(where()) == "frlab-test-engine"


def test_a_call_past_its_deadline_is_cancelled_with_timeout_error(runner: EngineLoop) -> None:
    cancelled = threading.Event()

    async def hang() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(TimeoutError):
        runner.call(hang(), timeout=0.2, down=lambda: None, poll_s=0.05)
    assert cancelled.wait(5)


def test_a_dead_engine_ends_a_call_that_would_never_return(runner: EngineLoop) -> None:
    died_at = time.monotonic() + 0.3
    reason = lambda: "the core is dead" if time.monotonic() > died_at else None  # noqa: E731
    with pytest.raises(EngineError, match="the core is dead"):
        runner.call(asyncio.sleep(60), down=reason, poll_s=0.05)


def test_a_call_from_the_loop_thread_itself_is_refused(runner: EngineLoop) -> None:
    async def nested() -> None:
        runner.call(asyncio.sleep(0))

    with pytest.raises(EngineError, match="own loop thread"):
        runner.call(nested())


def test_submit_hands_a_request_from_another_loop(runner: EngineLoop) -> None:
    async def name() -> str:
        return threading.current_thread().name

    assert asyncio.run(runner.submit(name())) == "frlab-test-engine"


def test_calls_before_start_and_after_stop_name_the_engine() -> None:
    runner = EngineLoop("TestEngine", "frlab-test-engine")
    with pytest.raises(EngineError, match="TestEngine is not running"):
        runner.call(asyncio.sleep(0))
    runner.start()
    runner.stop()
    assert not runner.running
    with pytest.raises(EngineError, match="TestEngine is not running"):
        asyncio.run(runner.submit(asyncio.sleep(0)))


def test_stop_runs_the_last_coroutine_then_closes_the_loop() -> None:
    runner = EngineLoop("TestEngine", "frlab-test-engine")
    runner.start()
    loop, ran = runner.loop, []

    async def last() -> None:
        ran.append(threading.current_thread().name)

    runner.stop(last())
    assert ran == ["frlab-test-engine"] and loop is not None and loop.is_closed()


def test_a_thread_that_does_not_stop_is_abandoned_within_the_deadline(monkeypatch) -> None:
    """A loop blocked in a synchronous call cannot stop: stop returns after its deadline."""
    monkeypatch.setattr(engine_loop, "JOIN_TIMEOUT_S", 0.3)
    monkeypatch.setattr(engine_loop, "CLOSE_TIMEOUT_S", 0.3)
    runner = EngineLoop("TestEngine", "frlab-test-engine")
    runner.start()
    release = threading.Event()
    loop, thread = runner.loop, runner._thread
    assert loop is not None and thread is not None
    loop.call_soon_threadsafe(release.wait, 30)  # blocks the loop thread
    began = time.monotonic()
    runner.stop(asyncio.sleep(0))
    assert time.monotonic() - began < 5 and not runner.running and thread.is_alive()
    release.set()  # the abandoned thread ends; what it left pending finishes here
    thread.join(5)
    loop.run_until_complete(asyncio.gather(*asyncio.all_tasks(loop), return_exceptions=True))
    loop.close()
