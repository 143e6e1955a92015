"""The progress bar shows step, reward, acceptance and lag."""

from __future__ import annotations

from frlab.tracking.progress import short_metrics


def test_short_metrics_picks_and_formats_the_shown_metrics() -> None:
    metrics = {
        "train/reward_mean": 0.25, "train/acceptance_rate_step": 0.875,
        "train/policy_lag_mean": 1.5, "train/loss": 3.0,
    }  # fmt: skip
    assert short_metrics(metrics, 7) == {
        "step": 7,
        "reward": "0.250",
        "acc": "0.875",
        "lag": "1.500",
    }


def test_short_metrics_before_anything_is_logged() -> None:
    assert short_metrics({}, 0) == {"step": 0}
    assert short_metrics({"train/reward_mean": float("nan")}, 1)["reward"] == "nan"
