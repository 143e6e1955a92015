"""How report.md prints numbers: three significant places below 10, whole numbers of updates
as whole numbers, and the two cases where a median is not a number."""

from __future__ import annotations

import math

from frlab.report.stats import TimeTo
from frlab.report.write import median, num


def test_num_keeps_three_places_below_ten_and_fewer_above() -> None:
    assert [num(0.95512), num(8.0), num(11.04), num(123.4), num(None), num(math.nan)] == [
        "0.955",
        "8.000",
        "11.0",
        "123",
        "-",
        "-",
    ]


def test_a_median_of_updates_prints_as_a_whole_number() -> None:
    assert median(TimeTo(n=3, reached=3, median=8.0), whole=True) == "8"
    assert median(TimeTo(n=3, reached=3, median=8.5), whole=True) == "8.500"
    assert median(TimeTo(n=3, reached=3, median=617.3)) == "617"
    assert median(TimeTo(n=3, reached=1)) == "not reached by half the runs"
    assert median(TimeTo(n=0, reached=0)) == "not logged"


def test_the_curve_band_is_the_seeds_range_at_low_n_and_a_t_interval_from_four() -> None:
    import numpy as np
    from scipy import stats as scipy_stats

    from frlab.report.plots import band

    two = np.array([[0.0, 1.0, 2.0], [1.0, 1.0, 4.0]])
    mean, low, high, n = band(two)
    assert mean.tolist() == [0.5, 1.0, 3.0] and n.tolist() == [2, 2, 2]
    assert low.tolist() == [0.0, 1.0, 2.0] and high.tolist() == [1.0, 1.0, 4.0]
    four = np.array([[0.0], [1.0], [2.0], [3.0]])
    mean, low, high, n = band(four)
    half = scipy_stats.t.ppf(0.975, 3) * np.std([0, 1, 2, 3], ddof=1) / 2
    assert mean[0] == 1.5 and np.allclose([low[0], high[0]], [1.5 - half, 1.5 + half])
