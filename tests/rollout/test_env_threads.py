"""EnvThreads and call_with_deadline: a hung call is abandoned (never joined), its slot is
refilled, the deadline counts from the start of the call, and a call's own TimeoutError is not
mistaken for the deadline."""

from __future__ import annotations

import asyncio
import threading

import pytest

from frlab.rollout.env_threads import DeadlineExceeded, EnvThreads, call_with_deadline

HANG_GUARD_S = 60.0  # a hang detector for the test itself, not a performance bound


def test_a_hung_call_is_abandoned_and_its_slot_refilled() -> None:
    release = threading.Event()
    threads = EnvThreads(1, name="t-env")

    async def main() -> tuple[str, int]:
        with pytest.raises(DeadlineExceeded) as info:
            await call_with_deadline(threads, 0.05, "env_step", release.wait)
        assert info.value.what == "env_step"
        # The only worker is hung; a second call still runs, on a fresh thread.
        name = await call_with_deadline(
            threads, HANG_GUARD_S, "env_step", lambda: threading.current_thread().name
        )
        return name, threads.abandoned

    name, abandoned = asyncio.run(main())
    assert abandoned == 1 and name == "t-env-2"
    assert threads.busy() == 0  # the hung call no longer counts against the pool
    threads.shutdown(wait=True)  # returns although the abandoned thread still blocks
    hung = [t for t in threading.enumerate() if t.name == "t-env-1"]
    assert hung and hung[0].daemon and hung[0].is_alive()
    release.set()
    hung[0].join(HANG_GUARD_S)
    assert not hung[0].is_alive()  # it exits once its call returns


def test_the_deadline_counts_from_the_start_of_the_call_not_from_queueing() -> None:
    """One worker, a first call holding it; the second call waits in the queue longer than its
    own deadline and still succeeds, because it runs quickly once started."""
    gate = threading.Event()
    threads = EnvThreads(1)

    async def main() -> str:
        first = asyncio.ensure_future(call_with_deadline(threads, HANG_GUARD_S, "a", gate.wait))
        second = asyncio.ensure_future(call_with_deadline(threads, 0.2, "b", lambda: "ran"))
        await asyncio.sleep(0.5)  # the second call has been queued for more than 0.2 s
        assert not second.done()
        gate.set()
        await first
        return await second

    assert asyncio.run(main()) == "ran"
    threads.shutdown()


def test_a_calls_own_timeout_error_is_not_the_deadline() -> None:
    threads = EnvThreads(1)

    def raises() -> None:
        raise TimeoutError("the tool timed out by itself")

    async def main() -> None:
        await call_with_deadline(threads, HANG_GUARD_S, "env_step", raises)

    with pytest.raises(TimeoutError) as info:
        asyncio.run(main())
    assert not isinstance(info.value, DeadlineExceeded) and threads.abandoned == 0
    threads.shutdown()


def test_cancelling_the_caller_cancels_a_queued_call() -> None:
    gate, ran = threading.Event(), []
    threads = EnvThreads(1)

    async def main() -> None:
        first = asyncio.ensure_future(call_with_deadline(threads, HANG_GUARD_S, "a", gate.wait))
        queued = asyncio.ensure_future(call_with_deadline(threads, 5, "b", lambda: ran.append(1)))
        await asyncio.sleep(0.05)
        queued.cancel()
        await asyncio.gather(queued, return_exceptions=True)
        gate.set()
        await first

    asyncio.run(main())
    threads.shutdown(wait=True)
    assert ran == []


def test_shutdown_refuses_new_work_and_bad_sizes_are_refused() -> None:
    threads = EnvThreads(2)
    assert threads.submit(lambda: 3).result(HANG_GUARD_S) == 3
    threads.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        threads.submit(lambda: 1)
    with pytest.raises(ValueError, match="max_workers"):
        EnvThreads(0)
