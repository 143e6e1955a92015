"""Adaptive deadlines of environment calls and engine requests: a hung call costs one rollout.

A fixed deadline must cover the slowest legitimate call, so a call that never returns holds
its rollout, and with the lag bound the whole next batch, for that long (a 300 s env deadline
on a task whose steps take milliseconds). `AdaptiveDeadline` learns each kind of call's time
from the calls that returned: its deadline is FACTOR times the 99th percentile of the last
WINDOW of them (the slowest of them while fewer than MIN_SAMPLES returned), at least
`floor_s`, at most the configured value (`rollout.env_timeout_s`, `rollout.engine_timeout_s`),
which is also the deadline of the very first call.
`rollout.adaptive_deadlines=false` keeps the configured values. Thread-safe; the current
values are logged as `rollout/env_deadline_s` and `rollout/engine_deadline_s`.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass, field

FACTOR = 10.0  # deadline = FACTOR x p99 of the recent call times (within floor, ceiling)
WINDOW = 512  # recent call times kept
MIN_SAMPLES = 32  # calls that must return before the deadline adapts


@dataclass
class AdaptiveDeadline:
    """One kind of call's deadline (see the module docstring); `adaptive=False`: the ceiling."""

    ceiling_s: float
    floor_s: float
    adaptive: bool
    _times: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW), repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        for name, value in (("ceiling_s", self.ceiling_s), ("floor_s", self.floor_s)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"AdaptiveDeadline.{name} must be a number > 0, got {value!r}")
        self.floor_s = min(float(self.floor_s), float(self.ceiling_s))

    def current(self) -> float:
        """The deadline a call starting now gets (seconds)."""
        if not self.adaptive:
            return float(self.ceiling_s)
        with self._lock:
            if not self._times:
                return float(self.ceiling_s)
            ordered = sorted(self._times)
        if len(ordered) < MIN_SAMPLES:  # too few for a p99: the slowest so far
            typical = ordered[-1]
        else:
            typical = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
        return min(float(self.ceiling_s), max(self.floor_s, FACTOR * typical))

    def observe(self, seconds: float) -> None:
        """A call of this kind returned after `seconds`."""
        with self._lock:
            self._times.append(float(seconds))


@dataclass
class Deadlines:
    """The deadlines of a run's environment calls (build, reset, step) and engine requests."""

    env: AdaptiveDeadline
    engine: AdaptiveDeadline

    def stats(self) -> dict[str, float]:
        return {"env_deadline_s": self.env.current(), "engine_deadline_s": self.engine.current()}
