"""bench/ttr_stats.py: the time-to-reward benchmark's moving-average crossing, censoring and
median/ratio rules, on hand-computed values and against a brute-force reference."""

from __future__ import annotations

import random
import statistics

import pytest
from helpers.bench import load_bench

stats = load_bench("ttr_stats")


def brute_force_crossing(times, rewards, window, target):
    """The definition, written out: first i with a full window whose mean is >= target."""
    for i in range(window - 1, len(rewards)):
        if sum(rewards[i - window + 1 : i + 1]) / window >= target:
            return times[i], i + 1
    return None, None


def test_first_crossing_hand_computed() -> None:
    times = [1.0, 2.0, 3.5, 4.0, 6.0]
    rewards = [0.0, 1.0, 0.0, 1.0, 1.0]
    # window 2 means: 0.5, 0.5, 0.5, 1.0 at updates 2..5
    assert stats.first_crossing(times, rewards, 2, 0.5) == 2.0
    assert stats.first_crossing(times, rewards, 2, 0.6) == 6.0
    # window 3 means: 1/3, 2/3, 2/3 at updates 3..5
    assert stats.first_crossing(times, rewards, 3, 0.6) == 4.0
    assert stats.first_crossing(times, rewards, 3, 0.7) is None


def test_only_full_windows_count() -> None:
    """A first batch at reward 1 does not reach the target before the window is full."""
    assert stats.first_crossing([1.0, 2.0, 3.0], [1.0, 1.0, 0.0], 3, 0.6) == 3.0
    assert stats.first_crossing([1.0, 2.0], [1.0, 1.0], 3, 0.1) is None
    window = stats.RewardWindow(3, 0.5)
    assert window.average is None
    assert not window.add(1.0, 1.0) and window.average is None


def test_the_first_crossing_is_kept_after_a_dip() -> None:
    window = stats.RewardWindow(2, 0.75)
    results = [window.add(t, r) for t, r in enumerate([0.5, 1.0, 0.5, 0.0, 1.0, 1.0])]
    assert results == [False, True, True, True, True, True]
    assert (window.crossed_at, window.crossed_update) == (1.0, 2)


def test_online_detector_matches_the_definition() -> None:
    rng = random.Random(0)
    for _ in range(300):
        n, window = rng.randrange(1, 40), rng.randrange(1, 8)
        target = rng.choice([0.25, 0.5, 0.8, 1.0])
        rewards = [rng.choice([0.0, 0.5, 1.0]) for _ in range(n)]
        times = sorted(rng.uniform(0, 100) for _ in range(n))
        detector = stats.RewardWindow(window, target)
        for t, r in zip(times, rewards, strict=True):
            detector.add(t, r)
        expected = brute_force_crossing(times, rewards, window, target)
        assert (detector.crossed_at, detector.crossed_update) == expected
        assert stats.first_crossing(times, rewards, window, target) == expected[0]


def test_bad_arguments_name_the_flag() -> None:
    with pytest.raises(ValueError, match="--window"):
        stats.RewardWindow(0, 0.5)
    with pytest.raises(ValueError, match="--target"):
        stats.RewardWindow(3, float("nan"))
    with pytest.raises(ValueError, match="2 times but 1 rewards"):
        stats.first_crossing([1.0, 2.0], [1.0], 1, 0.5)
    with pytest.raises(ValueError, match="--time-cap"):
        stats.summarize([1.0], 0.0)
    with pytest.raises(ValueError, match="no runs"):
        stats.summarize([], 60.0)


def test_censored_runs_count_as_the_cap() -> None:
    s = stats.summarize([10.0, None, 30.0, 20.0, None], 60.0)
    # filled: 10, 60, 30, 20, 60 -> sorted 10, 20, 30, 60, 60 -> median 30 (a reached run)
    assert s == stats.ArmSummary(median_s=30.0, censored=2, runs=5, median_censored=False)
    s = stats.summarize([None, 5.0, None], 60.0)
    assert s == stats.ArmSummary(median_s=60.0, censored=2, runs=3, median_censored=True)
    # even count: the median averages 20 and the cap -> only a lower bound
    s = stats.summarize([10.0, 20.0, None, None], 60.0)
    assert s == stats.ArmSummary(median_s=40.0, censored=2, runs=4, median_censored=True)
    s = stats.summarize([10.0, 20.0, 30.0, None], 60.0)
    assert s == stats.ArmSummary(median_s=25.0, censored=1, runs=4, median_censored=False)


def test_uncensored_summary_is_the_plain_median() -> None:
    rng = random.Random(1)
    for n in range(1, 12):
        times = [rng.uniform(0, 50) for _ in range(n)]
        s = stats.summarize(times, 50.0)
        assert s.median_s == statistics.median(times)
        assert (s.censored, s.runs, s.median_censored) == (0, n, False)


def test_a_time_past_the_cap_must_be_reported_as_censored() -> None:
    with pytest.raises(ValueError, match="report later ones as None"):
        stats.summarize([10.0, 61.0], 60.0)
    with pytest.raises(ValueError, match="report later ones as None"):
        stats.summarize([-1.0], 60.0)


def test_ratio_and_how_to_read_it() -> None:
    fast = stats.summarize([10.0, 12.0, 11.0], 60.0)  # median 11
    slow = stats.summarize([33.0, 22.0, 44.0], 60.0)  # median 33
    capped = stats.summarize([None, None, 30.0], 60.0)  # median 60, a lower bound
    assert stats.ratio(slow, fast) == (3.0, "=")
    assert stats.ratio(fast, slow) == (pytest.approx(1 / 3), "=")
    assert stats.ratio(capped, fast) == (pytest.approx(60 / 11), ">=")
    assert stats.ratio(fast, capped) == (pytest.approx(11 / 60), "<=")
    assert stats.ratio(capped, capped) == (1.0, "?")
