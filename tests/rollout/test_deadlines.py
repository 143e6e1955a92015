"""`AdaptiveDeadline` (frlab.rollout.deadlines): the configured value until enough calls
returned, then 10x their p99 within [floor, ceiling]; fixed when not adaptive."""

from __future__ import annotations

import pytest

from frlab.defaults import agent_loop_config
from frlab.rollout.deadlines import FACTOR, MIN_SAMPLES, WINDOW, AdaptiveDeadline


def test_the_first_call_gets_the_ceiling_then_ten_times_the_slowest_until_a_p99_exists() -> None:
    d = AdaptiveDeadline(ceiling_s=300.0, floor_s=2.0, adaptive=True)
    assert d.current() == 300.0  # nothing known yet
    d.observe(0.001)
    assert d.current() == 2.0  # 10 x 1 ms is below the floor
    d.observe(1.0)
    assert d.current() == 10.0  # 10 x the slowest so far
    for _ in range(MIN_SAMPLES - 2):
        d.observe(0.001)
    assert d.current() == 10.0  # 32 calls: the p99 of 32 is their slowest, 1 s


def test_the_deadline_is_ten_times_the_p99_within_floor_and_ceiling() -> None:
    d = AdaptiveDeadline(ceiling_s=300.0, floor_s=2.0, adaptive=True)
    times = [0.5] * 99 + [1.5]  # p99 = 0.5 (the 99th of 100 sorted)
    for t in times:
        d.observe(t)
    assert d.current() == pytest.approx(FACTOR * 0.5)
    for _ in range(5):
        d.observe(100.0)  # a slow tail: p99 = 100 -> 1000 s, capped at the ceiling
    assert d.current() == 300.0


def test_only_the_recent_window_counts() -> None:
    d = AdaptiveDeadline(ceiling_s=300.0, floor_s=1.0, adaptive=True)
    for _ in range(WINDOW):
        d.observe(20.0)
    assert d.current() == 200.0
    for _ in range(WINDOW):
        d.observe(0.2)
    assert d.current() == pytest.approx(2.0)


def test_not_adaptive_is_the_configured_value_and_bad_values_are_refused() -> None:
    d = AdaptiveDeadline(ceiling_s=30.0, floor_s=2.0, adaptive=False)
    for _ in range(100):
        d.observe(0.001)
    assert d.current() == 30.0
    assert (
        AdaptiveDeadline(ceiling_s=1.0, floor_s=5.0, adaptive=True).floor_s == 1.0
    )  # floor <= ceiling
    with pytest.raises(ValueError, match="ceiling_s"):
        AdaptiveDeadline(ceiling_s=0.0, floor_s=1.0, adaptive=True)


def test_the_agent_loop_config_builds_its_deadlines_from_the_rollout_keys() -> None:
    cfg = agent_loop_config(env_timeout_s=300.0, engine_timeout_s=1800.0, env_timeout_floor_s=3.0)
    assert cfg.deadlines.env.ceiling_s == 300.0 and cfg.deadlines.env.floor_s == 3.0
    assert cfg.deadlines.engine.ceiling_s == 1800.0 and cfg.deadlines.engine.adaptive
    fixed = agent_loop_config(adaptive_deadlines=False)
    assert not fixed.deadlines.env.adaptive
    with pytest.raises(ValueError, match="rollout.env_timeout_floor_s"):
        agent_loop_config(env_timeout_floor_s=-1.0)
