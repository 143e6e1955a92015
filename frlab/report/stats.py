"""Statistics across seeds, computed by the field's libraries, not re-derived.

Following Agarwal et al. (2021), "Deep Reinforcement Learning at the Edge of the Statistical
Precipice", with its library `rliable` and with `scipy`:

- An arm's value for a metric is the mean over its runs (seeds). With 4 or more runs its 95%
  interval is a percentile bootstrap over the runs. With 2 or 3 runs a bootstrap has too few
  distinct resamples (3 runs give 10): the report shows the seeds' values and their range,
  marked low n, and keeps scipy's t interval only as a number in the tidy outputs. One run
  has no interval.
- The interquartile mean (rliable's `aggregate_iqm`: the 25% trimmed mean over runs x
  benchmarks) where there are at least 4 such scores; its interval from 4 runs, by rliable's
  stratified bootstrap (runs resampled within each benchmark).
- A comparison with the baseline arm: the difference of means, paired by seed where both arms
  ran the same seeds (the mean of the per-seed differences: a bootstrap from 4 pairs, scipy's t
  interval for 2-3), else unpaired (each arm resampled on its own, as rliable's
  `StratifiedIndependentBootstrap` does, from 4 runs each; scipy's Welch interval below) and
  marked so; and rliable's probability of improvement P(arm > baseline) (Mann-Whitney U /
  (n_x n_y)), with its bootstrap interval from 4 runs each.
- Time to a threshold: scipy's Kaplan-Meier estimate (`scipy.stats.ecdf` on `CensoredData`),
  runs that never reach it right-censored at their last update, never averaged as if they had.

Point estimates are rliable's functions. The bootstrap intervals are `scipy.stats.bootstrap`
(percentile method) resampling exactly as rliable's `get_interval_estimates` does, vectorised:
rliable draws each resample in a Python loop through `arch` (about 50 us a resample, and 5 s
to import), too slow for a report of 200 runs in seconds; tests check both give the same
interval. Every bootstrap uses a generator seeded with the report's seed, so the same runs
give the same report.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

LOW_N = 3  # up to this many runs: seeds' values and range, no bootstrap
CONFIDENCE = 0.95
EXTRA = "report"  # the optional dependency group that brings rliable and scipy


class MissingExtra(ImportError):
    """rliable or scipy is not installed."""


def libraries() -> tuple[Any, Any]:
    """(rliable.metrics, scipy.stats), or MissingExtra naming the extra to install."""
    try:
        import scipy.stats
        from rliable import metrics
    except ImportError as exc:
        raise MissingExtra(
            f"python -m frlab.report needs rliable and scipy ({exc}): pip install 'frlab[{EXTRA}]'"
        ) from exc
    return metrics, scipy.stats


def bootstrap(
    samples: Sequence[np.ndarray], statistic: Callable[..., Any], reps: int, seed: int
) -> tuple[float, float]:
    """The 95% percentile interval of `statistic` (vectorised: `statistic(*samples, axis)`)
    with every sample resampled on its own, from a generator seeded with `seed`."""
    _, st = libraries()
    samples = [np.asarray(s, dtype=float) for s in samples]
    if all(np.ptp(s) == 0 for s in samples):  # every resample is the sample itself
        point = float(statistic(*[s[None, :] for s in samples], axis=-1)[0])
        return point, point
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        found = st.bootstrap(
            tuple(samples),
            statistic,
            n_resamples=reps,
            confidence_level=CONFIDENCE,
            method="percentile",
            vectorized=True,
            paired=False,
            rng=np.random.default_rng(seed),
        )
    return float(found.confidence_interval.low), float(found.confidence_interval.high)


def mean_statistic(x: np.ndarray, axis: int) -> np.ndarray:
    return np.mean(x, axis=axis)


def difference_statistic(x: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
    return np.mean(x, axis=axis) - np.mean(y, axis=axis)


def improvement_statistic(x: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
    """rliable's probability of improvement on one task, P(X > Y) + P(X = Y) / 2: the
    Mann-Whitney U of x over n_x n_y, counted pair by pair (equal to rliable's value, which a
    test checks, and cheap for the few runs of an arm)."""
    x, y = np.moveaxis(x, axis, -1), np.moveaxis(y, axis, -1)
    greater = (x[..., :, None] > y[..., None, :]).mean(axis=(-1, -2))
    ties = (x[..., :, None] == y[..., None, :]).mean(axis=(-1, -2))
    return greater + 0.5 * ties


def iqm_statistic(*columns: np.ndarray, axis: int) -> np.ndarray:
    """rliable's `aggregate_iqm` (scipy's 25% trimmed mean over runs x tasks) per resample."""
    _, st = libraries()
    stacked = np.stack([np.moveaxis(c, axis, -1) for c in columns], axis=-2)
    flat = stacked.reshape(*stacked.shape[:-2], -1)
    return st.trim_mean(flat, proportiontocut=0.25, axis=-1)


@dataclass
class Estimate:
    """An arm's mean for one metric across its runs, with a 95% interval where one is due."""

    n: int
    mean: float = math.nan
    low: float = math.nan
    high: float = math.nan
    method: str = "none"  # "bootstrap", "range" (low n: min and max of the seeds), or "none"
    values: list[float] = field(default_factory=list)
    seeds: list[Any] = field(default_factory=list)
    t_low: float = math.nan  # scipy's t interval (2-3 runs), for the tidy outputs
    t_high: float = math.nan

    @property
    def low_n(self) -> bool:
        return 1 <= self.n <= LOW_N


def t_interval(values: np.ndarray) -> tuple[float, float]:
    """scipy's 95% t interval of the mean (a point interval when all values are equal)."""
    _, st = libraries()
    if np.ptp(values) == 0:
        return float(values[0]), float(values[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # nearly equal values: still the interval
        ci = st.ttest_1samp(values, 0.0).confidence_interval(CONFIDENCE)
    return float(ci.low), float(ci.high)


def estimate(values: Sequence[float], seeds: Sequence[Any], reps: int, seed: int) -> Estimate:
    """The arm's mean over its runs' finite values and its interval (rules above)."""
    pairs = [(v, s) for v, s in zip(values, seeds, strict=True) if math.isfinite(v)]
    x = np.array([v for v, _ in pairs], dtype=float)
    out = Estimate(n=x.size, values=x.tolist(), seeds=[s for _, s in pairs])
    if x.size == 0:
        return out
    metrics, _ = libraries()
    out.mean = float(metrics.aggregate_mean(x[:, None]))
    if x.size == 1:
        return out
    if x.size <= LOW_N:
        out.low, out.high, out.method = float(x.min()), float(x.max()), "range"
        out.t_low, out.t_high = t_interval(x)
        return out
    out.low, out.high = bootstrap([x], mean_statistic, reps, seed)
    out.method = "bootstrap"
    return out


def iqm(scores: np.ndarray, reps: int, seed: int) -> Estimate | None:
    """rliable's interquartile mean of `scores` [runs, benchmarks] (None under 4 scores), with
    its stratified bootstrap interval from 4 runs."""
    if scores.ndim != 2 or scores.size < 4 or not np.isfinite(scores).all():
        return None
    metrics, _ = libraries()
    out = Estimate(n=scores.shape[0], mean=float(metrics.aggregate_iqm(scores)))
    if scores.shape[0] > LOW_N:
        out.low, out.high = bootstrap(list(scores.T), iqm_statistic, reps, seed)
        out.method = "bootstrap"
    return out


@dataclass
class Comparison:
    """An arm against the baseline arm on one metric."""

    paired: bool
    n: int  # pairs (paired), or the arm's runs (unpaired)
    n_baseline: int
    difference: float = math.nan
    low: float = math.nan
    high: float = math.nan
    method: str = "none"  # "bootstrap", "t", "welch t" or "none"
    improvement: float = math.nan  # rliable's P(arm > baseline)
    improvement_low: float = math.nan
    improvement_high: float = math.nan
    wins: int | None = None  # paired: seeds where the arm is higher

    @property
    def low_n(self) -> bool:
        return min(self.n, self.n_baseline) <= LOW_N


def _finite(values: Mapping[Any, float]) -> dict[Any, float]:
    return {s: v for s, v in values.items() if math.isfinite(v)}


def compare(
    arm: Mapping[Any, float],
    baseline: Mapping[Any, float],
    reps: int,
    seed: int,
    improvement_interval: bool = True,
) -> Comparison:
    """`arm` and `baseline` map seed -> value (a run without a seed under a key of its own).
    `improvement_interval`: also bootstrap the probability of improvement (its Mann-Whitney
    statistic per resample is the costliest number of a report)."""
    x, y = _finite(arm), _finite(baseline)
    paired = bool(x) and set(x) == set(y) and None not in x and len(x) > 1
    out = Comparison(paired=paired, n=len(x), n_baseline=len(y))
    if not x or not y:
        return out
    a, b = np.array(list(x.values())), np.array(list(y.values()))
    out.difference = float(np.mean(a) - np.mean(b))
    if paired:
        d = np.array([x[s] - y[s] for s in sorted(x)])
        out.wins = int((d > 0).sum())
        if d.size > LOW_N:
            out.low, out.high = bootstrap([d], mean_statistic, reps, seed)
            out.method = "bootstrap"
        else:
            out.low, out.high = t_interval(d)
            out.method = "t"
    elif a.size > LOW_N and b.size > LOW_N:
        out.low, out.high = bootstrap([a, b], difference_statistic, reps, seed)
        out.method = "bootstrap"
    elif a.size > 1 and b.size > 1:
        _, st = libraries()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ci = st.ttest_ind(a, b, equal_var=False).confidence_interval(CONFIDENCE)
        out.low, out.high, out.method = float(ci.low), float(ci.high), "welch t"
    metrics, _ = libraries()
    out.improvement = float(metrics.probability_of_improvement(a[:, None], b[:, None]))
    if improvement_interval and a.size > LOW_N and b.size > LOW_N:
        out.improvement_low, out.improvement_high = bootstrap(
            [a, b], improvement_statistic, reps, seed
        )
    return out


@dataclass
class TimeTo:
    """Kaplan-Meier view of when an arm's runs reach a threshold."""

    n: int
    reached: int
    median: float = math.nan  # NaN: fewer than half reached it (the median is not known)
    times: list[float] = field(default_factory=list)  # where the fraction reached changes
    fraction: list[float] = field(default_factory=list)  # 1 - KM survival after each time
    censored: list[float] = field(default_factory=list)  # where runs stopped without reaching


def time_to(times: Sequence[float], reached: Sequence[bool]) -> TimeTo:
    """scipy's Kaplan-Meier estimate from event times (reached) and censoring times."""
    t = np.asarray(times, dtype=float)
    hit = np.asarray(reached, dtype=bool)
    out = TimeTo(n=t.size, reached=int(hit.sum()), censored=sorted(t[~hit].tolist()))
    if not hit.any():
        return out
    _, st = libraries()
    survival = st.ecdf(st.CensoredData(uncensored=t[hit], right=t[~hit])).sf
    out.times = survival.quantiles.tolist()
    out.fraction = (1.0 - survival.probabilities).tolist()
    below = np.flatnonzero(survival.probabilities <= 0.5)
    if below.size:
        out.median = float(survival.quantiles[below[0]])
    return out
