"""The report's statistics: hand-computed values, an exactly enumerated bootstrap, and the
intervals of rliable's own `get_interval_estimates` on the same data."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from frlab.report import stats

pytest.importorskip("rliable", reason="the report extra (rliable) is not installed")


def test_one_run_has_a_mean_and_no_interval() -> None:
    e = stats.estimate([0.7], [0], reps=100, seed=0)
    assert (e.n, e.mean, e.method) == (1, 0.7, "none")
    assert math.isnan(e.low) and math.isnan(e.high) and e.low_n


def test_three_seeds_give_their_range_and_a_t_interval_by_hand() -> None:
    e = stats.estimate([0.2, 0.5, 0.8], [0, 1, 2], reps=100, seed=0)
    assert e.method == "range" and e.low_n
    assert (e.mean, e.low, e.high) == pytest.approx((0.5, 0.2, 0.8))
    # t interval: mean +- t(0.975, 2) * s / sqrt(3), s = 0.3, t = 4.302652729749462
    half = 4.302652729749462 * 0.3 / math.sqrt(3)
    assert (e.t_low, e.t_high) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-9)


def test_nan_values_are_not_runs() -> None:
    e = stats.estimate([0.2, math.nan, 0.8], [0, 1, 2], reps=100, seed=0)
    assert e.n == 2 and e.seeds == [0, 2] and e.mean == pytest.approx(0.5)


def test_equal_values_give_a_point_interval() -> None:
    e = stats.estimate([0.4] * 5, list(range(5)), reps=1000, seed=0)
    assert (e.method, e.low, e.high) == ("bootstrap", 0.4, 0.4)


def exact_percentiles(values: list[float]) -> tuple[float, float]:
    """The 2.5% and 97.5% points of the exact bootstrap distribution of the mean (every one
    of the n^n equally likely resamples enumerated)."""
    means = [np.mean(c) for c in itertools.product(values, repeat=len(values))]
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def test_four_seeds_bootstrap_matches_the_enumerated_bootstrap_distribution() -> None:
    values = [0.1, 0.4, 0.5, 0.9]
    e = stats.estimate(values, list(range(4)), reps=200_000, seed=3)
    low, high = exact_percentiles(values)
    assert e.method == "bootstrap" and not e.low_n
    assert (e.low, e.high) == pytest.approx((low, high), abs=0.02)


def test_the_same_seed_gives_the_same_interval_and_another_seed_another() -> None:
    values = [0.11, 0.35, 0.52, 0.6, 0.93]
    first = stats.estimate(values, list(range(5)), reps=500, seed=7)
    again = stats.estimate(values, list(range(5)), reps=500, seed=7)
    other = stats.estimate(values, list(range(5)), reps=500, seed=8)
    assert (first.low, first.high) == (again.low, again.high)
    assert (first.low, first.high) != (other.low, other.high)


def rliable_interval(data, func) -> tuple[float, float]:
    """rliable's own stratified bootstrap (20,000 resamples; it draws from NumPy's global
    generator)."""
    from rliable import library

    state = np.random.get_state()
    np.random.seed(0)
    try:
        _, ci = library.get_interval_estimates({"x": data}, func, reps=20_000)
    finally:
        np.random.set_state(state)
    low, high = np.asarray(ci["x"]).reshape(2)
    return float(low), float(high)


def test_the_mean_interval_is_rliables() -> None:
    values = np.array([0.12, 0.3, 0.45, 0.47, 0.8, 0.91])
    e = stats.estimate(values.tolist(), list(range(6)), reps=20_000, seed=0)
    expected = rliable_interval(values[:, None], lambda s: np.array([np.mean(s)]))
    assert (e.low, e.high) == pytest.approx(expected, abs=0.015)


@pytest.mark.slow
def test_iqm_by_hand_and_its_stratified_interval_is_rliables() -> None:
    from rliable import metrics

    scores = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 100.0]])
    # 8 scores, a quarter trimmed from each end: 3, 4, 5, 6 remain
    found = stats.iqm(scores, reps=20_000, seed=0)
    assert found is not None and found.mean == pytest.approx(4.5)
    assert found.mean == pytest.approx(metrics.aggregate_iqm(scores))
    rng = np.random.default_rng(1)
    scores = rng.uniform(size=(6, 3))
    found = stats.iqm(scores, reps=20_000, seed=0)
    expected = rliable_interval(scores, lambda s: np.array([metrics.aggregate_iqm(s)]))
    assert (found.low, found.high) == pytest.approx(expected, abs=0.015)


def test_iqm_needs_four_scores_and_four_runs_for_an_interval() -> None:
    assert stats.iqm(np.array([[0.1], [0.2], [0.3]]), reps=100, seed=0) is None
    three_runs = stats.iqm(np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]), reps=100, seed=0)
    assert three_runs is not None and three_runs.method == "none"


def test_probability_of_improvement_by_hand_and_as_rliable() -> None:
    from rliable import metrics

    x, y = [1.0, 2.0, 3.0, 5.0], [0.0, 2.0, 4.0, 4.0]
    # pairs x > y: 1>0; 2>0, 2=2 (1/2); 3>0, 3>2; 5>0, 5>2, 5>4, 5>4: 8.5 of 16
    c = stats.compare(dict(enumerate(x)), dict(enumerate(y)), reps=2000, seed=0)
    assert c.improvement == pytest.approx(8.5 / 16)
    rng = np.random.default_rng(2)
    for _ in range(5):
        a, b = rng.integers(0, 4, size=5).astype(float), rng.integers(0, 4, size=6).astype(float)
        expected = metrics.probability_of_improvement(a[:, None], b[:, None])
        assert stats.improvement_statistic(a, b, axis=-1) == pytest.approx(expected)


def test_paired_comparison_by_seed_with_a_t_interval_at_low_n() -> None:
    arm = {0: 0.5, 1: 0.7, 2: 0.9}
    base = {0: 0.4, 1: 0.4, 2: 0.6}  # differences 0.1, 0.3, 0.3
    c = stats.compare(arm, base, reps=100, seed=0)
    assert c.paired and c.method == "t" and c.wins == 3 and c.low_n
    d_mean, d_sd = 0.7 / 3, float(np.std([0.1, 0.3, 0.3], ddof=1))
    half = 4.302652729749462 * d_sd / math.sqrt(3)
    assert c.difference == pytest.approx(d_mean)
    assert (c.low, c.high) == pytest.approx((d_mean - half, d_mean + half))


def test_paired_bootstrap_is_the_bootstrap_of_the_differences() -> None:
    arm = {s: v for s, v in enumerate([0.5, 0.7, 0.9, 0.6, 0.8])}
    base = {s: v for s, v in enumerate([0.4, 0.4, 0.6, 0.7, 0.5])}
    c = stats.compare(arm, base, reps=20_000, seed=0)
    d = np.array([arm[s] - base[s] for s in range(5)])
    expected = rliable_interval(d[:, None], lambda s: np.array([np.mean(s)]))
    assert c.paired and c.method == "bootstrap" and c.wins == 4
    assert (c.low, c.high) == pytest.approx(expected, abs=0.015)


def test_different_seeds_are_compared_unpaired_and_marked() -> None:
    arm = {0: 0.5, 1: 0.7, 2: 0.9}
    base = {3: 0.4, 4: 0.5, 5: 0.6}
    c = stats.compare(arm, base, reps=100, seed=0)
    assert not c.paired and c.method == "welch t" and c.wins is None
    from scipy import stats as scipy_stats

    welch = scipy_stats.ttest_ind([0.5, 0.7, 0.9], [0.4, 0.5, 0.6], equal_var=False)
    ci = welch.confidence_interval(0.95)
    assert (c.low, c.high) == pytest.approx((ci.low, ci.high))


@pytest.mark.slow
def test_unpaired_bootstrap_resamples_each_arm_as_rliable_does() -> None:
    rng = np.random.default_rng(4)
    a, b = rng.uniform(size=6), rng.uniform(size=5)
    c = stats.compare(dict(enumerate(a)), {10 + i: v for i, v in enumerate(b)}, 20_000, 0)
    expected = rliable_interval(
        (a[:, None], b[:, None]), lambda p, q: np.array([np.mean(p) - np.mean(q)])
    )
    assert not c.paired and c.method == "bootstrap"
    assert (c.low, c.high) == pytest.approx(expected, abs=0.015)


def test_kaplan_meier_by_hand_censored_runs_are_not_averaged() -> None:
    # reached at 5, 10, 15; two runs stopped at 20 and 25 without reaching it:
    # S = 4/5, then 4/5 * 3/4 = 0.6, then 0.6 * 2/3 = 0.4 -> median 15
    km = stats.time_to([5, 10, 15, 20, 25], [True, True, True, False, False])
    assert (km.n, km.reached, km.median) == (5, 3, 15.0)
    assert km.fraction[:3] == pytest.approx([0.2, 0.4, 0.6]) and km.censored == [20, 25]
    # censored early: S(5) = 1 - 1/3, S(10) = 0 -> median 10, where the mean of the runs
    # that reached it (7.5) would say otherwise
    km = stats.time_to([3, 5, 8, 10], [False, True, False, True])
    assert km.median == 10.0


def test_kaplan_meier_without_half_reaching_has_no_median() -> None:
    assert math.isnan(stats.time_to([5, 20, 20], [True, False, False]).median)
    none = stats.time_to([20, 20], [False, False])
    assert none.reached == 0 and math.isnan(none.median) and none.fraction == []


def test_a_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real = builtins.__import__

    def no_rliable(name: str, *args, **kwargs):
        if name.startswith("rliable"):
            raise ImportError("No module named 'rliable'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_rliable)
    with pytest.raises(stats.MissingExtra, match=r"pip install 'frlab\[report\]'"):
        stats.libraries()
