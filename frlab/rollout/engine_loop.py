"""`EngineLoop`: the asyncio event loop an engine's requests run on, in a daemon thread.

The vLLM engine and the remote engine each keep their requests, gates and locks on a loop of
their own, so the rollout pool's loop never blocks on them. `call` runs a control coroutine
there and waits for it from another thread, within a deadline, or polling a `down` check
that ends the wait when the engine reports itself dead (a call awaiting a dead vLLM core
never returns). `submit` hands a request over from the caller's loop. `stop` runs a last
coroutine (closing clients, the engine core) within its own deadline, then stops the loop
and joins the thread for a bounded time: a thread that does not end is abandoned, so
stopping never hangs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from frlab.rollout.engine import EngineError

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 30.0  # the longest wait for `stop`'s last coroutine
JOIN_TIMEOUT_S = 10.0  # the longest wait for the thread once its loop was asked to stop


class EngineLoop:
    """An event loop in a daemon thread, named for the engine that owns it."""

    def __init__(self, owner: str, thread_name: str) -> None:
        self.owner, self.thread_name = owner, thread_name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self.loop is not None

    def start(self) -> None:
        """Start the loop's thread (a no-op when it runs already)."""
        if self.loop is not None:
            return
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name=self.thread_name, daemon=True
        )
        self._thread.start()

    def call(
        self,
        coro: Coroutine[Any, Any, Any],
        timeout: float | None = None,
        down: Callable[[], str | None] | None = None,
        poll_s: float = 1.0,
    ) -> Any:
        """Run `coro` on the loop and return its result (from any other thread).

        TimeoutError after `timeout` s; with `down`, every `poll_s` the wait asks it whether
        the engine died, and an answer ends the call with EngineError naming it. Either
        cancels the coroutine."""
        loop = self._running_loop(coro)
        if threading.current_thread() is self._thread:
            coro.close()
            raise EngineError(f"{self.owner} control calls must not run on its own loop thread")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            wait = left if down is None else poll_s if left is None else min(poll_s, left)
            try:
                return future.result(wait)
            except concurrent.futures.TimeoutError:
                reason = None if down is None else down()
                if reason is not None:
                    future.cancel()
                    raise EngineError(reason) from None
                if deadline is not None and time.monotonic() >= deadline:
                    future.cancel()
                    raise

    async def submit(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Await `coro` run on this loop, from the caller's own loop."""
        loop = self._running_loop(coro)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    def stop(self, last: Coroutine[Any, Any, Any] | None = None) -> None:
        """Run `last`, then cancel every task left (each within CLOSE_TIMEOUT_S; a failure is
        logged), stop the loop and join the thread within JOIN_TIMEOUT_S (else it is
        abandoned, still a daemon)."""
        loop, thread = self.loop, self._thread
        if loop is None or thread is None:
            if last is not None:
                last.close()
            return
        self.loop = self._thread = None
        for coro in (last, _cancel_the_rest()):
            if coro is None:
                continue
            try:
                asyncio.run_coroutine_threadsafe(coro, loop).result(CLOSE_TIMEOUT_S)
            except Exception:  # stopping must never fail the run
                log.exception("%s: closing on its loop failed", self.owner)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(JOIN_TIMEOUT_S)
        if thread.is_alive():
            log.warning(
                "%s: its loop thread did not stop in %.0f s; abandoned (a daemon)",
                self.owner,
                JOIN_TIMEOUT_S,
            )
            return
        loop.close()

    def _running_loop(self, coro: Coroutine[Any, Any, Any]) -> asyncio.AbstractEventLoop:
        if self.loop is None:
            coro.close()
            raise EngineError(f"{self.owner} is not running: call start() first")
        return self.loop


async def _cancel_the_rest() -> None:
    """Cancel every other task on this loop and wait for them to end."""
    me = asyncio.current_task()
    rest = [task for task in asyncio.all_tasks() if task is not me]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)
