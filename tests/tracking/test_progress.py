"""The progress bar shows step, reward, acceptance and lag."""

from __future__ import annotations

import io
import logging
from types import SimpleNamespace

import pytest

from frlab.tracking.progress import TIP_LOGGER, ProgressBar, short_metrics


def test_short_metrics_picks_and_formats_the_shown_metrics() -> None:
    metrics = {
        "train/reward_mean": 0.25,
        "train/acceptance_rate_step": 0.875,
        "train/policy_lag_mean": 1.5,
        "train/loss": 3.0,
    }
    assert short_metrics(metrics, 7) == {
        "step": 7,
        "reward": "0.250",
        "acc": "0.875",
        "lag": "1.500",
    }


def test_short_metrics_before_anything_is_logged() -> None:
    assert short_metrics({}, 0) == {"step": 0}
    assert short_metrics({"train/reward_mean": float("nan")}, 1)["reward"] == "nan"


def _bar_for(global_step: int, max_steps: int, monkeypatch: pytest.MonkeyPatch) -> tuple:
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    bar = ProgressBar()
    bar._trainer = SimpleNamespace(global_step=global_step, max_steps=max_steps)  # type: ignore
    return bar.init_train_tqdm(), out


def test_a_resumed_run_shows_its_step_out_of_max_steps_from_the_first_draw(monkeypatch) -> None:
    """Lightning skips on_train_epoch_start when it restarts mid-epoch, so the bar used to show
    `Training ... 12/?` after a resume, next to an empty `Training` bar at start."""
    tqdm, out = _bar_for(12, 20, monkeypatch)
    tqdm.refresh()
    text = out.getvalue()
    assert tqdm.desc == "updates" and (tqdm.n, tqdm.total) == (12, 20)
    assert "12/20" in text and "Training" not in text and "?" not in text.split("[")[0]
    tqdm.close()


def test_lightning_advertising_tips_are_not_shown() -> None:
    ProgressBar()
    logger = logging.getLogger(TIP_LOGGER)
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.INFO
    try:
        logger.info("💡 Tip: For seamless cloud logging, try installing [litlogger]")
        logger.info("GPU available: False, used: False")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert seen == ["GPU available: False, used: False"]


def test_a_disabled_bar_on_other_ranks_is_left_alone() -> None:
    bar = ProgressBar()
    bar.disable()
    bar._trainer = SimpleNamespace(global_step=3, max_steps=9, is_global_zero=False)  # type: ignore
    bar.train_progress_bar = bar.init_train_tqdm()
    bar.on_train_epoch_start(bar._trainer)  # used to raise AttributeError on rank 1
    assert bar.train_progress_bar.disable


class FakeBar:
    def __init__(self) -> None:
        self.descriptions: list[str] = []

    def set_description(self, desc: str, refresh: bool = True) -> None:
        self.descriptions.append(desc)


def test_the_bar_says_fleet_down_while_the_pools_engine_is_down() -> None:
    from frlab.tracking.progress import OutageLabel, bar_label

    assert bar_label(None) == "updates" and bar_label(34.6) == "updates (fleet down 35 s)"
    down: list[float | None] = [None, 3.0, 4.2, None]
    bar = FakeBar()
    label = OutageLabel(lambda: bar, lambda: down[0], poll_s=60.0)
    for _ in range(4):
        label.relabel()
        down.pop(0)
    assert bar.descriptions == ["updates (fleet down 3 s)", "updates (fleet down 4 s)", "updates"]


def test_the_outage_label_thread_polls_until_stopped() -> None:
    import threading

    from frlab.tracking.progress import OutageLabel

    bar, asked = FakeBar(), threading.Event()

    def outage_s() -> float:
        asked.set()
        return 7.0

    label = OutageLabel(lambda: bar, outage_s, poll_s=0.01)
    label.start()
    try:
        assert asked.wait(10)
    finally:
        label.stop()
    assert "updates (fleet down 7 s)" in bar.descriptions
