"""Pure statistics of the time-to-reward benchmark (bench/time_to_reward.py).

A run reaches the target at the first update whose trailing moving average of batch rewards
(over the last `window` updates, full windows only) is >= `target`; its time to reward is the
wall-clock second of that update. A run that never gets there within the time cap is
CENSORED: its time to reward is only known to exceed the cap, so summaries use the cap in its
place and count the censored runs, and a median that falls on a censored value is a lower
bound. No torch, no timing: importable and testable anywhere.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass


class RewardWindow:
    """Online detector of the first target crossing of a trailing moving average."""

    def __init__(self, window: int, target: float) -> None:
        if int(window) < 1:
            raise ValueError(f"--window must be >= 1, got {window}")
        if not math.isfinite(float(target)):
            raise ValueError(f"--target must be a finite number, got {target}")
        self.window, self.target = int(window), float(target)
        self._last: deque[float] = deque(maxlen=self.window)
        self.updates = 0
        self.crossed_at: float | None = None  # time of the first crossing
        self.crossed_update: int | None = None  # its update number (1-based)

    @property
    def average(self) -> float | None:
        """The trailing mean once a full window exists, else None."""
        if len(self._last) < self.window:
            return None
        return sum(self._last) / self.window

    def add(self, t: float, reward: float) -> bool:
        """Record one update's batch reward at time `t`; True once the target was reached."""
        self._last.append(float(reward))
        self.updates += 1
        avg = self.average
        if self.crossed_at is None and avg is not None and avg >= self.target:
            self.crossed_at, self.crossed_update = float(t), self.updates
        return self.crossed_at is not None


def first_crossing(
    times: Sequence[float], rewards: Sequence[float], window: int, target: float
) -> float | None:
    """Time of the first update whose trailing `window`-update mean reward is >= `target`."""
    if len(times) != len(rewards):
        raise ValueError(f"{len(times)} times but {len(rewards)} rewards")
    detector = RewardWindow(window, target)
    for t, r in zip(times, rewards, strict=True):
        if detector.add(t, r):
            break
    return detector.crossed_at


@dataclass(frozen=True)
class ArmSummary:
    """Median time to reward of one arm's seeds, the cap standing in for censored seeds."""

    median_s: float
    censored: int
    runs: int
    median_censored: bool  # the median is a censored value: a lower bound only


def summarize(times: Sequence[float | None], cap_s: float) -> ArmSummary:
    """Median over seeds of the time to reward; None (never reached) counts as `cap_s`."""
    if not times:
        raise ValueError("no runs to summarize")
    if not cap_s > 0:
        raise ValueError(f"--time-cap must be > 0, got {cap_s}")
    late = [t for t in times if t is not None and not 0 <= t <= cap_s]
    if late:
        raise ValueError(f"times must lie in [0, cap={cap_s}] (report later ones as None): {late}")
    filled = [cap_s if t is None else float(t) for t in times]
    censored = sum(t is None for t in times)
    median = statistics.median(filled)
    # The median is a lower bound when censored values reach into the middle of the sorted list.
    ordered = sorted(filled)
    mid = ordered[(len(ordered) - 1) // 2 : len(ordered) // 2 + 1]
    median_censored = censored > 0 and any(v >= cap_s for v in mid)
    return ArmSummary(median, censored, len(times), median_censored)


def ratio(numerator: ArmSummary, denominator: ArmSummary) -> tuple[float, str]:
    """numerator / denominator medians, and how to read it: "=", ">=" (numerator censored:
    the true ratio is at least this), "<=" (denominator censored) or "?" (both censored)."""
    value = numerator.median_s / denominator.median_s
    if numerator.median_censored and denominator.median_censored:
        return value, "?"
    if numerator.median_censored:
        return value, ">="
    if denominator.median_censored:
        return value, "<="
    return value, "="
