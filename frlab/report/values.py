"""One number per run and metric, over a declared window, never the best step.

- `eval/...` metrics: the value at the run's last evaluation (the last row where the metric
  was written), with its step; the within-run standard error that frlab writes beside an avg@k
  (`..._se`: over the benchmark's problems) is carried with it and never mixed into the
  interval across seeds.
- training metrics (`train/...`, `timing/...`, any `--metric`): the mean over the last
  `window` fraction of the run's updates (10% by default, at least one update).
- updates per minute: the run's updates over its training wall time (`elapsed_s`).
- time to a threshold: the first update (and its `elapsed_s`) at which the metric, optionally
  as a trailing mean of `smooth` updates, reaches the value; a run that never does is censored
  at its last update.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from frlab.report.runs import Run

SE_SUFFIX = "_se"
UPDATES_PER_MINUTE = "updates_per_minute"
REWARD = "train/reward_mean"
DEFAULT_TRAIN_METRICS = (REWARD, "train/acceptance_rate", "train/policy_lag_mean")
TITLES = {
    "train/reward_mean": "final train reward",
    "train/acceptance_rate": "acceptance rate",
    "train/policy_lag_mean": "policy lag",
    UPDATES_PER_MINUTE: "updates / min",
}


@dataclass(frozen=True)
class Value:
    """One run's number for one metric (NaN: the run never logged it)."""

    value: float
    step: int | None = None  # the update it was read at (evaluations), or the window's last
    se: float = math.nan  # the within-run standard error of an evaluation, where logged


def is_eval(metric: str) -> bool:
    return metric.startswith("eval/")


def eval_metrics(runs: Iterable[Run]) -> list[str]:
    """Every evaluation metric any run logged (not the standard errors), benchmarks first and
    the across-benchmark `eval/mean/...` last."""
    names = {c for r in runs for c in r.columns if is_eval(c) and not c.endswith(SE_SUFFIX)}
    return sorted(names, key=lambda n: (n.startswith("eval/mean/"), n))


def last_evaluation(run: Run, metric: str) -> Value:
    values = run.columns.get(metric)
    if values is None or not np.isfinite(values).any():
        return Value(math.nan)
    row = int(np.flatnonzero(np.isfinite(values))[-1])
    se = run.columns.get(metric + SE_SUFFIX)
    return Value(
        float(values[row]), int(run.steps[row]), float(se[row]) if se is not None else math.nan
    )


def window_rows(run: Run, fraction: float) -> np.ndarray:
    """The rows of the last `fraction` of the run's updates (at least one)."""
    rows = run.update_rows()
    if rows.size == 0:
        return rows
    return rows[-max(1, math.ceil(fraction * rows.size)) :]


def window_mean(run: Run, metric: str, fraction: float) -> Value:
    values = run.columns.get(metric)
    rows = window_rows(run, fraction)
    if values is None or rows.size == 0 or not np.isfinite(values[rows]).any():
        return Value(math.nan)
    return Value(float(np.nanmean(values[rows])), int(run.steps[rows[-1]]))


def updates_per_minute(run: Run) -> Value:
    updates, wall = run.update_rows().size, run.wall_s
    if updates == 0 or not wall > 0:
        return Value(math.nan)
    return Value(60.0 * updates / wall, run.last_update)


def run_value(run: Run, metric: str, fraction: float) -> Value:
    """The run's number for `metric` by the rules above."""
    if metric == UPDATES_PER_MINUTE:
        return updates_per_minute(run)
    if is_eval(metric):
        return last_evaluation(run, metric)
    return window_mean(run, metric, fraction)


@dataclass(frozen=True)
class Crossing:
    """When a run first reached a threshold, or where it was censored."""

    reached: bool
    update: float  # the update it was reached at, or its last update (censored)
    wall_s: float  # elapsed_s at that update


def crossing(run: Run, metric: str, threshold: float, smooth: int = 1) -> Crossing | None:
    """The first update where the (trailing-`smooth`-mean) metric is >= `threshold`; None for a
    run without the metric or without updates."""
    rows = run.update_rows()
    values = run.columns.get(metric)
    if values is None or rows.size == 0:
        return None
    series = values[rows]
    finite = np.isfinite(series)
    if not finite.any():
        return None
    rows, series = rows[finite], series[finite]
    if smooth > 1:
        kernel = np.ones(smooth) / smooth
        series = np.convolve(series, kernel, mode="valid")
        rows = rows[smooth - 1 :]
    elapsed = run.columns.get("elapsed_s", np.full(run.steps.shape, np.nan))
    hits = np.flatnonzero(series >= threshold)
    row = int(rows[hits[0]]) if hits.size else int(run.update_rows()[-1])
    return Crossing(bool(hits.size), float(run.steps[row]), float(elapsed[row]))
