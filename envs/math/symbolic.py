"""Symbolic equivalence through math-verify, safe to call from any thread.

math-verify bounds its own work with `signal.alarm`, which only works in a process's main
thread: called from the rollout threads it raises, and with its timeouts disabled a
pathological answer can hang the thread. A signal also cannot interrupt a long C-level
computation. So every check runs in a small pool of persistent worker processes
(`_verify_worker.py`, started lazily, reused across calls): math-verify's alarms bound each
operation inside the worker, and the caller waits at most `timeout_s`; a worker that misses
the deadline is killed with its whole process group and replaced on the next call. A timed
out or failed check counts as "not equal" (grade 0.0).

When math-verify is not installed (extra `math`), `symbolic_equal` returns None after logging
one warning, and the grader falls back to string matching.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

logger = logging.getLogger(__name__)

WORKER_SCRIPT = Path(__file__).with_name("_verify_worker.py")


class _Worker:
    """One math-verify process and its line-based pipe protocol."""

    def __init__(self, argv: list[str], startup_timeout_s: float) -> None:
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # own process group: a kill takes its children too
        )
        self._buffer = b""
        self.ready = self._read_line(time.monotonic() + startup_timeout_s)

    def _read_line(self, deadline: float) -> dict | None:
        """The next JSON reply, or None on deadline, EOF or garbage."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    return None
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except ValueError:
            return None
        return reply if isinstance(reply, dict) else None

    def request(self, payload: dict, timeout_s: float) -> dict | None:
        """Send one request; its reply, or None when the worker missed `timeout_s` or died."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write((json.dumps(payload) + "\n").encode())
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        return self._read_line(time.monotonic() + timeout_s)

    def kill(self) -> None:
        """Kill the worker's process group and reap it."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for stream in (self.process.stdin, self.process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        self.process.wait()


class SymbolicVerifier:
    """A lazily grown pool of at most `max_workers` math-verify processes (thread-safe).

    `memory_mb` caps each worker's address space; `argv` overrides the worker command line
    (tests use it to start a worker that never answers)."""

    def __init__(
        self,
        max_workers: int = 2,
        *,
        memory_mb: int = 2048,
        startup_timeout_s: float = 120.0,
        argv: list[str] | None = None,
    ) -> None:
        if int(max_workers) < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = int(max_workers)
        self.startup_timeout_s = float(startup_timeout_s)
        self.argv = argv or [sys.executable, str(WORKER_SCRIPT), str(int(memory_mb))]
        self.timeouts = 0
        self.startup_error: str | None = None  # set once a worker failed to start
        self._idle: list[_Worker] = []
        self._live = 0
        self._closed = False
        self._cond = threading.Condition()

    def _acquire(self) -> _Worker | None:
        with self._cond:
            while not self._idle and self._live >= self.max_workers and not self._closed:
                self._cond.wait()
            if self._closed:
                raise RuntimeError("SymbolicVerifier is closed")
            if self.startup_error is not None:
                return None
            if self._idle:
                return self._idle.pop()
            self._live += 1
        try:
            worker = _Worker(self.argv, self.startup_timeout_s)
        except OSError:
            self._release(None)
            raise
        if worker.ready is None or not worker.ready.get("ready"):
            reason = "no reply" if worker.ready is None else worker.ready.get("error")
            self.startup_error = str(reason)
            logger.warning("math-verify worker failed to start (%s); grading by string", reason)
            worker.kill()
            self._release(None)
            return None
        return worker

    def _release(self, worker: _Worker | None) -> None:
        with self._cond:
            if worker is not None and not self._closed:
                self._idle.append(worker)
            else:
                self._live -= 1
                if worker is not None:
                    worker.kill()
            self._cond.notify_all()  # waiters re-check: a slot, an idle worker or an error

    def equal(self, gold: str, pred: str, timeout_s: float = 5.0) -> bool | None:
        """Whether math-verify finds `pred` equivalent to `gold` within `timeout_s` seconds
        (False on timeout or error); None when no worker could start."""
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        worker = self._acquire()
        if worker is None:
            return None
        soft = max(1, int(timeout_s // 2))  # math-verify's own alarm, per operation
        reply = worker.request({"gold": gold, "pred": pred, "timeout": soft}, timeout_s)
        if reply is None or "equal" not in reply:
            with self._cond:
                self.timeouts += 1
            logger.warning("math-verify gave no answer within %.1f s; graded 0", timeout_s)
            worker.kill()
            self._release(None)
            return False
        self._release(worker)
        return bool(reply["equal"])

    def close(self) -> None:
        """Stop every idle worker; busy ones stop when their call returns."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._live -= len(idle)
            self._cond.notify_all()
        for worker in idle:
            worker.kill()


_default: SymbolicVerifier | None = None
_default_pid = -1
_default_lock = threading.Lock()
_missing_warned = False


def math_verify_available() -> bool:
    """Whether the `math_verify` package is importable (checked without importing it)."""
    try:
        return importlib.util.find_spec("math_verify") is not None
    except (ImportError, ValueError):  # e.g. blocked with sys.modules["math_verify"] = None
        return False


def default_verifier() -> SymbolicVerifier:
    """The process-wide verifier (created on first use, closed at exit)."""
    global _default, _default_pid
    with _default_lock:
        if _default is None or _default_pid != os.getpid():  # a forked child needs its own
            workers = max(1, min(4, os.cpu_count() or 1))
            _default, _default_pid = SymbolicVerifier(workers), os.getpid()
            atexit.register(_default.close)
        return _default


def symbolic_equal(gold: str, pred: str, timeout_s: float = 5.0) -> bool | None:
    """math-verify's verdict (False on timeout), or None when math-verify is unavailable."""
    global _missing_warned
    if not math_verify_available():
        if not _missing_warned:
            _missing_warned = True
            logger.warning(
                "math-verify is not installed (pip install 'frlab[math]'): math answers are "
                "graded by normalised string match only"
            )
        return None
    return default_verifier().equal(gold, pred, timeout_s)
