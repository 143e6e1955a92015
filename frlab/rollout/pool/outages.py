"""The engine's outages as the rollout pool lives through them: timed, counted, told once.

While the engine reports an outage (`Engine.outage()`: every server of a fleet down) the pool
admits no rollout and requeues the prompts whose requests failed (frlab.rollout.pool.requeue).
`OutageWatch` follows it from the pool's admission ticks and tells it in a few lines, however
many prompts it costs time: one WARNING when it begins (the engine's reason), an INFO every
REPORT_S while it lasts (down for, prompts waiting to run again, time left before the run
stops), one INFO when it ends (how long, prompts requeued). Its totals (outages, longest and
total seconds, the one under way included) go to `RolloutPool.stats()` (`outages`,
`fleet_down_s`: summary.json, metrics.csv) and travel with the pool's checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from frlab.rollout.engine import Outage

log = logging.getLogger(__name__)

REPORT_S = 30.0  # an outage under way is summed up this often


class OutageWatch:
    """Outage totals and the outage under way (not locked: the pool calls it under its lock)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.count, self.total_s, self.longest_s = 0, 0.0, 0.0
        self.current: Outage | None = None
        self.requeued = 0  # prompts requeued since the outage under way began
        self._next_report = 0.0

    def observe(self, outage: Outage | None, waiting: int) -> None:
        """The engine's outage now (None: it serves); `waiting`: prompts queued to run again."""
        now = self.clock()
        if outage is not None and self.current is None:
            self._begin(outage, waiting, now)
        elif outage is None and self.current is not None:
            self._end(now)
        elif outage is not None and now >= self._next_report:
            self._report(outage, waiting, now)

    def requeued_one(self) -> None:
        """One prompt requeued (told when the outage under way ends)."""
        self.requeued += self.current is not None

    def down_s(self) -> float | None:
        """How long the outage under way has lasted (None: none is)."""
        return None if self.current is None else max(0.0, self.clock() - self.current.since)

    def totals(self) -> dict[str, Any]:
        """`count`, `longest_s`, `total_s`, the outage under way included."""
        now = self.down_s() or 0.0
        return {
            "count": self.count + (self.current is not None),
            "longest_s": round(max(self.longest_s, now), 3),
            "total_s": round(self.total_s + now, 3),
        }

    def restore(self, record: Mapping[str, Any] | None) -> None:
        """The totals of a checkpoint (`totals()`; none: zero)."""
        record = record or {}
        self.count = int(record.get("count", 0))
        self.longest_s = float(record.get("longest_s", 0.0))
        self.total_s = float(record.get("total_s", 0.0))

    def _begin(self, outage: Outage, waiting: int, now: float) -> None:
        self.current, self.requeued = outage, 0
        self._next_report = now + REPORT_S
        log.warning(
            "rollout fleet down (%s): no rollout is admitted until it is back; %d prompts wait "
            "to run again%s",
            outage.reason,
            waiting,
            _deadline(outage, now),
        )

    def _report(self, outage: Outage, waiting: int, now: float) -> None:
        self._next_report = now + REPORT_S
        log.info(
            "rollout fleet down for %.0f s: %d prompts wait to run again%s",
            now - outage.since,
            waiting,
            _deadline(outage, now),
        )

    def _end(self, now: float) -> None:
        assert self.current is not None
        took = max(0.0, now - self.current.since)
        self.count += 1
        self.total_s += took
        self.longest_s = max(self.longest_s, took)
        log.info(
            "rollout fleet back after %.0f s: %d prompts requeued during the outage run again",
            took,
            self.requeued,
        )
        self.current, self.requeued = None, 0


def _deadline(outage: Outage, now: float) -> str:
    if outage.deadline_s is None:
        return ""
    left = max(0.0, outage.since + outage.deadline_s - now)
    return f"; the run stops in {left:.0f} s if it stays down"
