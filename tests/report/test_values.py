"""One number per run: the declared windows, the last evaluation, time to a threshold."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from helpers.report_runs import make_run

from frlab.report import values
from frlab.report.runs import load_run


def test_training_metrics_are_the_mean_of_the_last_tenth_of_updates(tmp_path: Path) -> None:
    rewards = [float(i) for i in range(1, 31)]  # 30 updates: the last 3 are 28, 29, 30
    run = load_run(make_run(tmp_path / "r", seed=0, rewards=rewards))
    found = values.run_value(run, "train/reward_mean", 0.1)
    assert (found.value, found.step) == (29.0, 30)
    assert values.run_value(run, "train/reward_mean", 0.5).value == pytest.approx(23.0)
    short = load_run(make_run(tmp_path / "s", seed=0, rewards=[1.0, 3.0]))
    assert values.run_value(short, "train/reward_mean", 0.1).value == 3.0  # at least one update


def test_evaluations_are_read_at_the_last_evaluation_with_their_own_se(tmp_path: Path) -> None:
    evals = {"eval/heldout/avg@4": [(0, 0.2, 0.05), (10, 0.9, 0.03), (20, 0.7, 0.04)]}
    run = load_run(make_run(tmp_path / "r", seed=0, rewards=[0.5] * 20, evals=evals))
    found = values.run_value(run, "eval/heldout/avg@4", 0.1)
    assert (found.value, found.step, found.se) == (0.7, 20, 0.04)  # the last, not the best
    assert values.eval_metrics([run]) == ["eval/heldout/avg@4"]


def test_eval_mean_comes_after_the_benchmarks(tmp_path: Path) -> None:
    evals = {m: [(3, 0.5, math.nan)] for m in ("eval/mean/avg@4", "eval/b/avg@4", "eval/a/avg@4")}
    run = load_run(make_run(tmp_path / "r", seed=0, rewards=[0.5] * 3, evals=evals))
    assert values.eval_metrics([run]) == ["eval/a/avg@4", "eval/b/avg@4", "eval/mean/avg@4"]


def test_a_metric_an_older_run_never_logged_is_nan(tmp_path: Path) -> None:
    run = load_run(make_run(tmp_path / "r", seed=0, rewards=[0.5] * 3))
    assert math.isnan(values.run_value(run, "train/acceptance_rate", 0.1).value)
    assert math.isnan(values.run_value(run, "eval/x/avg@4", 0.1).value)


def test_updates_per_minute_over_training_wall_time(tmp_path: Path) -> None:
    run = load_run(make_run(tmp_path / "r", seed=0, rewards=[0.5] * 12, seconds_per_update=5.0))
    assert values.run_value(run, values.UPDATES_PER_MINUTE, 0.1).value == pytest.approx(12.0)


def test_crossing_is_the_first_update_reaching_it_or_censored_at_the_last(tmp_path: Path) -> None:
    run = load_run(make_run(tmp_path / "r", seed=0, rewards=[0.1, 0.9, 0.2, 0.8, 0.85, 0.9]))
    hit = values.crossing(run, "train/reward_mean", 0.8)
    assert hit is not None and (hit.reached, hit.update, hit.wall_s) == (True, 2.0, 4.0)
    smooth = values.crossing(run, "train/reward_mean", 0.8, smooth=3)  # trailing 3-update mean
    assert smooth is not None and (smooth.reached, smooth.update) == (True, 6.0)
    never = values.crossing(run, "train/reward_mean", 0.95)
    assert never is not None and (never.reached, never.update, never.wall_s) == (False, 6.0, 12.0)
    assert values.crossing(run, "train/missing", 0.5) is None
