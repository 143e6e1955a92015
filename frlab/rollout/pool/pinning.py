"""Work that must see one weight version while training goes on (evaluation on the engine).

An evaluation measures the policy of one learner step. Run synchronously it stops the
learner for its whole duration; run in the background it would see the engine's weights
change at the next weight sync. `WeightPins` runs such work in its own thread and makes
weight updates wait for it: the learner keeps computing its next update (and the engine keeps
serving training rollouts, interleaved with the evaluation's requests) until that update is
ready to be pushed; only the push waits, at most `timeout_s`.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any


class WeightPins:
    """Background jobs that pin the engine's weights until they finish."""

    def __init__(self, timeout_s: float = 3600.0) -> None:
        if not float(timeout_s) > 0:
            raise ValueError(f"WeightPins timeout_s must be > 0, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self._jobs: set[concurrent.futures.Future] = set()

    def run(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        """Start `fn(*args)` on a daemon thread of its own; weight updates wait for it (`wait`).
        Daemon: a job that never returns must not keep the process alive (see `shutdown`)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._jobs.add(future)
        future.add_done_callback(self._discard)

        def job() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)

        threading.Thread(target=job, name="frlab-pinned", daemon=True).start()
        return future

    def _discard(self, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._jobs.discard(future)

    def wait(self) -> None:
        """Block until every running job has finished; TimeoutError after `timeout_s`."""
        with self._lock:
            jobs = list(self._jobs)
        if not jobs:
            return
        _, late = concurrent.futures.wait(jobs, timeout=self.timeout_s)
        if late:
            raise TimeoutError(
                f"{len(late)} pinned job(s) (evaluation) still running after {self.timeout_s}s: "
                "the weight update cannot wait longer"
            )

    def shutdown(self, timeout_s: float = 10.0) -> bool:
        """Wait at most `timeout_s` for the running jobs (a job blocked on a stopped engine
        fails soon after); True if none was left running (those are abandoned: daemon threads)."""
        with self._lock:
            jobs = list(self._jobs)
        _, late = concurrent.futures.wait(jobs, timeout=timeout_s)
        return not late
