"""`LoopThread.cancel_all` ends every tracked task, even one that swallowed its first
cancellation (as `asyncio.wait_for` does on Python <= 3.11 when the cancellation arrives just as
its inner future finishes: the rollout then ran on into a blocking environment step and
`close_admission` waited out its whole deadline)."""

from __future__ import annotations

import asyncio

from frlab.rollout.pool.loop_thread import LoopThread


def test_cancel_all_ends_a_task_that_swallowed_the_first_cancellation() -> None:
    runner = LoopThread(tick=lambda: None, on_crash=lambda exc: None)
    runner.start()
    swallowed, finished = [], []

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.append(True)  # what wait_for does when the inner future just finished
        try:
            await asyncio.sleep(3600)  # e.g. a gated environment step
        finally:
            finished.append(True)

    async def plain() -> None:
        await asyncio.sleep(3600)

    async def spawn_both() -> None:
        runner.spawn(stubborn())
        runner.spawn(plain())
        await asyncio.sleep(0.05)  # both are suspended in their first sleep

    try:
        runner.run(spawn_both(), timeout=10)
        runner.run(runner.cancel_all(), timeout=10)  # before: TimeoutError (gather hung)
        assert swallowed == [True] and finished == [True] and not runner.tasks
    finally:
        assert runner.stop(10)
