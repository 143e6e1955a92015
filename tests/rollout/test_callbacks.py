"""`rollout_metrics`: the pool's counters and the engine's reach the logs as `rollout/<name>`."""

from __future__ import annotations

from frlab.rollout.callbacks import rollout_metrics


def test_pool_counters_and_reasons_become_rollout_metrics() -> None:
    """The keys of `RolloutPool.stats()`: counters, failures and rejections by reason (a reason
    such as `agent_loop:ValueError` becomes one name segment), engine counters; gauges,
    booleans and other counters are left out."""
    stats = {
        "started": 12,
        "finished": 9,
        "paused_for_lag": 2,
        "lag_violations": 0,
        "failed": 2,
        "failed_by_reason": {"agent_loop:ValueError": 1, "engine_error": 1},
        "rejected": 1,
        "rejected_by_reason": {"zero_action_tokens": 1},
        "in_flight": 3,
        "lag_paused": True,
        "engine": {"retries": 4, "flag": False},
    }
    assert rollout_metrics(stats) == {
        "rollout/paused_for_lag": 2.0,
        "rollout/lag_violations": 0.0,
        "rollout/failed": 2.0,
        "rollout/rejected": 1.0,
        "rollout/failed/agent_loop_ValueError": 1.0,
        "rollout/failed/engine_error": 1.0,
        "rollout/rejected/zero_action_tokens": 1.0,
        "rollout/retries": 4.0,
    }
    assert rollout_metrics(None) == {} == rollout_metrics({"failed_by_reason": {}})
