"""A stop request from SIGINT/SIGTERM, readable by any layer (stdlib only).

The signal handlers of `frlab.run.guard` only record the request here; code that waits (the
training data stream waiting for the next rollout batch) polls `raise_if_stop_requested`
between short waits, so the run stops at a safe point: between two learner steps, where a
final checkpoint is consistent.
"""

from __future__ import annotations

import signal
import threading

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + signal number (shell convention)


class RunInterrupted(BaseException):
    """The run was stopped by a signal. `safe`: raised between two learner steps, so the
    training state is consistent and a final checkpoint may be written."""

    def __init__(self, signum: int, safe: bool) -> None:
        self.signum, self.safe = int(signum), bool(safe)
        name = signal.Signals(self.signum).name
        where = "between learner steps" if safe else "during a learner step"
        super().__init__(f"{name} received: stopped {where}")

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(signal.Signals(self.signum), 128 + self.signum)


_lock = threading.Lock()
_requested: list[int] = []  # signal numbers, in arrival order


def request_stop(signum: int) -> None:
    """Record a stop request (called from a signal handler)."""
    with _lock:
        _requested.append(int(signum))


def stop_signal() -> int | None:
    """The first signal that asked to stop, or None."""
    with _lock:
        return _requested[0] if _requested else None


def raise_if_stop_requested() -> None:
    """Raise RunInterrupted(safe=True) if a stop was requested (call only at a safe point)."""
    signum = stop_signal()
    if signum is not None:
        raise RunInterrupted(signum, safe=True)


def exception_status(exc: BaseException) -> dict[str, str]:
    """summary.json fields for a run that ended with `exc`: `status` ("interrupted" for a
    signal, else "failed") and, for a signal, its name."""
    if isinstance(exc, RunInterrupted):
        return {"status": "interrupted", "signal": exc.signal_name}
    if type(exc).__name__ == "SIGTERMException":  # Lightning's own SIGTERM stop
        return {"status": "interrupted", "signal": "SIGTERM"}
    if isinstance(exc, KeyboardInterrupt):
        return {"status": "interrupted", "signal": "SIGINT"}
    return {"status": "failed"}


def clear() -> None:
    """Forget stop requests (at the start of a run)."""
    with _lock:
        _requested.clear()
