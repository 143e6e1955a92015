"""`LoopThread`: the rollout pool's asyncio event loop, run in a daemon thread.

The loop calls `tick()` (the pool's admission step) at start and whenever `wake()` is
called, from any thread, until `stop()`; rollouts are tasks `spawn`ed on it. `stop()` cancels
every task and joins the thread for at most a bounded time: a daemon thread that does not
finish is abandoned, so stopping never hangs (rollout tasks only await futures, which
cancel at once; environment threads are never joined, see frlab.rollout.env_threads).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


STOP_WAIT_S = 10.0  # longest wait for the loop thread, the engine, and env closes
RECANCEL_S = 0.1  # cancel_all cancels a task that is still running again after this long


class LoopThread:
    """An event loop in a daemon thread: `tick` on every wake, tasks cancelled on stop."""

    def __init__(
        self,
        tick: Callable[[], None],
        on_crash: Callable[[BaseException], None],
        name: str = "frlab-rollout-loop",
    ) -> None:
        self.tick, self.on_crash, self.name = tick, on_crash, name
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tasks: set[asyncio.Task] = set()
        self._thread: threading.Thread | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._later: asyncio.TimerHandle | None = None  # a `wake_later` not yet fired

    def start(self) -> None:
        """Start the thread and wait until its loop runs."""
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._thread_main, args=(ready,), name=self.name, daemon=True
        )
        self._thread.start()
        ready.wait()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float) -> bool:
        """Cancel every task and join the thread for at most `timeout` s; False if abandoned."""
        self._stopping = True
        if self._thread is None:
            return True
        self.wake()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("rollout loop thread did not stop within %.0f s: abandoned", timeout)
            return False
        if self.loop is not None:
            self.loop.close()
        return True

    def wake(self) -> None:
        """Make the loop call `tick()` soon (thread-safe)."""
        loop, wake = self.loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # closed meanwhile
                pass

    def wake_in_loop(self) -> None:
        """`wake()` from inside the loop thread."""
        if self._wake is not None:
            self._wake.set()

    def wake_later(self, delay: float) -> None:
        """`wake_in_loop()` in `delay` s (from inside the loop thread; one pending at a time:
        the earlier one stands)."""
        if self._later is None and self.loop is not None:
            self._later = self.loop.call_later(delay, self._wake_now)

    def _wake_now(self) -> None:
        self._later = None
        self.wake_in_loop()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Start `coro` as a tracked task (call from the loop thread)."""
        assert self.loop is not None
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        """Run `coro` on the loop from another thread and return its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def cancel_all(self) -> None:
        """Cancel every tracked task and wait until they have unwound, cancelling again the ones
        still running every RECANCEL_S: `asyncio.wait_for` (Python <= 3.11) swallows a
        cancellation that arrives as its inner future finishes, and the task runs on (into a
        blocking environment step, say) as if it had never been cancelled."""
        pending = set(self.tasks)
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)

    def _thread_main(self, ready: threading.Event) -> None:
        assert self.loop is not None
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main(ready))
        except BaseException as exc:  # a bug in the pool itself: reported to the consumer
            log.exception("rollout pool loop crashed")
            self.on_crash(exc)
        finally:
            ready.set()
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())

    async def _main(self, ready: threading.Event) -> None:
        self._wake = asyncio.Event()
        ready.set()
        try:
            while not self._stopping:
                self.tick()
                await self._wake.wait()
                self._wake.clear()
        finally:
            await self.cancel_all()


def run_bounded(fn: Callable[[], Any], what: str, timeout: float) -> None:
    """Run `fn` in a daemon thread and wait at most `timeout` s (then abandon it, logged);
    an exception of `fn` is re-raised here."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # re-raised in the caller below
            errors.append(exc)

    thread = threading.Thread(target=run, name=f"frlab-{what.replace(' ', '-')}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        log.warning("%s did not finish within %.0f s: abandoned", what, timeout)
    elif errors:
        raise errors[0]
