"""Environment calls off the event loop, each under a deadline; hung calls are abandoned.

A Python thread cannot be cancelled, and `concurrent.futures.ThreadPoolExecutor` joins its
threads at shutdown and at interpreter exit, so one environment step that never returns would
stall the pool and keep the process alive after SIGINT/SIGTERM. `EnvThreads` runs environment
construction, `reset`, `step` and `close` on daemon threads instead: `call_with_deadline`
waits at most the deadline for a call (counted from when it starts running, not from when it
was queued), then gives up on it: its thread is written off (`abandon`), a fresh thread takes
its place so the pool keeps `max_workers` usable threads, and shutdown never waits for it.

An abandoned thread keeps running until its call returns. That is harmless for a call that
blocks (I/O, a sleep, a lock); an environment whose step can spin inside C code that holds
the GIL must run its work in a subprocess it can kill (as `envs.alfworld.worker` does).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from frlab.errors import ConfigError


class DeadlineExceeded(TimeoutError):
    """An environment or engine call ran past its deadline (`what` names the call)."""

    def __init__(self, what: str, deadline_s: float) -> None:
        super().__init__(f"{what} did not return within {deadline_s:g} s")
        self.what, self.deadline_s = what, deadline_s


class _Worker:
    """One daemon thread's bookkeeping (`abandoned`: written off, exits after its call)."""

    def __init__(self) -> None:
        self.abandoned = False
        self.thread: threading.Thread | None = None


class EnvThreads(concurrent.futures.Executor):
    """An executor of daemon threads that can write off a hung call (see module docstring)."""

    def __init__(self, max_workers: int, name: str = "frlab-env") -> None:
        if int(max_workers) < 1:
            raise ValueError(f"EnvThreads needs max_workers >= 1, got {max_workers}")
        self.max_workers, self.name = int(max_workers), name
        self._cond = threading.Condition()
        self._work: deque[tuple[concurrent.futures.Future, Callable, tuple, dict]] = deque()
        self._running: dict[concurrent.futures.Future, _Worker] = {}
        self._workers: set[_Worker] = set()
        self._idle = self._spawned = 0
        self._shutdown = False
        self.abandoned = 0  # calls given up on since creation

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._work.append((future, fn, args, kwargs))
            self._grow()
            self._cond.notify()
        return future

    def _grow(self) -> None:
        """Start a thread if queued work outnumbers idle threads and a slot is free."""
        live = sum(not w.abandoned for w in self._workers)
        if len(self._work) > self._idle and live < self.max_workers:
            worker = _Worker()
            self._spawned += 1
            worker.thread = threading.Thread(
                target=self._serve, args=(worker,), name=f"{self.name}-{self._spawned}", daemon=True
            )
            self._workers.add(worker)
            worker.thread.start()

    def _serve(self, worker: _Worker) -> None:
        while True:
            with self._cond:
                while not self._work and not self._shutdown:
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                if not self._work:  # shut down and nothing left to run
                    self._workers.discard(worker)
                    return
                future, fn, args, kwargs = self._work.popleft()
                if not future.set_running_or_notify_cancel():
                    continue
                self._running[future] = worker
            result, error = None, None
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the caller through the future
                error = exc
            with self._cond:  # bookkeeping first: a caller woken by the result sees it done
                self._running.pop(future, None)
                retired = worker.abandoned
                if retired:
                    self._workers.discard(worker)
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
            if retired:
                return

    def abandon(self, future: concurrent.futures.Future) -> None:
        """Give up on `future`: cancel it if queued, else write its thread off and replace it."""
        with self._cond:
            worker = self._running.get(future)
            if worker is None:
                future.cancel()
                return
            if not worker.abandoned:
                worker.abandoned = True
                self.abandoned += 1
                if not self._shutdown:
                    self._grow()
                    self._cond.notify()

    def shutdown(
        self, wait: bool = True, *, cancel_futures: bool = False, timeout: float | None = None
    ) -> None:
        """Stop taking work; with `wait`, let queued and running calls finish for at most
        `timeout` seconds (None: no limit, but never for abandoned calls)."""
        with self._cond:
            self._shutdown = True
            if cancel_futures:
                while self._work:
                    self._work.popleft()[0].cancel()
            self._cond.notify_all()
            threads = [w.thread for w in self._workers if not w.abandoned and w.thread]
        if not wait:
            return
        end = None if timeout is None else time.monotonic() + timeout
        for thread in threads:
            if thread is threading.current_thread():
                continue
            thread.join(None if end is None else max(0.0, end - time.monotonic()))

    def busy(self) -> int:
        """Calls running now on threads that were not written off."""
        with self._cond:
            return sum(not w.abandoned for w in self._running.values())


def check_deadline(name: str, value: Any) -> float:
    """`value` as a float if it is a finite number > 0, else ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(name, f"must be a number of seconds, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(name, f"must be finite and > 0, got {value!r}")
    return float(value)


async def call_with_deadline(
    executor: concurrent.futures.Executor,
    deadline_s: float,
    what: str,
    fn: Callable[..., Any],
    *args: Any,
    observe: Callable[[float], None] | None = None,
) -> Any:
    """`fn(*args)` on `executor`; DeadlineExceeded if it runs longer than `deadline_s` once
    started (on EnvThreads its thread is then abandoned). Cancelling the caller cancels a
    queued call. `observe` gets the seconds a call that returned ran (queueing not counted)."""
    loop = asyncio.get_running_loop()
    started = loop.create_future()
    times: list[float] = []

    def run() -> Any:
        loop.call_soon_threadsafe(_set_started, started)
        begin = time.monotonic()
        try:
            return fn(*args)
        finally:
            times.append(time.monotonic() - begin)

    source = executor.submit(run)
    done = asyncio.wrap_future(source)
    try:
        await asyncio.wait({started, done}, return_when=asyncio.FIRST_COMPLETED)
        out = await asyncio.wait_for(done, deadline_s)
        if observe is not None and times:
            observe(times[0])
        return out
    except TimeoutError:
        if done.done() and not done.cancelled():
            raise  # fn's own TimeoutError, not the deadline
        abandon = getattr(executor, "abandon", None)  # EnvThreads; other executors: cancel
        abandon(source) if callable(abandon) else source.cancel()
        raise DeadlineExceeded(what, deadline_s) from None
    except asyncio.CancelledError:
        # a queued call never starts; a running one is written off, so that a stop (SIGTERM
        # while an env step hangs) never waits for it
        abandon = getattr(executor, "abandon", None)
        abandon(source) if callable(abandon) else source.cancel()
        raise
    finally:
        started.cancel()


def _set_started(started: asyncio.Future) -> None:
    if not started.done():
        started.set_result(None)
